import { execFile } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { availableParallelism, loadavg } from "node:os";
import { join } from "node:path";
import { benchStack, fmt, percentile } from "./load";

/**
 * Scheduling lag: from a run's scheduled second to its command starting on the
 * builder (the builder's timestamp of the command's first output line), in one
 * local system (the Worker under wrangler's dev server + builder, every command in its sandbox). Baseline:
 * one job alone in its minute. Then 200 and 1,000 jobs all due in the same
 * minute (`M H * * *`, so each fires exactly once), in two shapes: every job
 * in one app of one account, and the jobs spread over the apps of ten accounts
 * (each with its own plan limits and keys). For each: p50/p99/max, the
 * ratio to the baseline, runs counted per job (exactly one each: none missed,
 * none duplicated), and the D1 statements each scheduled run cost, counted by
 * the job's object and logged with the run (`"event":"cron.run"` in the
 * Worker's log), not estimated. CPU per run is what the whole machine spent
 * (all cores, /proc/stat) from the minute until the node had ended every run,
 * less this bench's own CPU meanwhile (reading the node's records), divided
 * by the runs, and the shares of the Worker, the builder's own process, its
 * sandboxes and PID 1: with two cores, N runs cannot all start sooner than
 * N × that / 2. After each minute, the floor issue 21 measures against: the
 * same number of bare bubblewrap sandboxes run `date`, as many at once as
 * there are cores (before the jobs exist and again after their minute; the
 * faster is held to), the p99 lag as a ratio of it, and the machine's CPU per
 * bare sandbox against ours per run. Runs of jobs without a disk are sent to
 * the node 10–30 s before their second and staged there (issue 33): the CPU per
 * run counts from the minute, so it leaves that staging out; the "reached the
 * builder" times are then negative.
 *
 *     npx tsx bench/cron-lag.ts [counts…]      (default 200 1000)
 */
const COUNTS = process.argv.slice(2).map(Number).filter((n) => n > 0);
const counts = COUNTS.length > 0 ? COUNTS : [200, 1000];
/** Sandboxes at once on the builder: enough that 1,000 trivial commands are not queued behind eight. */
const BUILDER_CONCURRENCY = 64;
const CREATE_CONCURRENCY = 8;

type Run = { jobName: string; status: string; error: string | null };

const stack = await benchStack({ builderEnv: { BUILDER_MAX_CONCURRENT_JOBS: String(BUILDER_CONCURRENCY) }, workerLogs: true });

/** An account the bench drives: its keys (requests are rate-limited per key, 100 per 10 s) and its app. */
type Tenant = { keys: string[]; turn: number; app: string };

const api = async <T>(tenant: Tenant, method: string, path: string, body?: unknown): Promise<T> => {
  for (let attempt = 1; ; attempt++) {
    const headers = { Authorization: `Bearer ${tenant.keys[tenant.turn++ % tenant.keys.length]}`, "Content-Type": "application/json" };
    // Only reads are sent again after a dropped connection (wrangler's dev server resets one now and then under a burst).
    const res = await fetch(`${stack.apiUrl}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) }).catch((error: unknown) => {
      if (method !== "GET" || attempt >= 5) throw error;
      return null;
    });
    if (res === null) {
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    if (res.status === 429) {
      await new Promise((r) => setTimeout(r, Number(res.headers.get("Retry-After") ?? 1) * 1000));
      continue;
    }
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
    return ((await res.json()) as { data: T }).data;
  }
};

/** `keyCount` keys of the account `adminKey` belongs to, and a node app of its own. */
async function tenant(adminKey: string, keyCount: number, appName: string): Promise<Tenant> {
  const keys: string[] = [];
  for (let i = 0; i < keyCount; i++) {
    const res = await fetch(`${stack.apiUrl}/v1/api-keys`, {
      method: "POST",
      headers: { Authorization: `Bearer ${adminKey}`, "Content-Type": "application/json" },
      body: JSON.stringify({ name: `bench-${i}`, scopes: ["deploy"] }),
    });
    keys.push(((await res.json()) as { key: string }).key);
  }
  const owner: Tenant = { keys, turn: 0, app: "" };
  owner.app = (await api<{ id: string }>(owner, "POST", "/v1/apps", { name: appName, runtime: "node" })).id;
  return owner;
}

/** A new account on the business plan (the operator's route), as a customer signing up would get. */
async function newAccount(name: string): Promise<string> {
  const res = await fetch(`${stack.apiUrl}/v1/accounts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${stack.secrets.OPERATOR_TOKEN}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name, plan: "business" }),
  });
  if (res.status !== 201) throw new Error(`creating account ${name}: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { apiKey: { key: string } }).apiKey.key;
}

async function inParallel<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) await work(items[next++]!);
  }));
}

/** CPU milliseconds the whole machine has spent (all cores), from /proc/stat. */
function machineCpuMs(): number {
  const fields = readFileSync("/proc/stat", "latin1").split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number);
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0] = fields;
  return (user + nice + system + irq + softirq) * 10;
}

/** CPU milliseconds of one process itself and of its waited-for children (the builder; its sandboxes). */
function processCpuMs(pid: number): { own: number; children: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  return { own: (fields[11]! + fields[12]!) * 10, children: (fields[13]! + fields[14]!) * 10 };
}

/** CPU milliseconds of every process in one process group (the Worker: wrangler's dev server in Node and workerd). */
function groupCpuMs(leader: number): number {
  let total = 0;
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "latin1");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[2]) === leader) total += (Number(fields[11]) + Number(fields[12])) * 10;
    } catch {
      // exited meanwhile
    }
  }
  return total;
}

type Result = {
  lags: number[];
  runsPerJob: Map<number, number>;
  d1PerRun: number;
  loggedRuns: number;
  notStarted: Map<string, number>;
  /**
   * CPU per run while the minute's runs went: the whole machine, the builder's
   * own process, its sandboxes, the Worker (wrangler's dev server and workerd),
   * and PID 1 (on this VM an init that spends CPU on every sandbox, as it does
   * on the floor's).
   */
  cpuPerRun: { machine: number; builder: number; sandboxes: number; api: number; init: number };
  /** Per run, from the node's own job records: scheduled second → the job reached the builder, and → the builder started it. */
  reached: number[];
  started: number[];
};

/** The node's record of each cron job run due at `due`: when it reached the builder, when the builder started it, and how many have ended. */
async function nodeRecords(ids: Set<string>, due: number): Promise<{ reached: number[]; started: number[]; ended: number }> {
  const reached: number[] = [];
  const started: number[] = [];
  let ended = 0;
  const jobs = join(stack.nodes[0]!.dataDir, "jobs");
  for (const name of await readdir(jobs)) {
    const status = JSON.parse(await readFile(join(jobs, name, "status.json"), "utf8").catch(() => "{}")) as {
      createdAt?: string;
      startedAt?: string | null;
      finishedAt?: string | null;
      labels?: { kind?: string; cronId?: string; jobName?: string };
    };
    const labels = status.labels;
    if (labels?.kind !== "cron" || !ids.has(labels.cronId ?? "") || !labels.jobName?.endsWith(`-${due / 1000}`) || !status.createdAt) continue;
    reached.push(Date.parse(status.createdAt) - due);
    if (status.startedAt) started.push(Date.parse(status.startedAt) - due);
    if (status.finishedAt) ended++;
  }
  return { reached: reached.sort((a, b) => a - b), started: started.sort((a, b) => a - b), ended };
}

/**
 * Creates `count` jobs due together at a minute boundary far enough ahead, job
 * i in the app of `tenants[i % tenants.length]`, and measures that minute's runs.
 */
async function scenario(tenants: Tenant[], count: number, label: string): Promise<Result> {
  // Creating a job costs a few D1 round trips and an object: leave room for that before the minute.
  const lead = 10_000 + count * 60;
  const due = Math.ceil((Date.now() + lead) / 60_000) * 60_000;
  const at = new Date(due);
  const schedule = `${at.getUTCMinutes()} ${at.getUTCHours()} * * *`;
  const ids: { id: string; owner: Tenant }[] = [];
  await inParallel(
    Array.from({ length: count }, (_, i) => i),
    CREATE_CONCURRENCY,
    async (i) => {
      const owner = tenants[i % tenants.length]!;
      const cron = await api<{ id: string }>(owner, "POST", "/v1/crons", { appId: owner.app, name: `${label}-${i}`, schedule, command: "echo started" });
      ids.push({ id: cron.id, owner });
    },
  );
  if (Date.now() >= due) throw new Error(`creating ${count} jobs took past their minute`);
  await new Promise((r) => setTimeout(r, due - Date.now()));
  const builderPid = stack.builderPid();
  const workerPid = stack.workerPid();
  const before = { machine: machineCpuMs(), builder: processCpuMs(builderPid), api: groupCpuMs(workerPid), init: processCpuMs(1) };
  const benchBefore = process.cpuUsage();
  // The window ends once the node has ended every run (its records read every 2 s; the CPU that costs this bench is left out below).
  const cronIds = new Set(ids.map((job) => job.id));
  const windowEnds = Date.now() + 180_000;
  while ((await nodeRecords(cronIds, due)).ended < count && Date.now() < windowEnds) await new Promise((r) => setTimeout(r, 2000));
  const builderAfter = stack.builderPid() === builderPid ? processCpuMs(builderPid) : null;
  const initAfter = processCpuMs(1);
  // Reading the node's records is this bench's work, not the platform's: it is left out of the machine's CPU.
  const benchUsed = process.cpuUsage(benchBefore);
  const cpuPerRun = {
    machine: (machineCpuMs() - before.machine - (benchUsed.user + benchUsed.system) / 1000) / count,
    builder: builderAfter ? (builderAfter.own - before.builder.own) / count : Number.NaN,
    sandboxes: builderAfter ? (builderAfter.children - before.builder.children) / count : Number.NaN,
    api: (groupCpuMs(workerPid) - before.api) / count,
    init: (initAfter.own + initAfter.children - before.init.own - before.init.children) / count,
  };

  const lags: number[] = [];
  const runsPerJob = new Map<number, number>();
  const notStarted = new Map<string, number>();
  const pending = new Set(ids);
  const deadline = Date.now() + 180_000;
  while (pending.size > 0 && Date.now() < deadline) {
    await inParallel([...pending], CREATE_CONCURRENCY, async (job) => {
      const { id, owner } = job;
      const runs = await api<Run[]>(owner, "GET", `/v1/crons/${id}/runs`);
      const run = runs.find((r) => r.jobName.endsWith(`-${due / 1000}`));
      if (!run || run.status === "running") return;
      runsPerJob.set(runs.length, (runsPerJob.get(runs.length) ?? 0) + 1);
      const { logs } = await api<{ logs: string }>(owner, "GET", `/v1/crons/${id}/runs/${run.jobName}/logs`);
      const first = logs.split("\n").find((l) => / out started$/.test(l));
      if (first) lags.push(Date.parse(first.slice(0, 24)) - due);
      else {
        // Counted by what the run ended as and its log's first line (without the time), e.g. "success: (empty log)".
        const said = logs.split("\n")[0]?.slice(25, 120) || "(empty log)";
        const why = `${run.error ?? run.status}: ${said}`;
        notStarted.set(why, (notStarted.get(why) ?? 0) + 1);
      }
      pending.delete(job);
    });
    if (pending.size > 0) await new Promise((r) => setTimeout(r, 1000));
  }
  if (pending.size > 0) notStarted.set("no finished run within 3 minutes", pending.size);
  // What each of these runs cost D1, as the objects counted it.
  const log = await readFile(join(stack.stateDir, "wrangler.log"), "utf8");
  const costs = [...log.matchAll(/\{"event":"cron\.run"[^\n]*\}/g)]
    .map((m) => JSON.parse(m[0]) as { jobName: string; d1Queries: number })
    .filter((e) => e.jobName.startsWith(`${label}-`) && e.jobName.endsWith(`-${due / 1000}`));
  const d1PerRun = costs.reduce((sum, e) => sum + e.d1Queries, 0) / Math.max(1, costs.length);
  const records = await nodeRecords(cronIds, due);
  return { lags: lags.sort((a, b) => a - b), runsPerJob, d1PerRun, loggedRuns: costs.length, notStarted, cpuPerRun, ...records };
}

/** The bare sandbox issue 21 holds dispatch to: no cgroup, network, user or disk; just the namespaces and `date`. */
const BARE_SANDBOX = ["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "date"];

/**
 * Milliseconds this machine takes to run `count` bare bubblewrap sandboxes, as
 * many at once as it has cores, and the machine's CPU per sandbox meanwhile.
 */
async function bareSandboxes(count: number): Promise<{ ms: number; cpuPerSandbox: number }> {
  const cpuBefore = machineCpuMs();
  const started = performance.now();
  await inParallel(
    Array.from({ length: count }, (_, i) => i),
    availableParallelism(),
    () =>
      new Promise<void>((resolve, reject) => {
        execFile("bwrap", BARE_SANDBOX, (err) => (err ? reject(err) : resolve()));
      }),
  );
  return { ms: performance.now() - started, cpuPerSandbox: (machineCpuMs() - cpuBefore) / count };
}

/** Accounts the "spread" shape spreads its jobs over, an app each. */
const SPREAD_ACCOUNTS = 10;

try {
  const one = [await tenant(stack.adminKey, 16, "cron-lag")];
  const spread = await Promise.all(
    Array.from({ length: SPREAD_ACCOUNTS }, async (_, i) => tenant(await newAccount(`cron-lag-${i}`), 2, `cron-lag-${i}`)),
  );
  console.log(`bench/cron-lag: scheduled second -> command start on the builder (the Worker + builder with ${BUILDER_CONCURRENCY} sandboxes at once, loopback)`);
  const baseline = await scenario(one, 1, "solo");
  const line = (label: string, r: Result) =>
    `  ${label.padEnd(26)} n=${String(r.lags.length).padStart(4)}  p50 ${fmt(percentile(r.lags, 50), 0).padStart(5)} ms  p99 ${fmt(percentile(r.lags, 99), 0).padStart(5)} ms  max ${fmt(r.lags.at(-1) ?? Number.NaN, 0).padStart(5)} ms  ` +
    `runs per job ${[...r.runsPerJob].map(([runs, jobs]) => `${runs}:${jobs}`).join(",")}  D1 statements per run ${fmt(r.d1PerRun, 2)} (${r.loggedRuns} runs logged)  ` +
    `CPU per run ${fmt(r.cpuPerRun.machine)} ms (Worker: dev server and workerd ${fmt(r.cpuPerRun.api)} ms, builder ${fmt(r.cpuPerRun.builder)} ms, ` +
    `its sandboxes ${fmt(r.cpuPerRun.sandboxes)} ms, PID 1 ${fmt(r.cpuPerRun.init)} ms)  load ${fmt(loadavg()[0]!, 2)}`;
  console.log(line("1 job (baseline)", baseline));
  const shapes = [
    { name: "one app", tenants: one },
    { name: `${SPREAD_ACCOUNTS} accounts`, tenants: spread },
  ];
  for (const count of counts) for (const shape of shapes) {
    // The floor is measured before the jobs exist and again after their minute; the faster of the two is the one held to.
    const floorBefore = await bareSandboxes(count);
    const result = await scenario(shape.tenants, count, `m${count}-${shape.tenants.length}`);
    console.log(line(`${count} jobs, ${shape.name}`, result));
    const split = (values: number[]) => `p50 ${fmt(percentile(values, 50), 0)} ms, p99 ${fmt(percentile(values, 99), 0)} ms`;
    console.log(
      `    where: scheduled second -> job reached the builder ${split(result.reached)}; -> builder started it ${split(result.started)}; -> the command's first line ${split(result.lags)} (${result.reached.length} node records)`,
    );
    console.log(
      `    ratio to baseline: p50 ${fmt(percentile(result.lags, 50) / percentile(baseline.lags, 50), 2)}x, max ${fmt((result.lags.at(-1) ?? 0) / (baseline.lags.at(-1) ?? 1), 2)}x`,
    );
    // The floor, measured right after the minute's runs on the same machine too: the target is p99 <= 1.0x of it (1.5x, issue 33).
    const floorAfter = await bareSandboxes(count);
    const floor = floorBefore.ms <= floorAfter.ms ? floorBefore : floorAfter;
    console.log(
      `    floor: ${count} bare bwrap sandboxes, ${availableParallelism()} at once: ${fmt(floorBefore.ms, 0)} ms before the jobs, ${fmt(floorAfter.ms, 0)} ms after their minute; ` +
        `p99 lag ${fmt(percentile(result.lags, 99) / floor.ms, 2)}x the faster (target <= 1.00, issue 33 <= 1.50); ` +
        `CPU per sandbox ${fmt(floor.cpuPerSandbox)} ms of the machine, a run ${fmt(result.cpuPerRun.machine / floor.cpuPerSandbox, 2)}x that`,
    );
    for (const [reason, jobs] of result.notStarted) console.log(`    ! ${jobs} jobs: ${reason}`);
  }
} finally {
  await stack.stop();
}
