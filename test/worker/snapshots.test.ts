import { createExecutionContext, createScheduledController, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import worker from "../../worker/index";
import { newId } from "../../worker/lib/ids";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { HOUR_MS, nextSnapshotAt } from "../../worker/lib/snapshot-schedule";
import { backupStub, backupUsage } from "../../worker/services/backups";
import { finishedSnapshot } from "./backup-helpers";
import { call, db, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";

type Disk = {
  id: string;
  snapshotIntervalHours: number;
  snapshotKeep: number;
  nextSnapshotAt: string | null;
  snapshotSkipped: string | null;
  createdAt: string;
};
type Backup = { id: string; status: string; description: string; automatic: boolean };
type Data<T> = { data: T };

async function newDisk(key: string, body: Record<string, unknown> = {}): Promise<Disk> {
  const res = await call("/v1/disks", { method: "POST", key, body: { name: "data", sizeGb: 1, ...body } });
  expect(res.status).toBe(201);
  return (await json<Data<Disk>>(res)).data;
}

const getDisk = async (key: string, id: string) => (await json<Data<Disk>>(await call(`/v1/disks/${id}`, { key }))).data;
const listBackups = async (key: string, diskId: string) =>
  (await json<Data<Backup[]>>(await call(`/v1/disks/${diskId}/backups`, { key }))).data;

/** One watchdog trigger, through the Worker's own scheduled() handler, as the five-minute cron trigger delivers it. */
async function watchdogPass(scheduledTime = Date.now()): Promise<void> {
  const ctx = createExecutionContext();
  worker.scheduled(createScheduledController({ cron: "*/5 * * * *", scheduledTime }), env, ctx);
  await waitOnExecutionContext(ctx);
}

const makeDue = (diskId: string, at: number) => env.DB.prepare("UPDATE disks SET next_snapshot_at = ? WHERE id = ?").bind(at, diskId).run();

/** A ready backup as the BackupJob leaves it: row plus archive object. */
async function readyBackup(accountId: string, diskId: string, opts: { automatic: boolean; createdAt: number; sizeBytes?: number }) {
  const id = newId("backup");
  const objectKey = `backups/${diskId}/${id}.tar.gz`;
  await env.BUCKET.put(objectKey, "archive");
  await env.DB.prepare(
    "INSERT INTO backups (id, account_id, disk_id, status, description, automatic, size_bytes, object_key, created_at, completed_at, expires_at) VALUES (?, ?, ?, 'ready', ?, ?, ?, ?, ?, ?, ?)",
  )
    .bind(id, accountId, diskId, opts.automatic ? "automatic snapshot" : "mine", opts.automatic ? 1 : 0, opts.sizeBytes ?? 7, objectKey, opts.createdAt, opts.createdAt, Date.now() + 86_400_000)
    .run();
  return { id, objectKey };
}


describe("automatic snapshots: the watchdog pass", () => {
  it("a disk whose snapshot is due gets an automatic backup, through the same path as a user's, and not another before its interval", async () => {
    const { adminKey: key } = await newAccount();
    const disk = await newDisk(key);
    // As a disk made before snapshots existed: due at once (the migration's default), and empty.
    await makeDue(disk.id, 0);
    const now = Date.now();
    await watchdogPass(now);

    const [auto, ...others] = await listBackups(key, disk.id);
    expect(others).toEqual([]);
    expect(auto).toMatchObject({ automatic: true, description: "automatic snapshot" });
    expect(["creating", "failed"]).toContain(auto!.status);
    // It missed whole intervals, so its schedule starts again from this pass.
    const after = await getDisk(key, disk.id);
    expect(after.nextSnapshotAt).toBe(new Date(now + 24 * HOUR_MS).toISOString());
    expect(after.snapshotSkipped).toBeNull();

    await watchdogPass(now + 60_000);
    await watchdogPass(Date.now());
    expect((await listBackups(key, disk.id)).length).toBe(1);

    // A day later, on time: another, and the schedule keeps its time of day.
    await env.DB.prepare("UPDATE backups SET status = 'ready', size_bytes = 10, reserved_bytes = 0, completed_at = ? WHERE id = ?").bind(now, auto!.id).run();
    const due = Date.now() - 60_000;
    await makeDue(disk.id, due);
    await watchdogPass(Date.now());
    const list = await listBackups(key, disk.id);
    expect(list.map((b) => b.automatic)).toEqual([true, true]);
    expect((await getDisk(key, disk.id)).nextSnapshotAt).toBe(new Date(due + 24 * HOUR_MS).toISOString());
  });

  it("counts against the backup quota: a full quota skips the snapshot with the reason on the disk, and tries again later", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const disk = await newDisk(key);
    const quota = PLAN_LIMITS.free.backupQuotaBytes;
    await readyBackup(accountId, disk.id, { automatic: false, createdAt: Date.now() - HOUR_MS, sizeBytes: quota - 10 });
    await makeDue(disk.id, Date.now() - 1000);
    const now = Date.now();
    await watchdogPass(now);
    expect((await listBackups(key, disk.id)).filter((b) => b.automatic)).toEqual([]);
    const skipped = await getDisk(key, disk.id);
    expect(skipped.snapshotSkipped).toMatch(/did not start: backup space is full/);
    expect(skipped.nextSnapshotAt).toBe(new Date(now + HOUR_MS).toISOString());
  });

  it("a disk being restored, or already being backed up, is skipped with the reason", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const restoring = await newDisk(key, { name: "restoring" });
    await env.DB.prepare("UPDATE disks SET status = 'restoring' WHERE id = ?").bind(restoring.id).run();
    const busy = await newDisk(key, { name: "busy" });
    // A user's backup still being made (its row, without an object to finish it).
    await env.DB.prepare(
      "INSERT INTO backups (id, account_id, disk_id, status, description, reserved_bytes, object_key, created_at) VALUES (?, ?, ?, 'creating', 'mine', 65536, 'x', ?)",
    )
      .bind(newId("backup"), accountId, busy.id, Date.now())
      .run();
    for (const d of [restoring, busy]) await makeDue(d.id, Date.now() - 1000);
    await watchdogPass();
    expect(await listBackups(key, restoring.id)).toEqual([]);
    expect((await getDisk(key, restoring.id)).snapshotSkipped).toMatch(/did not start: the disk was being restored$/);
    expect((await listBackups(key, busy.id)).map((b) => b.automatic)).toEqual([false]);
    expect((await getDisk(key, busy.id)).snapshotSkipped).toMatch(/did not start: a backup of the disk was still being made$/);
  });

  it("snapshotIntervalHours 0 turns them off: no due time, and the pass leaves the disk alone", async () => {
    const { adminKey: key } = await newAccount();
    const off = await newDisk(key, { name: "off", snapshotIntervalHours: 0 });
    expect(off).toMatchObject({ snapshotIntervalHours: 0, nextSnapshotAt: null });
    const on = await newDisk(key, { name: "on" });
    const patched = await call(`/v1/disks/${on.id}`, { method: "PATCH", key, body: { snapshotIntervalHours: 0 } });
    expect((await json<Data<Disk>>(patched)).data).toMatchObject({ snapshotIntervalHours: 0, nextSnapshotAt: null });
    // Even a due time left behind does not make a disk with snapshots off due.
    await makeDue(off.id, Date.now() - 1000);
    await watchdogPass();
    expect(await listBackups(key, off.id)).toEqual([]);
    expect(await listBackups(key, on.id)).toEqual([]);
  });
});

describe("automatic snapshots: keeping snapshotKeep", () => {
  it("when a new automatic snapshot is ready, the oldest automatic ones beyond the keep are deleted, never a user's", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const disk = await newDisk(key, { snapshotKeep: 2 });
    const day = 24 * HOUR_MS;
    const now = Date.now();
    const mine = await readyBackup(accountId, disk.id, { automatic: false, createdAt: now - 10 * day });
    const old = [3, 2, 1].map((ago) => readyBackup(accountId, disk.id, { automatic: true, createdAt: now - ago * day }));
    const [oldest, older, newest] = await Promise.all(old);
    const { backupId, status } = await finishedSnapshot(accountId, disk.id, { automatic: true, description: "automatic snapshot" });
    await backupStub(env, backupId).jobFinished(status);

    const list = await listBackups(key, disk.id);
    expect(list.map((b) => [b.id, b.automatic, b.status])).toEqual([
      [backupId, true, "ready"],
      [newest!.id, true, "ready"],
      [mine.id, false, "ready"],
    ]);
    for (const gone of [oldest!, older!]) expect(await env.BUCKET.head(gone.objectKey)).toBeNull();
    expect(await env.BUCKET.head(mine.objectKey)).not.toBeNull();
    // The new snapshot's archive counts in the quota like any ready backup.
    expect(await backupUsage(db(), accountId)).toBe(7 + 7 + (status.result?.kind === "snapshot" ? status.result.sizeBytes : 0));
  });

  it("a user's backup reports automatic: false", async () => {
    const { adminKey: key } = await newAccount();
    const disk = await newDisk(key);
    const created = await json<{ data: Backup }>(await call(`/v1/disks/${disk.id}/backups`, { method: "POST", key, body: {} }));
    expect(created.data.automatic).toBe(false);
    expect((await listBackups(key, disk.id)).map((b) => b.automatic)).toEqual([false]);
  });
});

describe("automatic snapshots: settings", () => {
  it("a new disk snapshots daily and keeps 7 by default, the first one a day after it was made", async () => {
    const { adminKey: key } = await newAccount();
    const disk = await newDisk(key);
    expect(disk).toMatchObject({ snapshotIntervalHours: 24, snapshotKeep: 7, snapshotSkipped: null });
    expect(Date.parse(disk.nextSnapshotAt!) - Date.parse(disk.createdAt)).toBe(24 * HOUR_MS);
    const listed = (await json<Data<Disk[]>>(await call("/v1/disks", { key }))).data.find((d) => d.id === disk.id);
    expect(listed).toMatchObject({ snapshotIntervalHours: 24, snapshotKeep: 7, nextSnapshotAt: disk.nextSnapshotAt });
  });

  it("create and update validate the settings (400 VALIDATION_ERROR) and bound the keep by the plan (403 PLAN_LIMIT_EXCEEDED)", async () => {
    const { accountId, adminKey: key } = await newAccount();
    for (const body of [
      { snapshotIntervalHours: -1 },
      { snapshotIntervalHours: 169 },
      { snapshotIntervalHours: 1.5 },
      { snapshotIntervalHours: "daily" },
      { snapshotKeep: 0 },
      { snapshotKeep: 91 },
    ]) {
      const res = await call("/v1/disks", { method: "POST", key, body: { name: "bad", sizeGb: 1, ...body } });
      expect(res.status, JSON.stringify(body)).toBe(400);
      const err = await json<ErrorJson>(res);
      expect(err.error.code).toBe("VALIDATION_ERROR");
      expect(err.error.details?.map((d) => d.field)).toEqual([Object.keys(body)[0]]);
    }
    const overPlan = await call("/v1/disks", { method: "POST", key, body: { name: "many", sizeGb: 1, snapshotKeep: 8 } });
    expect(overPlan.status).toBe(403);
    expect((await json<ErrorJson>(overPlan)).error).toMatchObject({ code: "PLAN_LIMIT_EXCEEDED", message: expect.stringMatching(/at most 7 automatic snapshots/) });
    expect((await json<Data<Disk[]>>(await call("/v1/disks", { key }))).data).toEqual([]);

    const disk = await newDisk(key);
    const patch = (body: unknown) => call(`/v1/disks/${disk.id}`, { method: "PATCH", key, body });
    for (const body of [{}, { name: "renamed" }, { snapshotIntervalHours: 200 }, { snapshotKeep: 0 }]) {
      const res = await patch(body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((await json<ErrorJson>(res)).error.code).toBe("VALIDATION_ERROR");
    }
    const refused = await patch({ snapshotKeep: 8 });
    expect([refused.status, (await json<ErrorJson>(refused)).error.code]).toEqual([403, "PLAN_LIMIT_EXCEEDED"]);
    expect((await getDisk(key, disk.id)).snapshotKeep).toBe(7);

    const before = Date.now();
    const changed = await patch({ snapshotIntervalHours: 6, snapshotKeep: 3 });
    expect(changed.status).toBe(200);
    const updated = (await json<Data<Disk>>(changed)).data;
    expect(updated).toMatchObject({ snapshotIntervalHours: 6, snapshotKeep: 3 });
    expect(Date.parse(updated.nextSnapshotAt!) - before).toBeGreaterThanOrEqual(6 * HOUR_MS);
    expect(Date.parse(updated.nextSnapshotAt!) - Date.now()).toBeLessThanOrEqual(6 * HOUR_MS);
    // Changing only the keep leaves the schedule as it was.
    const keepOnly = (await json<Data<Disk>>(await patch({ snapshotKeep: 5 }))).data;
    expect(keepOnly).toMatchObject({ snapshotKeep: 5, nextSnapshotAt: updated.nextSnapshotAt });

    const pro = await newAccount("pro");
    const proDisk = await newDisk(pro.adminKey, { snapshotKeep: 30, snapshotIntervalHours: 1 });
    expect(proDisk).toMatchObject({ snapshotKeep: 30, snapshotIntervalHours: 1 });

    const checks = await expectAuthEnforced(`/v1/disks/${disk.id}`, { method: "PATCH", body: { snapshotKeep: 2 } }, "deploy", accountId);
    expect([checks.unauthenticated, checks.garbage, checks.wrongScope?.error.code]).toEqual([401, 401, "INSUFFICIENT_SCOPE"]);
    const foreign = await call(`/v1/disks/${disk.id}`, { method: "PATCH", key: pro.adminKey, body: { snapshotKeep: 2 } });
    expect([foreign.status, (await json<ErrorJson>(foreign)).error.code]).toEqual([404, "DISK_NOT_FOUND"]);
  });

  it("the next snapshot keeps its time of day when on time, and restarts from now after a missed interval", () => {
    const due = Date.UTC(2026, 10, 24, 3, 0);
    expect(nextSnapshotAt(due, 24, due + 4 * 60_000)).toBe(due + 24 * HOUR_MS);
    expect(nextSnapshotAt(due, 24, due + 30 * HOUR_MS)).toBe(due + 54 * HOUR_MS);
    expect(nextSnapshotAt(0, 24, due)).toBe(due + 24 * HOUR_MS);
  });
});
