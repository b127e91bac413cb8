/**
 * The node's native fast path (processes/native-proxy.ts): HAProxy in front
 * of the builder answers plain proxied requests itself, and everything the
 * other process suites check of the proxy holds through it (they run through
 * it too). Here: that it is HAProxy that served (its own counters, read over
 * its runtime socket), what goes to the Node proxy instead, the cookie rules
 * against the Node proxy's own, a restart of HAProxy, a keep-alive
 * connection across changes of its maps, and a slot handed to another
 * account's process, and what it runs as.
 */
import { createHash, randomBytes } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { chmod, cp, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { request as httpRequest, Agent } from "node:http";
import { connect } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cookieDomainProblem } from "../../builder/src/processes/proxy.js";
import { signProxy } from "../../builder/src/protocol/processes.js";
import type { ProcessStatus } from "../../builder/src/protocol/processes.js";
import { type BuilderProcess, signedFetch, startBuilder } from "./builder-process.js";
import {
  APP_SERVER,
  type ControlPlane,
  type Release,
  makeRelease,
  pidsWith,
  proxyFetch,
  proxyHeaders,
  readyProcess,
  startControlPlane,
  startProcess,
  stopProcess,
  waitFor,
  webSpec,
} from "./process-support.js";

let builder: BuilderProcess;
let plane: ControlPlane;
let release: Release;

beforeAll(async () => {
  builder = await startBuilder({ env: { BUILDER_NATIVE_PROXY: "on" } });
  plane = await startControlPlane(builder.secret);
  release = await makeRelease({ "server.js": APP_SERVER });
});
afterAll(async () => {
  await builder?.stop();
  await plane?.close();
});

/**
 * A ready process, once HAProxy routes it: the builder writes a process's
 * route into HAProxy's maps just after it is ready (until then its requests
 * take the Node proxy), so what is counted here waits for that.
 */
async function readyApp(overrides: Parameters<typeof webSpec>[1] = {}): Promise<ProcessStatus> {
  const status = await readyProcess(builder, plane, release, overrides);
  const routes = join(builder.dataDir, "native-proxy", "routes.map");
  await expect.poll(async () => (await runtime(`show map ${routes}`)).includes(` ${status.id} `), { timeout: 5_000, interval: 20 }).toBe(true);
  return status;
}

/** One command over HAProxy's runtime socket (of the suite's builder unless another's data dir is given). */
function runtime(command: string, dataDir = builder.dataDir): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(join(dataDir, "native-proxy", "haproxy.sock"));
    let answer = "";
    socket.on("data", (chunk) => {
      answer += chunk.toString();
    });
    socket.once("error", reject);
    socket.once("close", () => resolve(answer));
    socket.end(`${command}\n`);
  });
}

/** Requests HAProxy sent to the app servers of its slots so far. */
async function servedNatively(): Promise<number> {
  const stats = await runtime("show stat -1 4 -1");
  return stats
    .split("\n")
    .filter((line) => /^s\d+,app,/.test(line))
    .reduce((sum, line) => sum + Number(line.split(",")[7] ?? 0), 0);
}

/** The process's runtime log. */
async function appLog(appId: string): Promise<string> {
  return (await signedFetch(builder, `/v1/app-logs/${appId}`)).text();
}

describe("the native fast path", () => {
  it("is HAProxy, in front of the builder's port, serving a proxied GET and POST itself", async () => {
    expect(builder.output()).toMatch(/builder native proxy: HAProxy on http:\/\/127\.0\.0\.1:\d+, in front of the builder's own server/);
    const app = await readyApp();
    const before = await servedNatively();
    const get = await proxyFetch(builder, app.id, "/echo/x?y=1");
    expect(get.status).toBe(200);
    const echoed = (await get.json()) as { url: string; headers: Record<string, string> };
    expect(echoed.url).toBe("/echo/x?y=1");
    expect(echoed.headers.host).toBe("myapp.apps.example");
    expect(Object.keys(echoed.headers).filter((name) => name.startsWith("x-svc-"))).toEqual([]);
    expect(get.headers.get("x-svc-leak")).toBeNull();
    const body = randomBytes(100_000);
    const post = await proxyFetch(builder, app.id, "/upload", { method: "POST", body, headers: { "Content-Type": "application/octet-stream" } });
    expect(((await post.json()) as { bodySha256: string }).bodySha256).toBe(createHash("sha256").update(body).digest("hex"));
    // The root: `/v1/proxy/<id>` and `/v1/proxy/<id>?q` reach the app's `/`.
    const root = await proxyFetch(builder, app.id, "?q=2");
    expect(((await root.json()) as { url: string }).url).toBe("/?q=2");
    expect(await servedNatively()).toBe(before + 3);
  });

  it("leaves to the Node proxy what it does not settle itself: a wrong, missing or older signature (401 or served), a chunked body; the builder's own API", async () => {
    const app = await readyApp();
    const before = await servedNatively();
    const wrong = await fetch(`${builder.url}/v1/proxy/${app.id}/hello`, { headers: { ...(await proxyHeaders(builder.secret, app.id)), "X-Svc-Proxy-Signature": "0".repeat(64) } });
    expect(wrong.status).toBe(401);
    const other = await fetch(`${builder.url}/v1/proxy/${app.id}/hello`, { headers: await signProxy(builder.secret, "prc_someoneelse") });
    expect(other.status).toBe(401);
    expect((await fetch(`${builder.url}/v1/proxy/${app.id}/hello`)).status).toBe(401);
    // Signed 60 s ago: valid (the signature window is 300 s), outside the fast path's few seconds.
    const older = await fetch(`${builder.url}/v1/proxy/${app.id}/hello`, { headers: await signProxy(builder.secret, app.id, Math.floor(Date.now() / 1000) - 60) });
    expect(older.status).toBe(200);
    expect(await older.text()).toBe("hello from the app");
    const chunked = await proxyFetch(builder, app.id, "/chunked", {
      method: "POST",
      body: new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode("part one, "));
          controller.enqueue(new TextEncoder().encode("part two"));
          controller.close();
        },
      }),
      duplex: "half",
    } as RequestInit);
    expect(((await chunked.json()) as { bodyLength: number }).bodyLength).toBe(18);
    expect((await signedFetch(builder, `/v1/processes/${app.id}`)).status).toBe(200);
    expect(await servedNatively()).toBe(before);
  });

  it("drops the cookies the Node proxy drops, and no other, with the same line in the app's runtime log", async () => {
    const appId = `app_cookies${randomBytes(3).toString("hex")}`;
    const app = await readyApp({ appId });
    const apps = "apps.example";
    const host = "myapp.apps.example";
    const cookies = [
      "a=1",
      "b=1; Path=/; HttpOnly",
      "c=1; Domain=myapp.apps.example",
      "d=1; Domain=.MyApp.Apps.Example",
      "e=1; Domain=",
      "f=1; Domain=apps.example",
      "g=1; domain=.APPS.example; Path=/",
      "h=1; Path=/; DOMAIN = apps.example ; HttpOnly",
      "i=1; Domain=example",
      "j=1; Domain=other.apps.example",
      "k=1; Domain=myapp.apps.example; Domain=apps.example",
      "l=1; Domain=unrelated.org",
      "m=1; Expires=Wed, 21 Oct 2037 07:28:00 GMT; Domain=apps.example",
    ];
    const query = cookies.map((cookie) => `c=${encodeURIComponent(cookie)}`).join("&");
    const response = await proxyFetch(builder, app.id, `/cookies?${query}`, { headers: { "X-Svc-Apps-Domain": apps } });
    expect(response.status).toBe(200);
    const expected = cookies.filter((cookie) => cookieDomainProblem(cookie, apps, host) === null);
    expect(response.headers.getSetCookie()).toEqual(expected);
    expect(expected.length).toBeGreaterThan(3);
    const reasons = cookies.flatMap((cookie) => cookieDomainProblem(cookie, apps, host) ?? []);
    await expect
      .poll(
        async () => {
          const log = await appLog(appId);
          return reasons.filter((why) => !log.includes(why));
        },
        { timeout: 5_000 },
      )
      .toEqual([]);
  });

  it("answers past a process's share of requests in flight with 503 and Retry-After, as the Node proxy does", async () => {
    const app = await readyApp();
    const agent = new Agent({ keepAlive: true, maxSockets: 600 });
    const headers = await proxyHeaders(builder.secret, app.id);
    const url = new URL(`${builder.url}/v1/proxy/${app.id}/slow?ms=3000`);
    const statuses = await Promise.all(
      Array.from(
        { length: 530 },
        () =>
          new Promise<{ status: number; retryAfter: string | undefined; error: string | undefined }>((resolve) => {
            const req = httpRequest({ host: url.hostname, port: url.port, path: url.pathname + url.search, agent, headers }, (res) => {
              res.resume();
              res.on("end", () => resolve({ status: res.statusCode ?? 0, retryAfter: res.headers["retry-after"] as string | undefined, error: res.headers["x-svc-proxy-error"] as string | undefined }));
            });
            req.on("error", () => resolve({ status: 0, retryAfter: undefined, error: undefined }));
            req.end();
          }),
      ),
    );
    agent.destroy();
    const refused = statuses.filter((answer) => answer.status === 503);
    expect(statuses.filter((answer) => answer.status === 200).length).toBe(512);
    expect(refused.length).toBe(18);
    expect(refused[0]).toMatchObject({ retryAfter: "1", error: "UNAVAILABLE" });
  }, 30_000);

  it("keeps a kept-alive connection across changes of its maps, and is started again when it dies", async () => {
    const app = await readyApp();
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const sockets = new Set<unknown>();
    const get = (headers: Record<string, string>) =>
      new Promise<string>((resolve, reject) => {
        const url = new URL(`${builder.url}/v1/proxy/${app.id}/hello`);
        const req = httpRequest({ host: url.hostname, port: url.port, path: url.pathname, agent, headers }, (res) => {
          sockets.add(res.socket);
          let body = "";
          res.on("data", (chunk) => {
            body += chunk;
          });
          res.on("end", () => resolve(body));
        });
        req.on("error", reject);
        req.end();
      });
    expect(await get(await proxyHeaders(builder.secret, app.id))).toBe("hello from the app");
    // Another process starts and stops: routes and slots change under the open connection.
    const other = await readyApp();
    await stopProcess(builder, other.id);
    await waitFor(builder, other.id, (status) => status.state === "stopped");
    expect(await get(await proxyHeaders(builder.secret, app.id))).toBe("hello from the app");
    expect(sockets.size).toBe(1);
    agent.destroy();

    const pid = Number(/^Pid: (\d+)$/m.exec(await runtime("show info"))?.[1]);
    expect(pid).toBeGreaterThan(0);
    process.kill(pid, "SIGKILL");
    await expect
      .poll(async () => {
        const again = await proxyFetch(builder, app.id, "/hello").catch(() => null);
        return again?.status;
      }, { timeout: 10_000, interval: 100 })
      .toBe(200);
    expect(builder.output()).toMatch(/HAProxy exited \(SIGKILL\)[^\n]*; starting it again/);
    const before = await servedNatively();
    await proxyFetch(builder, app.id, "/hello");
    expect(await servedNatively()).toBe(before + 1);
  }, 30_000);

  it("hands a stopped process's slot to another account's process: requests for each reach its own, never the other", async () => {
    const first = await readyApp({ appId: "app_first", tenant: "acct_first" });
    expect(await (await proxyFetch(builder, first.id, "/hello")).text()).toBe("hello from the app");
    await stopProcess(builder, first.id);
    await waitFor(builder, first.id, (status) => status.state === "stopped");
    const marker = `second-${randomBytes(4).toString("hex")}`;
    const second = await readyApp({ appId: "app_second", tenant: "acct_second", env: { MARKER: marker }, command: `node server.js ${marker}` });
    expect(pidsWith(marker).length).toBe(1);
    for (let i = 0; i < 5; i++) {
      const gone = await proxyFetch(builder, first.id, "/hello");
      expect(gone.status).toBe(404);
      expect(gone.headers.get("x-svc-proxy-error")).toBe("PROCESS_NOT_FOUND");
      const served = await proxyFetch(builder, second.id, "/info");
      expect(((await served.json()) as { env: Record<string, string> }).env).toBeDefined();
    }
  });

  it("holds a request sent right after the app's process is killed until it is back (200)", async () => {
    const marker = `killed-${randomBytes(4).toString("hex")}`;
    const app = await readyApp({ command: `node server.js ${marker}` });
    expect(await (await proxyFetch(builder, app.id, "/hello")).text()).toBe("hello from the app");
    const [pid] = pidsWith(marker);
    process.kill(pid!, "SIGKILL");
    const answer = await proxyFetch(builder, app.id, "/hello");
    expect(answer.status).toBe(200);
    expect(await answer.text()).toBe("hello from the app");
    const held = (await runtime("show stat -1 4 -1")).split("\n").filter((line) => /^s\d+,hold,/.test(line)).reduce((sum, line) => sum + Number(line.split(",")[7]), 0);
    console.log(`held by the builder: ${held}`);
  });

  it("runs as nobody, with its configuration, maps and sockets readable by it and root alone", async () => {
    const dir = join(builder.dataDir, "native-proxy");
    const config = readFileSync(join(dir, "haproxy.cfg"), "utf8");
    expect(config).toContain("backend s255 from slots");
    expect(config).not.toContain(builder.secret);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    for (const name of ["haproxy.cfg", "cookies.lua", "tokens.map", "routes.map", "haproxy.sock", "hold.sock"]) {
      const { mode, uid } = statSync(join(dir, name));
      expect(mode & 0o077, name).toBe(0);
      expect(uid, name).toBe(65534);
    }
    const pid = Number(/^Pid: (\d+)$/m.exec(await runtime("show info"))?.[1]);
    expect(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]).toBe("65534");
  });
});

describe("when HAProxy keeps failing", () => {
  it("the builder serves its port itself after three failures in a row, apps included", async () => {
    const folder = await mkdtemp(join(tmpdir(), "svc-haproxy-"));
    // HAProxy runs as nobody: its folder must be open to it.
    await chmod(folder, 0o755);
    const copy = join(folder, "haproxy");
    await cp("/usr/sbin/haproxy", copy);
    const alone = await startBuilder({ env: { BUILDER_NATIVE_PROXY: "on", BUILDER_HAPROXY: copy } });
    try {
      const alonePlane = await startControlPlane(alone.secret);
      const started = await startProcess(alone, webSpec(alonePlane.serve(release)));
      await waitFor(alone, started.id, (status) => status.ready);
      expect(await (await proxyFetch(alone, started.id, "/hello")).text()).toBe("hello from the app");
      // HAProxy can no longer be started: its binary is gone, and it is killed.
      await rm(copy);
      const info = await runtime("show info", alone.dataDir);
      process.kill(Number(/^Pid: (\d+)$/m.exec(info)?.[1]), "SIGKILL");
      await expect.poll(() => alone.output(), { timeout: 10_000 }).toMatch(/HAProxy failed 3 times in a row; the builder serves its port itself/);
      await expect.poll(async () => (await proxyFetch(alone, started.id, "/hello").catch(() => null))?.status, { timeout: 10_000 }).toBe(200);
      expect((await signedFetch(alone, `/v1/processes/${started.id}`)).status).toBe(200);
      await alonePlane.close();
    } finally {
      await alone.stop();
      await rm(folder, { recursive: true, force: true });
    }
  }, 60_000);
});
