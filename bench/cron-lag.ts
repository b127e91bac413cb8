import { fmt, percentile, benchStack } from "./load";

/**
 * Scheduling lag: from a run's scheduled second to its command starting on the
 * builder (the timestamp of the command's first output line). Baseline: one job
 * alone in a minute. Then JOBS jobs all due in the same minute, in one local
 * system (wrangler dev + builder). Prints p50/p99/max and the ratio to baseline.
 */
const JOBS = Number(process.env.JOBS ?? 200);

type Run = { jobName: string; status: string; error: string | null };

const stack = await benchStack();
const headers = { Authorization: `Bearer ${stack.adminKey}`, "Content-Type": "application/json" };
const api = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
  const res = await fetch(`${stack.apiUrl}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { data: T }).data;
};

/** Waits until the start of a minute leaves `needSeconds` before the next boundary. */
async function untilFreshMinute(needSeconds: number): Promise<number> {
  for (;;) {
    const now = Date.now();
    const next = Math.ceil(now / 60_000) * 60_000;
    if (next - now >= needSeconds * 1000) return next;
    await new Promise((r) => setTimeout(r, next - now + 50));
  }
}

async function measure(cronIds: string[], due: number): Promise<number[]> {
  const lags: number[] = [];
  const failures = new Map<string, number>();
  const pending = new Set(cronIds);
  const deadline = due + 120_000;
  while (pending.size > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 1000));
    for (const id of [...pending]) {
      const run = (await api<Run[]>("GET", `/v1/crons/${id}/runs`)).find((r) => r.jobName.endsWith(`-${due / 1000}`));
      if (!run || run.status === "running") continue;
      const { logs } = await api<{ logs: string }>("GET", `/v1/crons/${id}/runs/${run.jobName}/logs`);
      const first = logs.split("\n").find((l) => / out started$/.test(l));
      if (first) lags.push(Date.parse(first.slice(0, 24)) - due);
      else failures.set(run.error ?? run.status, (failures.get(run.error ?? run.status) ?? 0) + 1);
      pending.delete(id);
    }
  }
  for (const id of cronIds) await api("PATCH", `/v1/crons/${id}`, { enabled: false });
  if (pending.size > 0) console.log(`  warning: ${pending.size} runs did not finish within 2 minutes`);
  for (const [reason, count] of failures) console.log(`  warning: ${count} runs never started their command: ${reason}`);
  return lags.sort((a, b) => a - b);
}

async function scenario(app: string, count: number, label: string): Promise<number[]> {
  const due = await untilFreshMinute(Math.min(50, 10 + count * 0.1));
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const cron = await api<{ id: string }>("POST", "/v1/crons", {
      appId: app,
      name: `${label}-${i}`,
      schedule: "* * * * *",
      command: "echo started",
    });
    ids.push(cron.id);
  }
  if (Date.now() >= due) throw new Error("creating the jobs took past their due minute; lower JOBS");
  return measure(ids, due);
}

try {
  const app = (await api<{ id: string }>("POST", "/v1/apps", { name: "cron-lag", runtime: "node" })).id;
  const single = await scenario(app, 1, "solo");
  const many = await scenario(app, JOBS, "many");
  const line = (label: string, l: number[]) =>
    `  ${label.padEnd(18)} n=${String(l.length).padStart(3)}  p50 ${fmt(percentile(l, 50), 0).padStart(5)} ms  p99 ${fmt(percentile(l, 99), 0).padStart(5)} ms  max ${fmt(l.at(-1) ?? Number.NaN, 0).padStart(5)} ms`;
  console.log("bench/cron-lag: scheduled second -> command start on the builder (wrangler dev + builder, loopback)");
  console.log(line("1 job (baseline)", single));
  console.log(line(`${JOBS} jobs same minute`, many));
  console.log(`  ratio ${JOBS} jobs / baseline: p50 ${fmt(percentile(many, 50) / percentile(single, 50), 2)}x, max ${fmt((many.at(-1) ?? 0) / (single.at(-1) ?? 1), 2)}x`);
} finally {
  await stack.stop();
}
