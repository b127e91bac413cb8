import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import type { ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DiskLeases } from "../../builder/src/disks/leases.js";
import { isId, newId } from "../../builder/src/ids.js";
import { APP_LOG_FILE_BYTES, AppLog, type LogWindow, ProcessOutput } from "../../builder/src/processes/app-log.js";
import { cookieDomainProblem, forwardedRequestHeaders, forwardedResponseHeaders, parseProxyPath } from "../../builder/src/processes/proxy.js";
import { RESTART_POLICY, TRANSITIONS, afterExit } from "../../builder/src/processes/supervisor.js";
import { workTreeBytes } from "../../builder/src/processes/worktree.js";
import { LOG_LIMIT_BYTES } from "../../builder/src/protocol/jobs.js";
import { type ProcessSpec, ProcessState, parseAppLogLine, processSpecProblems } from "../../builder/src/protocol/processes.js";

describe("restart policy", () => {
  it("backs off 0.5, 1, 2, 4 s, then calls the fifth exit a crash loop retried every 60 s", () => {
    let exits = 0;
    const plan: string[] = [];
    for (let i = 0; i < 6; i++) {
      const next = afterExit(exits, 1_000);
      exits = next.exits;
      plan.push(`${next.state} ${next.delayMs}`);
    }
    expect(plan).toEqual(["backoff 500", "backoff 1000", "backoff 2000", "backoff 4000", "crash_loop 60000", "crash_loop 60000"]);
  });

  it("starts counting again after an instance ran 10 minutes", () => {
    expect(afterExit(7, RESTART_POLICY.resetAfterMs)).toEqual({ exits: 1, state: "backoff", delayMs: 500 });
    expect(afterExit(3, RESTART_POLICY.resetAfterMs - 1).exits).toBe(4);
  });

  it("names every state in the transition table, and only stopping leads to stopped", () => {
    expect(Object.keys(TRANSITIONS).sort()).toEqual([...ProcessState.options].sort());
    for (const [from, targets] of Object.entries(TRANSITIONS)) {
      if (targets.includes("stopped")) expect(from).toBe("stopping");
      if (from !== "stopped" && from !== "failed" && from !== "stopping") expect(targets).toContain("stopping");
    }
    expect(TRANSITIONS.stopped).toEqual([]);
    expect(TRANSITIONS.failed).toEqual([]);
  });
});

describe("process specs", () => {
  const base = {
    key: "a/b/1",
    tenant: "t",
    appId: "a",
    release: { url: "https://r.example/x", sha256: "0".repeat(64), sizeBytes: 1 },
    command: "node server.js",
    env: {},
    memoryMb: 256,
  };
  it("needs a port for a web process and neither port nor health check for a worker", () => {
    expect(processSpecProblems({ ...base, type: "web", port: 8080, healthCheck: null } as ProcessSpec)).toEqual([]);
    expect(processSpecProblems({ ...base, type: "web", port: null, healthCheck: null } as ProcessSpec).map((p) => p.path)).toEqual(["port"]);
    expect(processSpecProblems({ ...base, type: "worker", port: null, healthCheck: null } as ProcessSpec)).toEqual([]);
    expect(
      processSpecProblems({ ...base, type: "worker", port: 1, healthCheck: { path: null, timeoutSeconds: 5 } } as ProcessSpec).map((p) => p.path),
    ).toEqual(["port", "healthCheck"]);
  });

  it("gives a working tree twice the release, at least 1 GiB", () => {
    expect(workTreeBytes(10)).toBe(1024 ** 3);
    expect(workTreeBytes(3 * 1024 ** 3)).toBe(6 * 1024 ** 3);
  });

  it("names processes prc_ + 24 base62 characters", () => {
    const id = newId("prc");
    expect(id).toMatch(/^prc_[0-9A-Za-z]{24}$/);
    expect(isId("prc", id)).toBe(true);
    expect(isId("prc", "prc_../../etc/passwd000000")).toBe(false);
    expect(isId("job", id)).toBe(false);
  });
});

describe("proxy paths and headers", () => {
  it("splits the process id from the app's path, keeping the query as sent", () => {
    expect(parseProxyPath("/v1/proxy/prc_abc/a/b%20c?x=1&y")).toEqual({ id: "prc_abc", path: "/a/b%20c?x=1&y" });
    expect(parseProxyPath("/v1/proxy/prc_abc")).toEqual({ id: "prc_abc", path: "/" });
    expect(parseProxyPath("/v1/proxy/prc_abc?x=1")).toEqual({ id: "prc_abc", path: "/?x=1" });
    expect(parseProxyPath("/v1/proxy//x")).toBeNull();
    expect(parseProxyPath("/v1/proxy/../jobs")).toBeNull();
    expect(parseProxyPath("/v1/jobs")).toBeNull();
  });

  it("drops X-Svc-* and hop-by-hop headers (and those Connection names), sets Host from X-Forwarded-Host", () => {
    const raw = [
      "Host", "node.internal:8788",
      "X-Svc-Proxy-Signature", "abc",
      "x-svc-proxy-timestamp", "1",
      "X-Forwarded-Host", "app.example",
      "X-Forwarded-For", "203.0.113.7",
      "Connection", "keep-alive, X-Hop",
      "X-Hop", "gone",
      "Keep-Alive", "timeout=5",
      "TE", "trailers",
      "Proxy-Authorization", "secret",
      "Set-Cookie-Like", "a",
      "Set-Cookie-Like", "b",
      "Content-Length", "3",
    ];
    expect(forwardedRequestHeaders(raw, false)).toEqual([
      "Host", "app.example",
      "X-Forwarded-Host", "app.example",
      "X-Forwarded-For", "203.0.113.7",
      "Set-Cookie-Like", "a",
      "Set-Cookie-Like", "b",
      "Content-Length", "3",
    ]);
  });

  it("keeps a chunked body chunked, and an upgrade's Connection and Upgrade", () => {
    expect(forwardedRequestHeaders(["Host", "h", "Transfer-Encoding", "chunked"], false)).toEqual(["Host", "h", "Transfer-Encoding", "chunked"]);
    expect(forwardedRequestHeaders(["Host", "h", "Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Key", "k"], true)).toEqual([
      "Host", "h", "Sec-WebSocket-Key", "k", "Connection", "Upgrade", "Upgrade", "websocket",
    ]);
  });

  it("passes the app's response headers but hop-by-hop and X-Svc-* ones", () => {
    expect(
      forwardedResponseHeaders(["Content-Type", "text/plain", "Transfer-Encoding", "chunked", "Connection", "close", "X-Svc-Anything", "1", "Set-Cookie", "a=1", "Set-Cookie", "b=2"]),
    ).toEqual(["Content-Type", "text/plain", "Set-Cookie", "a=1", "Set-Cookie", "b=2"]);
  });

  it("drops an app's cookie whose Domain reaches other apps' visitors, whatever its spelling, and says why", () => {
    const apps = "apps.example.com";
    const host = "shop.apps.example.com";
    for (const cookie of [
      "sid=1; Domain=apps.example.com",
      "sid=1; domain=.APPS.example.com; Path=/",
      "sid=1; Path=/; DOMAIN = apps.example.com ; HttpOnly",
      "sid=1; Domain=example.com",
      "sid=1; Domain=.com",
      "sid=1; Domain=other.apps.example.com",
      "sid=1; Domain=shop.apps.example.com; Domain=apps.example.com",
    ]) {
      expect(cookieDomainProblem(cookie, apps, host), cookie).toMatch(/^dropped the app's cookie "sid": its Domain=/);
    }
    for (const cookie of ["sid=1", "sid=1; Path=/; HttpOnly", "sid=1; Domain=shop.apps.example.com", "sid=1; Domain=.Shop.Apps.Example.Com", "sid=1; Domain="]) {
      expect(cookieDomainProblem(cookie, apps, host), cookie).toBeNull();
    }
    // A custom domain's own parent is its owner's to use; the apps domain never is.
    expect(cookieDomainProblem("a=1; Domain=example.org", apps, "www.example.org")).toBeNull();
    expect(cookieDomainProblem("a=1; Domain=apps.example.com", apps, "www.example.org")).toMatch(/every app on this platform/);
    // The local stack's host carries a port; cookies never do.
    expect(cookieDomainProblem("a=1; Domain=localhost", "localhost", "shop.localhost:8787")).toMatch(/top-level name/);
    expect(cookieDomainProblem("a=1; Domain=shop.localhost", "localhost", "shop.localhost:8787")).toBeNull();

    const refused: string[] = [];
    const headers = forwardedResponseHeaders(["Set-Cookie", "a=1; Domain=apps.example.com", "Set-Cookie", "b=2", "Content-Type", "text/plain"], {
      appsDomain: apps,
      host,
      refused: (why) => refused.push(why),
    });
    expect(headers).toEqual(["Set-Cookie", "b=2", "Content-Type", "text/plain"]);
    expect(refused).toEqual([expect.stringContaining('"a": its Domain=apps.example.com would reach the visitors of every app on this platform; set it without Domain')]);
  });
});

describe("disk leases", () => {
  it("shares a disk between runs and a process, and keeps a restore out while either holds it", () => {
    const leases = new DiskLeases();
    const app = leases.acquire("d", { kind: "process", id: "prc_1" }, false);
    expect(app.ok).toBe(true);
    expect(leases.acquire("d", { kind: "job", id: "job_run" }, false).ok).toBe(true);
    const restore = leases.acquire("d", { kind: "job", id: "job_restore" }, true);
    expect(restore).toEqual({ ok: false, message: "disk d is used by a queued or running job" });
    expect(leases.busy("other")).toBeNull();
  });

  it("names the process when only a process holds the disk, and frees it on release (idempotent)", () => {
    const leases = new DiskLeases();
    const app = leases.acquire("d", { kind: "process", id: "prc_1" }, false);
    expect(leases.busy("d")).toBe("disk d is used by app process prc_1; stop the app's process first");
    if (app.ok) {
      app.release();
      app.release();
    }
    expect(leases.busy("d")).toBeNull();
    const restore = leases.acquire("d", { kind: "job", id: "job_restore" }, true);
    expect(restore.ok).toBe(true);
    expect(leases.acquire("d", { kind: "process", id: "prc_2" }, false)).toEqual({
      ok: false,
      message: "disk d is being restored; retry once the restore has ended",
    });
  });
});

describe("the runtime log", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "svc-app-log-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** Reads the log as the route does, into a string. */
  async function read(log: AppLog, window: LogWindow = {}): Promise<string> {
    const sink = new PassThrough();
    const chunks: Buffer[] = [];
    sink.on("data", (chunk: Buffer) => chunks.push(chunk));
    await log.stream(window, false, sink as unknown as ServerResponse);
    return Buffer.concat(chunks).toString("utf8");
  }

  it("writes records in the app log format, naming the release and process of each line, and keeps the process's last lines", async () => {
    const log = await AppLog.open(join(dir, "app"));
    const output = new ProcessOutput(log, "prc_x", "dep_y");
    const out = new PassThrough();
    output.capture("out", out);
    output.note("starting: release abc");
    out.write("one\ntw");
    out.end("o\n\u001b[31mred\u001b[0m");
    await new Promise((resolve) => setImmediate(resolve));
    await log.settled();
    const text = await read(log);
    const records = text.trimEnd().split("\n").map((line) => parseAppLogLine(line));
    expect(records.map((r) => r && `${r.stream} ${r.release} ${r.process} ${r.text}`)).toEqual([
      "svc dep_y prc_x starting: release abc",
      "out dep_y prc_x one",
      "out dep_y prc_x two",
      "out dep_y prc_x red",
    ]);
    // Its own last lines need not name it.
    expect(output.lastLines().map((line) => line.slice(25))).toEqual(["svc starting: release abc", "out one", "out two", "out red"]);
  });

  it("reads the last lines, the lines since a time, and one process's lines", async () => {
    const log = await AppLog.open(join(dir, "app"));
    const first = new ProcessOutput(log, "prc_first", "dep_a");
    const second = new ProcessOutput(log, "prc_second", "dep_b");
    for (let i = 0; i < 300; i++) (i % 3 === 0 ? second : first).note(`line ${i} ${"x".repeat(i % 7 === 0 ? 400 : 10)}`);
    await log.settled();
    // A clean millisecond on either side: on a fast machine the last of the 300 lines shared the millisecond `middle` was read in.
    await new Promise((resolve) => setTimeout(resolve, 5));
    const middle = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 5));
    for (let i = 300; i < 310; i++) first.note(`line ${i}`);
    await log.settled();
    const lines = (text: string) => text.trimEnd().split("\n").filter(Boolean);
    expect(lines(await read(log, { tailLines: 3 })).map((l) => l.split(" ").at(-1))).toEqual(["307", "308", "309"]);
    expect(lines(await read(log, { tailLines: 0 }))).toEqual([]);
    expect(lines(await read(log, { tailLines: 10_000 }))).toHaveLength(310);
    const since = lines(await read(log, { since: middle }));
    expect(since).toHaveLength(10);
    expect(since[0]).toContain("line 300");
    expect(lines(await read(log, { since: 0 }))).toHaveLength(310);
    expect(lines(await read(log, { since: Date.now() + 60_000 }))).toEqual([]);
    const ofSecond = lines(await read(log, { process: "prc_second" }));
    expect(ofSecond).toHaveLength(100);
    for (const line of ofSecond) expect(parseAppLogLine(line)).toMatchObject({ release: "dep_b", process: "prc_second" });
    expect(lines(await read(log, { process: "prc_first", since: middle }))).toHaveLength(10);
  });

  it("stays within LOG_LIMIT_BYTES in two files, keeping the newest lines, and a tail starts at a whole line", async () => {
    const log = await AppLog.open(join(dir, "app"));
    const output = new ProcessOutput(log, "prc_x", "dep_y");
    const line = "x".repeat(1000);
    const total = Math.ceil((LOG_LIMIT_BYTES * 1.6) / 1030);
    for (let i = 0; i < total; i++) output.note(`${i} ${line}`);
    await log.settled();
    const files = await readdir(join(dir, "app"));
    expect(files.sort()).toEqual(["log", "log.1"]);
    const sizes = await Promise.all(files.map(async (name) => (await readFile(join(dir, "app", name))).length));
    for (const size of sizes) expect(size).toBeLessThanOrEqual(APP_LOG_FILE_BYTES);
    const kept = await read(log);
    expect(kept.length).toBeLessThanOrEqual(LOG_LIMIT_BYTES);
    expect(kept.length).toBeGreaterThanOrEqual(LOG_LIMIT_BYTES / 2);
    expect(kept.trimEnd().split("\n").at(-1)).toContain(`svc dep_y/prc_x ${total - 1} x`);
    const tail = await read(log, { tailBytes: 2500 });
    expect(tail.length).toBeLessThanOrEqual(2500);
    expect(tail.split("\n")[0]).toMatch(/^\d{4}-\d{2}-\d{2}T/);
    expect(kept.endsWith(tail)).toBe(true);

    // A reopened log (a builder restart) continues where the files end.
    const reopened = await AppLog.open(join(dir, "app"));
    expect(await read(reopened)).toBe(kept);
  });
});
