import { readFileSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { type BuilderProcess, followLog, jobStatus, signedFetch, startBuilder, submitJob } from "./builder-process.js";

/**
 * Runs sent ahead of their second (`startAt`, issue 33): the builder makes the
 * sandbox at once and starts only the command's exec at the second.
 */
let dataDir: string;
let builder: BuilderProcess;
beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "svc-builder-staged-"));
  builder = await startBuilder({ dataDir, env: { BUILDER_MAX_CONCURRENT_JOBS: "4" } });
});
afterAll(async () => {
  await builder?.stop();
  await rm(dataDir, { recursive: true, force: true });
});

/** Whether a process whose arguments include `marker` is alive (the staged sandbox's prelude carries the command as one). */
function alive(marker: string): boolean {
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").some((arg) => arg.includes(marker))) return true;
    } catch {
      // exited meanwhile
    }
  }
  return false;
}

const outLines = (log: string) => [...log.matchAll(/^(\S+) out (.*)$/gm)].map((m) => ({ at: Date.parse(m[1]!), text: m[2]! }));

describe("a run sent ahead of its second", () => {
  it("is made ready at once, waits `scheduled`, starts its command at the second, never before, and its time limit counts from then", async () => {
    const marker = `staged-${Date.now()}`;
    const startAt = Date.now() + 2_500;
    // A 1 s limit it would pass if it counted from the submission; `sleep 0.5` stays within it from the start.
    const job = await submitJob(builder, { command: `echo ${marker}; sleep 0.5; echo done`, startAt, timeoutSeconds: 1 });
    expect(job).toMatchObject({ status: "queued", startedAt: null, waiting: { reason: "scheduled" } });
    // The sandbox is made before the second: its prelude waits with the command as an argument.
    await expect.poll(() => alive(marker), { timeout: 2_000, interval: 50 }).toBe(true);
    expect(Date.now()).toBeLessThan(startAt);
    expect((await jobStatus(builder, job.id)).status).toBe("queued");

    const log = await followLog(builder, job.id);
    const done = await jobStatus(builder, job.id);
    expect(done.status, log).toBe("succeeded");
    expect(Date.parse(done.startedAt!)).toBeGreaterThanOrEqual(startAt);
    const [first, second] = outLines(log);
    expect(first?.text).toBe(marker);
    expect(first!.at).toBeGreaterThanOrEqual(startAt);
    // Only the exec was left at the second.
    expect(first!.at - startAt).toBeLessThan(500);
    expect(second?.text).toBe("done");
  });

  it("a time limit counts from the second: a staged run past it is killed as a timeout", async () => {
    const job = await submitJob(builder, { command: "sleep 5", startAt: Date.now() + 1_000, timeoutSeconds: 1 });
    await followLog(builder, job.id);
    const done = await jobStatus(builder, job.id);
    expect(done).toMatchObject({ status: "failed", reason: "timeout" });
    expect(Date.parse(done.finishedAt!) - Date.parse(done.startedAt!)).toBeGreaterThanOrEqual(1_000);
  });

  it("starts within its tenant's share at the second: two runs of a tenant limited to one start one after the other", async () => {
    const startAt = Date.now() + 1_500;
    const spec = { command: "sleep 0.4; echo ran", startAt, tenantConcurrency: 1 };
    const [a, b] = await Promise.all([submitJob(builder, spec), submitJob(builder, spec)]);
    await Promise.all([followLog(builder, a.id), followLog(builder, b.id)]);
    const [first, second] = (await Promise.all([jobStatus(builder, a.id), jobStatus(builder, b.id)])).sort((x, y) => Date.parse(x.startedAt!) - Date.parse(y.startedAt!));
    expect(first!.status).toBe("succeeded");
    expect(second!.status).toBe("succeeded");
    expect(Date.parse(first!.startedAt!)).toBeGreaterThanOrEqual(startAt);
    expect(Date.parse(second!.startedAt!)).toBeGreaterThanOrEqual(Date.parse(first!.finishedAt!));
  });

  it("a cancel before its second ends it unstarted (its sandbox gone, no output); `unstarted` leaves a started run running", async () => {
    const marker = `cancelled-${Date.now()}`;
    const job = await submitJob(builder, { command: `echo ${marker}`, startAt: Date.now() + 5_000 });
    await expect.poll(() => alive(marker), { timeout: 3_000, interval: 50 }).toBe(true);
    const cancel = await signedFetch(builder, `/v1/jobs/${job.id}/cancel?unstarted=true`, { method: "POST" });
    expect(JobStatus.parse(await cancel.json())).toMatchObject({ status: "cancelled", startedAt: null });
    expect(alive(marker)).toBe(false);
    expect(outLines(await followLog(builder, job.id))).toEqual([]);

    const running = await submitJob(builder, { command: "echo up; sleep 2; echo still" });
    const left = await signedFetch(builder, `/v1/jobs/${running.id}/cancel?unstarted=true`, { method: "POST" });
    expect(JobStatus.parse(await left.json()).status).toBe("running");
    expect(outLines(await followLog(builder, running.id)).map((line) => line.text)).toEqual(["up", "still"]);
    expect((await jobStatus(builder, running.id)).status).toBe("succeeded");
  });

  it("refuses a second more than 5 minutes ahead, and runs one already past at once", async () => {
    const far = await signedFetch(builder, "/v1/jobs", {
      method: "POST",
      body: { tenant: "acct_test", env: {}, timeoutSeconds: 60, memoryMb: 512, command: "true", startAt: Date.now() + 6 * 60_000 },
    });
    expect(far.status).toBe(400);
    expect(await far.text()).toMatch(/startAt.*must be at most 5 minutes ahead/);
    const past = await submitJob(builder, { command: "echo now", startAt: Date.now() - 1_000 });
    expect(past.status).toBe("running");
    await followLog(builder, past.id);
  });
});

describe("staging beyond its bound (BUILDER_MAX_STAGED_JOBS=1)", () => {
  let small: BuilderProcess;
  let smallDir: string;
  beforeAll(async () => {
    smallDir = await mkdtemp(join(tmpdir(), "svc-builder-staged-small-"));
    small = await startBuilder({ dataDir: smallDir, env: { BUILDER_MAX_CONCURRENT_JOBS: "4", BUILDER_MAX_STAGED_JOBS: "1" } });
  });
  afterAll(async () => {
    await small?.stop();
    await rm(smallDir, { recursive: true, force: true });
  });

  it("runs it could not make ahead are made at their second and run once each, never before it; one cancelled while unmade never runs", async () => {
    const tag = `bound-${Date.now()}`;
    const startAt = Date.now() + 2_000;
    const jobs = [];
    for (let i = 0; i < 4; i++) jobs.push(await submitJob(small, { command: `echo ${tag}-${i}`, startAt }));
    // One is made ahead (the bound); the others wait unmade.
    await expect.poll(() => alive(`${tag}-0`), { timeout: 1_500, interval: 50 }).toBe(true);
    expect([1, 2, 3].some((i) => alive(`${tag}-${i}`))).toBe(false);
    const cancel = await signedFetch(small, `/v1/jobs/${jobs[3]!.id}/cancel?unstarted=true`, { method: "POST" });
    expect(JobStatus.parse(await cancel.json())).toMatchObject({ status: "cancelled", startedAt: null });
    for (const [i, job] of jobs.entries()) {
      const log = await followLog(small, job.id);
      const done = await jobStatus(small, job.id);
      if (i === 3) {
        expect(outLines(log)).toEqual([]);
        continue;
      }
      expect(done.status, log).toBe("succeeded");
      expect(outLines(log).map((line) => line.text)).toEqual([`${tag}-${i}`]);
      expect(outLines(log)[0]!.at).toBeGreaterThanOrEqual(startAt);
    }
  });
});
