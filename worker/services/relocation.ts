import { and, desc, eq } from "drizzle-orm";
import type { Db } from "../db/client";
import { type BackupRow, backups, type DiskRow, disks, type RestoreRow, restores } from "../db/schema";
import { configOf, type Env } from "../env";
import { type NodeRef, provisionDisk } from "../lib/builder-client";
import { newId } from "../lib/ids";
import { startRestoreJob } from "./backups";
import { appChanged } from "./cron-targets";
import { GIB } from "./disks";

/**
 * Moving a disk's copy of record to another node (DESIGN §10): by restoring a
 * backup there, never by copying a live disk. Drain and node loss both end
 * here. The disk's generation is bumped in the same statement that moves it,
 * so the old node's copy is fenced (it refuses requests of the new generation,
 * and its heartbeat is told to set the copy aside).
 */

/** The disk's newest ready backup (what a lost disk is restored from), or null. */
export async function newestReadyBackup(db: Db, diskId: string): Promise<BackupRow | null> {
  const [row] = await db
    .select()
    .from(backups)
    .where(and(eq(backups.diskId, diskId), eq(backups.status, "ready")))
    .orderBy(desc(backups.completedAt))
    .limit(1);
  return row ?? null;
}

/**
 * Restores `backup` onto `target` as the disk's new copy of record: the disk
 * row moves (node, generation + 1, `restoring`, the note saying what
 * happened) only if nobody moved it meanwhile; then the node makes the disk
 * and the RestoreJob object fills it (its end restarts the app, now placed on
 * the disk's new node). Returns why it did not move, or null.
 */
export async function relocateDisk(env: Env, db: Db, disk: DiskRow, backup: BackupRow, target: NodeRef, note: string): Promise<string | null> {
  const now = Date.now();
  const generation = disk.generation + 1;
  const moved = await db
    .update(disks)
    .set({ nodeId: target.id, generation, status: "restoring", placementNote: note, updatedAt: now })
    .where(and(eq(disks.id, disk.id), eq(disks.generation, disk.generation), eq(disks.status, "available")))
    .returning({ id: disks.id });
  if (moved.length === 0) return "the disk changed meanwhile (restored, moved or deleted)";
  const made = await provisionDisk(configOf(env), target, disk.id, { sizeBytes: disk.sizeGb * GIB, tenant: disk.accountId, generation }).catch(
    (err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }),
  );
  if (!made.ok) {
    // Back where it was: the next attempt starts from the same generation.
    const why = `could not be made on node ${target.id}: ${made.message}`;
    await db
      .update(disks)
      .set({ nodeId: disk.nodeId, generation: disk.generation, status: "available", placementNote: `${note} — not done: ${why}`, updatedAt: Date.now() })
      .where(eq(disks.id, disk.id));
    return why;
  }
  const row: RestoreRow = {
    id: newId("restore"),
    accountId: disk.accountId,
    diskId: disk.id,
    objectKey: backup.objectKey,
    sizeBytes: backup.sizeBytes,
    sha256: backup.sha256,
    uploadId: null,
    backupId: backup.id,
    status: "running",
    error: null,
    builderJobId: null,
    createdAt: now,
    finishedAt: null,
  };
  await db.insert(restores).values(row);
  // Not started: the disk is left `available` on its new node, empty, with the reason; a later failover or
  // the user's own restore of that backup fills it.
  const error = await startRestoreJob(env, db, row, note);
  if (error !== null) return error;
  // Its app's cron runs go to the disk's new node (and wait while it is restored); the watchdog pushes again if this fails.
  if (disk.appId) await appChanged(env, db, disk.appId).catch((err: unknown) => console.error(`relocation: pushing app ${disk.appId}'s target`, err));
  return null;
}
