import { and, desc, eq, sql } from "drizzle-orm";
import type { Db } from "../db/client";
import {
  type BackupRow,
  backups,
  type DiskRow,
  disks,
  type RestoreRow,
  type RestoreUploadRow,
  restoreUploads,
  restores,
} from "../db/schema";
import type { JobProgress } from "../../durable-objects/single-job";
import { type Config, configOf, type Env } from "../env";
import { diskUsage } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { newId } from "../lib/ids";
import { planOf } from "../lib/plans";
import { iso, isoOrNull } from "../lib/time";
import { presign } from "../storage/presign";
import { appChanged } from "./cron-targets";
import { isInUse, resolveDisk } from "./disks";
import { lostNode } from "./fleet";
import { backupFailed } from "./webhooks";
import { diskNode } from "./placement";

/** Archives above this are uploaded in parts (DESIGN §7). */
export const MULTIPART_THRESHOLD_BYTES = 100 * 1024 * 1024;
/** R2 allows 10,000 parts; parts grow with the archive so that limit is never reached. */
const MIN_PART_BYTES = 64 * 1024 * 1024;
const MAX_PARTS = 10_000;
/** Even an empty disk's archive takes some bytes; a backup never reserves less than this. */
const MIN_RESERVATION_BYTES = 64 * 1024;

export type BackupView = {
  id: string;
  diskId: string;
  sizeBytes: number;
  status: BackupRow["status"];
  /** While `creating`: `queued` until the builder starts the snapshot, then `running`. */
  phase?: "queued" | "running";
  /** Why a queued backup waits, in words. */
  waiting?: string;
  description: string;
  /** Made by the disk's snapshot schedule rather than by a person. */
  automatic: boolean;
  createdAt: string;
  completedAt?: string;
  sha256?: string;
  failureReason?: string;
  expiresAt?: string;
};

/**
 * The API's backup. A backup still `creating` also says whether its snapshot
 * waits for a slot on the builder (`phase: "queued"`, with the reason) or runs:
 * `progress` is its object's (a finishing one, null, runs).
 */
export function backupView(row: BackupRow, progress?: JobProgress | null): BackupView {
  const creating = row.status === "creating" && progress !== undefined;
  const phase = progress?.phase ?? "running";
  return {
    id: row.id,
    diskId: row.diskId,
    sizeBytes: row.sizeBytes,
    status: row.status,
    ...(creating ? { phase } : {}),
    ...(creating && phase === "queued" && progress?.waiting ? { waiting: progress.waiting } : {}),
    description: row.description,
    automatic: row.automatic,
    createdAt: iso(row.createdAt),
    ...(row.completedAt !== null ? { completedAt: iso(row.completedAt) } : {}),
    ...(row.sha256 !== null ? { sha256: row.sha256 } : {}),
    ...(row.failureReason !== null ? { failureReason: row.failureReason } : {}),
    ...(row.expiresAt !== null ? { expiresAt: iso(row.expiresAt) } : {}),
  };
}

export type RestoreView = {
  jobId: string;
  diskId: string;
  status: RestoreRow["status"];
  /** While `running`: `queued` until the builder starts the restore, then `running`. */
  phase?: "queued" | "running";
  waiting?: string;
  error: string | null;
  createdAt: string;
  finishedAt: string | null;
};

export function restoreView(row: RestoreRow, progress?: JobProgress | null): RestoreView {
  const running = row.status === "running" && progress !== undefined;
  const phase = progress?.phase ?? "running";
  return {
    jobId: row.id,
    diskId: row.diskId,
    status: row.status,
    ...(running ? { phase } : {}),
    ...(running && phase === "queued" && progress?.waiting ? { waiting: progress.waiting } : {}),
    error: row.error,
    createdAt: iso(row.createdAt),
    finishedAt: isoOrNull(row.finishedAt),
  };
}

export const backupStub = (env: Env, backupId: string) => env.BACKUP_JOB.get(env.BACKUP_JOB.idFromName(backupId));
export const restoreStub = (env: Env, restoreId: string) => env.RESTORE_JOB.get(env.RESTORE_JOB.idFromName(restoreId));

/** Backups as the API shows them: those still `creating` ask their object where the snapshot stands (in parallel). */
export async function backupViews(env: Env, rows: BackupRow[]): Promise<BackupView[]> {
  return Promise.all(
    rows.map(async (row) => (row.status === "creating" ? backupView(row, await backupStub(env, row.id).progress()) : backupView(row))),
  );
}

/** A restore as the API shows it; one still `running` asks its object whether the builder has started it. */
export async function restoreViewOf(env: Env, row: RestoreRow): Promise<RestoreView> {
  return row.status === "running" ? restoreView(row, await restoreStub(env, row.id).progress()) : restoreView(row);
}

/**
 * Bytes counted against the account's backup space: ready backups, the
 * reservation of backups still being created, and database dumps (spec: one
 * quota shared by disk backups and database dumps).
 */
const usageSql = (accountId: string) => sql`(
  coalesce((select sum(case when status = 'ready' then size_bytes when status = 'creating' then reserved_bytes else 0 end)
            from backups where account_id = ${accountId}), 0)
  + coalesce((select sum(size_bytes) from database_dumps where account_id = ${accountId} and deleted_at is null), 0)
)`;

export async function backupUsage(db: Db, accountId: string): Promise<number> {
  const row = await db.get<{ used: number }>(sql`select ${usageSql(accountId)} as used`);
  return row.used;
}

/**
 * Creates a `creating` backup only if it fits the plan's quota; the check and
 * the insert are one statement, so concurrent requests cannot both squeeze in.
 * Automatic snapshots come through here too: they count against the same quota.
 */
export async function createBackup(
  db: Db,
  env: Env,
  accountId: string,
  disk: DiskRow,
  description: string,
  automatic = false,
): Promise<BackupRow> {
  const quota = (await planOf(db, accountId)).limits.backupQuotaBytes;
  const node = await diskNode(env, disk);
  const lost = await lostNode(env, node.id);
  if (lost) throw new ApiError("NODE_LOST", `disk ${disk.name} is on node ${lost.name}, which was lost; it cannot be backed up until it returns or the disk is restored elsewhere`);
  const usage = await diskUsage(configOf(env), node, disk.id);
  if (!usage.ok) throw new ApiError("BUILDER_UNAVAILABLE", `the builder could not measure the disk: ${usage.message}`);
  const reserved = Math.max(usage.value.usedBytes, MIN_RESERVATION_BYTES);
  const id = newId("backup");
  const now = Date.now();
  const objectKey = `backups/${disk.id}/${id}.tar.gz`;
  const inserted = await db.run(sql`
    insert into backups (id, account_id, disk_id, status, description, automatic, size_bytes, reserved_bytes, object_key, created_at)
    select ${id}, ${accountId}, ${disk.id}, 'creating', ${description}, ${automatic ? 1 : 0}, 0, ${reserved}, ${objectKey}, ${now}
    where ${usageSql(accountId)} + ${reserved} <= ${quota}`);
  if (inserted.meta.changes !== 1) {
    const used = await backupUsage(db, accountId);
    throw new ApiError(
      "BACKUP_QUOTA_EXCEEDED",
      `backup space is full: ${used} of ${quota} bytes used and this disk holds ${reserved}; delete old backups or upgrade the plan`,
    );
  }
  return {
    id,
    accountId,
    diskId: disk.id,
    status: "creating",
    description,
    automatic,
    sizeBytes: 0,
    reservedBytes: reserved,
    sha256: null,
    objectKey,
    failureReason: null,
    createdAt: now,
    completedAt: null,
    expiresAt: null,
  };
}

/**
 * Starts a backup of the disk: the row (within the quota), then its BackupJob
 * object, which has the builder snapshot the disk. A user's backup and an
 * automatic snapshot both start here.
 */
export async function startBackup(
  db: Db,
  env: Env,
  accountId: string,
  disk: DiskRow,
  description: string,
  automatic = false,
): Promise<BackupRow> {
  const backup = await createBackup(db, env, accountId, disk, description, automatic);
  try {
    await backupStub(env, backup.id).start(backup.id);
  } catch (err) {
    // Left `creating`, the row would hold its quota and keep the disk busy (no automatic snapshot again) for good.
    const failureReason = `the backup could not start: ${err instanceof Error ? err.message : String(err)}`;
    await db
      .update(backups)
      .set({ status: "failed", failureReason, reservedBytes: 0, completedAt: Date.now() })
      .where(and(eq(backups.id, backup.id), eq(backups.status, "creating")));
    await backupFailed(env, backup.id);
    throw err;
  }
  return backup;
}

export async function listBackups(db: Db, diskId: string): Promise<BackupRow[]> {
  return db.select().from(backups).where(eq(backups.diskId, diskId)).orderBy(desc(backups.createdAt), desc(backups.id));
}

export async function resolveBackup(db: Db, diskId: string, backupId: string): Promise<BackupRow> {
  const row = await db
    .select()
    .from(backups)
    .where(and(eq(backups.id, backupId), eq(backups.diskId, diskId)))
    .get();
  if (!row) throw new ApiError("BACKUP_NOT_FOUND", `backup ${backupId} not found; list the disk's backups`);
  return row;
}

export function requireReady(backup: BackupRow): void {
  if (backup.status === "creating") throw new ApiError("BACKUP_NOT_READY", `backup ${backup.id} is still being created`);
  if (backup.status === "failed") {
    throw new ApiError("BACKUP_NOT_READY", `backup ${backup.id} failed (${backup.failureReason ?? "unknown reason"}) and has no archive`);
  }
}

/** Removes the archive and the row, which frees its quota. */
export async function deleteBackup(db: Db, env: Env, backup: BackupRow): Promise<void> {
  if (backup.status === "creating") {
    throw new ApiError("BACKUP_NOT_READY", `backup ${backup.id} is still being created; delete it when it is ready`);
  }
  await env.BUCKET.delete(backup.objectKey);
  await db.delete(backups).where(eq(backups.id, backup.id));
}

export type PresignedUpload = {
  uploadUrl: string;
  uploadId: string;
  expiresAt: string;
  parts?: { partNumber: number; url: string; sizeBytes: number }[];
};

/** Part size for an archive of `size` bytes: at least 64 MiB, never more than 10,000 parts. */
export function partSizeFor(size: number): number {
  return Math.max(MIN_PART_BYTES, Math.ceil(size / MAX_PARTS));
}

/**
 * Presigned PUT for a restore archive of exactly `sizeBytes`; above the
 * multipart threshold the upload is also offered in parts (each part URL
 * signed for its exact length).
 */
export async function presignRestoreUpload(
  db: Db,
  env: Env,
  config: Config,
  accountId: string,
  disk: DiskRow,
  sizeBytes: number,
): Promise<PresignedUpload> {
  const id = newId("upload");
  const objectKey = `restore-uploads/${disk.id}/${id}.tar.gz`;
  const ttl = config.PRESIGNED_URL_TTL_SECONDS;
  const single = await presign(config, { method: "PUT", key: objectKey, expiresInSeconds: ttl, contentLength: sizeBytes });
  let multipartUploadId: string | null = null;
  let parts: PresignedUpload["parts"];
  if (sizeBytes > MULTIPART_THRESHOLD_BYTES) {
    multipartUploadId = (await env.BUCKET.createMultipartUpload(objectKey)).uploadId;
    const partSize = partSizeFor(sizeBytes);
    const count = Math.ceil(sizeBytes / partSize);
    parts = await Promise.all(
      Array.from({ length: count }, async (_, i) => {
        const partBytes = i === count - 1 ? sizeBytes - partSize * (count - 1) : partSize;
        const { url } = await presign(config, {
          method: "PUT",
          key: objectKey,
          expiresInSeconds: ttl,
          contentLength: partBytes,
          query: { partNumber: String(i + 1), uploadId: multipartUploadId! },
        });
        return { partNumber: i + 1, url, sizeBytes: partBytes };
      }),
    );
  }
  const row: RestoreUploadRow = {
    id,
    accountId,
    diskId: disk.id,
    sizeBytes,
    objectKey,
    multipartUploadId,
    expiresAt: single.expiresAt,
    usedAt: null,
    createdAt: Date.now(),
  };
  await db.insert(restoreUploads).values(row);
  return { uploadUrl: single.url, uploadId: id, expiresAt: iso(single.expiresAt), ...(parts ? { parts } : {}) };
}

type ArchiveSource = { objectKey: string; sizeBytes: number; sha256: string | null; uploadId: string | null; backupId: string | null };

/**
 * Checks an upload is complete (finishing a multipart upload from the client's
 * part list), or explains why not: unknown → 404, window passed without an
 * upload → 410, not (fully) uploaded or size differs → 409.
 */
export async function uploadedArchive(
  db: Db,
  env: Env,
  diskId: string,
  uploadId: string,
  parts: { partNumber: number; etag: string }[] | undefined,
): Promise<ArchiveSource> {
  const upload = await db
    .select()
    .from(restoreUploads)
    .where(and(eq(restoreUploads.id, uploadId), eq(restoreUploads.diskId, diskId)))
    .get();
  if (!upload || upload.usedAt !== null) throw new ApiError("UPLOAD_NOT_FOUND", `upload ${uploadId} not found; request a new one with presign`);
  let object = await env.BUCKET.head(upload.objectKey);
  if (!object && upload.multipartUploadId && parts && parts.length > 0) {
    try {
      await env.BUCKET.resumeMultipartUpload(upload.objectKey, upload.multipartUploadId).complete(
        parts.map((p) => ({ partNumber: p.partNumber, etag: p.etag.replace(/^"|"$/g, "") })),
      );
    } catch (err) {
      throw new ApiError("UPLOAD_INCOMPLETE", `the uploaded parts could not be assembled: ${err instanceof Error ? err.message : err}`);
    }
    object = await env.BUCKET.head(upload.objectKey);
  }
  if (!object) {
    if (Date.now() > upload.expiresAt) {
      throw new ApiError("PRESIGNED_URL_EXPIRED", "the upload URL expired before an archive was uploaded; request a new one with presign");
    }
    throw new ApiError(
      "UPLOAD_INCOMPLETE",
      upload.multipartUploadId && !parts
        ? "the archive was not uploaded yet (for a multipart upload, pass the uploaded parts and their ETags)"
        : "the archive was not uploaded yet; PUT it to the uploadUrl first",
    );
  }
  if (object.size !== upload.sizeBytes) {
    throw new ApiError("UPLOAD_INCOMPLETE", `the uploaded archive has ${object.size} bytes, ${upload.sizeBytes} were announced`);
  }
  return { objectKey: upload.objectKey, sizeBytes: upload.sizeBytes, sha256: null, uploadId: upload.id, backupId: null };
}

export function backupArchive(backup: BackupRow): ArchiveSource {
  requireReady(backup);
  return { objectKey: backup.objectKey, sizeBytes: backup.sizeBytes, sha256: backup.sha256, uploadId: null, backupId: backup.id };
}

/**
 * Starts a restore: refused while the disk is in use (attached to a running
 * app) or already restoring; marks the disk `restoring` and the upload used in
 * one batch, then hands over to the RestoreJob Durable Object.
 */
export async function startRestore(
  db: Db,
  env: Env,
  accountId: string,
  diskRef: string,
  source: ArchiveSource,
): Promise<RestoreRow> {
  const entry = await resolveDisk(db, accountId, diskRef);
  if (isInUse(entry)) {
    throw new ApiError(
      "DISK_IN_USE",
      `disk ${entry.disk.name} is attached to running app ${entry.app!.name}; detach the disk or stop the app, restore, then attach it again`,
    );
  }
  const now = Date.now();
  const row: RestoreRow = {
    id: newId("restore"),
    accountId,
    diskId: entry.disk.id,
    objectKey: source.objectKey,
    sizeBytes: source.sizeBytes,
    sha256: source.sha256,
    uploadId: source.uploadId,
    backupId: source.backupId,
    status: "running",
    error: null,
    builderJobId: null,
    createdAt: now,
    finishedAt: null,
  };
  const claimed = await db
    .update(disks)
    .set({ status: "restoring", updatedAt: now })
    .where(and(eq(disks.id, entry.disk.id), eq(disks.status, "available")))
    .returning({ id: disks.id });
  if (claimed.length === 0) throw new ApiError("DISK_IN_USE", `disk ${entry.disk.name} is already being restored`);
  await db.batch([
    db.insert(restores).values(row),
    ...(source.uploadId ? [db.update(restoreUploads).set({ usedAt: now }).where(eq(restoreUploads.id, source.uploadId))] : []),
  ]);
  // Its app (stopped, or it would be in use) learns that the disk is being restored.
  if (entry.disk.appId) await appChanged(env, db, entry.disk.appId);
  const error = await startRestoreJob(env, db, row);
  if (error === null) return row;
  if (entry.disk.appId) await appChanged(env, db, entry.disk.appId);
  return { ...row, status: "failed", error };
}

/**
 * Hands a recorded restore to its RestoreJob object. One that cannot start is
 * failed with the reason and its disk made `available` again (with `note`
 * as what happened to it, when given); returns that reason, or null.
 */
export async function startRestoreJob(env: Env, db: Db, row: RestoreRow, note?: string): Promise<string | null> {
  try {
    await restoreStub(env, row.id).start(row.id);
    return null;
  } catch (err) {
    const error = `the restore could not start: ${err instanceof Error ? err.message : String(err)}`;
    const now = Date.now();
    await db.batch([
      db.update(restores).set({ status: "failed", error, finishedAt: now }).where(eq(restores.id, row.id)),
      db
        .update(disks)
        .set({ status: "available", updatedAt: now, ...(note === undefined ? {} : { placementNote: `${note} — not done: ${error}` }) })
        .where(eq(disks.id, row.diskId)),
    ]);
    return error;
  }
}

export async function resolveRestore(db: Db, diskId: string, restoreId: string): Promise<RestoreRow> {
  const row = await db
    .select()
    .from(restores)
    .where(and(eq(restores.id, restoreId), eq(restores.diskId, diskId)))
    .get();
  if (!row) throw new ApiError("NOT_FOUND", `restore job ${restoreId} not found`);
  return row;
}
