import { type Bucket, type DiskStep, percentile, type RunStep } from "../../durable-objects/app-metrics";
import type { Env } from "../env";

/** The ranges metrics are asked for, and the step each is summed into (60 to 120 points). */
export const METRIC_RANGES = {
  "1h": { ms: 3_600_000, stepMs: 60_000 },
  "24h": { ms: 24 * 3_600_000, stepMs: 15 * 60_000 },
  "7d": { ms: 7 * 24 * 3_600_000, stepMs: 2 * 3_600_000 },
  "30d": { ms: 30 * 24 * 3_600_000, stepMs: 6 * 3_600_000 },
} as const;
export type MetricRange = keyof typeof METRIC_RANGES;

/** One step of an app's request metrics, as the API gives it: its counts, and percentiles read from its histogram. */
export type MetricPoint = Omit<Bucket, "at" | "latency"> & {
  at: string;
  /** Latency percentiles (ms), null when the step had no request. */
  p50Ms: number | null;
  p95Ms: number | null;
  p99Ms: number | null;
};

export const metricsStub = (env: Env, appId: string) => env.APP_METRICS.get(env.APP_METRICS.idFromName(appId));

/** One step of a process's usage: CPU seconds it used, the most memory it held, its restarts (null: no report in the step). */
export type ProcessPoint = { at: string; cpuSeconds: number | null; memoryBytes: number | null; restarts: number };
export type ProcessMetrics = { id: string; memoryLimitBytes: number; points: ProcessPoint[] };

const iso = (at: number) => new Date(at).toISOString();

/** The app's request metrics over `range`, oldest step first, the range's totals, and each of its processes' usage. */
export async function appMetrics(
  env: Env,
  appId: string,
  range: MetricRange,
  now = Date.now(),
): Promise<{ stepSeconds: number; points: MetricPoint[]; totals: Omit<MetricPoint, "at">; processes: ProcessMetrics[] }> {
  const { ms, stepMs } = METRIC_RANGES[range];
  const stub = metricsStub(env, appId);
  const [buckets, processes] = await Promise.all([stub.series(now - ms, stepMs, now), stub.processSeries(now - ms, stepMs, now)]);
  const all = buckets.reduce(
    (sum, b) => ({
      requests: sum.requests + b.requests,
      s2xx: sum.s2xx + b.s2xx,
      s3xx: sum.s3xx + b.s3xx,
      s4xx: sum.s4xx + b.s4xx,
      s5xx: sum.s5xx + b.s5xx,
      bytes: sum.bytes + b.bytes,
      latency: sum.latency.map((count, i) => count + (b.latency[i] ?? 0)),
    }),
    { requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, bytes: 0, latency: buckets[0]?.latency.map(() => 0) ?? [] },
  );
  const point = ({ latency, ...counts }: typeof all) => ({ ...counts, p50Ms: percentile(latency, 0.5), p95Ms: percentile(latency, 0.95), p99Ms: percentile(latency, 0.99) });
  return {
    stepSeconds: stepMs / 1000,
    points: buckets.map(({ at, ...rest }) => ({ at: iso(at), ...point(rest) })),
    totals: point(all),
    processes: newestProcesses(processes).map(({ id, memoryLimitBytes, steps }) => ({ id, memoryLimitBytes, points: steps.map(({ at, ...rest }) => ({ at: iso(at), ...rest })) })),
  };
}

/** Processes a metrics answer names at most: every deploy starts new ones, so a month of an app can hold hundreds. */
export const MAX_PROCESSES_SHOWN = 20;

/** The {@link MAX_PROCESSES_SHOWN} processes that ran most recently in the range, in the order they were found. */
function newestProcesses<T extends { steps: { cpuSeconds: number | null; memoryBytes: number | null }[] }>(processes: T[]): T[] {
  if (processes.length <= MAX_PROCESSES_SHOWN) return processes;
  const lastSeen = (p: T) => p.steps.findLastIndex((s) => s.cpuSeconds !== null || s.memoryBytes !== null);
  const kept = new Set([...processes].sort((a, b) => lastSeen(b) - lastSeen(a)).slice(0, MAX_PROCESSES_SHOWN));
  return processes.filter((p) => kept.has(p));
}

/** A disk's use over `range`: the most in each step (null: not measured then), with its size and inode limit. */
export async function diskMetrics(
  env: Env,
  diskId: string,
  range: MetricRange,
  now = Date.now(),
): Promise<{ stepSeconds: number; sizeBytes: number | null; inodeLimit: number | null; points: (Omit<DiskStep, "at"> & { at: string })[] }> {
  const { ms, stepMs } = METRIC_RANGES[range];
  const { sizeBytes, inodeLimit, steps } = await metricsStub(env, diskId).diskSeries(now - ms, stepMs, now);
  return { stepSeconds: stepMs / 1000, sizeBytes, inodeLimit, points: steps.map(({ at, ...rest }) => ({ at: iso(at), ...rest })) };
}

/** Runs of a cron job in one step (or a range): how many, how many failed, their mean and longest durations. */
export type RunPoint = { runs: number; succeeded: number; failed: number; meanDurationMs: number | null; maxDurationMs: number | null };

/** A cron job's finished runs over `range`, oldest step first, and the range's totals. */
export async function cronMetrics(env: Env, cronId: string, range: MetricRange, now = Date.now()): Promise<{ stepSeconds: number; points: (RunPoint & { at: string })[]; totals: RunPoint }> {
  const { ms, stepMs } = METRIC_RANGES[range];
  const steps = await metricsStub(env, cronId).runSeries(now - ms, stepMs, now);
  const point = (s: Omit<RunStep, "at">): RunPoint => ({
    runs: s.runs,
    succeeded: s.runs - s.failed,
    failed: s.failed,
    meanDurationMs: s.runs === 0 ? null : Math.round(s.durationMsTotal / s.runs),
    maxDurationMs: s.maxDurationMs,
  });
  const all = steps.reduce(
    (sum, s) => ({ runs: sum.runs + s.runs, failed: sum.failed + s.failed, durationMsTotal: sum.durationMsTotal + s.durationMsTotal, maxDurationMs: s.maxDurationMs === null ? sum.maxDurationMs : Math.max(sum.maxDurationMs ?? 0, s.maxDurationMs) }),
    { runs: 0, failed: 0, durationMsTotal: 0, maxDurationMs: null as number | null },
  );
  return { stepSeconds: stepMs / 1000, points: steps.map(({ at, ...rest }) => ({ at: iso(at), ...point(rest) })), totals: point(all) };
}
