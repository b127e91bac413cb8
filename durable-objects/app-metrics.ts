import { DurableObject } from "cloudflare:workers";
import type { Env } from "../worker/env";

/**
 * An app's request metrics (docs/metrics.md): one SQLite-backed object per
 * app holding minute buckets for 7 days and hour buckets for 30 days. The
 * edge never calls it per request: each isolate's request log already
 * batches the app's requests about once a second (worker/sites/request-log.ts),
 * and that flush, off the serving path, adds one call per app with the
 * minutes it saw, summed here.
 *
 * A bucket holds requests by status class, bytes out and a latency
 * histogram over {@link LATENCY_BOUNDS_MS}; percentiles are read from it
 * (the bound of the bucket holding the rank, so at most one bucket's width
 * high: ~19 % above 1 ms).
 */

/** Upper bounds (ms) of the latency histogram's buckets, each 1.19× the one before (the last holds everything slower). */
export const LATENCY_BOUNDS_MS = Array.from({ length: 64 }, (_, i) => Math.round(1.19 ** i * 100) / 100);

/** One minute (or hour) of an app's requests. */
export type Bucket = {
  /** Start of the bucket (epoch ms, a whole minute or hour). */
  at: number;
  requests: number;
  /** Requests by status class: 1xx/2xx, 3xx, 4xx, 5xx. */
  s2xx: number;
  s3xx: number;
  s4xx: number;
  s5xx: number;
  bytes: number;
  /** Counts per {@link LATENCY_BOUNDS_MS} bucket. */
  latency: number[];
};

const MINUTE_MS = 60_000;
const HOUR_MS = 60 * MINUTE_MS;
const MINUTES_KEPT_MS = 7 * 24 * HOUR_MS;
const HOURS_KEPT_MS = 30 * 24 * HOUR_MS;
/** Old buckets are dropped at most this often. */
const PRUNE_EVERY_MS = HOUR_MS;

/** The histogram bucket of a duration. */
export function latencyBucket(ms: number): number {
  let low = 0;
  let high = LATENCY_BOUNDS_MS.length - 1;
  while (low < high) {
    const mid = (low + high) >> 1;
    if (ms <= LATENCY_BOUNDS_MS[mid]!) high = mid;
    else low = mid + 1;
  }
  return low;
}

/** The duration below which `share` of a histogram's requests took (the upper bound of its bucket); null when empty. */
export function percentile(latency: number[], share: number): number | null {
  const total = latency.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  const rank = Math.ceil(total * share);
  let seen = 0;
  for (const [i, count] of latency.entries()) {
    seen += count;
    if (seen >= rank) return LATENCY_BOUNDS_MS[i]!;
  }
  return LATENCY_BOUNDS_MS.at(-1)!;
}

type Row = { at: number; requests: number; s2xx: number; s3xx: number; s4xx: number; s5xx: number; bytes: number; latency: string };

export class AppMetrics extends DurableObject<Env> {
  #ready = false;

  private get sql(): SqlStorage {
    if (!this.#ready) {
      for (const table of ["minutes", "hours"]) {
        this.ctx.storage.sql.exec(
          `CREATE TABLE IF NOT EXISTS ${table} (at INTEGER PRIMARY KEY, requests INTEGER NOT NULL, s2xx INTEGER NOT NULL, s3xx INTEGER NOT NULL, s4xx INTEGER NOT NULL, s5xx INTEGER NOT NULL, bytes INTEGER NOT NULL, latency TEXT NOT NULL)`,
        );
      }
      this.#ready = true;
    }
    return this.ctx.storage.sql;
  }

  /** Adds what an isolate saw, minute by minute, to the minute and hour buckets; drops what is past its keeping. */
  async record(buckets: Bucket[]): Promise<void> {
    const sql = this.sql;
    for (const bucket of buckets) {
      for (const [table, at] of [
        ["minutes", bucket.at - (bucket.at % MINUTE_MS)],
        ["hours", bucket.at - (bucket.at % HOUR_MS)],
      ] as const) {
        const found = sql.exec<Row>(`SELECT * FROM ${table} WHERE at = ?`, at).toArray()[0];
        const latency = found ? (JSON.parse(found.latency) as number[]) : new Array<number>(LATENCY_BOUNDS_MS.length).fill(0);
        for (const [i, count] of bucket.latency.entries()) latency[i] = (latency[i] ?? 0) + count;
        sql.exec(
          `INSERT OR REPLACE INTO ${table} (at, requests, s2xx, s3xx, s4xx, s5xx, bytes, latency) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
          at,
          (found?.requests ?? 0) + bucket.requests,
          (found?.s2xx ?? 0) + bucket.s2xx,
          (found?.s3xx ?? 0) + bucket.s3xx,
          (found?.s4xx ?? 0) + bucket.s4xx,
          (found?.s5xx ?? 0) + bucket.s5xx,
          (found?.bytes ?? 0) + bucket.bytes,
          JSON.stringify(latency),
        );
      }
    }
    const now = Date.now();
    const pruned = this.ctx.storage.kv.get<number>("prunedAt") ?? 0;
    if (now - pruned > PRUNE_EVERY_MS) {
      sql.exec("DELETE FROM minutes WHERE at < ?", now - MINUTES_KEPT_MS);
      sql.exec("DELETE FROM hours WHERE at < ?", now - HOURS_KEPT_MS);
      this.ctx.storage.kv.put("prunedAt", now);
    }
  }

  /**
   * The buckets from `from` to now, summed into steps of `stepMs` (a whole
   * number of minutes, or of hours when asked for more than 7 days), every
   * step present (empty ones as zero), oldest first.
   */
  async series(from: number, stepMs: number, now = Date.now()): Promise<Bucket[]> {
    const table = stepMs >= HOUR_MS && now - from > MINUTES_KEPT_MS ? "hours" : "minutes";
    const unit = table === "hours" ? HOUR_MS : MINUTE_MS;
    const step = Math.max(unit, stepMs - (stepMs % unit));
    const start = from - (from % step);
    const steps = new Map<number, Bucket>();
    for (let at = start; at <= now; at += step) steps.set(at, { at, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, bytes: 0, latency: new Array<number>(LATENCY_BOUNDS_MS.length).fill(0) });
    for (const row of this.sql.exec<Row>(`SELECT * FROM ${table} WHERE at >= ? ORDER BY at`, start)) {
      const bucket = steps.get(row.at - ((row.at - start) % step));
      if (!bucket) continue;
      bucket.requests += row.requests;
      bucket.s2xx += row.s2xx;
      bucket.s3xx += row.s3xx;
      bucket.s4xx += row.s4xx;
      bucket.s5xx += row.s5xx;
      bucket.bytes += row.bytes;
      for (const [i, count] of (JSON.parse(row.latency) as number[]).entries()) bucket.latency[i]! += count;
    }
    return [...steps.values()];
  }

  /** The app was deleted: its metrics go with it. */
  async drop(): Promise<void> {
    this.sql.exec("DELETE FROM minutes");
    this.sql.exec("DELETE FROM hours");
  }
}
