import { DurableObject } from "cloudflare:workers";
import type { Env } from "../worker/env";

/**
 * Metrics (docs/metrics.md): one SQLite-backed object per app, disk or cron
 * job (named by its id) holding minute buckets for 7 days and hour buckets
 * for 30 days. An app's holds its requests and its processes' usage, a disk's
 * its use, a cron job's its runs.
 *
 * Requests: the
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

/**
 * The steps of `stepMs` from `from` to `now` read from the minute table, or
 * from the hour table for ranges past the minutes' keeping: the table's unit,
 * the step (a whole number of units) and each step's start, oldest first.
 */
function stepsOf(from: number, stepMs: number, now: number): { unit: "minutes" | "hours"; step: number; starts: number[] } {
  const unit = stepMs >= HOUR_MS && now - from > MINUTES_KEPT_MS ? "hours" : "minutes";
  const size = unit === "hours" ? HOUR_MS : MINUTE_MS;
  const step = Math.max(size, stepMs - (stepMs % size));
  const starts: number[] = [];
  for (let at = from - (from % step); at <= now; at += step) starts.push(at);
  return { unit, step, starts };
}

/** The start of the step a bucket at `at` falls in. */
const stepOf = (at: number, start: number, step: number) => at - ((at - start) % step);

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

/** One process's usage over a node's report interval (builder/src/node/metrics.ts). */
export type ProcessSample = { id: string; cpuSeconds: number; memoryBytes: number; memoryLimitBytes: number; restarts: number };
/** A disk's use as its node measured it. */
export type DiskSample = { usedBytes: number; usedInodes: number; sizeBytes: number; inodeLimit: number };
/** One finished cron run. */
export type RunSample = { durationMs: number; ok: boolean };

/** A process's usage in one step: CPU seconds used, the most memory seen, restarts (null usage: it did not report then). */
export type ProcessStep = { at: number; cpuSeconds: number | null; memoryBytes: number | null; restarts: number };
export type DiskStep = { at: number; usedBytes: number | null; usedInodes: number | null };
export type RunStep = { at: number; runs: number; failed: number; durationMsTotal: number; maxDurationMs: number | null };

/** A disk is almost full from its alert threshold on, and no longer once it is 5 points below it. */
const ALMOST_FULL_CLEARS_BELOW = 5;

/** Tables besides the requests', each with a minute and an hour version: how a sample adds to a bucket. */
const TABLES = {
  processes: {
    columns: "process TEXT NOT NULL, cpu REAL NOT NULL, memory INTEGER NOT NULL, memory_limit INTEGER NOT NULL, restarts INTEGER NOT NULL, PRIMARY KEY (at, process)",
    upsert: (t: string) =>
      `INSERT INTO ${t} (at, process, cpu, memory, memory_limit, restarts) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (at, process) DO UPDATE SET cpu = cpu + excluded.cpu, memory = max(memory, excluded.memory), memory_limit = excluded.memory_limit, restarts = restarts + excluded.restarts`,
  },
  disk: {
    columns: "used_bytes INTEGER NOT NULL, used_inodes INTEGER NOT NULL, PRIMARY KEY (at)",
    upsert: (t: string) =>
      `INSERT INTO ${t} (at, used_bytes, used_inodes) VALUES (?, ?, ?) ON CONFLICT (at) DO UPDATE SET used_bytes = max(used_bytes, excluded.used_bytes), used_inodes = max(used_inodes, excluded.used_inodes)`,
  },
  runs: {
    columns: "runs INTEGER NOT NULL, failed INTEGER NOT NULL, duration_total INTEGER NOT NULL, duration_max INTEGER NOT NULL, PRIMARY KEY (at)",
    upsert: (t: string) =>
      `INSERT INTO ${t} (at, runs, failed, duration_total, duration_max) VALUES (?, 1, ?, ?, ?) ON CONFLICT (at) DO UPDATE SET runs = runs + 1, failed = failed + excluded.failed, duration_total = duration_total + excluded.duration_total, duration_max = max(duration_max, excluded.duration_max)`,
  },
} as const;

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
      for (const [name, { columns }] of Object.entries(TABLES)) {
        for (const unit of ["minutes", "hours"]) this.ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS ${name}_${unit} (at INTEGER NOT NULL, ${columns})`);
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
    this.prune();
  }

  /** Adds a node's report of the app's processes, taken at `at`. */
  async recordProcesses(at: number, samples: ProcessSample[]): Promise<void> {
    for (const [table, bucket] of this.buckets("processes", at)) {
      for (const s of samples) this.sql.exec(TABLES.processes.upsert(table), bucket, s.id, s.cpuSeconds, s.memoryBytes, s.memoryLimitBytes, s.restarts);
    }
    this.prune();
  }

  /**
   * Adds a measure of the disk; answers whether it just became almost full
   * (at `alertAtPercent` of its bytes or inodes) or stopped being so, once
   * each way (the state is kept here).
   */
  async recordDisk(at: number, sample: DiskSample, alertAtPercent: number): Promise<{ crossed: "full" | "cleared" | null; percent: number }> {
    for (const [table, bucket] of this.buckets("disk", at)) this.sql.exec(TABLES.disk.upsert(table), bucket, sample.usedBytes, sample.usedInodes);
    this.ctx.storage.kv.put("disk", { sizeBytes: sample.sizeBytes, inodeLimit: sample.inodeLimit });
    this.prune();
    const percent = Math.max(sample.usedBytes / Math.max(1, sample.sizeBytes), sample.usedInodes / Math.max(1, sample.inodeLimit)) * 100;
    const wasFull = this.ctx.storage.kv.get<boolean>("almostFull") ?? false;
    const full = wasFull ? percent >= alertAtPercent - ALMOST_FULL_CLEARS_BELOW : percent >= alertAtPercent;
    if (full !== wasFull) this.ctx.storage.kv.put("almostFull", full);
    return { crossed: full === wasFull ? null : full ? "full" : "cleared", percent };
  }

  /** Adds a finished run of the cron job. */
  async recordRun(at: number, run: RunSample): Promise<void> {
    const duration = Math.max(0, Math.round(run.durationMs));
    for (const [table, bucket] of this.buckets("runs", at)) this.sql.exec(TABLES.runs.upsert(table), bucket, run.ok ? 0 : 1, duration, duration);
    this.prune();
  }

  /** The minute and hour table of `name` with the bucket `at` falls in. */
  private buckets(name: keyof typeof TABLES, at: number): [string, number][] {
    return [
      [`${name}_minutes`, at - (at % MINUTE_MS)],
      [`${name}_hours`, at - (at % HOUR_MS)],
    ];
  }

  /** Drops what is past its keeping, at most once an hour. */
  private prune(): void {
    const now = Date.now();
    const pruned = this.ctx.storage.kv.get<number>("prunedAt") ?? 0;
    if (now - pruned <= PRUNE_EVERY_MS) return;
    for (const prefix of ["", ...Object.keys(TABLES).map((name) => `${name}_`)]) {
      this.sql.exec(`DELETE FROM ${prefix}minutes WHERE at < ?`, now - MINUTES_KEPT_MS);
      this.sql.exec(`DELETE FROM ${prefix}hours WHERE at < ?`, now - HOURS_KEPT_MS);
    }
    this.ctx.storage.kv.put("prunedAt", now);
  }

  /**
   * The buckets from `from` to now, summed into steps of `stepMs` (a whole
   * number of minutes, or of hours when asked for more than 7 days), every
   * step present (empty ones as zero), oldest first.
   */
  async series(from: number, stepMs: number, now = Date.now()): Promise<Bucket[]> {
    const { unit, step, starts } = stepsOf(from, stepMs, now);
    const steps = new Map<number, Bucket>(starts.map((at) => [at, { at, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, bytes: 0, latency: new Array<number>(LATENCY_BOUNDS_MS.length).fill(0) }]));
    for (const row of this.sql.exec<Row>(`SELECT * FROM ${unit} WHERE at >= ? ORDER BY at`, starts[0]!)) {
      const bucket = steps.get(stepOf(row.at, starts[0]!, step));
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

  /** Each process's usage from `from` to now in steps of `stepMs` (as {@link series}), with its memory limit. */
  async processSeries(from: number, stepMs: number, now = Date.now()): Promise<{ id: string; memoryLimitBytes: number; steps: ProcessStep[] }[]> {
    const { unit, step, starts } = stepsOf(from, stepMs, now);
    const found = new Map<string, { memoryLimitBytes: number; steps: Map<number, ProcessStep> }>();
    type ProcessRow = { at: number; process: string; cpu: number; memory: number; memory_limit: number; restarts: number };
    for (const row of this.sql.exec<ProcessRow>(`SELECT * FROM processes_${unit} WHERE at >= ? ORDER BY at`, starts[0]!)) {
      let process = found.get(row.process);
      if (!process) {
        process = { memoryLimitBytes: row.memory_limit, steps: new Map(starts.map((at) => [at, { at, cpuSeconds: null, memoryBytes: null, restarts: 0 }])) };
        found.set(row.process, process);
      }
      process.memoryLimitBytes = row.memory_limit;
      const bucket = process.steps.get(stepOf(row.at, starts[0]!, step));
      if (!bucket) continue;
      bucket.cpuSeconds = (bucket.cpuSeconds ?? 0) + row.cpu;
      bucket.memoryBytes = Math.max(bucket.memoryBytes ?? 0, row.memory);
      bucket.restarts += row.restarts;
    }
    return [...found].map(([id, { memoryLimitBytes, steps }]) => ({ id, memoryLimitBytes, steps: [...steps.values()] }));
  }

  /** The disk's most use in each step (as {@link series}), with its size and inode limit as last measured. */
  async diskSeries(from: number, stepMs: number, now = Date.now()): Promise<{ sizeBytes: number | null; inodeLimit: number | null; steps: DiskStep[] }> {
    const { unit, step, starts } = stepsOf(from, stepMs, now);
    const steps = new Map<number, DiskStep>(starts.map((at) => [at, { at, usedBytes: null, usedInodes: null }]));
    for (const row of this.sql.exec<{ at: number; used_bytes: number; used_inodes: number }>(`SELECT * FROM disk_${unit} WHERE at >= ? ORDER BY at`, starts[0]!)) {
      const bucket = steps.get(stepOf(row.at, starts[0]!, step));
      if (!bucket) continue;
      bucket.usedBytes = Math.max(bucket.usedBytes ?? 0, row.used_bytes);
      bucket.usedInodes = Math.max(bucket.usedInodes ?? 0, row.used_inodes);
    }
    const limits = this.ctx.storage.kv.get<{ sizeBytes: number; inodeLimit: number }>("disk");
    return { sizeBytes: limits?.sizeBytes ?? null, inodeLimit: limits?.inodeLimit ?? null, steps: [...steps.values()] };
  }

  /** The cron job's runs in each step (as {@link series}). */
  async runSeries(from: number, stepMs: number, now = Date.now()): Promise<RunStep[]> {
    const { unit, step, starts } = stepsOf(from, stepMs, now);
    const steps = new Map<number, RunStep>(starts.map((at) => [at, { at, runs: 0, failed: 0, durationMsTotal: 0, maxDurationMs: null }]));
    type RunRow = { at: number; runs: number; failed: number; duration_total: number; duration_max: number };
    for (const row of this.sql.exec<RunRow>(`SELECT * FROM runs_${unit} WHERE at >= ? ORDER BY at`, starts[0]!)) {
      const bucket = steps.get(stepOf(row.at, starts[0]!, step));
      if (!bucket) continue;
      bucket.runs += row.runs;
      bucket.failed += row.failed;
      bucket.durationMsTotal += row.duration_total;
      bucket.maxDurationMs = Math.max(bucket.maxDurationMs ?? 0, row.duration_max);
    }
    return [...steps.values()];
  }

  /** The app, disk or cron job was deleted: its metrics go with it. */
  async drop(): Promise<void> {
    await this.ctx.storage.deleteAll();
    this.#ready = false;
  }
}
