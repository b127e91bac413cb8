import { and, asc, desc, eq, gt, inArray, lte, sql } from "drizzle-orm";
import { type Db, openDb } from "../db/client";
import { backups, disks } from "../db/schema";
import type { Env } from "../env";
import { ApiError } from "../lib/errors";
import { AUTOMATIC_DESCRIPTION, HOUR_MS, nextSnapshotAt } from "../lib/snapshot-schedule";
import { iso } from "../lib/time";
import { startBackup } from "./backups";

/**
 * Snapshots started per watchdog pass (every 5 minutes): each costs a few
 * subrequests (the disk's usage, the quota-checked insert, its object), and
 * the pass shares its invocation with the cron watchdog. 25 a pass is 7,200
 * disks a day; the oldest-due go first, so a backlog drains in order.
 */
export const MAX_SNAPSHOTS_PER_PASS = 25;
/** A due snapshot that could not start is tried again this much later, never later than its next regular time. */
export const SNAPSHOT_RETRY_MS = HOUR_MS;

export type SnapshotPass = { started: number; skipped: number; failures: number };

/**
 * The snapshot half of the watchdog pass (DESIGN §10: automatic snapshots are
 * ordinary backups made on a schedule). Takes the disks whose snapshot is due,
 * oldest first and at most {@link MAX_SNAPSHOTS_PER_PASS}, from one range scan
 * of `disks_next_snapshot_idx`, and starts each one's backup exactly as a
 * user's (quota and all), marked automatic. A disk that is being restored or
 * backed up, or whose account's backup space is full, is skipped with the
 * reason on the disk and tried again later; nothing about one disk fails the
 * pass. Each disk is claimed by moving its due time first, so passes that
 * overlap (cron triggers are at-least-once) never snapshot it twice.
 */
export async function snapshotDueDisks(env: Env, now: number): Promise<SnapshotPass> {
  const db = openDb(env.DB);
  const result: SnapshotPass = { started: 0, skipped: 0, failures: 0 };
  const due = await db
    .select({
      disk: disks,
      // Spelled out: drizzle leaves a single-table select's columns unqualified, which the subquery would capture.
      busy: sql<number>`exists (select 1 from backups b where b.disk_id = disks.id and b.status = 'creating')`,
    })
    .from(disks)
    .where(and(lte(disks.nextSnapshotAt, now), gt(disks.snapshotIntervalHours, 0)))
    .orderBy(asc(disks.nextSnapshotAt))
    .limit(MAX_SNAPSHOTS_PER_PASS);
  for (const { disk, busy } of due) {
    const dueAt = disk.nextSnapshotAt ?? 0;
    const next = nextSnapshotAt(dueAt, disk.snapshotIntervalHours, now);
    const retryAt = Math.min(now + SNAPSHOT_RETRY_MS, next);
    const skip = async (reason: string, from: number) => {
      await db
        .update(disks)
        .set({ nextSnapshotAt: retryAt, snapshotSkipped: `the automatic snapshot of ${iso(now)} did not start: ${reason}` })
        .where(and(eq(disks.id, disk.id), eq(disks.nextSnapshotAt, from)));
    };
    try {
      const why = disk.status === "restoring" ? "the disk was being restored" : busy ? "a backup of the disk was still being made" : null;
      if (why) {
        await skip(why, dueAt);
        result.skipped++;
        continue;
      }
      const claimed = await db
        .update(disks)
        .set({ nextSnapshotAt: next, snapshotSkipped: null })
        .where(and(eq(disks.id, disk.id), eq(disks.nextSnapshotAt, dueAt)))
        .returning({ id: disks.id });
      // Another pass took it, or its owner changed the schedule since the select.
      if (claimed.length === 0) continue;
      try {
        await startBackup(db, env, disk.accountId, disk, AUTOMATIC_DESCRIPTION, true);
        result.started++;
      } catch (err) {
        // Quota full, the builder unreachable: the user's reasons, and the user's to read on the disk.
        if (err instanceof ApiError) {
          await skip(err.message, next);
          result.skipped++;
          continue;
        }
        await skip("the platform could not start it (an internal error, logged for the operator)", next);
        throw err;
      }
    } catch (err) {
      result.failures++;
      console.error(`snapshots: starting the automatic snapshot of disk ${disk.id} failed`, err);
    }
  }
  if (result.started + result.skipped + result.failures > 0) console.log(JSON.stringify({ event: "snapshots.pass", ...result }));
  return result;
}

/**
 * Deletes the disk's ready automatic snapshots beyond its `snapshotKeep`,
 * oldest first; a person's backups are never touched. Called when an
 * automatic snapshot becomes ready (BackupJob), so a disk holds the newest
 * `snapshotKeep` and never fewer than before the new one was ready. Objects go
 * before rows: a crash between them leaves rows to prune again, never
 * orphaned objects. Safe to repeat.
 */
export async function pruneAutomaticSnapshots(db: Db, bucket: R2Bucket, diskId: string): Promise<number> {
  const disk = await db.select({ keep: disks.snapshotKeep }).from(disks).where(eq(disks.id, diskId)).get();
  if (!disk) return 0;
  const ready = await db
    .select({ id: backups.id, objectKey: backups.objectKey })
    .from(backups)
    .where(and(eq(backups.diskId, diskId), eq(backups.automatic, true), eq(backups.status, "ready")))
    .orderBy(desc(backups.createdAt), desc(backups.id));
  const beyond = ready.slice(disk.keep);
  if (beyond.length === 0) return 0;
  await bucket.delete(beyond.map((b) => b.objectKey));
  await db.delete(backups).where(and(inArray(backups.id, beyond.map((b) => b.id)), eq(backups.automatic, true)));
  return beyond.length;
}
