import type { ResponseData } from "../../../openapi/types.js";
import { path } from "../api.js";
import { APP_ARG, defineCommand } from "../command.js";
import { fields, table } from "../output.js";
import { formatBytes } from "../progress.js";

type Metrics = ResponseData<"/v1/apps/{app}/metrics", "get", 200>;

const RANGES = ["1h", "24h", "7d", "30d"] as const;

/** The `--since` option of every metrics command (`svc metrics`, `svc disk metrics`, `svc cron metrics`). */
export const SINCE_OPTION = { type: "string", value: "range", description: "1h (default), 24h, 7d or 30d" } as const;

/** The range `--since` asks for, checked before any request is sent. */
export function sinceOf(since: string | undefined, fail: (message: string) => Error): string {
  const range = since ?? "1h";
  if (!(RANGES as readonly string[]).includes(range)) throw fail(`--since must be one of ${RANGES.join(", ")}, got "${range}"`);
  return range;
}

/** The head line naming the range and its steps: "last 1h, 1 min steps". */
export const rangeLine = (since: string, stepSeconds: number) =>
  `last ${since}, ${stepSeconds / 60 >= 60 ? `${stepSeconds / 3600} h` : `${stepSeconds / 60} min`} steps`;

/** A step's start as the tables show it: `2026-11-24 03:15` (UTC). */
export const stepTime = (at: string) => at.replace("T", " ").slice(0, 16);

const ms = (value: number | null) => (value === null ? "-" : value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`);

/** The CPU of every process that reported in step `i`, as a percent of one core; null when none reported. */
function cpuPercent(data: Metrics, i: number): number | null {
  const reported = data.processes.map((p) => p.points[i]?.cpuSeconds ?? null).filter((s): s is number => s !== null);
  return reported.length === 0 ? null : (reported.reduce((sum, s) => sum + s, 0) / data.stepSeconds) * 100;
}

/** The most memory any process held in step `i`; null when none reported. */
function memoryPeak(data: Metrics, i: number): number | null {
  const reported = data.processes.map((p) => p.points[i]?.memoryBytes ?? null).filter((b): b is number => b !== null);
  return reported.length === 0 ? null : Math.max(...reported);
}

/** "3 (limit 256 MiB), 1 restart": the processes that ran in the range. */
function processesLine(data: Metrics): string {
  const limits = [...new Set(data.processes.map((p) => formatBytes(p.memoryLimitBytes)))];
  const restarts = data.processes.reduce((sum, p) => sum + p.points.reduce((n, point) => n + point.restarts, 0), 0);
  return `${data.processes.length} (memory limit ${limits.join(", ")}), ${restarts} restart${restarts === 1 ? "" : "s"}`;
}

/** `svc metrics <app>`: the app's requests, errors and latency at the edge, and its processes' CPU and memory, as a compact table. */
export const metrics = defineCommand({
  name: "metrics",
  summary: "Show an app's requests, errors and latency at the edge, and its processes' CPU and memory",
  description: `Requests by status class, bytes out and latency percentiles (p50, p95, p99) as the edge measured them,
and the CPU and memory of the app's processes as their nodes read them every 10 s, in steps:
--since 1h (1 minute), 24h (15 minutes), 7d (2 hours), 30d (6 hours). CPU is the processes' CPU time
in the step as a percent of one core, summed over the processes (100% = one core busy all the step);
MEM is the most memory one process held in the step. Steps without requests or process readings are
left out of the table (--json has every step, and each process's own). Requests are about a second
behind, processes up to 10 s. More: docs/metrics.md.`,
  args: [APP_ARG],
  options: { since: SINCE_OPTION },
  examples: ["svc metrics web", "svc metrics web --since 24h --json"],
  async run({ args, opts, out, api, fail }) {
    const since = sinceOf(opts.since, fail);
    const data = await (await api()).data<Metrics>("GET", `${path`/v1/apps/${args.app}/metrics`}?since=${since}`, undefined, {
      what: `show the metrics of app ${args.app}`,
      hints: { APP_NOT_FOUND: `no app "${args.app}" in this account: \`svc apps list\` shows the names and ids` },
    });
    const t = data.totals;
    const errors = t.requests === 0 ? "-" : `${(((t.s5xx + t.s4xx) / t.requests) * 100).toFixed(1)} % (${t.s4xx} 4xx, ${t.s5xx} 5xx)`;
    const head = fields([
      ["range", rangeLine(since, data.stepSeconds)],
      ["requests", `${t.requests} (${t.s2xx} 2xx, ${t.s3xx} 3xx, ${t.s4xx} 4xx, ${t.s5xx} 5xx)`],
      ["errors", errors],
      ["latency", `p50 ${ms(t.p50Ms)}, p95 ${ms(t.p95Ms)}, p99 ${ms(t.p99Ms)}`],
      ["bytes out", formatBytes(t.bytes)],
      ["processes", data.processes.length === 0 ? "none ran" : processesLine(data)],
    ]);
    const steps = data.points.map((point, i) => ({ point, cpu: cpuPercent(data, i), mem: memoryPeak(data, i) }));
    const busy = steps.filter((s) => s.point.requests > 0 || s.cpu !== null || s.mem !== null);
    const rows =
      busy.length === 0
        ? `No requests and no process readings in the last ${since}.`
        : table(busy, [
            ["TIME", (s) => stepTime(s.point.at)],
            ["REQUESTS", (s) => String(s.point.requests)],
            ["2XX", (s) => String(s.point.s2xx)],
            ["3XX", (s) => String(s.point.s3xx)],
            ["4XX", (s) => String(s.point.s4xx)],
            ["5XX", (s) => String(s.point.s5xx)],
            ["P50", (s) => ms(s.point.p50Ms)],
            ["P95", (s) => ms(s.point.p95Ms)],
            ["P99", (s) => ms(s.point.p99Ms)],
            ["BYTES", (s) => formatBytes(s.point.bytes)],
            ["CPU", (s) => (s.cpu === null ? "-" : `${s.cpu.toFixed(1)}%`)],
            ["MEM", (s) => (s.mem === null ? "-" : formatBytes(s.mem))],
          ]);
    out.result(data, `${head}\n\n${rows}`);
  },
});
