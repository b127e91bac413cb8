import { eq } from "drizzle-orm";
import { accounts, backups, disks } from "../worker/db/schema";
import { submitSnapshot } from "../worker/lib/builder-client";
import { diskNode } from "../worker/services/placement";
import { builderShare, PLAN_LIMITS } from "../worker/lib/plans";
import { GIB } from "../worker/services/disks";
import { pruneAutomaticSnapshots } from "../worker/services/snapshots";
import { completeUpload } from "../worker/storage/objects";
import { presignPart } from "../worker/storage/presign";
import { backupFailed } from "../worker/services/webhooks";
import { type Ending, failureOf, SingleBuilderJob } from "./single-job";

/** Snapshot parts: ≥ R2's 5 MiB minimum, and large enough that a full disk stays under 10,000 parts. */
const MIN_PART_BYTES = 8 * 1024 * 1024;
const MAX_PARTS = 9_000;
const DAY_MS = 86_400_000;

/**
 * One object per backup: opens an R2 multipart upload, has the builder stream
 * tar.gz of the disk into it through presigned part URLs (the builder holds no
 * credentials), then completes the upload and marks the backup ready — or
 * aborts it and marks the backup failed with the reason.
 *
 * A backup is never `ready` without its object: the row says ready only after
 * the completed object was checked. Finishing runs once (single-job.ts) and is
 * repeatable after a failure half-way: completing the upload is recorded the
 * moment it succeeds, so a retry checks the object instead of completing
 * again (which would fail and, before, deleted a good archive).
 */
export class BackupJob extends SingleBuilderJob {
  async start(backupId: string): Promise<void> {
    const found = await this.db
      .select({ backup: backups, plan: accounts.plan })
      .from(backups)
      .innerJoin(accounts, eq(accounts.id, backups.accountId))
      .where(eq(backups.id, backupId))
      .get();
    const backup = found?.backup;
    if (!found || backup?.status !== "creating" || this.ctx.storage.kv.get("multipartUploadId")) return;
    const disk = await this.db
      .select({ id: disks.id, sizeGb: disks.sizeGb, nodeId: disks.nodeId, generation: disks.generation })
      .from(disks)
      .where(eq(disks.id, backup.diskId))
      .get();
    const node = disk ? await diskNode(this.env, disk).catch((err: unknown) => (err instanceof Error ? err : new Error(String(err)))) : null;
    if (!disk || !node || node instanceof Error) {
      await this.fail(!disk ? "the disk no longer exists" : node instanceof Error ? node.message : "the disk's node is no longer a member of the fleet");
      return;
    }
    const upload = await this.env.BUCKET.createMultipartUpload(backup.objectKey, {
      httpMetadata: { contentType: "application/gzip" },
    });
    const kv = this.ctx.storage.kv;
    kv.put("backupId", backupId);
    kv.put("objectKey", backup.objectKey);
    kv.put("multipartUploadId", upload.uploadId);
    const base = this.config.PUBLIC_URL;
    const submitted = await submitSnapshot(this.config, node, {
      key: backupId,
      diskId: backup.diskId,
      generation: disk.generation,
      partSizeBytes: Math.max(MIN_PART_BYTES, Math.ceil((disk.sizeGb * GIB) / MAX_PARTS)),
      partUrlEndpoint: new URL(`/internal/backups/${backupId}/part-url`, base).href,
      callbackUrl: new URL("/internal/builder/callback", base).href,
      labels: { kind: "backup", backupId },
      tenant: backup.accountId,
      ...builderShare(found.plan),
    }).catch((err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }));
    await this.submitted(backupId, node, submitted, "the snapshot");
  }

  /** A presigned URL for one part of the archive (asked for by the builder, signed). */
  async partUrl(partNumber: number): Promise<string | null> {
    const kv = this.ctx.storage.kv;
    const objectKey = kv.get<string>("objectKey");
    const multipartUploadId = kv.get<string>("multipartUploadId");
    if (!objectKey || !multipartUploadId || kv.get("finished") || kv.get("finishing")) return null;
    return presignPart(this.config, objectKey, multipartUploadId, partNumber);
  }

  protected maxRuntimeMs(): number {
    return 12 * 3_600_000;
  }

  protected async finish(ending: Ending): Promise<void> {
    const kv = this.ctx.storage.kv;
    const backupId = kv.get<string>("backupId");
    const objectKey = kv.get<string>("objectKey");
    const multipartUploadId = kv.get<string>("multipartUploadId");
    if (!backupId || !objectKey || !multipartUploadId) return;
    let error = failureOf(ending);
    const result = "id" in ending ? ending.result : null;
    if (!error && result?.kind === "snapshot") {
      error = await completeUpload(this.env.BUCKET, objectKey, multipartUploadId, result, kv.get("completed") === true);
      if (!error) kv.put("completed", true);
    } else if (!error) {
      error = "the builder reported no snapshot result";
    }
    const now = Date.now();
    if (error || result?.kind !== "snapshot") {
      if (!kv.get("completed")) await this.env.BUCKET.resumeMultipartUpload(objectKey, multipartUploadId).abort().catch(() => undefined);
      await this.env.BUCKET.delete(objectKey);
      await this.db
        .update(backups)
        .set({ status: "failed", failureReason: error, reservedBytes: 0, completedAt: now })
        .where(eq(backups.id, backupId));
      await backupFailed(this.env, backupId);
      return;
    }
    const owner = await this.db
      .select({ plan: accounts.plan, diskId: backups.diskId, automatic: backups.automatic })
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
    // A new automatic snapshot is ready: the oldest beyond the disk's keep go (never a person's backups).
    if (owner?.automatic) await pruneAutomaticSnapshots(this.db, this.env.BUCKET, owner.diskId);
  }
}
