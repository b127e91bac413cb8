import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type { Ack, ApiCall, Note } from "./load.js";

/** One line of the chaos run's table: what was counted, and what it must be (null: reported, not bounded). */
export type Row = { check: string; value: number | string; mustBe: 0 | null; detail?: string };

/** When a failover's restore may have dropped writes: acknowledged after `from` (its backup's start), up to the moment the run read the note. */
export type LossWindow = { disk: string; from: number; to: number; note: string };

/**
 * The writes a disk's placement notes say were lost: each failover restores
 * the disk from a backup, and says which and from when (durable-objects/fleet.ts);
 * a restore that failed says so, and everything before it may be gone. A note
 * ending "— not done: …" moved nothing.
 */
export function lossWindows(disk: string, notes: Note[]): LossWindow[] {
  const windows: LossWindow[] = [];
  for (const note of notes) {
    if (/ — not done: /.test(note.text)) continue;
    if (/ — the restore failed: /.test(note.text)) {
      windows.push({ disk, from: 0, to: note.seenAt, note: note.text });
      continue;
    }
    const begun = / from the backup begun at (\S+) \(/.exec(note.text)?.[1];
    if (begun) windows.push({ disk, from: Date.parse(begun), to: note.seenAt, note: note.text });
  }
  // A note seen again later is the same failover: one window per backup start.
  return windows.filter((w, i) => windows.findIndex((o) => o.from === w.from && o.note.split(";")[0] === w.note.split(";")[0]) === i);
}

/** The acknowledged writes missing from the disk's final ledger: those a loss window covers, and the rest (which must be none). */
export function lostWrites(acks: Ack[], ledger: string, windows: LossWindow[]): { reported: number[]; unreported: number[] } {
  const kept = new Set(ledger.split("\n").filter(Boolean).map(Number));
  const reported: number[] = [];
  const unreported: number[] = [];
  for (const ack of acks) {
    if (kept.has(ack.seq)) continue;
    if (windows.some((w) => ack.at > w.from && ack.at <= w.to)) reported.push(ack.seq);
    else unreported.push(ack.seq);
  }
  return { reported, unreported };
}

/** A job as its node recorded it (builder/src/jobs/manager.ts keeps each one's status.json for a day). */
type NodeJob = { node: string; id: string; key: string | null; status: string; startedAt: string | null; createdAt: string; labels: Record<string, string> };

/** Every job the nodes under `dataDirs` (name → data directory) recorded. */
export async function nodeJobs(dataDirs: Map<string, string>): Promise<NodeJob[]> {
  const jobs: NodeJob[] = [];
  for (const [node, dataDir] of dataDirs) {
    for (const id of await readdir(join(dataDir, "jobs")).catch(() => [])) {
      const text = await readFile(join(dataDir, "jobs", id, "status.json"), "utf8").catch(() => null);
      if (text === null) continue;
      const status = JSON.parse(text) as Omit<NodeJob, "node">;
      jobs.push({ ...status, node });
    }
  }
  return jobs;
}

/**
 * Cron runs (by cron and job name: a run taken back and sent again has a new
 * idempotency key) that more than one node job started: executed twice.
 */
export function runsExecutedTwice(jobs: NodeJob[]): string[] {
  const started = new Map<string, string[]>();
  for (const job of jobs) {
    const { kind, cronId, jobName } = job.labels;
    if (kind !== "cron" || job.startedAt === null || !cronId || !jobName) continue;
    const run = `${cronId}/${jobName}`;
    started.set(run, [...(started.get(run) ?? []), `${job.node}/${job.id}`]);
  }
  return [...started].filter(([, ran]) => ran.length > 1).map(([key, ran]) => `${key} on ${ran.join(", ")}`);
}

/** The API's errors: 5xx answers and calls that got none, except a 503 that said when to come back (the honest answer of a sick node's resources). */
export function apiFailures(calls: ApiCall[]): ApiCall[] {
  return calls.filter((call) => call.status === 0 || (call.status >= 500 && !(call.status === 503 && call.retryAfter)));
}

/** The table, one row per line, the rows that must be 0 marked when they are not. */
export function formatTable(rows: Row[]): string {
  const width = Math.max(...rows.map((row) => row.check.length));
  return rows
    .map((row) => {
      const failed = row.mustBe !== null && row.value !== row.mustBe;
      const bound = row.mustBe === null ? "" : `  (must be ${row.mustBe})${failed ? "  FAILED" : ""}`;
      return `${row.check.padEnd(width)}  ${String(row.value).padStart(8)}${bound}${row.detail ? `\n${" ".repeat(width + 2)}  ${row.detail}` : ""}`;
    })
    .join("\n");
}

/** The rows that must be 0 and are not. */
export function failedRows(rows: Row[]): Row[] {
  return rows.filter((row) => row.mustBe !== null && row.value !== row.mustBe);
}
