import { and, asc, eq, inArray, isNull, lt, or, sql } from "drizzle-orm";
import type { Db } from "../db/client";
import { accounts, apps, crons, deployments, disks, envVars, type Plan } from "../db/schema";
import type { Env } from "../env";
import { cronStub } from "./crons";

/**
 * Everything a cron run needs of its app at fire time. Each of the app's cron
 * objects keeps a copy, pushed whenever one of these changes (stop and restart,
 * env vars, disk attach/detach/restore, a new active deployment), so a
 * scheduled run starts without reading D1 at all (issue 11: D1 is one
 * serialised database, and jobs due together would queue on it).
 */
export type CronTarget = {
  appId: string;
  /**
   * The app's `updated_at` when this was read: every change above bumps it, a
   * cron object ignores a push older than what it has, and the watchdog
   * re-pushes to jobs whose copy is older than the app.
   */
  version: number;
  stopped: boolean;
  memoryMb: number;
  /** The account's plan: its share of the builder (absent in copies pushed before plans set one). */
  plan?: Plan;
  /** Name → AES-GCM ciphertext as stored in D1 (decrypted only at dispatch, never stored in the clear). */
  env: Record<string, string>;
  /** `nodeId` and `generation` (where the disk is, fencing) are absent in copies pushed before the fleet. */
  disk: { id: string; name: string; mountPath: string; sizeGb: number; restoring: boolean; nodeId?: string | null; generation?: number } | null;
  /** The active deployment's release (apps that run: the tree with its dependencies), else its source archive: the run's working directory. */
  sourceKey: string | null;
  /** Whether `sourceKey` is a release (its commands are on RELEASE_PATH). */
  release?: boolean;
};

/** The app's current target (two queries: app with disk and active source, then its env vars); null when the app is gone. */
export async function loadTarget(db: Db, appId: string): Promise<CronTarget | null> {
  const [row, vars] = await Promise.all([
    db
      .select({ app: apps, disk: disks, sourceKey: deployments.sourceKey, releaseKey: deployments.releaseKey, plan: accounts.plan })
      .from(apps)
      .innerJoin(accounts, eq(accounts.id, apps.accountId))
      .leftJoin(disks, eq(disks.appId, apps.id))
      .leftJoin(deployments, eq(deployments.id, apps.activeDeploymentId))
      .where(eq(apps.id, appId))
      .orderBy(asc(disks.createdAt))
      .limit(1),
    db.select({ name: envVars.name, value: envVars.value }).from(envVars).where(eq(envVars.appId, appId)),
  ]);
  const found = row[0];
  if (!found) return null;
  const { app, disk, sourceKey, releaseKey, plan } = found;
  return {
    appId,
    version: app.updatedAt,
    stopped: app.status === "stopped",
    memoryMb: app.memoryMb,
    plan,
    env: Object.fromEntries(vars.map((v) => [v.name, v.value])),
    disk: disk
      ? {
          id: disk.id,
          name: disk.name,
          mountPath: disk.mountPath,
          sizeGb: disk.sizeGb,
          restoring: disk.status === "restoring",
          nodeId: disk.nodeId,
          generation: disk.generation,
        }
      : null,
    sourceKey: releaseKey ?? sourceKey ?? null,
    release: releaseKey !== null && releaseKey !== undefined,
  };
}

/**
 * Marks the app changed for its cron jobs (bumps `updated_at`, which versions
 * targets, always forward). Call before {@link pushTargets}.
 */
export async function touchApp(db: Db, appId: string): Promise<void> {
  await db
    .update(apps)
    .set({ updatedAt: sql`max(${apps.updatedAt} + 1, ${Date.now()})` })
    .where(eq(apps.id, appId));
}

/**
 * Hands the app's current target to each of its cron objects and records the
 * version each now holds. A cron object that cannot be reached keeps its old
 * copy until the watchdog (every few minutes) pushes again; the error is
 * reported to the caller after the others got theirs.
 */
export async function pushTargets(env: Env, db: Db, appId: string): Promise<void> {
  const target = await loadTarget(db, appId);
  const jobs = await db.select({ id: crons.id }).from(crons).where(eq(crons.appId, appId));
  if (!target || jobs.length === 0) return;
  const results = await Promise.allSettled(jobs.map((job) => cronStub(env, job.id).setTarget(target)));
  const synced = jobs.filter((_, i) => results[i]?.status === "fulfilled").map((job) => job.id);
  if (synced.length > 0) {
    await db
      .update(crons)
      .set({ targetVersion: target.version })
      .where(and(eq(crons.appId, appId), inArray(crons.id, synced)));
  }
  const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) throw failed.reason;
}

/** After a change to what the app's cron runs need: bump the app's version and push its target to its jobs. */
export async function appChanged(env: Env, db: Db, appId: string): Promise<void> {
  await touchApp(db, appId);
  await pushTargets(env, db, appId);
}

/** Cron jobs whose copy of their app's target is older than the app (a push that failed, or never happened). */
export async function staleTargets(db: Db): Promise<{ appId: string }[]> {
  return db
    .selectDistinct({ appId: crons.appId })
    .from(crons)
    .innerJoin(apps, eq(apps.id, crons.appId))
    .where(or(isNull(crons.targetVersion), lt(crons.targetVersion, apps.updatedAt)));
}
