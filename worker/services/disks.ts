import { and, desc, eq, sql } from "drizzle-orm";
import { metricsStub } from "./metrics";
import { type Db, isUniqueViolation } from "../db/client";
import { type AppRow, apps, backups, type DiskRow, disks, type Plan } from "../db/schema";
import { configOf, type Env } from "../env";
import { destroyDisk, diskUsage, LONE_BUILDER_ID, provisionDisk } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { isId, newId } from "../lib/ids";
import { planLimitError, planOf } from "../lib/plans";
import { DEFAULT_SNAPSHOT_INTERVAL_HOURS, DEFAULT_SNAPSHOT_KEEP, firstSnapshotAt } from "../lib/snapshot-schedule";
import { iso, isoOrNull } from "../lib/time";
import { deletePrefix } from "../storage/objects";
import { lostNode } from "./fleet";
import { diskNode, placeDisk } from "./placement";

export const GIB = 1024 ** 3;

export type DiskView = {
  id: string;
  name: string;
  sizeGb: number;
  mountPath: string;
  status: DiskRow["status"];
  appId: string | null;
  appName: string | null;
  inUse: boolean;
  /** Hours between automatic snapshots; 0 when they are off. */
  snapshotIntervalHours: number;
  snapshotKeep: number;
  /** When the next automatic snapshot starts (a time past means at the next watchdog pass); null when off. */
  nextSnapshotAt: string | null;
  snapshotSkipped: string | null;
  /** What happened to the disk when its node was lost or drained (DiskRow.placementNote). */
  placement: string | null;
  /** Percent of its bytes or files at which `disk.almost_full` goes out. */
  alertAtPercent: number;
  /** Bytes the disk's files take on its node (allocated blocks); null when not measured (see {@link measured}). */
  usedBytes: number | null;
  createdAt: string;
  updatedAt: string;
};

/** A disk's snapshot settings as the API takes them (both optional on update). */
export type SnapshotSettings = { snapshotIntervalHours?: number; snapshotKeep?: number };
/** What `PATCH /v1/disks/{disk}` changes: its snapshots and its alert threshold. */
export type DiskSettings = SnapshotSettings & { alertAtPercent?: number };

type DiskWithApp = { disk: DiskRow; app: Pick<AppRow, "id" | "name" | "status"> | null };

/**
 * The one definition of "in use" (spec: restore is refused while the disk is in
 * use): attached to an app that is running. Detaching or stopping frees it.
 */
export function isInUse({ app }: DiskWithApp): boolean {
  return app !== null && app.status === "running";
}

function viewOf(entry: DiskWithApp): DiskView {
  const { disk, app } = entry;
  return {
    id: disk.id,
    name: disk.name,
    sizeGb: disk.sizeGb,
    mountPath: disk.mountPath,
    status: disk.status,
    appId: app?.id ?? null,
    appName: app?.name ?? null,
    inUse: isInUse(entry),
    snapshotIntervalHours: disk.snapshotIntervalHours,
    snapshotKeep: disk.snapshotKeep,
    // A disk older than snapshots is due "at 0": shown as due since it was made.
    nextSnapshotAt: isoOrNull(disk.nextSnapshotAt === null ? null : Math.max(disk.nextSnapshotAt, disk.createdAt)),
    snapshotSkipped: disk.snapshotSkipped,
    placement: disk.placementNote,
    alertAtPercent: disk.alertAtPercent,
    usedBytes: null,
    createdAt: iso(disk.createdAt),
    updatedAt: iso(disk.updatedAt),
  };
}

function selectWithApp(db: Db) {
  return db
    .select({ disk: disks, app: { id: apps.id, name: apps.name, status: apps.status } })
    .from(disks)
    .leftJoin(apps, eq(disks.appId, apps.id));
}

/** Finds a disk of the account by id or name, with its app; 404 otherwise. */
export async function resolveDisk(db: Db, accountId: string, ref: string): Promise<DiskWithApp> {
  const row = await selectWithApp(db)
    .where(and(eq(disks.accountId, accountId), isId("disk", ref) ? eq(disks.id, ref) : eq(disks.name, ref)))
    .get();
  if (!row) throw new ApiError("DISK_NOT_FOUND", `disk ${ref} not found`);
  return row;
}

/** How long a listing waits for nodes to say how full their disks are before it answers without. */
const USAGE_WAIT_MS = 1500;

/**
 * Views with `usedBytes` asked of the nodes holding the disks, all at once and
 * for at most {@link USAGE_WAIT_MS}: a node that is slow, lost or mid-restore
 * leaves its disks' usage null rather than holding up the answer (a restoring
 * disk's files are being replaced, so it is not asked at all).
 */
async function measured(env: Env, entries: DiskWithApp[]): Promise<DiskView[]> {
  const signal = AbortSignal.timeout(USAGE_WAIT_MS);
  return Promise.all(
    entries.map(async (entry) => {
      const view = viewOf(entry);
      if (entry.disk.status !== "available") return view;
      try {
        const usage = await diskUsage(configOf(env), await diskNode(env, entry.disk), entry.disk.id, signal);
        return usage.ok ? { ...view, usedBytes: usage.value.usedBytes } : view;
      } catch {
        return view; // unreachable or too slow: shown as not measured
      }
    }),
  );
}

export async function diskView(db: Db, env: Env, accountId: string, ref: string): Promise<DiskView> {
  const [view] = await measured(env, [await resolveDisk(db, accountId, ref)]);
  return view!;
}

export async function listDisks(db: Db, env: Env, accountId: string): Promise<DiskView[]> {
  const rows = await selectWithApp(db).where(eq(disks.accountId, accountId)).orderBy(desc(disks.createdAt), desc(disks.id));
  return measured(env, rows);
}

/**
 * Inserts the row, then provisions the directory on the builder; if the
 * builder refuses or is unreachable the row is removed again, so a disk either
 * exists in both places or in neither.
 */
export async function createDisk(
  db: Db,
  env: Env,
  accountId: string,
  input: { name: string; sizeGb: number; mountPath: string } & DiskSettings,
): Promise<DiskView> {
  const now = Date.now();
  const interval = input.snapshotIntervalHours ?? DEFAULT_SNAPSHOT_INTERVAL_HOURS;
  const row: DiskRow = {
    id: newId("disk"),
    accountId,
    name: input.name,
    sizeGb: input.sizeGb,
    mountPath: input.mountPath,
    appId: null,
    status: "available",
    nodeId: null,
    generation: 1,
    placementNote: null,
    alertAtPercent: input.alertAtPercent ?? 90,
    // The first snapshot one interval after creation: an empty disk has nothing to keep yet.
    snapshotIntervalHours: interval,
    snapshotKeep: input.snapshotKeep ?? DEFAULT_SNAPSHOT_KEEP,
    nextSnapshotAt: firstSnapshotAt(interval, now),
    snapshotSkipped: null,
    createdAt: now,
    updatedAt: now,
  };
  const { plan, limits } = await planOf(db, accountId);
  if (input.sizeGb > limits.diskSizeGb) {
    throw planLimitError(plan, `a disk may have at most ${limits.diskSizeGb} GB (asked for ${input.sizeGb} GB)`, "ask for less");
  }
  checkSnapshotKeep(plan, limits.snapshotKeep, row.snapshotKeep);
  // Placed before it exists anywhere: the node with the most room (placement.ts).
  const node = await placeDisk(env, db, row.sizeGb * GIB);
  row.nodeId = node.id === LONE_BUILDER_ID ? null : node.id;
  // The plan's limits are checked by the statement that inserts, so concurrent creations cannot both squeeze in.
  const owned = sql`(select count(*) from disks where account_id = ${accountId})`;
  const reserved = sql`(select coalesce(sum(size_gb), 0) from disks where account_id = ${accountId})`;
  let inserted: D1Result;
  try {
    inserted = await db.run(sql`
      insert into disks (id, account_id, name, size_gb, mount_path, app_id, status, node_id, generation,
                         snapshot_interval_hours, snapshot_keep, next_snapshot_at, alert_at_percent, created_at, updated_at)
      select ${row.id}, ${accountId}, ${row.name}, ${row.sizeGb}, ${row.mountPath}, null, ${row.status}, ${row.nodeId}, 1,
             ${row.snapshotIntervalHours}, ${row.snapshotKeep}, ${row.nextSnapshotAt}, ${row.alertAtPercent}, ${now}, ${now}
      where ${owned} < ${limits.disks} and ${reserved} + ${row.sizeGb} <= ${limits.totalDiskGb}`);
  } catch (err) {
    if (isUniqueViolation(err)) throw new ApiError("NAME_TAKEN", `a disk named "${input.name}" already exists`);
    throw err;
  }
  if (inserted.meta.changes !== 1) {
    const usage = await db.get<{ count: number; gb: number }>(sql`select ${owned} as count, ${reserved} as gb`);
    if (usage.count >= limits.disks) throw planLimitError(plan, `an account may have ${limits.disks} disks and has ${usage.count}`, "delete one");
    throw planLimitError(
      plan,
      `an account's disks may hold ${limits.totalDiskGb} GB in all; ${usage.gb} GB are taken and this disk asks for ${row.sizeGb} GB`,
      "delete or shrink a disk",
    );
  }
  const spec = { sizeBytes: row.sizeGb * GIB, tenant: row.accountId, generation: row.generation };
  const provisioned = await provisionDisk(configOf(env), node, row.id, spec).catch(async (err: unknown) => {
    await db.delete(disks).where(eq(disks.id, row.id));
    throw err;
  });
  if (!provisioned.ok) {
    await db.delete(disks).where(eq(disks.id, row.id));
    throw builderRefusal(provisioned, "the builder could not create the disk");
  }
  return viewOf({ disk: row, app: null });
}

function checkSnapshotKeep(plan: Plan, max: number, keep: number): void {
  if (keep > max) {
    throw planLimitError(plan, `a disk may keep at most ${max} automatic snapshots (asked for ${keep})`, "keep fewer");
  }
}

/**
 * Changes a disk's automatic snapshots. A new interval (or turning them on)
 * starts the schedule afresh: the next one is due an interval from now; 0
 * turns them off (the snapshots already made stay until their retention ends).
 * A smaller keep takes effect when the next automatic snapshot is ready, so
 * changing a setting never deletes a backup by itself.
 */
export async function updateDisk(db: Db, accountId: string, ref: string, input: DiskSettings): Promise<DiskView> {
  const { disk } = await resolveDisk(db, accountId, ref);
  const now = Date.now();
  const changes: Partial<DiskRow> = { updatedAt: now };
  if (input.alertAtPercent !== undefined) changes.alertAtPercent = input.alertAtPercent;
  if (input.snapshotKeep !== undefined) {
    const { plan, limits } = await planOf(db, accountId);
    checkSnapshotKeep(plan, limits.snapshotKeep, input.snapshotKeep);
    changes.snapshotKeep = input.snapshotKeep;
  }
  const interval = input.snapshotIntervalHours;
  if (interval !== undefined && interval !== disk.snapshotIntervalHours) {
    changes.snapshotIntervalHours = interval;
    changes.nextSnapshotAt = firstSnapshotAt(interval, now);
    changes.snapshotSkipped = null;
  }
  await db.update(disks).set(changes).where(eq(disks.id, disk.id));
  return viewOf(await resolveDisk(db, accountId, disk.id));
}

/**
 * A builder's refusal as the API reports it: a disk busy with a job is the
 * user's to wait for (409), a host without room the platform's (507); anything
 * else means the data plane failed us (502).
 */
function builderRefusal(refusal: { code: string; message: string }, what: string): ApiError {
  if (refusal.code === "DISK_BUSY") return new ApiError("DISK_BUSY", `${what}: ${refusal.message}`);
  if (refusal.code === "INSUFFICIENT_STORAGE") return new ApiError("INSUFFICIENT_STORAGE", `${what}: ${refusal.message}`);
  return new ApiError("BUILDER_UNAVAILABLE", `${what}: ${refusal.message}`);
}

export async function attachDisk(db: Db, accountId: string, ref: string, app: AppRow): Promise<DiskView> {
  const { disk, app: current } = await resolveDisk(db, accountId, ref);
  if (current && current.id !== app.id) {
    throw new ApiError("DISK_ATTACHED", `disk ${disk.name} is attached to app ${current.name}; detach it first`);
  }
  if (disk.status === "restoring") throw new ApiError("DISK_IN_USE", `disk ${disk.name} is being restored; attach it when the restore ends`);
  // One disk per app, as on Render and Fly: its runs, backups and restores name exactly one. The
  // update checks it itself, so two disks attached at once cannot both land on the app.
  const attached = await db.run(sql`
    update disks set app_id = ${app.id}, updated_at = ${Date.now()}
    where id = ${disk.id} and not exists (select 1 from disks other where other.app_id = ${app.id} and other.id != ${disk.id})
      and (select instances from apps where id = ${app.id}) = 1`);
  if (attached.meta.changes !== 1) {
    const instances = (await db.select({ instances: apps.instances }).from(apps).where(eq(apps.id, app.id)).get())?.instances ?? 1;
    if (instances > 1) {
      throw new ApiError("APP_HAS_INSTANCES", `app ${app.name} runs ${instances} instances; an app with a disk runs one (one writer per disk): \`svc apps scale ${app.name} 1\` first`);
    }
    const other = await db.select({ name: disks.name, mountPath: disks.mountPath }).from(disks).where(eq(disks.appId, app.id)).get();
    throw new ApiError(
      "APP_HAS_DISK",
      `app ${app.name} already has disk ${other?.name ?? "another disk"}${other ? ` at ${other.mountPath}` : ""}; an app has one disk: detach it first`,
    );
  }
  return viewOf(await resolveDisk(db, accountId, disk.id));
}

/** Detaches the disk; also says which app had it (its cron jobs must learn of it). */
export async function detachDisk(db: Db, accountId: string, ref: string): Promise<{ disk: DiskView; formerAppId: string | null }> {
  const { disk } = await resolveDisk(db, accountId, ref);
  await db.update(disks).set({ appId: null, updatedAt: Date.now() }).where(eq(disks.id, disk.id));
  return { disk: viewOf(await resolveDisk(db, accountId, disk.id)), formerAppId: disk.appId };
}

/**
 * Refused while attached or restoring. The builder's data goes first so a
 * failure leaves the disk listed; then the disk's backup archives and restore
 * uploads, then the rows (backups cascade with the disk).
 */
export async function deleteDisk(db: Db, env: Env, accountId: string, ref: string): Promise<string> {
  const { disk, app } = await resolveDisk(db, accountId, ref);
  if (app) throw new ApiError("DISK_ATTACHED", `disk ${disk.name} is attached to app ${app.name}; detach it first`);
  if (disk.status === "restoring") throw new ApiError("DISK_IN_USE", `disk ${disk.name} is being restored`);
  const backup = await db
    .select({ id: backups.id })
    .from(backups)
    .where(and(eq(backups.diskId, disk.id), eq(backups.status, "creating")))
    .get();
  if (backup) {
    throw new ApiError("DISK_BUSY", `disk ${disk.name} is being backed up (${backup.id}); delete it once the backup is ready or failed`);
  }
  // A disk whose node is lost is deleted from the record (and its backups); the node, if it returns, sets its copy aside.
  const node = await diskNode(env, disk);
  if (!(await lostNode(env, node.id))) {
    const destroyed = await destroyDisk(configOf(env), node, disk.id);
    if (!destroyed.ok) throw builderRefusal(destroyed, "the builder could not delete the disk");
  }
  await deletePrefix(env.BUCKET, `backups/${disk.id}/`);
  await deletePrefix(env.BUCKET, `restore-uploads/${disk.id}/`);
  await db.delete(disks).where(eq(disks.id, disk.id));
  await metricsStub(env, disk.id).drop();
  return disk.id;
}
