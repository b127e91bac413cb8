import { afterEach, describe, expect, it, vi } from "vitest";
import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { call, type ErrorJson, json, newAccount } from "./helpers";
import { deliverAlarm, logsOf, newApp, newCron, runs, stubOf, waitForRun } from "./cron-helpers";

type Started = { data: { jobName: string; status: string } };

async function manualRun(key: string, cronId: string): Promise<string> {
  const res = await call(`/v1/crons/${cronId}/run`, { method: "POST", key });
  expect(res.status).toBe(202);
  const started = await json<Started>(res);
  expect(started.data.status).toBe("running");
  expect(started.data.jobName).toMatch(/^manual-[0-9a-z]{6}-\d{10}$/);
  return started.data.jobName;
}

describe("cron runs on the real builder", () => {
  afterEach(() => vi.restoreAllMocks());

  it("runs `echo hello $GREETING` with the app's env vars: success, value in the log", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    await call(`/v1/apps/${app.id}/env`, { method: "PATCH", key, body: { vars: { GREETING: "from-env-vars" } } });
    const cron = await newCron(key, { appId: app.id, command: "echo hello $GREETING" });
    const jobName = await manualRun(key, cron.id);
    const run = await waitForRun(key, cron.id, jobName);
    expect(run).toMatchObject({ status: "success", exitCode: 0, error: null });
    expect(Date.parse(run.finishedAt!)).toBeGreaterThanOrEqual(Date.parse(run.startedAt));
    const logs = await logsOf(key, cron.id, jobName);
    expect(logs).toContain("hello from-env-vars");
    // After the run the log lives in R2.
    expect(await (await env.BUCKET.get(`cron-logs/${cron.id}/${jobName}.log`))?.text()).toBe(logs);
  });

  it("`exit 2` fails with an error line naming the exit code", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "echo before; exit 2" });
    const jobName = await manualRun(key, cron.id);
    const run = await waitForRun(key, cron.id, jobName);
    expect(run).toMatchObject({ status: "failed", exitCode: 2 });
    const logs = await logsOf(key, cron.id, jobName);
    expect(logs).toContain("before");
    expect(logs).toMatch(/error: command exited with code 2/);
  });

  it("`nosuchcmd` fails with `command not found` in the log", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "nosuchcmd" });
    const jobName = await manualRun(key, cron.id);
    const run = await waitForRun(key, cron.id, jobName);
    expect(run).toMatchObject({ status: "failed", exitCode: 127 });
    expect(await logsOf(key, cron.id, jobName)).toContain("command not found");
  });

  it("a run past its timeout is killed and failed", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "echo started; sleep 30", timeoutSeconds: 1 });
    const jobName = await manualRun(key, cron.id);
    const started = Date.now();
    const run = await waitForRun(key, cron.id, jobName);
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(run.status).toBe("failed");
    expect(run.error).toContain("timed out");
    const logs = await logsOf(key, cron.id, jobName);
    expect(logs).toContain("started");
    expect(logs).toContain("timed out after 1 s");
  });

  it("logs are readable while the run is still running", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "echo early-line; sleep 3; echo late-line" });
    const jobName = await manualRun(key, cron.id);
    let during = "";
    for (let i = 0; i < 40 && !during.includes("early-line"); i++) {
      await new Promise((r) => setTimeout(r, 100));
      during = await logsOf(key, cron.id, jobName);
    }
    expect(during).toContain("early-line");
    expect(during).not.toContain("late-line");
    expect((await runs(key, cron.id))[0]!.status).toBe("running");
    await waitForRun(key, cron.id, jobName);
    expect(await logsOf(key, cron.id, jobName)).toContain("late-line");
  });

  it("cancel kills a running run", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "sleep 30" });
    const jobName = await manualRun(key, cron.id);
    const res = await call(`/v1/crons/${cron.id}/runs/${jobName}/cancel`, { method: "POST", key });
    expect(res.status).toBe(200);
    expect((await json<{ data: { status: string; error: string } }>(res)).data).toMatchObject({ status: "failed", error: "cancelled" });
  });

  it("a manual run on a stopped app is refused with 409 APP_STOPPED", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key, "stopped")).id, command: "true" });
    const res = await call(`/v1/crons/${cron.id}/run`, { method: "POST", key });
    expect(res.status).toBe(409);
    expect((await json<ErrorJson>(res)).error.code).toBe("APP_STOPPED");
    expect(await runs(key, cron.id)).toEqual([]);
  });

  it("an unknown run is 404 RUN_NOT_FOUND", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "true" });
    const res = await call(`/v1/crons/${cron.id}/runs/nope-1/logs`, { key });
    expect(res.status).toBe(404);
    expect((await json<ErrorJson>(res)).error.code).toBe("RUN_NOT_FOUND");
  });

  it("builder unreachable: the run waits to learn by its key whether it arrived, then fails with the reason; the schedule goes on", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "true" });
    // Simulated outage: the builder is a real process here, so the only way to make it
    // unreachable for one test is to refuse connections to its address.
    const realFetch = globalThis.fetch;
    const outage = vi.spyOn(globalThis, "fetch").mockImplementation((input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      if (url.startsWith(env.BUILDER_URL!)) return Promise.reject(new TypeError("connection refused"));
      return realFetch(input, init);
    });
    const due = Math.floor(Date.now() / 1000) * 1000 - 1000;
    await deliverAlarm(cron.id, due);
    // Unconfirmed, not failed: a reply lost on the way back looks the same.
    expect((await runs(key, cron.id))[0]).toMatchObject({ jobName: `${cron.name}-${due / 1000}`, status: "running" });
    outage.mockRestore();
    // The builder answers again and has no job under the run's key: it never arrived.
    const run = await waitForRun(key, cron.id, `${cron.name}-${due / 1000}`);
    expect(run.status).toBe("failed");
    expect(run.error).toContain("could not be reached");
    expect(await logsOf(key, cron.id, run.jobName)).toContain("connection refused");
    const detail = (await json<{ data: { nextRun: string } }>(await call(`/v1/crons/${cron.id}`, { key }))).data;
    expect(Date.parse(detail.nextRun)).toBeGreaterThan(Date.now());
  });

  it("a submission whose reply was lost is found by its key: the run is not failed, and not run twice", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "echo ran-once" });
    // The builder gets the submission and starts the job; the answer is lost on the way back.
    const realFetch = globalThis.fetch;
    vi.spyOn(globalThis, "fetch").mockImplementation(async (input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      const method = input instanceof Request ? input.method : (init?.method ?? "GET");
      const response = await realFetch(input, init);
      if (url === `${env.BUILDER_URL}/v1/jobs` && method === "POST") throw new TypeError("network connection lost");
      return response;
    });
    const due = Math.floor(Date.now() / 1000) * 1000 - 1000;
    await deliverAlarm(cron.id, due);
    vi.restoreAllMocks();
    const run = await waitForRun(key, cron.id, `${cron.name}-${due / 1000}`);
    expect(run).toMatchObject({ status: "success", error: null });
    const logs = await logsOf(key, cron.id, run.jobName);
    // The retries carried the same key: the builder ran the command once.
    expect(logs.match(/ out ran-once$/gm)).toHaveLength(1);
  });

  it("a finished run whose log cannot be fetched yet stays running, and a later poll stores it with its output", async () => {
    const { adminKey: key } = await newAccount();
    const cron = await newCron(key, { appId: (await newApp(key)).id, command: "echo kept-output" });
    // The builder runs the job, but every log request fails (as under a burst of 1,000 runs).
    const realFetch = globalThis.fetch;
    let refused = 0;
    vi.spyOn(globalThis, "fetch").mockImplementation((input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      if (url.startsWith(`${env.BUILDER_URL}/v1/jobs/`) && url.includes("/logs")) {
        refused++;
        return Promise.reject(new TypeError("connection reset"));
      }
      return realFetch(input, init);
    });
    const due = Math.floor(Date.now() / 1000) * 1000 - 1000;
    const jobName = `${cron.name}-${due / 1000}`;
    await deliverAlarm(cron.id, due);
    // Polls until the object has seen the job finished and failed to fetch its log at least once.
    await vi.waitFor(
      async () => {
        await runDurableObjectAlarm(stubOf(cron.id));
        expect(refused).toBeGreaterThan(0);
      },
      { timeout: 20_000, interval: 250 },
    );
    expect((await runs(key, cron.id)).find((r) => r.jobName === jobName)?.status).toBe("running");
    vi.restoreAllMocks();
    const run = await waitForRun(key, cron.id, jobName);
    expect(run).toMatchObject({ status: "success", exitCode: 0 });
    expect(await logsOf(key, cron.id, jobName)).toMatch(/ out kept-output$/m);
  });
});
