import { type Bucket, percentile } from "../../durable-objects/app-metrics";
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

/** The app's request metrics over `range`, oldest step first, and the range's totals. */
export async function appMetrics(env: Env, appId: string, range: MetricRange, now = Date.now()): Promise<{ stepSeconds: number; points: MetricPoint[]; totals: Omit<MetricPoint, "at"> }> {
  const { ms, stepMs } = METRIC_RANGES[range];
  const buckets = await metricsStub(env, appId).series(now - ms, stepMs, now);
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
    points: buckets.map(({ at, ...rest }) => ({ at: new Date(at).toISOString(), ...point(rest) })),
    totals: point(all),
  };
}
