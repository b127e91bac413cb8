import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { parseLogLine } from "../../builder/src/protocol/jobs.js";
import { type BuilderProcess, followLog, jobStatus, runToEnd, signedFetch, startBuilder, submitJob } from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

/** The `text` of every log record from the given stream. */
function lines(log: string, stream: "out" | "err" | "svc"): string[] {
  return log
    .split("\n")
    .filter(Boolean)
    .map((line) => parseLogLine(line))
    .filter((record) => record?.stream === stream)
    .map((record) => record!.text);
}

describe("POST /v1/jobs", () => {
  it("answers 201 with a running job and records output, exit code and timestamps", async () => {
    const submitted = await submitJob(builder, { command: "echo hello; echo oops >&2; printf 'no newline'", labels: { run: "r1" } });
    expect(submitted).toMatchObject({ status: "running", labels: { run: "r1" }, startedAt: expect.any(String), finishedAt: null });
    const log = await followLog(builder, submitted.id);
    const status = await jobStatus(builder, submitted.id);
    expect(status).toMatchObject({ status: "succeeded", reason: null, exitCode: 0, signal: null, error: null, labels: { run: "r1" } });
    expect(Date.parse(status.finishedAt!)).toBeGreaterThanOrEqual(Date.parse(status.startedAt!));
    expect(status.logBytes).toBe(Buffer.byteLength(log));
    expect(lines(log, "out")).toEqual(["hello", "no newline"]);
    expect(lines(log, "err")).toEqual(["oops"]);
    expect(lines(log, "svc")).toEqual(["job succeeded (exit code 0)"]);
    for (const line of log.trimEnd().split("\n")) expect(parseLogLine(line)).not.toBeNull();
  });

  it("reports `exit 3` as failed with exit code 3", async () => {
    const { status, log } = await runToEnd(builder, { command: "echo before; exit 3" });
    expect(status).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 3, error: "exit code 3" });
    expect(lines(log, "svc")).toEqual(["job failed: exit code 3"]);
  });

  it("reports an unknown command as exit 127 with `command not found` in the log", async () => {
    const { status, log } = await runToEnd(builder, { command: "nosuchcmd" });
    expect(status).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 127 });
    expect(lines(log, "err").join("\n")).toContain("nosuchcmd");
    expect(log).toContain("command not found");
  });

  it("answers 400 VALIDATION_ERROR with details for a bad spec", async () => {
    const response = await signedFetch(builder, "/v1/jobs", {
      method: "POST",
      body: { command: "", env: { "BAD-NAME": "x" }, timeoutSeconds: 0, memoryMb: 64 },
    });
    expect(response.status).toBe(400);
    const body = (await response.json()) as { error: { code: string; details: Array<{ path: string }> } };
    expect(body.error.code).toBe("VALIDATION_ERROR");
    expect(body.error.details.map((detail) => detail.path)).toEqual(expect.arrayContaining(["command", "timeoutSeconds"]));
  });
});

describe("job environment", () => {
  it("holds exactly the job's variables plus PATH, HOME, TMPDIR, SVC_JOB_ID and the version-check switches, never the builder's secret", async () => {
    const { status, log } = await runToEnd(builder, { command: "env", env: { GREETING: "hello world", DATABASE_URL: "postgres://db" } });
    const env = Object.fromEntries(lines(log, "out").map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]));
    expect(env).toMatchObject({
      GREETING: "hello world",
      DATABASE_URL: "postgres://db",
      PATH: "/usr/local/bin:/usr/bin:/bin",
      SVC_JOB_ID: status.id,
    });
    expect(env).toMatchObject({ HOME: "/work", PWD: "/work", TMPDIR: "/tmp" });
    // No package manager's "new version available" note in every log.
    expect(env).toMatchObject({ NPM_CONFIG_UPDATE_NOTIFIER: "false", PIP_DISABLE_PIP_VERSION_CHECK: "1" });
    expect(Object.keys(env).sort()).toEqual([
      "DATABASE_URL",
      "GREETING",
      "HOME",
      "NPM_CONFIG_UPDATE_NOTIFIER",
      "PATH",
      "PIP_DISABLE_PIP_VERSION_CHECK",
      "PWD",
      "SVC_JOB_ID",
      "TMPDIR",
    ]);
    expect(log).not.toContain("BUILDER_");
    expect(log).not.toContain(builder.secret);
  });

  it("lets the job override PATH but not SVC_JOB_ID", async () => {
    const { status, log } = await runToEnd(builder, {
      command: 'echo "$PATH|$SVC_JOB_ID"',
      env: { PATH: "/opt/tool/bin:/usr/bin:/bin", SVC_JOB_ID: "spoofed" },
    });
    expect(lines(log, "out")).toEqual([`/opt/tool/bin:/usr/bin:/bin|${status.id}`]);
  });
});

describe("GET /v1/jobs/:id/logs", () => {
  it("keeps concurrent jobs' logs apart", async () => {
    const script = (token: string) => `i=0; while [ $i -lt 3000 ]; do echo ${token}-$i; i=$((i+1)); done`;
    const [a, b] = await Promise.all([runToEnd(builder, { command: script("ALPHA") }), runToEnd(builder, { command: script("BRAVO") })]);
    for (const [result, token] of [
      [a, "ALPHA"],
      [b, "BRAVO"],
    ] as const) {
      const out = lines(result.log, "out");
      expect(out).toHaveLength(3000);
      expect(out.every((line, index) => line === `${token}-${index}`)).toBe(true);
    }
  });

  it("streams lines while the job runs when following, and ends with the job", async () => {
    const submitted = await submitJob(builder, { command: "echo first; sleep 2; echo second" });
    const response = await signedFetch(builder, `/v1/jobs/${submitted.id}/logs?follow=1`);
    expect(response.headers.get("content-type")).toBe("text/plain; charset=utf-8");
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!text.includes("first")) text += (await reader.read()).value ?? "";
    expect((await jobStatus(builder, submitted.id)).status).toBe("running"); // the first line came before the end
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += chunk.value;
    expect(lines(text, "out")).toEqual(["first", "second"]);
    expect((await jobStatus(builder, submitted.id)).status).toBe("succeeded");
  });

  it("returns the log from a byte offset", async () => {
    const { status, log } = await runToEnd(builder, { command: "echo one; echo two" });
    const offset = log.indexOf("\n") + 1;
    const response = await signedFetch(builder, `/v1/jobs/${status.id}/logs?offset=${offset}`);
    expect(await response.text()).toBe(log.slice(offset));
  });

  it("caps the log at 10 MiB with one truncation marker", async () => {
    const { status, log } = await runToEnd(builder, { command: "yes | head -c 12000000; echo after-the-cap" });
    expect(status).toMatchObject({ status: "succeeded", logTruncated: true });
    expect(status.logBytes).toBeLessThanOrEqual(10 * 1024 * 1024);
    expect(status.logBytes).toBeGreaterThan(10 * 1024 * 1024 - 8192);
    expect(lines(log, "svc")).toEqual(["[log truncated at 10 MiB]", "job succeeded (exit code 0)"]);
    expect(log).not.toContain("after-the-cap");
  });

  it("answers 404 JOB_NOT_FOUND for an unknown job", async () => {
    const response = await signedFetch(builder, "/v1/jobs/job_000000000000000000000000/logs");
    expect(response.status).toBe(404);
    expect(await response.json()).toEqual({ error: { code: "JOB_NOT_FOUND", message: "job not found" } });
  });
});

describe("POST /v1/jobs/:id/cancel", () => {
  it("kills the job's processes and reports it cancelled", async () => {
    const submitted = await submitJob(builder, { command: "echo started; sleep 30" });
    const started = Date.now();
    const response = await signedFetch(builder, `/v1/jobs/${submitted.id}/cancel`, { method: "POST" });
    expect(response.status).toBe(200);
    expect(JobStatus.parse(await response.json())).toMatchObject({ status: "cancelled", reason: "cancelled" });
    expect(Date.now() - started).toBeLessThan(5000);
  });
});

describe("sourceUrl", () => {
  let server: Server;
  let base: string;
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "svc-source-"));
    await writeFile(join(dir, "hello.txt"), "hello from the archive\n");
    execFileSync("tar", ["-czf", join(dir, "good.tar.gz"), "-C", dir, "hello.txt"]);
    execFileSync("tar", ["-czPf", join(dir, "evil.tar.gz"), "-C", dir, "--transform=s,^,../,", "hello.txt"]);
    server = createServer((request, response) => {
      const file = request.url === "/good.tar.gz" ? "good.tar.gz" : request.url === "/evil.tar.gz" ? "evil.tar.gz" : null;
      if (!file) return response.writeHead(404).end();
      response.end(execFileSync("cat", [join(dir, file)]));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("extracts the archive into the working directory before running", async () => {
    const { status, log } = await runToEnd(builder, { command: "cat hello.txt", sourceUrl: `${base}/good.tar.gz` });
    expect(status.status).toBe("succeeded");
    expect(lines(log, "out")).toEqual(["hello from the archive"]);
  });

  it("refuses an archive whose members climb out of the working directory, unpacking it only inside the sandbox", async () => {
    const { status, log } = await runToEnd(builder, { command: "echo ran", sourceUrl: `${base}/evil.tar.gz` });
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toMatch(/^the source archive could not be unpacked: .*tar: .*\.\.\//);
    expect(lines(log, "out")).toEqual([]);
    expect(existsSync(join(builder.dataDir, "jobs", "hello.txt"))).toBe(false);
  });

  it("fails with the HTTP status in the log when the download fails", async () => {
    const { status, log } = await runToEnd(builder, { command: "echo ran", sourceUrl: `${base}/missing.tar.gz` });
    expect(status).toMatchObject({ status: "failed", reason: "error", error: "source download failed: HTTP 404" });
    expect(log).toContain("job failed: source download failed: HTTP 404");
  });
});
