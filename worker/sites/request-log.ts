import { type Bucket, LATENCY_BOUNDS_MS, latencyBucket } from "../../durable-objects/app-metrics";
import { openDb } from "../db/client";
import { requestLogs } from "../db/schema";
import { configOf, type Env } from "../env";
import { metricsStub } from "../services/metrics";

export type RequestLogEntry = typeof requestLogs.$inferInsert;

/** Entries written per flush; D1 binds at most 100 parameters per statement (7 columns each). */
const CHUNK = 14;
const FLUSH_DELAY_MS = 1_000;

let buffer: RequestLogEntry[] = [];
let pending: Promise<void> | null = null;

/**
 * Request logging and metrics off the serving path: entries collect in the
 * isolate and are written in batches about once a second inside
 * `waitUntil`, so a request never waits for D1 and a burst costs one write
 * per chunk, not per request; the same flush sums them into minute buckets
 * per app and hands each app's to its AppMetrics object (one call per app),
 * unless METRICS is "off".
 */
export function logRequest(env: Env, entry: RequestLogEntry, waitUntil: (p: Promise<unknown>) => void): void {
  buffer.push(entry);
  if (pending) return;
  pending = new Promise<void>((resolve) => setTimeout(resolve, FLUSH_DELAY_MS)).then(async () => {
    const entries = buffer;
    buffer = [];
    pending = null;
    const orm = openDb(env.DB);
    const statements = [];
    for (let i = 0; i < entries.length; i += CHUNK) statements.push(orm.insert(requestLogs).values(entries.slice(i, i + CHUNK)));
    const [first, ...rest] = statements;
    const writes: Promise<unknown>[] = [];
    if (first) writes.push(orm.batch([first, ...rest]).catch((err: unknown) => console.error("request log write failed", err)));
    const buckets = configOf(env).METRICS === "on" ? minuteBuckets(entries) : new Map<string, Bucket[]>();
    for (const [appId, appBuckets] of buckets) {
      writes.push(
        metricsStub(env, appId)
          .record(appBuckets)
          .catch((err: unknown) => console.error("request metrics write failed", err)),
      );
    }
    await Promise.all(writes);
  });
  waitUntil(pending);
}

/** The entries summed per app and minute. */
export function minuteBuckets(entries: RequestLogEntry[]): Map<string, Bucket[]> {
  const byApp = new Map<string, Map<number, Bucket>>();
  for (const entry of entries) {
    const minute = entry.at - (entry.at % 60_000);
    let minutes = byApp.get(entry.appId);
    if (!minutes) {
      minutes = new Map();
      byApp.set(entry.appId, minutes);
    }
    let bucket = minutes.get(minute);
    if (!bucket) {
      bucket = { at: minute, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, bytes: 0, latency: new Array<number>(LATENCY_BOUNDS_MS.length).fill(0) };
      minutes.set(minute, bucket);
    }
    bucket.requests++;
    if (entry.status >= 500) bucket.s5xx++;
    else if (entry.status >= 400) bucket.s4xx++;
    else if (entry.status >= 300) bucket.s3xx++;
    else bucket.s2xx++;
    bucket.bytes += entry.bytes;
    bucket.latency[latencyBucket(entry.durationMs)]!++;
  }
  return new Map([...byApp].map(([appId, minutes]) => [appId, [...minutes.values()]]));
}
