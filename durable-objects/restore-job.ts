import { eq } from "drizzle-orm";
import { BACKUP_MAX_ENTRIES, backupMaxExpandedBytes } from "../builder/src/protocol/disks";
import { accounts, apps, disks, restores } from "../worker/db/schema";
import { submitRestore } from "../worker/lib/builder-client";
import { diskNode } from "../worker/services/placement";
import { builderShare } from "../worker/lib/plans";
import { appRuntimeStub, runsProcess } from "../worker/services/app-runtime";
import { setAppStatus } from "../worker/services/apps";
import { appChanged } from "../worker/services/cron-targets";
import { GIB } from "../worker/services/disks";
import { presign } from "../worker/storage/presign";
import { emit } from "../worker/services/webhooks";
import { type Ending, failureOf, SingleBuilderJob } from "./single-job";

/**
 * One object per restore: the builder downloads the archive through a
 * presigned GET, validates it, extracts into staging and swaps it in
 * atomically (a failure, or a builder crash, leaves the disk as it was).
 * Afterwards the disk is available again and, on success, its app is
 * restarted on the new data.
 */
export class RestoreJob extends SingleBuilderJob {
  async start(restoreId: string): Promise<void> {
    const found = await this.db
      .select({ restore: restores, plan: accounts.plan })
      .from(restores)
      .innerJoin(accounts, eq(accounts.id, restores.accountId))
      .where(eq(restores.id, restoreId))
      .get();
    const restore = found?.restore;
    if (!found || restore?.status !== "running") return;
    this.ctx.storage.kv.put("restoreId", restoreId);
    const disk = await this.db.select().from(disks).where(eq(disks.id, restore.diskId)).get();
    const node = disk ? await diskNode(this.env, disk).catch((err: unknown) => (err instanceof Error ? err : new Error(String(err)))) : null;
    if (!disk || !node || node instanceof Error) {
      await this.fail(!disk ? "the disk no longer exists" : node instanceof Error ? node.message : "the disk's node is no longer a member of the fleet");
      return;
    }
    const { url } = await presign(this.config, {
      method: "GET",
      key: restore.objectKey,
      expiresInSeconds: this.config.PRESIGNED_URL_TTL_SECONDS,
    });
    const submitted = await submitRestore(this.config, node, {
      key: restoreId,
      diskId: disk.id,
      generation: disk.generation,
      archiveUrl: url,
      expectedSizeBytes: restore.sizeBytes,
      ...(restore.sha256 ? { expectedSha256: restore.sha256 } : {}),
      // The backup limits snapshots enforce too (protocol/disks.ts), so every ready backup restores.
      maxEntries: BACKUP_MAX_ENTRIES,
      // The disk's size in file data plus what a backup may hold besides (headers, maps): the bound
      // every snapshot of this disk was checked against. The builder checks the data against the
      // disk's quota as it is now: a backup of a disk since made smaller restores only if it fits.
      maxExpandedBytes: backupMaxExpandedBytes(disk.sizeGb * GIB),
      callbackUrl: new URL("/internal/builder/callback", this.config.PUBLIC_URL).href,
      labels: { kind: "restore", restoreId },
      tenant: restore.accountId,
      ...builderShare(found.plan),
    }).catch((err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }));
    if (submitted.ok) await this.db.update(restores).set({ builderJobId: submitted.value.id }).where(eq(restores.id, restoreId));
    await this.submitted(restoreId, node, submitted, "the restore");
  }

  protected maxRuntimeMs(): number {
    return 12 * 3_600_000;
  }

  /** Every step is repeatable: a finish that failed half-way runs again from the top. */
  protected async finish(ending: Ending): Promise<void> {
    const restoreId = this.ctx.storage.kv.get<string>("restoreId");
    const restore = restoreId ? await this.db.select().from(restores).where(eq(restores.id, restoreId)).get() : null;
    if (!restore) return;
    const error = failureOf(ending);
    const now = Date.now();
    await this.db.batch([
      this.db
        .update(restores)
        .set({ status: error ? "failed" : "succeeded", error, finishedAt: now, ...("id" in ending ? { builderJobId: ending.id } : {}) })
        .where(eq(restores.id, restore.id)),
      this.db.update(disks).set({ status: "available", updatedAt: now }).where(eq(disks.id, restore.diskId)),
    ]);
    const disk = await this.db.select().from(disks).where(eq(disks.id, restore.diskId)).get();
    // A failover's or a drain's restore names its backup in the disk's note: one that failed must not read as done.
    const moved = restore.backupId !== null && disk?.placementNote?.includes(`(${restore.backupId})`) && !disk.placementNote.includes(" — the restore failed: ");
    if (error && disk && moved) {
      const note = `${disk.placementNote} — the restore failed: ${error}; the backup is kept (svc backups restore ${disk.name} --backup ${restore.backupId})`;
      await this.db.update(disks).set({ placementNote: note }).where(eq(disks.id, disk.id));
    }
    if (error && disk) {
      await emit(this.env, disk.accountId, "restore.failed", {
        disk: { id: disk.id, name: disk.name },
        restore: { id: restore.id, backupId: restore.backupId, error },
      });
    }
    const app = disk?.appId ? await this.db.select().from(apps).where(eq(apps.id, disk.appId)).get() : null;
    if (!app) return;
    if (!error) {
      // Spec: the application restarts automatically and the restored data becomes available.
      await setAppStatus(this.db, app, "running");
      if (runsProcess(app.runtime)) await appRuntimeStub(this.env, app.id).start(app.id);
    }
    await appChanged(this.env, this.db, app.id);
  }
}
