import { readFileSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { type BuilderProcess, followLog, jobStatus, signedFetch, startBuilder, submitJob } from "./builder-process.js";

let dataDir: string;
let builder: BuilderProcess;
beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "svc-builder-queue-"));
  builder = await startBuilder({ dataDir, env: { BUILDER_MAX_CONCURRENT_JOBS: "1" } });
});
afterAll(async () => {
  await builder?.stop();
  await rm(dataDir, { recursive: true, force: true });
});

describe("BUILDER_MAX_CONCURRENT_JOBS", () => {
  it("queues jobs beyond the limit, starts them in order, and cancels a queued one at once", async () => {
    const first = await submitJob(builder, { command: "sleep 1; echo first" });
    const second = await submitJob(builder, { command: "echo second" });
    const third = await submitJob(builder, { command: "echo third" });
    expect(first.status).toBe("running");
    expect(second).toMatchObject({ status: "queued", startedAt: null });
    expect(third.status).toBe("queued");

    const cancel = await signedFetch(builder, `/v1/jobs/${third.id}/cancel`, { method: "POST" });
    expect(JobStatus.parse(await cancel.json())).toMatchObject({ status: "cancelled", startedAt: null });

    expect(await followLog(builder, second.id)).toContain(" out second\n");
    const [firstDone, secondDone] = await Promise.all([jobStatus(builder, first.id), jobStatus(builder, second.id)]);
    expect(secondDone.status).toBe("succeeded");
    expect(Date.parse(secondDone.startedAt!)).toBeGreaterThanOrEqual(Date.parse(firstDone.finishedAt!));
    expect(await followLog(builder, third.id)).toBe("");
  });
});

describe("records across restarts", () => {
  it("keeps finished jobs pollable and ends jobs the builder stopped in the middle of", async () => {
    const done = await submitJob(builder, { command: "echo kept" });
    const doneLog = await followLog(builder, done.id);
    const interrupted = await submitJob(builder, { command: "sleep 30" });
    await builder.stop();

    builder = await startBuilder({ dataDir, env: { BUILDER_MAX_CONCURRENT_JOBS: "1" } });
    expect(await jobStatus(builder, done.id)).toMatchObject({ status: "succeeded", logBytes: Buffer.byteLength(doneLog) });
    expect(await followLog(builder, done.id)).toBe(doneLog);
    expect(await jobStatus(builder, interrupted.id)).toMatchObject({
      status: "failed",
      reason: "error",
      error: "builder shut down before the job finished",
    });
  });

  it("marks a job failed when the builder died without ending it, whose processes died with the builder", async () => {
    const sleep = `sleep 30.${Date.now()}`;
    const job = await submitJob(builder, { command: `echo started; ${sleep}` });
    const response = await signedFetch(builder, `/v1/jobs/${job.id}/logs?follow=1`);
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!/started\n/.test(text)) text += (await reader.read()).value ?? "";
    await reader.cancel();
    await expect.poll(() => running(sleep)).toBe(true);
    process.kill(builder.pid, "SIGKILL");
    await builder.stop();
    // The sandbox dies with its parent: nothing of the job outlives the builder.
    await expect.poll(() => running(sleep)).toBe(false);

    builder = await startBuilder({ dataDir, env: { BUILDER_MAX_CONCURRENT_JOBS: "1" } });
    expect(await jobStatus(builder, job.id)).toMatchObject({
      status: "failed",
      reason: "error",
      error: "builder restarted before the job finished",
      logBytes: Buffer.byteLength(text.slice(0, text.lastIndexOf("\n") + 1)),
    });
  });
});

/** Whether a process with exactly this command line runs on the host. */
function running(command: string): boolean {
  return readdirSync("/proc")
    .filter((name) => /^\d+$/.test(name))
    .some((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ") === command;
      } catch {
        return false;
      }
    });
}
