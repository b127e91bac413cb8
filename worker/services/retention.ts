import { and, eq, inArray, isNotNull, isNull, lt, or } from "drizzle-orm";
import { openDb } from "../db/client";
import { backups, requestLogs, restoreUploads, restores } from "../db/schema";
import type { Env } from "../env";

/** How long a consumed restore upload is kept after its restore ended. */
const USED_UPLOAD_KEEP_MS = 86_400_000;
/** Web-server request logs are kept this long. */
const REQUEST_LOG_KEEP_MS = 7 * 86_400_000;
/** Failed backups hold no archive; their rows are kept this long for the record. */
const FAILED_BACKUP_KEEP_MS = 7 * 86_400_000;

export type SweepResult = { backups: number; uploads: number; requestLogs: number };

/**
 * The scheduled() sweep: backups past their plan's retention, failed backups
 * after a week, restore uploads whose window passed unused, and consumed
 * uploads a day after their restore finished, and request logs older than a
 * week. Objects go before rows, so a
 * crash midway leaves rows to retry, never orphaned objects.
 */
export async function sweep(env: Env, now: number): Promise<SweepResult> {
  const db = openDb(env.DB);
  const expired = await db
    .select({ id: backups.id, objectKey: backups.objectKey })
    .from(backups)
    .where(
      or(
        and(eq(backups.status, "ready"), lt(backups.expiresAt, now)),
        and(eq(backups.status, "failed"), lt(backups.createdAt, now - FAILED_BACKUP_KEEP_MS)),
      ),
    )
    .limit(500);
  if (expired.length > 0) {
    await env.BUCKET.delete(expired.map((b) => b.objectKey));
    await db.delete(backups).where(inArray(backups.id, expired.map((b) => b.id)));
  }

  const finishedRestores = db
    .select({ uploadId: restores.uploadId })
    .from(restores)
    .where(and(isNotNull(restores.uploadId), lt(restores.finishedAt, now - USED_UPLOAD_KEEP_MS)));
  const stale = await db
    .select()
    .from(restoreUploads)
    .where(
      or(
        and(isNull(restoreUploads.usedAt), lt(restoreUploads.expiresAt, now)),
        inArray(restoreUploads.id, finishedRestores),
      ),
    )
    .limit(500);
  for (const upload of stale) {
    if (upload.multipartUploadId && upload.usedAt === null) {
      await env.BUCKET.resumeMultipartUpload(upload.objectKey, upload.multipartUploadId)
        .abort()
        .catch(() => undefined);
    }
    await env.BUCKET.delete(upload.objectKey);
  }
  if (stale.length > 0) await db.delete(restoreUploads).where(inArray(restoreUploads.id, stale.map((u) => u.id)));
  const logs = await db.delete(requestLogs).where(lt(requestLogs.at, now - REQUEST_LOG_KEEP_MS)).returning({ id: requestLogs.id });
  return { backups: expired.length, uploads: stale.length, requestLogs: logs.length };
}
