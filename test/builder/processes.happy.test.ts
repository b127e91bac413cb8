import { createHash, randomBytes } from "node:crypto";
import { connect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ProcessStatus, parseAppLogLine } from "../../builder/src/protocol/processes.js";
import { type BuilderProcess, signedFetch, startBuilder } from "./builder-process.js";
import {
  APP_SERVER,
  type ControlPlane,
  type Release,
  makeRelease,
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
  builder = await startBuilder();
  plane = await startControlPlane(builder.secret);
  release = await makeRelease({ "server.js": APP_SERVER });
});
afterAll(async () => {
  await builder?.stop();
  await plane?.close();
});

/** Starts the test app and waits until it takes traffic. */
const readyApp = (overrides: Parameters<typeof webSpec>[1] = {}): Promise<ProcessStatus> => readyProcess(builder, plane, release, overrides);

describe("an app process: start, health check, proxied traffic", () => {
  it("starts the release, becomes ready after its health check, and serves GET and POST through the proxy with Host and X-Forwarded-* set", async () => {
    const spec = webSpec(plane.serve(release), { env: { SECRET: "s3cret" }, callbackUrl: plane.callbackUrl, labels: { app: "a1" } });
    const started = await startProcess(builder, spec);
    expect(started).toMatchObject({ state: "starting", ready: false, key: spec.key, appId: "app_test", restarts: 0, labels: { app: "a1" } });
    expect(started.memoryLimitBytes).toBe(256 * 1024 * 1024);
    const ready = await waitFor(builder, started.id, (status) => status.ready);
    expect(ready.state).toBe("running");
    expect(ready.readyAt).not.toBeNull();

    const hello = await proxyFetch(builder, started.id, "/hello");
    expect(hello.status).toBe(200);
    expect(await hello.text()).toBe("hello from the app");

    const body = randomBytes(3 * 1024 * 1024);
    const posted = await proxyFetch(builder, started.id, "/echo/path?q=1&r=%20x", { method: "POST", body, headers: { "Content-Type": "application/octet-stream", "X-Custom": "kept" } });
    expect(posted.status).toBe(200);
    expect(posted.headers.get("x-app")).toBe("echo");
    expect(posted.headers.get("x-svc-leak")).toBeNull();
    const echo = (await posted.json()) as { method: string; url: string; headers: Record<string, string>; bodyLength: number; bodySha256: string };
    expect(echo).toMatchObject({ method: "POST", url: "/echo/path?q=1&r=%20x", bodyLength: body.length });
    expect(echo.bodySha256).toBe(createHash("sha256").update(body).digest("hex"));
    expect(echo.headers.host).toBe("myapp.apps.example");
    expect(echo.headers["x-forwarded-host"]).toBe("myapp.apps.example");
    expect(echo.headers["x-forwarded-for"]).toBe("203.0.113.7");
    expect(echo.headers["x-forwarded-proto"]).toBe("https");
    expect(echo.headers["x-custom"]).toBe("kept");
    expect(Object.keys(echo.headers).filter((name) => name.startsWith("x-svc-"))).toEqual([]);

    const info = (await (await proxyFetch(builder, started.id, "/info")).json()) as { uid: number; cwd: string; env: Record<string, string> };
    expect(info.env).toMatchObject({
      PORT: "8080",
      SECRET: "s3cret",
      SVC_APP_ID: "app_test",
      PATH: "/work/.venv/bin:/work/node_modules/.bin:/usr/local/bin:/usr/bin:/bin",
    });
    expect(info.cwd).toBe("/work");
    if (process.getuid?.() === 0) expect(info.uid).toBeGreaterThanOrEqual(2_000_000);

    // Callbacks: signed, in order, ending with the ready status.
    await expect.poll(() => plane.callbacks.filter((c) => c.id === started.id).at(-1)?.ready, { timeout: 5_000 }).toBe(true);
    expect(plane.badCallbacks).toBe(0);
    expect(plane.callbacks.filter((c) => c.id === started.id).map((c) => c.state)).toContain("starting");
    await stopProcess(builder, started.id);
    await waitFor(builder, started.id, (status) => status.state === "stopped");
  });

  it("answers the same process for the same key (200) and finds it by key", async () => {
    const spec = webSpec(plane.serve(release));
    const first = await startProcess(builder, spec);
    const again = await signedFetch(builder, "/v1/processes", { method: "POST", body: spec });
    expect(again.status).toBe(200);
    expect(ProcessStatus.parse(await again.json()).id).toBe(first.id);
    const byKey = await signedFetch(builder, `/v1/processes?key=${encodeURIComponent(spec.key)}`);
    expect(ProcessStatus.parse(await byKey.json()).id).toBe(first.id);
    await stopProcess(builder, first.id);
    await waitFor(builder, first.id, (status) => status.state === "stopped");
  });

  it("passes a chunked request body, a HEAD request and a large response", async () => {
    const app = await readyApp();
    const parts = [randomBytes(100_000), randomBytes(50_000), randomBytes(1)];
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const part of parts) controller.enqueue(part);
        controller.close();
      },
    });
    const posted = await proxyFetch(builder, app.id, "/echo", { method: "PUT", body: stream, duplex: "half" } as RequestInit);
    const echo = (await posted.json()) as { headers: Record<string, string>; bodyLength: number; bodySha256: string };
    expect(echo.headers["transfer-encoding"]).toBe("chunked");
    expect(echo.bodyLength).toBe(150_001);
    expect(echo.bodySha256).toBe(createHash("sha256").update(Buffer.concat(parts)).digest("hex"));

    const head = await proxyFetch(builder, app.id, "/big?bytes=100", { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.headers.get("content-length")).toBe("100");
    expect(await head.text()).toBe("");

    const big = await proxyFetch(builder, app.id, "/big?bytes=5000000");
    expect(big.headers.get("content-length")).toBe("5000000");
    const bytes = Buffer.from(await big.arrayBuffer());
    expect(bytes.length).toBe(5_000_000);
    expect(bytes.every((byte) => byte === 7)).toBe(true);
    await stopProcess(builder, app.id);
  });

  it("streams a response without a length event by event (server-sent events)", async () => {
    const app = await readyApp();
    const response = await proxyFetch(builder, app.id, "/sse");
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/event-stream");
    const reader = response.body!.getReader();
    const arrivals: { at: number; text: string }[] = [];
    const decoder = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      arrivals.push({ at: Date.now(), text: decoder.decode(value) });
    }
    expect(arrivals.map((a) => a.text).join("")).toBe("data: event 0\n\ndata: event 1\n\ndata: event 2\n\n");
    // The app writes one event every 300 ms: each arrives on its own, not all at the end.
    const events = arrivals.filter((a) => a.text.includes("data:"));
    expect(events.length).toBe(3);
    expect(events[2]!.at - events[0]!.at).toBeGreaterThanOrEqual(450);
    await stopProcess(builder, app.id);
  });

  it("passes a WebSocket through, both ways", async () => {
    const app = await readyApp();
    const key = randomBytes(16).toString("base64");
    const headers = await proxyHeaders(builder.secret, app.id);
    const { port, hostname } = new URL(builder.url);
    const socket = connect(Number(port), hostname);
    await new Promise((resolve) => socket.once("connect", resolve));
    let head = `GET /v1/proxy/${app.id}/ws HTTP/1.1\r\nHost: ${hostname}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n`;
    for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
    socket.write(`${head}\r\n`);
    let received = Buffer.alloc(0);
    socket.on("data", (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
    });
    const until = async (done: () => boolean) => {
      while (!done()) await new Promise((resolve) => socket.once("data", resolve));
    };
    await until(() => received.includes("\r\n\r\n"));
    const end = received.indexOf("\r\n\r\n") + 4;
    const answer = received.subarray(0, end).toString();
    expect(answer).toMatch(/^HTTP\/1\.1 101 /);
    // Header names are case-insensitive (HAProxy, in front of the node, writes them in lower case).
    expect(/^sec-websocket-accept: (.*)$/im.exec(answer)?.[1]?.trim()).toBe(createHash("sha1").update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64"));
    received = received.subarray(end);
    const mask = randomBytes(4);
    const payload = Buffer.from("hello through the proxy");
    socket.write(Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, Buffer.from(payload.map((byte, i) => byte ^ mask[i % 4]!))]));
    await until(() => received.length >= 2 && received.length >= 2 + received[1]!);
    expect(received[0]).toBe(0x81);
    expect(received.subarray(2, 2 + received[1]!).toString()).toBe("echo: hello through the proxy");
    socket.destroy();
    await stopProcess(builder, app.id);
  });

  it("runs a worker without port or health check: ready once started", async () => {
    const spec = webSpec(plane.serve(release), { type: "worker", port: null, healthCheck: null, command: "while true; do echo working; sleep 0.2; done" });
    const started = await startProcess(builder, spec);
    const ready = await waitFor(builder, started.id, (status) => status.ready);
    expect(ready.state).toBe("running");
    const traffic = await proxyFetch(builder, started.id, "/");
    expect(traffic.status).toBe(503);
    expect(((await traffic.json()) as { error: { message: string } }).error.message).toBe(`process ${started.id}: a worker process takes no HTTP traffic`);
    const stopped = await stopProcess(builder, started.id);
    expect(stopped.state).toBe("stopping");
    await waitFor(builder, started.id, (status) => status.state === "stopped");
  });

  it("refuses a web process without a port and a worker with one (400)", async () => {
    const web = await signedFetch(builder, "/v1/processes", { method: "POST", body: webSpec(plane.serve(release), { port: null }) });
    expect(web.status).toBe(400);
    const worker = await signedFetch(builder, "/v1/processes", { method: "POST", body: webSpec(plane.serve(release), { type: "worker", healthCheck: null }) });
    expect(worker.status).toBe(400);
    expect(((await worker.json()) as { error: { details: { path: string }[] } }).error.details.map((d) => d.path)).toEqual(["port"]);
  });
});

describe("stopping", () => {
  it("drains: a request in flight finishes, then the process is stopped and answers 404 PROCESS_NOT_FOUND", async () => {
    const app = await readyApp();
    const slow = proxyFetch(builder, app.id, "/slow?ms=1500");
    await new Promise((resolve) => setTimeout(resolve, 200));
    const stopping = await stopProcess(builder, app.id, 1);
    expect(stopping.state).toBe("stopping");
    // Still served while draining.
    const during = await proxyFetch(builder, app.id, "/hello");
    expect(during.status).toBe(200);
    const again = await stopProcess(builder, app.id, 1);
    expect(again.state).toBe("stopping");
    const finished = await slow;
    expect(finished.status).toBe(200);
    expect(await finished.text()).toBe("slow done");
    const stopped = await waitFor(builder, app.id, (status) => status.state === "stopped");
    expect(stopped.ready).toBe(false);
    expect(stopped.stoppedAt).not.toBeNull();
    const after = await proxyFetch(builder, app.id, "/hello");
    expect(after.status).toBe(404);
    expect(((await after.json()) as { error: { code: string } }).error.code).toBe("PROCESS_NOT_FOUND");
    expect((await stopProcess(builder, app.id)).state).toBe("stopped");
  });

  it("sends a stopping process's new requests to the successor its stop names, while that is ready; another app's process is never one", async () => {
    const secretVia = async (id: string) => ((await (await proxyFetch(builder, id, "/info")).json()) as { env: { SECRET: string } }).env.SECRET;
    const [old, next, decoy, other] = await Promise.all([
      readyApp({ env: { SECRET: "old" } }),
      readyApp({ env: { SECRET: "new" } }),
      readyApp({ env: { SECRET: "decoy" } }),
      readyApp({ appId: "app_other", key: `app_other/dep_${randomBytes(6).toString("hex")}/1`, env: { SECRET: "other" } }),
    ]);
    await stopProcess(builder, decoy.id, 1, other.id);
    expect(await secretVia(decoy.id)).toBe("decoy");
    await stopProcess(builder, old.id, 1, next.id);
    expect(await secretVia(old.id)).toBe("new");
    // Drained and stopped, it still hands over: an edge that named it a moment ago reaches the new release.
    await waitFor(builder, old.id, (status) => status.state === "stopped");
    expect(await secretVia(old.id)).toBe("new");
    // With the successor gone too, the old name is answered 404 PROCESS_NOT_FOUND: the edge looks the app up again.
    await stopProcess(builder, next.id);
    await waitFor(builder, next.id, (status) => status.state === "stopped");
    const gone = await proxyFetch(builder, old.id, "/hello");
    expect(gone.status).toBe(404);
    await gone.body?.cancel();
    await Promise.all([decoy, other].map((process) => stopProcess(builder, process.id)));
  });

  it("answers 404 PROCESS_NOT_FOUND for a process it does not know", async () => {
    const response = await proxyFetch(builder, "prc_000000000000000000000000", "/");
    expect(response.status).toBe(404);
    expect((await signedFetch(builder, "/v1/processes/prc_000000000000000000000000")).status).toBe(404);
  });
});

describe("runtime log", () => {
  it("keeps stdout, stderr and every transition across restarts, and follows it", async () => {
    const appId = `app_log_${randomBytes(4).toString("hex")}`;
    const follow = await signedFetch(builder, `/v1/app-logs/${appId}?follow=1`);
    expect(follow.status).toBe(200);
    const reader = follow.body!.getReader();
    let followed = "";
    const reading = (async () => {
      const decoder = new TextDecoder();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        followed += decoder.decode(value);
      }
    })();
    const spec = webSpec(plane.serve(release), {
      appId,
      type: "worker",
      port: null,
      healthCheck: null,
      command: "echo run on out; echo run on err >&2; sleep 0.3; exit 3",
    });
    const started = await startProcess(builder, spec);
    await waitFor(builder, started.id, (status) => status.restarts >= 2 && status.state === "backoff", 20_000);
    await stopProcess(builder, started.id);
    await waitFor(builder, started.id, (status) => status.state === "stopped");
    await expect.poll(() => followed.includes(`/${started.id} stopped: stopped`), { timeout: 5_000 }).toBe(true);
    await reader.cancel();
    await reading.catch(() => undefined);

    const lines = followed.trimEnd().split("\n");
    for (const line of lines) expect(parseAppLogLine(line), line).toMatchObject({ process: started.id });
    const texts = lines.map((line) => parseAppLogLine(line)!).map(({ stream, text }) => `${stream} ${text}`);
    expect(texts.filter((text) => text === "out run on out").length).toBe(3);
    expect(texts.filter((text) => text === "err run on err").length).toBe(3);
    expect(texts).toContain("svc backoff: exited with code 3; restarting in 0.5 s");
    expect(texts).toContain("svc backoff: exited with code 3; restarting in 1 s");
    expect(texts).toContain("svc starting: restarting (instance 3)");
    expect(texts.some((text) => text.startsWith("svc running: ready after"))).toBe(true);

    // A tail starts at a whole line; the whole log is what was followed.
    const whole = await (await signedFetch(builder, `/v1/app-logs/${appId}`)).text();
    expect(whole).toBe(followed);
    const tail = await (await signedFetch(builder, `/v1/app-logs/${appId}?tail=300`)).text();
    expect(tail.length).toBeLessThanOrEqual(300);
    expect(whole.endsWith(tail)).toBe(true);
    expect(parseAppLogLine(tail.split("\n")[0]!)).not.toBeNull();

    // The next process of the app (a deploy) writes to the same log.
    const next = await startProcess(builder, { ...spec, key: `${spec.key}-next`, command: "echo second release; sleep 30" });
    await waitFor(builder, next.id, (status) => status.ready);
    await expect
      .poll(async () => (await (await signedFetch(builder, `/v1/app-logs/${appId}`)).text()).includes(`out -/${next.id} second release`), { timeout: 5_000 })
      .toBe(true);
    const both = await (await signedFetch(builder, `/v1/app-logs/${appId}`)).text();
    expect(both.startsWith(whole)).toBe(true);
    // One process's lines, as svc deploy follows a new release's.
    const ofNext = (await (await signedFetch(builder, `/v1/app-logs/${appId}?process=${next.id}`)).text()).trimEnd().split("\n");
    expect(ofNext.length).toBeGreaterThan(0);
    for (const line of ofNext) expect(parseAppLogLine(line)?.process).toBe(next.id);
    await stopProcess(builder, next.id);
  });
});
