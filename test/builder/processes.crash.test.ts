import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BuilderProcess, startBuilder } from "./builder-process.js";
import {
  APP_SERVER,
  type ControlPlane,
  type Release,
  makeRelease,
  pidsWith,
  proxyFetch,
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

describe("restarts", () => {
  it("restarts an app killed with SIGKILL and serves again within 5 s", async () => {
    const marker = `marker-${randomBytes(6).toString("hex")}`;
    const started = await startProcess(builder, webSpec(plane.serve(release), { command: `node server.js ${marker}` }));
    await waitFor(builder, started.id, (status) => status.ready);
    const pids = pidsWith(marker);
    expect(pids, "the app's node process, found through /proc").toHaveLength(1);
    const pid = pids[0]!;
    const killedAt = Date.now();
    process.kill(pid, "SIGKILL");
    // What a visitor sees: the proxy holds requests while the app restarts.
    const served = await proxyFetch(builder, started.id, "/hello");
    const servedAfter = Date.now() - killedAt;
    expect(served.status).toBe(200);
    const ready = await waitFor(builder, started.id, (status) => status.ready && status.restarts === 1);
    const readyAfter = Date.now() - killedAt;
    console.log(`kill -9 → serving again after ${servedAfter} ms, status ready after ${readyAfter} ms`);
    expect(servedAfter).toBeLessThan(5_000);
    expect(ready.lastExit).toMatchObject({ reason: "exit_code", exitCode: 137 });
    expect(ready.lastExit?.message).toBe("exited with code 137 (killed by SIGKILL)");
    await stopProcess(builder, started.id);
  });

  it("backs off on repeated exits, then reports a crash loop with the exit and the last lines", async () => {
    const started = await startProcess(
      builder,
      webSpec(plane.serve(release), { type: "worker", port: null, healthCheck: null, command: "echo about to fail; echo bad config >&2; exit 1" }),
    );
    const seen = new Set<string>();
    const looped = await waitFor(
      builder,
      started.id,
      (status) => {
        seen.add(status.state);
        return status.state === "crash_loop";
      },
      25_000,
    );
    expect(seen.has("backoff")).toBe(true);
    expect(looped.restarts).toBe(4);
    expect(looped.ready).toBe(false);
    expect(looped.lastExit).toMatchObject({ reason: "exit_code", exitCode: 1, message: "exited with code 1" });
    // The process's own last lines: time, stream and text (the log's lines also name the release and process).
    expect(looped.lastLines.some((line) => / out about to fail$/.test(line))).toBe(true);
    expect(looped.lastLines.some((line) => / err bad config$/.test(line))).toBe(true);
    expect(looped.lastLines.at(-1)).toMatch(/ svc crash_loop: exited with code 1; 5 exits without 10 minutes of running; retrying every 60 s$/);
    // A crash-looping process is not ready: its traffic waits, then 503.
    const stopped = await stopProcess(builder, started.id);
    expect(stopped.state).toBe("stopping");
    await waitFor(builder, started.id, (status) => status.state === "stopped");
  });

  it("reports OOMKilled with the memory limit", async () => {
    const hog = "node -e \"const a=[];setInterval(()=>{for(let i=0;i<8;i++)a.push(Buffer.alloc(1<<20,1))},5)\"";
    const started = await startProcess(builder, webSpec(plane.serve(release), { type: "worker", port: null, healthCheck: null, command: hog, memoryMb: 96 }));
    const exited = await waitFor(builder, started.id, (status) => status.lastExit !== null, 20_000);
    expect(exited.lastExit?.reason).toBe("OOMKilled");
    expect(exited.lastExit?.message).toMatch(/^OOMKilled: memory limit 96 MiB exceeded/);
    expect(["backoff", "starting", "running"]).toContain(exited.state);
    await stopProcess(builder, started.id);
  });
});

describe("readiness", () => {
  it("never takes traffic while its health check fails: ended after the timeout (health_check), and traffic gets 503", async () => {
    const started = await startProcess(
      builder,
      webSpec(plane.serve(release), { env: { HEALTH: "fail" }, healthCheck: { path: "/healthz", timeoutSeconds: 1 } }),
    );
    const waiting = proxyFetch(builder, started.id, "/hello");
    const ended = await waitFor(builder, started.id, (status) => status.lastExit !== null, 15_000);
    expect(ended.ready).toBe(false);
    expect(ended.readyAt).toBeNull();
    expect(ended.lastExit).toMatchObject({ reason: "health_check", message: "health check failed for 1 s: GET /healthz answered 500" });
    const answer = await waiting;
    expect(answer.status).toBe(503);
    expect(((await answer.json()) as { error: { code: string } }).error.code).toBe("UNAVAILABLE");
    await stopProcess(builder, started.id);
  });

  it("ends an app that never listens (start_timeout)", async () => {
    const started = await startProcess(builder, webSpec(plane.serve(release), { command: "sleep 600", healthCheck: { path: null, timeoutSeconds: 1 } }));
    const ended = await waitFor(builder, started.id, (status) => status.lastExit !== null, 15_000);
    expect(ended.lastExit?.reason).toBe("start_timeout");
    expect(ended.lastExit?.message).toBe("not ready within 1 s: nothing listens on port 8080 (nor on any other port)");
    expect(ended.state).toBe("backoff");
    await stopProcess(builder, started.id);
  });
});

describe("a release that cannot run", () => {
  it("fails a process whose release does not match its SHA-256, saying so", async () => {
    const served = plane.serve(release);
    const started = await startProcess(builder, webSpec({ ...served, sha256: "0".repeat(64) }));
    const failed = await waitFor(builder, started.id, (status) => status.state === "failed");
    expect(failed.lastExit).toMatchObject({ reason: "error" });
    expect(failed.lastExit?.message).toMatch(/^release SHA-256 is [0-9a-f]{64}, not the announced 0{64}$/);
    expect((await proxyFetch(builder, started.id, "/")).status).toBe(503);
  });

  it("fails a process whose release is refused by the extractor (a link leading out)", async () => {
    const { execFileSync } = await import("node:child_process");
    const { mkdtemp, rm, symlink } = await import("node:fs/promises");
    const { join } = await import("node:path");
    const { tmpdir } = await import("node:os");
    const { createHash } = await import("node:crypto");
    const dir = await mkdtemp(join(tmpdir(), "svc-bad-release-"));
    await symlink("/etc/shadow", join(dir, "escape"));
    const archive = execFileSync("tar", ["-czf", "-", "-C", dir, "."]);
    await rm(dir, { recursive: true, force: true });
    const bad = { archive, sha256: createHash("sha256").update(archive).digest("hex"), sizeBytes: archive.length };
    const started = await startProcess(builder, webSpec(plane.serve(bad)));
    const failed = await waitFor(builder, started.id, (status) => status.state === "failed");
    expect(failed.lastExit?.message).toMatch(/^the release could not be unpacked: symlink "\.\/escape" -> "\/etc\/shadow" points outside/);
  });
});
