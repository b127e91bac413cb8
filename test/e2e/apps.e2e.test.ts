import { createHash, randomBytes } from "node:crypto";
import { cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import { request } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { expectExit, siteRequest } from "./sites.js";

/** The sample apps of these tests. */
const APPS = join(ROOT, "test", "fixtures", "apps");
/** A deploy installs from the registry and starts the release; on a shared 2-core machine give it room. */
const DEPLOY_MS = 180_000;

type AppInfo = {
  status: string;
  activeDeploymentId: string | null;
  process: {
    state: string;
    ready: boolean;
    restarts: number;
    lastExit: { reason: string; message: string } | null;
    lastLines: string[];
  } | null;
};
type Deployment = { id: string; status: string; error: string | null; logExcerpt: string[] | null; release: { type: string; startCommand: string; port: number | null } | null };

/**
 * Issue 18's acceptance through the stack `npm start` runs: the real `svc`
 * deploys real apps (one with no dependency that exercises every pass-through,
 * an Express app installed from the registry with its lockfile, a Python
 * standard-library app; workers are app-life.e2e.test.ts's), the builder builds releases
 * and runs them as supervised sandboxed processes, and the Worker forwards
 * `<app>.localhost` to them.
 */
describe("apps that run: deploy, serve, supervise", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const dirs: string[] = [];
  const suffix = randomBytes(3).toString("hex");
  const features = `feat-${suffix}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "e2e-apps", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  });

  /** A private copy of a fixture app (tests change some). */
  const copy = async (name: string) => {
    const dir = await mkdtemp(join(tmpdir(), `svc-app-${name}-`));
    dirs.push(dir);
    await cp(join(APPS, name), join(dir, name), { recursive: true });
    return join(dir, name);
  };
  const appInfo = async (app: string) => JSON.parse(expectExit(await svc(["apps", "info", app, "--json"], env), 0, "apps info").stdout) as AppInfo;
  const deployments = async (app: string) =>
    JSON.parse(expectExit(await svc(["deployments", "list", app, "--json"], env), 0, "deployments list").stdout) as Deployment[];
  const create = async (app: string, runtime: string, ...extra: string[]) =>
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", runtime, ...extra], env), 0, `apps create ${app}`);
  const deploy = async (app: string, source: string) => expectExit(await svc(["deploy", "--source", source, "--app", app], env), 0, `deploy ${app}`);
  /** The body of `path` once it answers 200 (and contains `text`), within `ms`. */
  const servedWithin = async (app: string, path: string, text: string, ms = 10_000) => {
    const deadline = Date.now() + ms;
    let last = { status: 0, body: "" };
    while (Date.now() < deadline) {
      last = await siteRequest(stack, app, path).catch(() => ({ status: 0, body: "", headers: {} }));
      if (last.status === 200 && last.body.includes(text)) return last;
      await sleep(100);
    }
    return last;
  };

  describe("an app with no dependency that uses everything the platform passes through", () => {
    it(
      "deploys with svc deploy: the build log streams, the release starts, passes its health check and serves at its URL",
      async () => {
        await create(features, "node", "--memory", "256");
        expectExit(await svc(["env", "set", "GREETING=world", "--app", features], env), 0, "env set");
        const r = await deploy(features, await copy("node-features"));
        expect(r.stdout).toMatch(/ svc release: /);
        expect(r.stdout.trimEnd().split("\n").at(-1)).toBe(`Deployed: http://${features}.localhost:${new URL(stack.apiUrl).port}`);
        const [latest] = await deployments(features);
        expect(latest).toMatchObject({ status: "ready", release: { type: "web", startCommand: "npm start", port: 8080 } });
        const home = await siteRequest(stack, features, "/");
        expect(home).toMatchObject({ status: 200, body: "hello world from v1\n" });
        expect((await appInfo(features)).process).toMatchObject({ state: "running", ready: true, restarts: 0 });
      },
      DEPLOY_MS,
    );

    it("passes methods, bodies, Host and X-Forwarded-* through, and logs the requests", async () => {
      const seen = JSON.parse((await siteRequest(stack, features, "/headers?x=1", { headers: { "X-Forwarded-For": "6.6.6.6" } })).body) as {
        url: string;
        headers: Record<string, string>;
      };
      const port = new URL(stack.apiUrl).port;
      expect(seen.url).toBe("/headers?x=1");
      expect(seen.headers.host).toBe(`${features}.localhost:${port}`);
      expect(seen.headers["x-forwarded-host"]).toBe(`${features}.localhost:${port}`);
      expect(seen.headers["x-forwarded-proto"]).toBe("http");
      // The client's own X-Forwarded-For is not believed; only the edge says who connected (locally it
      // knows no address it can trust, so there is none: see CLIENT_IP_HEADER).
      expect(seen.headers["x-forwarded-for"]).toBeUndefined();
      expect(Object.keys(seen.headers).filter((h) => h.startsWith("x-svc-"))).toEqual([]);

      const body = randomBytes(3 * 1024 * 1024);
      for (const method of ["POST", "PUT", "PATCH", "DELETE"]) {
        const echoed = await bodyRequest(stack, features, method, "/echo", body);
        expect(echoed, method).toBe(`${method} ${body.length} ${sha256(body)}\n`);
      }
      const lines = async () => expectExit(await svc(["logs", features], env), 0, "logs").stdout;
      let log = "";
      for (let i = 0; i < 20 && !/ PATCH \/echo 200 /.test(log); i++) {
        await sleep(250);
        log = await lines();
      }
      expect(log).toMatch(/ GET \/headers 200 \d+ \d+ms/);
      expect(log).toMatch(/ PATCH \/echo 200 \d+ \d+ms/);
    });

    it("streams a chunked response and server-sent events as the app writes them, to a client that accepts gzip", async () => {
      for (const path of ["/stream", "/events"]) {
        const arrivals = await chunkTimes(stack, features, path, { "Accept-Encoding": "gzip, br" });
        expect(arrivals.text).toContain(path === "/stream" ? "chunk 5" : "data: event 5");
        // Written 400 ms apart: a proxy or compressor that held them back delivers them together.
        expect(arrivals.last - arrivals.first, path).toBeGreaterThan(1000);
      }
    });

    it("passes WebSockets through: an echo over the upgraded connection", async () => {
      expect(await webSocketEcho(stack, features, ["one", "two"])).toEqual(["echo: one", "echo: two"]);
    });

    it("svc logs --runtime shows the app's own output and what the platform did", async () => {
      const runtime = expectExit(await svc(["logs", features, "--runtime"], env), 0, "logs --runtime").stdout;
      // Each line names the release and the process that wrote it.
      expect(runtime).toMatch(/ out dep_\w+\/prc_\w+ listening on 8080 \(v1\)$/m);
      expect(runtime).toMatch(/ svc .*ready/m);
    });

    it("kill -9 of the app: the node restarts it and it serves again within 5 s", async () => {
      expect((await siteRequest(stack, features, "/kill9")).body).toBe("dying\n");
      const killed = Date.now();
      await sleep(100);
      const back = await servedWithin(features, "/", "hello world", 10_000);
      const ms = Date.now() - killed;
      console.log(`kill -9 to serving again: ${ms} ms`);
      expect(back.status).toBe(200);
      expect(ms).toBeLessThan(5_000);
      const info = await appInfo(features);
      expect(info.process).toMatchObject({ state: "running", restarts: 1, lastExit: { reason: "exit_code" } });
      expect(info.process?.lastExit?.message).toMatch(/SIGKILL|signal 9|killed/i);
    });

    it("running out of memory is OOMKilled with the limit, shown on the app, and the app comes back", async () => {
      await siteRequest(stack, features, "/oom");
      let info = await appInfo(features);
      for (let i = 0; i < 100 && info.process?.lastExit?.reason !== "OOMKilled"; i++) {
        await sleep(200);
        info = await appInfo(features);
      }
      expect(info.process?.lastExit).toMatchObject({ reason: "OOMKilled" });
      expect(info.process?.lastExit?.message).toMatch(/256 MiB/);
      expect((await servedWithin(features, "/", "hello world", 20_000)).status).toBe(200);
    });

    it("stop answers 503 and stops the process; restart serves again", async () => {
      expectExit(await svc(["apps", "stop", features], env), 0, "stop");
      let stopped = await siteRequest(stack, features, "/");
      for (let i = 0; i < 30 && stopped.status !== 503; i++) {
        await sleep(100);
        stopped = await siteRequest(stack, features, "/");
      }
      expect(stopped.status).toBe(503);
      expect((await appInfo(features)).process).toBeNull();
      expectExit(await svc(["apps", "restart", features], env), 0, "restart");
      expect((await servedWithin(features, "/", "hello world", 20_000)).status).toBe(200);
    });

    it(
      "a redeploy under 16 clients of constant load fails no request, and the new release takes over",
      async () => {
        const source = await copy("node-features");
        await writeFile(join(source, "svc.json"), JSON.stringify({ runtime: "node", healthCheckPath: "/healthz" }));
        expectExit(await svc(["env", "set", "RELEASE_MARK=v2", "--app", features], env), 0, "env set");
        const load = constantLoad(stack, features, 16);
        await sleep(500);
        await deploy(features, source);
        // Both releases answered while the switch happened; then only the new one.
        await servedWithin(features, "/", "from v2", 10_000);
        await sleep(1000);
        const counts = await load.stop();
        console.log(`redeploy under load: ${counts.ok} requests ok, ${counts.failed} failed, ${counts.v2} served by the new release`);
        expect(counts.failed).toBe(0);
        expect(counts.ok).toBeGreaterThan(100);
        expect(counts.v2).toBeGreaterThan(0);
      },
      DEPLOY_MS,
    );

    it(
      "a release that never gets healthy fails its deploy with the reason and its last lines; the old one keeps serving",
      async () => {
        const source = await copy("node-features");
        await writeFile(join(source, "server.js"), 'console.log("about to fail: missing DATABASE_URL"); process.exit(3);\n');
        const r = await svc(["deploy", "--source", source, "--app", features], env);
        expect(r.code).toBe(1);
        const [latest] = await deployments(features);
        expect(latest?.status).toBe("failed");
        // The cause in one line; the lines that go with it apart.
        expect(latest?.error).toBe("process exited with code 3 during start");
        expect(latest?.logExcerpt?.some((line) => line.endsWith(" out about to fail: missing DATABASE_URL"))).toBe(true);
        expect(r.stderr).toMatch(/^last log lines of the new release:\n( {2}.*\n)* {2}\S+ out about to fail: missing DATABASE_URL$/m);
        expect(r.stderr).toContain("the previous release (dep_");
        expect((await siteRequest(stack, features, "/")).body).toBe("hello world from v2\n");
      },
      DEPLOY_MS,
    );

    it("cron runs work in the active release", async () => {
      const created = JSON.parse(
        expectExit(
          await svc(["cron", "create", "--app", features, "--name", "report", "--schedule", "0 0 1 1 *", "--command", "npm run report", "--json"], env),
          0,
          "cron create",
        ).stdout,
      ) as { id: string };
      const ran = await svc(["cron", "run", created.id, "--wait"], env);
      expect(ran.code, ran.stderr).toBe(0);
      expect(ran.stdout).toContain("report from the release: node-features-fixture");
    });
  });

  describe("an app with a disk", () => {
    const withDisk = `disk-${suffix}`;

    it(
      "writes to its disk; a backup, a stop, a restore and the automatic start serve the restored data",
      async () => {
        await create(withDisk, "node", "--memory", "256");
        expectExit(await svc(["disk", "create", "--name", `data-${suffix}`, "--size", "1", "--mount-path", "/data"], env), 0, "disk create");
        expectExit(await svc(["disk", "attach", `data-${suffix}`, "--app", withDisk], env), 0, "disk attach");
        await deploy(withDisk, await copy("node-features"));
        expect((await bodyRequest(stack, withDisk, "PUT", "/disk?value=before-backup", Buffer.alloc(0))).trim()).toBe("wrote before-backup");
        const backup = JSON.parse(expectExit(await svc(["backups", "create", `data-${suffix}`, "--wait", "--json"], env), 0, "backups create").stdout) as {
          id: string;
        };
        await bodyRequest(stack, withDisk, "PUT", "/disk?value=after-backup", Buffer.alloc(0));
        expect((await siteRequest(stack, withDisk, "/disk")).body).toBe("read after-backup\n");

        // Restoring is refused while the app uses the disk; stopped, it goes through and the app starts again.
        const refused = await svc(["backups", "restore", `data-${suffix}`, "--backup", backup.id, "--yes"], env);
        expect(refused.code).toBe(1);
        expect(refused.stderr).toContain("DISK_IN_USE");
        expectExit(await svc(["apps", "stop", withDisk], env), 0, "stop");
        expectExit(await svc(["backups", "restore", `data-${suffix}`, "--backup", backup.id, "--yes"], env), 0, "restore");
        expect((await servedWithin(withDisk, "/disk", "read before-backup", 60_000)).body).toBe("read before-backup\n");
        expect((await appInfo(withDisk)).status).toBe("running");
      },
      DEPLOY_MS,
    );
  });

  describe("apps from the registry and other runtimes", () => {
    it(
      "an Express app installed from the registry with its lockfile",
      async () => {
        const app = `express-${suffix}`;
        await create(app, "node");
        await deploy(app, await copy("node-express"));
        expect((await servedWithin(app, "/", "hello from express 4.22.1")).body).toBe("hello from express 4.22.1\n");
      },
      DEPLOY_MS,
    );

    it(
      "a Python standard-library app",
      async () => {
        const app = `py-${suffix}`;
        await create(app, "python");
        await deploy(app, await copy("python-stdlib"));
        expect((await servedWithin(app, "/", "hello from the python standard library")).status).toBe(200);
      },
      DEPLOY_MS,
    );
    // Workers (no port, stop-first redeploys, minReadySeconds) are test/e2e/app-life.e2e.test.ts's; the Procfile's
    // worker: line is test/builder/release.happy.test.ts's.
  });
});

function sha256(bytes: Buffer): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** A request with a body to `<app>.localhost`, answered as text. */
function bodyRequest(stack: LocalStack, app: string, method: string, path: string, body: Buffer): Promise<string> {
  const port = new URL(stack.apiUrl).port;
  return new Promise((resolve, reject) => {
    const req = request(
      { host: "127.0.0.1", port, path, method, agent: false, headers: { Host: `${app}.localhost:${port}`, "Content-Length": body.length } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

/** When the first and the last piece of a response arrived, and its (decoded) text. */
function chunkTimes(stack: LocalStack, app: string, path: string, headers: Record<string, string>): Promise<{ first: number; last: number; text: string }> {
  const port = new URL(stack.apiUrl).port;
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path, agent: false, headers: { ...headers, Host: `${app}.localhost:${port}` } }, (res) => {
      let first = 0;
      let last = 0;
      let text = "";
      res.on("data", (c: Buffer) => {
        last = Date.now();
        if (first === 0) first = last;
        text += c.toString("utf8");
      });
      res.on("end", () => resolve({ first, last, text: res.headers["content-encoding"] === "gzip" ? "(gzipped)" : text }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

/** Opens a WebSocket to `<app>.localhost` by hand (Node 20 has no client), sends each message, returns the replies. */
function webSocketEcho(stack: LocalStack, app: string, messages: string[]): Promise<string[]> {
  const port = Number(new URL(stack.apiUrl).port);
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    const replies: string[] = [];
    let upgraded = false;
    let buffered = Buffer.alloc(0);
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no WebSocket echo (got ${JSON.stringify(replies)}, upgraded ${upgraded})`));
    }, 10_000);
    socket.on("connect", () => {
      socket.write(
        `GET /ws HTTP/1.1\r\nHost: ${app}.localhost:${port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
          `Sec-WebSocket-Key: ${randomBytes(16).toString("base64")}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
    });
    socket.on("data", (data: Buffer) => {
      buffered = Buffer.concat([buffered, data]);
      if (!upgraded) {
        const end = buffered.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buffered.subarray(0, end).toString("utf8");
        if (!head.startsWith("HTTP/1.1 101")) {
          clearTimeout(timer);
          socket.destroy();
          reject(new Error(`upgrade refused: ${head.split("\r\n")[0]}`));
          return;
        }
        upgraded = true;
        buffered = buffered.subarray(end + 4);
        for (const message of messages) {
          const mask = randomBytes(4);
          const payload = Buffer.from(message);
          socket.write(Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, Buffer.from(payload.map((b, i) => b ^ mask[i % 4]!))]));
        }
      }
      while (buffered.length >= 2 && buffered.length >= 2 + (buffered[1]! & 0x7f)) {
        const length = buffered[1]! & 0x7f;
        replies.push(buffered.subarray(2, 2 + length).toString("utf8"));
        buffered = buffered.subarray(2 + length);
      }
      if (replies.length === messages.length) {
        clearTimeout(timer);
        socket.destroy();
        resolve(replies);
      }
    });
    socket.on("error", reject);
  });
}

/** `clients` keep requesting `/` until stopped; every answer but a 200 counts as failed. */
function constantLoad(stack: LocalStack, app: string, clients: number) {
  let running = true;
  const counts = { ok: 0, failed: 0, v2: 0 };
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      const r = await siteRequest(stack, app, "/").catch(() => ({ status: 0, body: "" }));
      if (r.status === 200) {
        counts.ok++;
        if (r.body.includes("from v2")) counts.v2++;
      } else {
        counts.failed++;
      }
    }
  });
  return {
    async stop() {
      running = false;
      await Promise.all(loops);
      return counts;
    },
  };
}
