import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { call, json } from "./helpers";

export type Cron = {
  id: string;
  appId: string;
  name: string;
  schedule: string;
  command: string;
  enabled: boolean;
  createdAt: string;
  lastRun?: string | null;
  nextRun?: string | null;
  nextRuns?: string[];
};
export type Run = { jobName: string; status: string; phase?: string | null; waiting?: string | null; startedAt: string; finishedAt: string | null; exitCode: number | null; error: string | null };

export const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

export async function newApp(key: string, status: "running" | "stopped" = "running") {
  const name = uniqueName("cronapp");
  const app = (await json<{ data: { id: string } }>(await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } }))).data;
  if (status === "stopped") await call(`/v1/apps/${app.id}/stop`, { method: "POST", key });
  return { id: app.id, name };
}

export async function newCron(key: string, body: Record<string, unknown>): Promise<Cron> {
  // Once a year by default: a job due within the test (its run sent to the node 10-30 s ahead) would add runs it did not ask for.
  const res = await call("/v1/crons", { method: "POST", key, body: { name: uniqueName("job"), schedule: "0 0 1 1 *", ...body } });
  if (res.status !== 201) throw new Error(`creating cron failed: ${res.status} ${await res.text()}`);
  return (await json<{ data: Cron }>(res)).data;
}

export const stubOf = (cronId: string) => env.CRON_JOB.get(env.CRON_JOB.idFromName(cronId));

export async function runs(key: string, cronId: string): Promise<Run[]> {
  return (await json<{ data: Run[] }>(await call(`/v1/crons/${cronId}/runs`, { key }))).data;
}

/** Makes the job's alarm due at `scheduledFor` and runs it now, as a (possibly repeated) delivery would. */
export async function deliverAlarm(cronId: string, scheduledFor: number): Promise<boolean> {
  const stub = stubOf(cronId);
  await runInDurableObject(stub, async (_instance, state) => {
    await state.storage.put("scheduledFor", scheduledFor);
    await state.storage.setAlarm(Date.now() + 60_000);
  });
  return runDurableObjectAlarm(stub);
}

/** Drives the job's alarm (which polls the builder) until the run leaves `running`. */
export async function waitForRun(key: string, cronId: string, jobName: string, timeoutMs = 30_000): Promise<Run> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = (await runs(key, cronId)).find((r) => r.jobName === jobName);
    if (run && run.status !== "running") return run;
    if (Date.now() > deadline) throw new Error(`run ${jobName} still ${run?.status ?? "missing"} after ${timeoutMs} ms`);
    await runDurableObjectAlarm(stubOf(cronId));
    await new Promise((r) => setTimeout(r, 250));
  }
}

export async function logsOf(key: string, cronId: string, jobName: string): Promise<string> {
  return (await json<{ data: { logs: string } }>(await call(`/v1/crons/${cronId}/runs/${jobName}/logs`, { key }))).data.logs;
}
