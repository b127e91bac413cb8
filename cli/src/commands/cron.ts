import { setTimeout as sleep } from "node:timers/promises";
import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type ApiClient, type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, CliError, fields, type Output, table, when } from "../output.js";
import { durationSeconds, positiveInteger } from "../parse.js";
import { confirmOrRefuse } from "../prompt.js";
import { rangeLine, SINCE_OPTION, sinceOf, stepTime } from "./metrics.js";

/** A cron job as created and listed. */
type CronJob = Schemas["Cron"];

/** `GET /v1/crons/:id` and PATCH add the run times. */
type CronDetail = Schemas["CronDetail"];

/** One run of a job, newest first in `GET /v1/crons/:id/runs`. */
type CronRun = Schemas["CronRun"];

type ConcurrencyPolicy = CronJob["concurrencyPolicy"];
const POLICIES = ["forbid", "allow", "replace"] as const satisfies readonly ConcurrencyPolicy[];

type RunStarted = ResponseData<"/v1/crons/{id}/run", "post", 202>;
type RunLog = ResponseData<"/v1/crons/{id}/runs/{jobName}/logs", "get", 200>;
type Deleted = ResponseData<"/v1/crons/{id}", "delete", 200>;
type CronMetrics = ResponseData<"/v1/crons/{id}/metrics", "get", 200>;

/** How often a followed run's status and log are read. */
const FOLLOW_INTERVAL_MS = 1000;

/** API field → flag, so VALIDATION_ERROR hints name what to fix. */
const CRON_FLAGS = {
  appId: "<app>",
  name: "--name",
  schedule: "--schedule",
  command: "--command",
  timezone: "--timezone",
  concurrencyPolicy: "--concurrency",
  timeoutSeconds: "--timeout",
  disableAfterFailures: "--disable-after",
  notifyAfterFailures: "--notify-after",
  id: "<id> (a cron_… id or a job name, from `svc cron list`)",
};

/** Error context for a call about one job. */
function aboutCron(what: string, ref: string, extra: Call["hints"] = {}): Call {
  return {
    what,
    flags: CRON_FLAGS,
    hints: { CRON_NOT_FOUND: `no cron job "${ref}" in this account: \`svc cron list\` shows the ids and names`, ...extra },
  };
}

/** Error context for a call about one run of a job. */
function aboutRun(what: string, ref: string, jobName: string): Call {
  return aboutCron(what, ref, { RUN_NOT_FOUND: `no run "${jobName}": \`svc cron runs ${ref}\` lists the job's runs` });
}

/** App names by id, so tables and details can say which app a job runs in. */
async function appNames(client: ApiClient): Promise<Map<string, string>> {
  const apps = await client.data<Schemas["App"][]>("GET", "/v1/apps", undefined, { what: "list apps" });
  return new Map(apps.map((a) => [a.id, a.name]));
}

/** A job's details as create, info and update all show them: the app by name and id. */
async function describeWithApp(client: ApiClient, job: CronJob & Partial<CronDetail>): Promise<string> {
  return describe(job, (await appNames(client)).get(job.appId));
}

/** `3600` → `1h`, `90` → `90s`: the largest unit that divides the value exactly. */
function seconds(value: number): string {
  const units: [number, string][] = [
    [86_400, "d"],
    [3600, "h"],
    [60, "m"],
  ];
  const unit = units.find(([size]) => value % size === 0);
  return unit ? `${value / unit[0]}${unit[1]}` : `${value}s`;
}

function describe(job: CronJob & Partial<CronDetail>, appName: string | undefined): string {
  const rows: [string, string][] = [
    ["id", job.id],
    ["name", job.name],
    ["app", appName ? `${appName} (${job.appId})` : job.appId],
    ["schedule", `${job.schedule} (${job.timezone})`],
    ["command", job.command],
    ["enabled", job.enabled ? "yes" : job.disabledReason ? `no: ${job.disabledReason} (svc cron enable ${job.name})` : "no (paused: svc cron update <id> --enable)"],
    ["disable after", job.disableAfterFailures === null ? "never" : `${job.disableAfterFailures} failed runs in a row`],
    [
      "notify after",
      job.notifyAfterFailures === 1 ? "1 failed run (cron.failed webhook for each)" : `${job.notifyAfterFailures} failed runs in a row (cron.failed webhook for each from then on)`,
    ],
    ["concurrency", job.concurrencyPolicy],
    ["timeout", seconds(job.timeoutSeconds)],
  ];
  if (job.nextRuns !== undefined) {
    rows.push(["last run", when(job.lastRun)], ["next run", when(job.nextRun, "none")]);
    rows.push(["next runs", job.nextRuns.length ? job.nextRuns.join("\n") : "none"]);
  }
  rows.push(["created", when(job.createdAt)], ["updated", when(job.updatedAt)]);
  return fields(rows);
}

/** A run's state as people read it: `queued` while the builder holds it for a slot, else its status. */
function state(run: Pick<CronRun, "status" | "phase">): string {
  return run.status === "running" && run.phase === "queued" ? "queued" : run.status;
}

function outcome(run: CronRun): string {
  if (run.status === "running") return state(run);
  const detail = run.error ?? (run.exitCode === null ? undefined : `exit code ${run.exitCode}`);
  return detail ? `${run.status} (${detail})` : run.status;
}

/** `1234` → `1.2 s`, `75000` → `75 s`; "-" for none. */
function runTime(ms: number | null): string {
  if (ms === null) return "-";
  return ms < 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
}

function duration(run: CronRun): string {
  return run.finishedAt ? runTime(Date.parse(run.finishedAt) - Date.parse(run.startedAt)) : "-";
}

/** The options create and update share, parsed into the API's fields. */
const TUNING = {
  timezone: { type: "string", value: "zone", description: "IANA time zone the schedule is read in (default UTC), e.g. Europe/Berlin" },
  concurrency: {
    type: "string",
    value: "policy",
    description: "when a run is due while one still runs: forbid (skip it, default), allow, replace",
  },
  timeout: { type: "string", value: "duration", description: "kill a run after this long: 90s, 15m, 1h (default 1h, at most 12h)" },
  "disable-after": { type: "string", value: "n|never", description: "disable the job by itself after n failed runs in a row (never: it keeps running)" },
  "notify-after": {
    type: "string",
    value: "N",
    description: "send the cron.failed webhook only from N failed runs in a row on (default 1: every failed run)",
  },
} as const;

type Tuning = {
  timezone?: string;
  concurrencyPolicy?: ConcurrencyPolicy;
  timeoutSeconds?: number;
  disableAfterFailures?: number | null;
  notifyAfterFailures?: number;
};

function tuning(
  opts: {
    timezone: string | undefined;
    concurrency: string | undefined;
    timeout: string | undefined;
    "disable-after": string | undefined;
    "notify-after": string | undefined;
  },
  fail: (message: string) => Error,
): Tuning {
  const body: Tuning = {};
  if (opts.timezone !== undefined) body.timezone = opts.timezone;
  if (opts.concurrency !== undefined) {
    const policy = POLICIES.find((p) => p === opts.concurrency);
    if (!policy) throw fail(`--concurrency must be one of ${POLICIES.join(", ")}, got "${opts.concurrency}"`);
    body.concurrencyPolicy = policy;
  }
  if (opts.timeout !== undefined) body.timeoutSeconds = durationSeconds(opts.timeout, "--timeout", fail);
  const after = opts["disable-after"];
  if (after !== undefined) body.disableAfterFailures = after === "never" ? null : positiveInteger(after, "--disable-after", fail);
  const notify = opts["notify-after"];
  if (notify !== undefined) body.notifyAfterFailures = positiveInteger(notify, "--notify-after", fail);
  return body;
}

/** Which run of which job a follower watches, with the reference the user typed for hints. */
type RunTarget = { ref: string; jobName: string };

/**
 * Prints a run's log as it grows (complete lines only, until the end) and
 * returns the run once it has finished. The status is read before the log,
 * so the log read after a finished status is the stored, final one.
 */
async function follow(client: ApiClient, target: RunTarget, print: ((line: string) => void) | undefined): Promise<CronRun> {
  const { ref, jobName } = target;
  let printed = 0;
  for (;;) {
    const runs = await client.data<CronRun[]>("GET", path`/v1/crons/${ref}/runs`, undefined, aboutCron(`list runs of cron job ${ref}`, ref));
    const run = runs.find((r) => r.jobName === jobName);
    const { logs } = await client.data<RunLog>(
      "GET",
      path`/v1/crons/${ref}/runs/${jobName}/logs`,
      undefined,
      aboutRun(`read the log of run ${jobName}`, ref, jobName),
    );
    const finished = run !== undefined && run.status !== "running";
    const lines = logs.split("\n");
    const partial = lines.pop() ?? "";
    if (finished && partial !== "") lines.push(partial);
    if (print) for (const line of lines.slice(printed)) print(line);
    printed = Math.max(printed, lines.length);
    if (finished) return run;
    await sleep(FOLLOW_INTERVAL_MS);
  }
}

/** The fix-it line for a failed run, by what its error says. */
function runHint(run: CronRun, target: RunTarget): string {
  if (run.exitCode === 127 || run.error?.includes("command not found")) {
    return "the command does not exist in the app's environment: define the script or install the binary";
  }
  if (run.error?.startsWith("timed out")) return `make the command faster or raise the limit: svc cron update ${target.ref} --timeout 2h`;
  return `the log shows what the command printed: svc cron logs ${target.ref} ${target.jobName}`;
}

const ID_ARG = { name: "id", description: "cron job id (cron_…) or name" } as const;

/** Unquoted, `0 3 * * *` reaches svc as five words, each * already replaced by the names of the files around. */
const SCHEDULE_QUOTE_HINT =
  'quote the schedule, it is one argument: --schedule "0 3 * * *" (unquoted, the shell splits it into words and turns each * into file names)';
const RUN_ARGS = [ID_ARG, { name: "job_name", description: "the run's name, from svc cron runs" }] as const;

const create = defineCommand({
  name: "create",
  summary: "Create a cron job that runs a command in an app's environment",
  description: `The schedule has five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12)
day-of-week (0-7, 0 and 7 are Sunday), with *, lists (1,15), ranges (1-5) and steps (*/15).
The command gets the app's env vars and its disk.`,
  args: [APP_ARG],
  options: {
    name: { type: "string", value: "name", description: "job name, unique in the account (a DNS label, e.g. nightly-report)", required: true },
    schedule: { type: "string", value: "expr", description: 'five-field cron expression, quoted, e.g. "0 3 * * *"', required: true, quoteHint: SCHEDULE_QUOTE_HINT },
    command: { type: "string", value: "cmd", description: "shell command to run", required: true },
    ...TUNING,
    disabled: { type: "boolean", description: "create it paused: it runs nothing until `svc cron enable`" },
  },
  examples: [
    'svc cron create --app my-app --name nightly-report --schedule "0 3 * * *" --command "npm run report"',
    'svc cron create --name cleanup --schedule "0 * * * *" --command "./cleanup.sh" --disabled   # app from svc.json',
    'svc cron create --app api --name sync --schedule "*/15 9-17 * * 1-5" --command "./sync.sh" --timezone Europe/Berlin --timeout 10m',
  ],
  async run({ args, opts, out, api, fail }) {
    const body = {
      appId: args.app,
      name: opts.name,
      schedule: opts.schedule,
      command: opts.command,
      ...tuning(opts, fail),
      ...(opts.disabled ? { enabled: false } : {}),
    };
    const client = await api();
    const job = await client.data<CronJob>("POST", "/v1/crons", body, {
      what: `create cron job ${opts.name} in app ${args.app}`,
      flags: CRON_FLAGS,
      hints: {
        APP_NOT_FOUND: `no app "${args.app}" in this account: \`svc apps list\` shows the names and ids`,
        NAME_TAKEN: "this account already has a cron job with that name: choose another --name",
      },
    });
    out.result(job, out.json ? undefined : `Created cron job ${job.name}\n${await describeWithApp(client, job)}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List the account's cron jobs",
  options: {},
  async run({ out, api }) {
    const client = await api();
    const jobs = await client.data<CronJob[]>("GET", "/v1/crons", undefined, { what: "list cron jobs" });
    if (out.json || jobs.length === 0) {
      out.result(jobs, 'No cron jobs yet. Create one: svc cron create --app <app> --name <name> --schedule "<expr>" --command <cmd>');
      return;
    }
    const names = await appNames(client);
    out.result(
      jobs,
      table(jobs, [
        ["ID", (j) => j.id],
        ["NAME", (j) => j.name],
        ["APP", (j) => names.get(j.appId) ?? j.appId],
        ["SCHEDULE", (j) => (j.timezone === "UTC" ? j.schedule : `${j.schedule} (${j.timezone})`)],
        ["ENABLED", (j) => (j.enabled ? "yes" : "no")],
        ["COMMAND", (j) => j.command],
      ]),
    );
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show a cron job with its last and next runs",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const client = await api();
    const job = await client.data<CronDetail>("GET", path`/v1/crons/${args.id}`, undefined, aboutCron(`show cron job ${args.id}`, args.id));
    out.result(job, out.json ? undefined : await describeWithApp(client, job));
  },
});

const update = defineCommand({
  name: "update",
  summary: "Change a cron job; only the given options change",
  args: [ID_ARG],
  options: {
    schedule: { type: "string", value: "expr", description: 'new five-field cron expression, quoted, e.g. "30 2 * * *"', quoteHint: SCHEDULE_QUOTE_HINT },
    command: { type: "string", value: "cmd", description: "new command" },
    ...TUNING,
    enable: { type: "boolean", description: "resume a paused job" },
    disable: { type: "boolean", description: "pause the job (runs nothing until --enable)" },
  },
  examples: [
    'svc cron update nightly-report --schedule "30 2 * * *"',
    "svc cron update cron_4fJ8kQ2mX9pR1sT6uV3wY7zA --disable",
    "svc cron update nightly-report --notify-after 3",
  ],
  async run({ args, opts, out, api, fail }) {
    if (opts.enable && opts.disable) throw fail("use either --enable or --disable, not both");
    const body = {
      ...(opts.schedule === undefined ? {} : { schedule: opts.schedule }),
      ...(opts.command === undefined ? {} : { command: opts.command }),
      ...tuning(opts, fail),
      ...(opts.enable || opts.disable ? { enabled: opts.enable } : {}),
    };
    if (Object.keys(body).length === 0) {
      throw fail("nothing to change: pass at least one of --schedule, --command, --timezone, --concurrency, --timeout, --disable-after, --notify-after, --enable, --disable");
    }
    const client = await api();
    const job = await client.data<CronDetail>("PATCH", path`/v1/crons/${args.id}`, body, aboutCron(`update cron job ${args.id}`, args.id));
    out.result(job, out.json ? undefined : `Updated cron job ${job.name}\n${await describeWithApp(client, job)}`);
  },
});

/** `svc cron enable` and `svc cron disable`: what `svc cron update --enable/--disable` does, under the names people try first. */
function toggle(enabled: boolean) {
  const verb = enabled ? "enable" : "disable";
  return defineCommand({
    name: verb,
    summary: enabled ? "Resume a paused cron job" : "Pause a cron job: it runs nothing until `svc cron enable` (a run in progress goes on)",
    args: [ID_ARG],
    options: {},
    examples: [`svc cron ${verb} nightly-report`],
    async run({ args, out, api }) {
      const client = await api();
      const job = await client.data<CronDetail>("PATCH", path`/v1/crons/${args.id}`, { enabled }, aboutCron(`${verb} cron job ${args.id}`, args.id));
      const next = job.nextRuns[0];
      const human = enabled
        ? `Enabled cron job ${job.name}${next ? `; next run ${when(next)}` : ""}`
        : `Disabled cron job ${job.name}: no scheduled runs until \`svc cron enable ${args.id}\``;
      out.result(job, human);
    },
  });
}

/** Follows a run to its end, printing the log (not with --json); a failed run is an error (exit 1). */
async function waitForRun(client: ApiClient, out: Output, target: RunTarget): Promise<void> {
  const run = await follow(client, target, out.json ? undefined : (line) => out.text(line));
  if (run.status === "success") {
    out.result(run, `Run ${run.jobName} succeeded after ${duration(run)}`);
    return;
  }
  if (out.json) out.result(run);
  const why = run.error ?? (run.exitCode === null ? "no reason recorded" : `exit code ${run.exitCode}`);
  throw new CliError(`run ${run.jobName} failed`, [why], runHint(run, target));
}

const run = defineCommand({
  name: "run",
  summary: "Run a cron job once, now",
  description: "Prints the run's name. With --wait, prints the log as it runs and exits 1 if the run fails.",
  args: [ID_ARG],
  options: { wait: { type: "boolean", description: "follow the run to its end, printing its log" } },
  examples: ["svc cron run nightly-report --wait"],
  async run({ args, opts, out, api }) {
    const client = await api();
    const started = await client.data<RunStarted>(
      "POST",
      path`/v1/crons/${args.id}/run`,
      undefined,
      aboutCron(`run cron job ${args.id}`, args.id, {
        APP_STOPPED: `stopped apps run no cron jobs: start the app with \`svc apps restart --app <app>\` (\`svc cron info ${args.id}\` names it)`,
        RUN_IN_PROGRESS: `the job's concurrency policy is forbid: wait for that run (\`svc cron runs ${args.id}\`), cancel it (\`svc cron cancel ${args.id} <run>\`), or let runs overlap: \`svc cron update ${args.id} --concurrency allow\``,
        TOO_MANY_JOBS: `the account's queued jobs start as its running ones end: \`svc cron runs ${args.id}\` shows them; cancel some, or wait`,
      }),
    );
    const target = { ref: args.id, jobName: started.jobName };
    const begun =
      started.phase === "queued"
        ? `Queued run ${started.jobName}: the account runs as many jobs as its plan allows at once; it starts when one ends`
        : `Started run ${started.jobName}`;
    if (!opts.wait) {
      out.result(started, begun);
      if (!out.json) out.note(`Follow it: svc cron logs ${args.id} ${started.jobName} --follow`);
      return;
    }
    out.step(begun);
    await waitForRun(client, out, target);
  },
});

const runs = defineCommand({
  name: "runs",
  summary: "List a cron job's runs, newest first (the last 100 are kept)",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const client = await api();
    const list = await client.data<CronRun[]>("GET", path`/v1/crons/${args.id}/runs`, undefined, aboutCron(`list runs of cron job ${args.id}`, args.id));
    const human =
      list.length === 0
        ? `No runs of cron job ${args.id} yet. Start one: svc cron run ${args.id}`
        : table(list, [
            ["JOB NAME", (r) => r.jobName],
            ["STATUS", state],
            ["TRIGGER", (r) => r.trigger],
            ["STARTED", (r) => ago(r.startedAt)],
            ["DURATION", duration],
            ["EXIT", (r) => (r.exitCode === null ? "-" : String(r.exitCode))],
            ["ERROR", (r) => r.error ?? ""],
          ]);
    out.result(list, human);
  },
});

const logs = defineCommand({
  name: "logs",
  summary: "Print a run's log (the newest run's unless named)",
  description: "Lines read `<time> <out|err|svc> <text>`. Without <job_name>, the job's newest run. With --follow, prints new lines\nuntil the run has finished.",
  args: [ID_ARG],
  optionalArg: { name: "job_name", description: "the run's name, from svc cron runs (default: the newest run)" },
  options: { follow: { type: "boolean", short: "f", description: "keep printing new lines until the run has finished" } },
  examples: [
    "svc cron logs nightly-report",
    "svc cron logs nightly-report nightly-report-1795237200",
    "svc cron logs nightly-report manual-k2x9qa-1795237342 --follow",
  ],
  async run({ args, opts, out, api }) {
    const client = await api();
    let jobName = args.job_name;
    if (jobName === undefined) {
      const runs = await client.data<CronRun[]>("GET", path`/v1/crons/${args.id}/runs`, undefined, aboutCron(`list the runs of cron job ${args.id}`, args.id));
      const newest = runs[0];
      if (!newest) throw new CliError(`cron job ${args.id} has not run yet`, [], `run it now: svc cron run ${args.id}`);
      out.note(`Newest run of cron job ${args.id}: ${newest.jobName} (${newest.status})`);
      jobName = newest.jobName;
    }
    const target = { ref: args.id, jobName };
    if (opts.follow) {
      const run = await follow(client, target, out.json ? undefined : (line) => out.text(line));
      if (out.json) await printLog(client, out, target);
      else out.note(`Run ${run.jobName} finished: ${outcome(run)}`);
      return;
    }
    await printLog(client, out, target);
  },
});

async function printLog(client: ApiClient, out: Output, { ref, jobName }: RunTarget): Promise<void> {
  const log = await client.data<RunLog>(
    "GET",
    path`/v1/crons/${ref}/runs/${jobName}/logs`,
    undefined,
    aboutRun(`read the log of run ${jobName}`, ref, jobName),
  );
  if (out.json) out.result(log);
  else if (log.logs === "") out.note(`The log of run ${jobName} is empty.`);
  else out.text(log.logs);
}

const cancel = defineCommand({
  name: "cancel",
  summary: "Cancel a running run (its processes are killed)",
  args: RUN_ARGS,
  options: {},
  async run({ args, out, api }) {
    const client = await api();
    const call = aboutRun(`cancel run ${args.job_name}`, args.id, args.job_name);
    const before = (await client.data<CronRun[]>("GET", path`/v1/crons/${args.id}/runs`, undefined, call)).find((r) => r.jobName === args.job_name);
    if (before && before.status !== "running") {
      out.result(before, `Run ${before.jobName} had already finished: ${outcome(before)}`);
      return;
    }
    const run = await client.data<CronRun>("POST", path`/v1/crons/${args.id}/runs/${args.job_name}/cancel`, undefined, call);
    out.result(run, run.error === "cancelled" ? `Cancelled run ${run.jobName}` : `Run ${run.jobName} finished before it could be cancelled: ${outcome(run)}`);
  },
});

const metrics = defineCommand({
  name: "metrics",
  summary: "Show a cron job's finished runs over time: outcomes and durations",
  description: `Runs that finished in each step, succeeded and failed (failed, timed out or lost), with their mean
and longest duration: --since 1h (1-minute steps), 24h (15 minutes), 7d (2 hours), 30d (6 hours). Steps
without a finished run are left out of the table (--json has every step). More: docs/metrics.md.`,
  args: [ID_ARG],
  options: { since: SINCE_OPTION },
  examples: ["svc cron metrics nightly-report", "svc cron metrics nightly-report --since 7d --json"],
  async run({ args, opts, out, api, fail }) {
    const since = sinceOf(opts.since, fail);
    const data = await (await api()).data<CronMetrics>(
      "GET",
      `${path`/v1/crons/${args.id}/metrics`}?since=${since}`,
      undefined,
      aboutCron(`show the metrics of cron job ${args.id}`, args.id),
    );
    const t = data.totals;
    const head = fields([
      ["range", rangeLine(since, data.stepSeconds)],
      ["runs", `${t.runs} (${t.succeeded} ok, ${t.failed} failed)`],
      ["duration", `mean ${runTime(t.meanDurationMs)}, max ${runTime(t.maxDurationMs)}`],
    ]);
    const finished = data.points.filter((p) => p.runs > 0);
    const rows =
      finished.length === 0
        ? `No run of cron job ${args.id} finished in the last ${since}.`
        : table(finished, [
            ["TIME", (p) => stepTime(p.at)],
            ["RUNS", (p) => String(p.runs)],
            ["OK", (p) => String(p.succeeded)],
            ["FAILED", (p) => String(p.failed)],
            ["MEAN", (p) => runTime(p.meanDurationMs)],
            ["MAX", (p) => runTime(p.maxDurationMs)],
          ]);
    out.result(data, `${head}\n\n${rows}`);
  },
});

const remove = defineCommand({
  name: "delete",
  summary: "Delete a cron job with its schedule, runs and logs",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: [ID_ARG],
  options: { yes: YES_OPTION },
  examples: ["svc cron delete nightly-report --yes"],
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `delete cron job ${args.id}`,
      question: `Delete cron job ${args.id} with its runs and logs? This cannot be undone.`,
      retry: `svc cron delete ${args.id}`,
    });
    const client = await api();
    const deleted = await client.data<Deleted>("DELETE", path`/v1/crons/${args.id}`, undefined, aboutCron(`delete cron job ${args.id}`, args.id));
    out.result(deleted, `Deleted cron job ${args.id}${args.id === deleted.id ? "" : ` (${deleted.id})`}`);
  },
});

/** `svc cron …`: scheduled commands in an app's environment, their runs and logs. */
export const cron: Group = {
  name: "cron",
  summary: "Manage cron jobs, their runs and logs",
  commands: [create, list, info, update, toggle(true), toggle(false), run, runs, logs, metrics, cancel, remove],
};
