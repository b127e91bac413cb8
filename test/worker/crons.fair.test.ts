import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import type { JobStatus } from "../../builder/src/protocol/job-status";
import { signRequest } from "../../builder/src/protocol/signing";
import { configOf } from "../../worker/env";
import { findJob, LONE_BUILDER_ID } from "../../worker/lib/builder-client";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { deliverAlarm, newApp, newCron, runs, stubOf, waitForRun } from "./cron-helpers";
import { call, type ErrorJson, json, newAccount } from "./helpers";

/**
 * Issue 17, point 5, through the API: an account's runs beyond its plan's
 * concurrency wait `queued` on the builder and say so (`phase`), another
 * account's run starts at once, and manual runs are bounded by the job's
 * concurrency policy and the plan.
 */
type Run = { jobName: string; status: string; phase: string | null; waiting: string | null; queuedAt: string; startedAt: string; error: string | null };
type Started = { data: { jobName: string; status: string; phase: string | null } };

/** Runs to cancel after each test, so the shared builder's slots are free again. */
const cleanup: { key: string; cronId: string }[] = [];
afterEach(async () => {
  for (const { key, cronId } of cleanup.splice(0)) {
    for (const run of await runs(key, cronId)) {
      if (run.status === "running") await call(`/v1/crons/${cronId}/runs/${run.jobName}/cancel`, { method: "POST", key });
    }
  }
});

async function manualRun(key: string, cronId: string): Promise<Started["data"]> {
  const res = await call(`/v1/crons/${cronId}/run`, { method: "POST", key });
  expect(res.status, await res.clone().text()).toBe(202);
  return (await json<Started>(res)).data;
}

async function runOf(key: string, cronId: string, jobName: string): Promise<Run> {
  return (await runs(key, cronId)).find((r) => r.jobName === jobName) as unknown as Run;
}

/** What the builder itself says of the run (found by the run's submission key). */
async function builderState(cronId: string, jobName: string) {
  const found = await findJob(configOf(env), { id: LONE_BUILDER_ID, address: env.BUILDER_URL! }, `${cronId}/${jobName}`);
  if (!found.ok) throw new Error(`builder has no job for ${jobName}: ${found.message}`);
  return found.value;
}

/** Delivers a status the way the builder's callback does (signed); answers the HTTP status. */
async function callback(status: JobStatus): Promise<number> {
  const body = JSON.stringify(status);
  const headers = await signRequest({ secret: env.BUILDER_SECRET!, method: "POST", path: "/internal/builder/callback", body });
  return (await call("/internal/builder/callback", { method: "POST", body, headers: { ...headers, "Content-Type": "application/json" } })).status;
}

/** An account (free plan) with a job that sleeps, whose runs are cancelled after the test. */
async function sleeper(policy: "allow" | "forbid" | "replace", command = "sleep 30") {
  const { adminKey: key, accountId } = await newAccount();
  const cron = await newCron(key, { appId: (await newApp(key)).id, command, concurrencyPolicy: policy });
  cleanup.push({ key, cronId: cron.id });
  return { key, accountId, cron };
}

describe("runs and the account's share of the builder", () => {
  it("runs beyond the plan's concurrency report phase queued (status running) until the builder starts them; another account's run starts at once", async () => {
    const a = await sleeper("allow");
    const limit = PLAN_LIMITS.free.concurrentJobs;
    const started = [];
    for (let i = 0; i <= limit; i++) started.push(await manualRun(a.key, a.cron.id));
    expect(started.map((r) => [r.status, r.phase])).toEqual([...Array(limit).fill(["running", "running"]), ["running", "queued"]]);
    const extra = started[limit]!.jobName;
    const queued = await runOf(a.key, a.cron.id, extra);
    expect(queued).toMatchObject({ status: "running", phase: "queued", startedAt: queued.queuedAt });
    expect(queued.waiting).toContain(`${limit} of ${limit} concurrent jobs`);
    // The API says queued exactly while the builder does.
    expect(await builderState(a.cron.id, extra)).toMatchObject({ status: "queued", startedAt: null });

    // B is not held up by A's backlog: its run starts at once.
    const b = await sleeper("forbid", "echo from-b");
    const bRun = await manualRun(b.key, b.cron.id);
    expect(bRun.phase).toBe("running");
    const bStarted = await builderState(b.cron.id, bRun.jobName);
    expect(Date.parse(bStarted.startedAt!) - Date.parse(bStarted.createdAt)).toBeLessThan(2_000);
    expect(await waitForRun(b.key, b.cron.id, bRun.jobName)).toMatchObject({ status: "success" });

    // A's queued run still waits, and says so; after one of A's runs ends it starts and says that.
    expect(await runOf(a.key, a.cron.id, extra)).toMatchObject({ phase: "queued" });
    const freedAt = Date.now();
    await call(`/v1/crons/${a.cron.id}/runs/${started[0]!.jobName}/cancel`, { method: "POST", key: a.key });
    expect((await builderState(a.cron.id, extra)).status).toBe("running");
    let run = await runOf(a.key, a.cron.id, extra);
    for (let i = 0; i < 40 && run.phase === "queued"; i++) {
      await runDurableObjectAlarm(stubOf(a.cron.id));
      await new Promise((r) => setTimeout(r, 250));
      run = await runOf(a.key, a.cron.id, extra);
    }
    expect(run).toMatchObject({ status: "running", phase: "running", waiting: null });
    expect(Date.parse(run.startedAt)).toBeGreaterThanOrEqual(freedAt - 1_000);
    expect(Date.parse(run.startedAt)).toBeGreaterThan(Date.parse(run.queuedAt));
  }, 30_000);

  it("the builder's start callback moves a queued run to running at once (no poll), and a late queued answer does not move it back", async () => {
    const a = await sleeper("allow");
    const limit = PLAN_LIMITS.free.concurrentJobs;
    const started = [];
    for (let i = 0; i <= limit; i++) started.push(await manualRun(a.key, a.cron.id));
    const extra = started[limit]!.jobName;
    const queuedStatus = await builderState(a.cron.id, extra);
    expect(queuedStatus.status).toBe("queued");
    await call(`/v1/crons/${a.cron.id}/runs/${started[0]!.jobName}/cancel`, { method: "POST", key: a.key });
    const runningStatus = await builderState(a.cron.id, extra);
    expect(runningStatus.status).toBe("running");
    expect(await callback(runningStatus)).toBe(204);
    const run = await runOf(a.key, a.cron.id, extra);
    expect(run).toMatchObject({ status: "running", phase: "running", waiting: null, startedAt: runningStatus.startedAt });
    // A retried or slow report of the queued state, arriving after the start, changes nothing.
    expect(await callback(queuedStatus)).toBe(204);
    expect(await runOf(a.key, a.cron.id, extra)).toMatchObject({ status: "running", phase: "running", startedAt: runningStatus.startedAt });
  }, 30_000);

  it("a finished run has no phase; its queuedAt and startedAt stay", async () => {
    const { key, cron } = await sleeper("forbid", "echo done");
    const { jobName } = await manualRun(key, cron.id);
    const run = (await waitForRun(key, cron.id, jobName)) as unknown as Run;
    expect(run).toMatchObject({ status: "success", phase: null, waiting: null });
    expect(Date.parse(run.startedAt)).toBeGreaterThanOrEqual(Date.parse(run.queuedAt));
  });
});

describe("manual runs and the concurrency policy", () => {
  it("forbid: a manual run while one is running is refused (409 RUN_IN_PROGRESS) naming the run and how to cancel it; nothing is recorded", async () => {
    const { key, cron } = await sleeper("forbid");
    const first = await manualRun(key, cron.id);
    const res = await call(`/v1/crons/${cron.id}/run`, { method: "POST", key });
    expect(res.status).toBe(409);
    const error = (await json<ErrorJson>(res)).error;
    expect(error.code).toBe("RUN_IN_PROGRESS");
    expect(error.message).toContain(first.jobName);
    expect(error.message).toContain(`/v1/crons/${cron.id}/runs/${first.jobName}/cancel`);
    expect((await runs(key, cron.id)).map((r) => r.jobName)).toEqual([first.jobName]);
    // Once it has ended, a manual run is accepted again.
    await call(`/v1/crons/${cron.id}/runs/${first.jobName}/cancel`, { method: "POST", key });
    await manualRun(key, cron.id);
  });

  it("forbid also refuses while the run is still queued for a slot", async () => {
    const busy = await sleeper("allow");
    for (let i = 0; i < PLAN_LIMITS.free.concurrentJobs; i++) await manualRun(busy.key, busy.cron.id);
    // A second job of the same account: its run has to wait for the account's slots.
    const cron = await newCron(busy.key, { appId: (await newApp(busy.key)).id, command: "sleep 30", concurrencyPolicy: "forbid" });
    cleanup.push({ key: busy.key, cronId: cron.id });
    const first = await manualRun(busy.key, cron.id);
    expect(first.phase).toBe("queued");
    const res = await call(`/v1/crons/${cron.id}/run`, { method: "POST", key: busy.key });
    expect(res.status).toBe(409);
    expect((await json<ErrorJson>(res)).error).toMatchObject({ code: "RUN_IN_PROGRESS", message: expect.stringContaining("queued") });
  });

  it("replace: a manual run cancels the running one", async () => {
    const { key, cron } = await sleeper("replace");
    const first = await manualRun(key, cron.id);
    const second = await manualRun(key, cron.id);
    const list = await runs(key, cron.id);
    expect(list.find((r) => r.jobName === first.jobName)).toMatchObject({ status: "failed", error: `replaced by manual run ${second.jobName}` });
    expect(list.find((r) => r.jobName === second.jobName)).toMatchObject({ status: "running" });
  });

  it("allow: manual runs past the plan's queue bound are refused (429 TOO_MANY_JOBS) and leave no run; scheduled runs still queue", async () => {
    const { key, cron } = await sleeper("allow");
    const { concurrentJobs, manualRunQueueLimit } = PLAN_LIMITS.free;
    const accepted = [];
    for (let i = 0; i < concurrentJobs + manualRunQueueLimit; i++) accepted.push(await manualRun(key, cron.id));
    expect(accepted.filter((r) => r.phase === "queued")).toHaveLength(manualRunQueueLimit);
    const res = await call(`/v1/crons/${cron.id}/run`, { method: "POST", key });
    expect(res.status).toBe(429);
    const error = (await json<ErrorJson>(res)).error;
    expect(error.code).toBe("TOO_MANY_JOBS");
    expect(error.message).toContain(`${manualRunQueueLimit} jobs waiting`);
    expect(await runs(key, cron.id)).toHaveLength(accepted.length);
    // The schedule is not bounded so: a due run queues behind the others.
    const due = Math.floor(Date.now() / 1000) * 1000 - 1000;
    await deliverAlarm(cron.id, due);
    expect((await runs(key, cron.id)).find((r) => r.jobName === `${cron.name}-${due / 1000}`)).toMatchObject({
      status: "running",
      phase: "queued",
    });
  });
});
