import { eq } from "drizzle-orm";
import type { JobStatus } from "../builder/src/protocol";
import { accounts, backups, disks } from "../worker/db/schema";
import { GIB } from "../worker/services/disks";
import { submitSnapshot } from "../worker/lib/builder-client";
import { PLAN_LIMITS } from "../worker/lib/plans";
import { presign } from "../worker/storage/presign";
import { failureOf, SingleBuilderJob } from "./single-job";

/** Snapshot parts: ≥ R2's 5 MiB minimum, and large enough that a full disk stays under 10,000 parts. */
const MIN_PART_BYTES = 8 * 1024 * 1024;
const MAX_PARTS = 9_000;
const DAY_MS = 86_400_000;

/**
 * One object per backup: opens an R2 multipart upload, has the builder stream
 * tar.gz of the disk into it through presigned part URLs (the builder holds no
 * credentials), then completes the upload and marks the backup ready — or
 * aborts it and marks the backup failed with the reason.
 */
export class BackupJob extends SingleBuilderJob {
  async start(backupId: string): Promise<void> {
    const backup = await this.db.select().from(backups).where(eq(backups.id, backupId)).get();
    if (backup?.status !== "creating") return;
    const disk = await this.db.select({ sizeGb: disks.sizeGb }).from(disks).where(eq(disks.id, backup.diskId)).get();
    const upload = await this.env.BUCKET.createMultipartUpload(backup.objectKey, {
      httpMetadata: { contentType: "application/gzip" },
    });
    await this.ctx.storage.put({ backupId, objectKey: backup.objectKey, multipartUploadId: upload.uploadId });
    const base = this.config.PUBLIC_URL;
    const submitted = await submitSnapshot(this.config, {
      diskId: backup.diskId,
      partSizeBytes: Math.max(MIN_PART_BYTES, Math.ceil(((disk?.sizeGb ?? 1) * GIB) / MAX_PARTS)),
      partUrlEndpoint: new URL(`/internal/backups/${backupId}/part-url`, base).href,
      callbackUrl: new URL("/internal/builder/callback", base).href,
      labels: { kind: "backup", backupId },
    }).catch((err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }));
    if (!submitted.ok) {
      await this.fail(`the builder could not start the snapshot: ${submitted.message}`);
      return;
    }
    await this.watch(submitted.value.id);
  }

  /** A presigned URL for one part of the archive (asked for by the builder, signed). */
  async partUrl(partNumber: number): Promise<string | null> {
    const [objectKey, multipartUploadId, finished] = await Promise.all([
      this.ctx.storage.get<string>("objectKey"),
      this.ctx.storage.get<string>("multipartUploadId"),
      this.ctx.storage.get<boolean>("finished"),
    ]);
    if (!objectKey || !multipartUploadId || finished) return null;
    const { url } = await presign(this.config, {
      method: "PUT",
      key: objectKey,
      expiresInSeconds: this.config.PRESIGNED_URL_TTL_SECONDS,
      query: { partNumber: String(partNumber), uploadId: multipartUploadId },
    });
    return url;
  }

  protected maxRuntimeMs(): number {
    return 12 * 3_600_000;
  }

  protected async finish(status: JobStatus | { error: string }): Promise<void> {
    const backupId = await this.ctx.storage.get<string>("backupId");
    const objectKey = await this.ctx.storage.get<string>("objectKey");
    const multipartUploadId = await this.ctx.storage.get<string>("multipartUploadId");
    if (!backupId || !objectKey || !multipartUploadId) return;
    const upload = this.env.BUCKET.resumeMultipartUpload(objectKey, multipartUploadId);
    let error = failureOf(status);
    const result = "id" in status ? status.result : null;
    if (!error && result?.kind === "snapshot") {
      try {
        await upload.complete(result.parts.map((p) => ({ partNumber: p.partNumber, etag: p.etag.replace(/^"|"$/g, "") })));
        const stored = await this.env.BUCKET.head(objectKey);
        if (stored?.size !== result.sizeBytes) error = `stored archive has ${stored?.size ?? 0} bytes, the builder wrote ${result.sizeBytes}`;
      } catch (err) {
        error = `completing the upload failed: ${err instanceof Error ? err.message : String(err)}`;
      }
    } else if (!error) {
      error = "the builder reported no snapshot result";
    }
    const now = Date.now();
    if (error || result?.kind !== "snapshot") {
      await upload.abort().catch(() => undefined);
      await this.env.BUCKET.delete(objectKey);
      await this.db
        .update(backups)
        .set({ status: "failed", failureReason: error, reservedBytes: 0, completedAt: now })
        .where(eq(backups.id, backupId));
      return;
    }
    const owner = await this.db
      .select({ plan: accounts.plan })
      .from(backups)
      .innerJoin(accounts, eq(backups.accountId, accounts.id))
      .where(eq(backups.id, backupId))
      .get();
    const retentionDays = PLAN_LIMITS[owner?.plan ?? "free"].backupRetentionDays;
    await this.db
      .update(backups)
      .set({
        status: "ready",
        sizeBytes: result.sizeBytes,
        reservedBytes: 0,
        sha256: result.sha256,
        completedAt: now,
        expiresAt: now + retentionDays * DAY_MS,
      })
      .where(eq(backups.id, backupId));
  }
}
