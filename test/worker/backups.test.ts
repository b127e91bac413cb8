import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { newId } from "../../worker/lib/ids";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { call, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";

type Envelope<T> = { data: T; status: number };
type Backup = { id: string; diskId: string; sizeBytes: number; status: string; description: string; createdAt: string; completedAt?: string };
type ErrorEnvelope = ErrorJson & { status: number; data: null };

const uniqueName = (p: string) => `${p}-${crypto.randomUUID().slice(0, 8)}`;

async function setup() {
  const account = await newAccount();
  const key = account.adminKey;
  const app = uniqueName("bk");
  await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "node" } });
  const disk = (await json<{ data: { id: string } }>(await call("/v1/disks", { method: "POST", key, body: { name: "data", sizeGb: 1 } }))).data;
  return { ...account, key, app, diskId: disk.id };
}

/** A ready backup as the BackupJob leaves it: row plus archive object. */
async function readyBackup(accountId: string, diskId: string, sizeBytes: number, content = "archive-bytes") {
  const id = newId("backup");
  const objectKey = `backups/${diskId}/${id}.tar.gz`;
  await env.BUCKET.put(objectKey, content);
  const now = Date.now();
  await env.DB.prepare(
    "INSERT INTO backups (id, account_id, disk_id, status, description, size_bytes, object_key, created_at, completed_at, expires_at, sha256) VALUES (?, ?, ?, 'ready', 'seeded', ?, ?, ?, ?, ?, ?)",
  )
    .bind(id, accountId, diskId, sizeBytes, objectKey, now, now, now + 86_400_000, "0".repeat(64))
    .run();
  return id;
}

async function backupCount(accountId: string): Promise<number> {
  return (await env.DB.prepare("SELECT count(*) AS n FROM backups WHERE account_id = ?").bind(accountId).first<{ n: number }>())!.n;
}

describe("/v1/disks/:diskId/backups", () => {
  it("creates a backup (201 {data, status}, status creating) and lists it", async () => {
    const { key, diskId } = await setup();
    const res = await call(`/v1/disks/${diskId}/backups`, { method: "POST", key, body: { description: "before upgrade" } });
    expect(res.status).toBe(201);
    const body = await json<Envelope<Backup>>(res);
    expect(body.status).toBe(201);
    expect(body.data).toMatchObject({ diskId, status: "creating", description: "before upgrade", sizeBytes: 0 });
    expect(body.data.id).toMatch(/^bak_/);
    const list = await json<Envelope<Backup[]>>(await call(`/v1/disks/${diskId}/backups`, { key }));
    expect(list.status).toBe(200);
    expect(list.data.map((b) => b.id)).toContain(body.data.id);
  });

  it("refuses a backup beyond the plan's quota (409, nothing created); deleting a backup frees it", async () => {
    const { accountId, key, diskId } = await setup();
    const quota = PLAN_LIMITS.free.backupQuotaBytes;
    const big = await readyBackup(accountId, diskId, quota - 10);
    await env.DB.prepare("INSERT INTO database_dumps (id, account_id, size_bytes, created_at) VALUES (?, ?, ?, ?)")
      .bind(`dump_${crypto.randomUUID()}`, accountId, 10, Date.now())
      .run();
    const before = await backupCount(accountId);
    // Even an empty disk's archive takes bytes, and usage already equals the quota.
    const refused = await call(`/v1/disks/${diskId}/backups`, { method: "POST", key, body: { description: "x" } });
    expect(refused.status).toBe(409);
    const err = await json<ErrorEnvelope>(refused);
    expect(err).toMatchObject({ status: 409, data: null, error: { code: "BACKUP_QUOTA_EXCEEDED" } });
    expect(await backupCount(accountId)).toBe(before);

    const deleted = await call(`/v1/disks/${diskId}/backups/${big}`, { method: "DELETE", key });
    expect(deleted.status).toBe(200);
    expect(await json(deleted)).toEqual({ data: { id: big, deleted: true }, status: 200 });
    expect(await env.BUCKET.head(`backups/${diskId}/${big}.tar.gz`)).toBeNull();
    const accepted = await call(`/v1/disks/${diskId}/backups`, { method: "POST", key, body: {} });
    expect(accepted.status).toBe(201);
  });

  it("download: presigned GET of a ready backup; 409 BACKUP_NOT_READY while creating; 404 for unknown or foreign", async () => {
    const { accountId, key, diskId } = await setup();
    const ready = await readyBackup(accountId, diskId, 13, "archive-bytes");
    const res = await call(`/v1/disks/${diskId}/backups/${ready}/download`, { key });
    expect(res.status).toBe(200);
    const link = await json<Envelope<{ url: string; expiresAt: string }>>(res);
    expect(Date.parse(link.data.expiresAt) - Date.now()).toBeGreaterThan(3_590_000);
    expect(Date.parse(link.data.expiresAt) - Date.now()).toBeLessThanOrEqual(3_600_000);
    const fetched = await exports.default.fetch(new Request(link.data.url));
    expect(await fetched.text()).toBe("archive-bytes");

    const creating = (await json<Envelope<Backup>>(await call(`/v1/disks/${diskId}/backups`, { method: "POST", key, body: {} }))).data;
    const notReady = await call(`/v1/disks/${diskId}/backups/${creating.id}/download`, { key });
    if (notReady.status !== 200) {
      expect(notReady.status).toBe(409);
      expect((await json<ErrorEnvelope>(notReady)).error.code).toBe("BACKUP_NOT_READY");
    }

    const unknown = await call(`/v1/disks/${diskId}/backups/bak_AAAAAAAAAAAAAAAAAAAAAAAA/download`, { key });
    expect(unknown.status).toBe(404);
    expect(await json<ErrorEnvelope>(unknown)).toMatchObject({ status: 404, data: null, error: { code: "BACKUP_NOT_FOUND" } });
    const other = await setup();
    const foreign = await call(`/v1/disks/${diskId}/backups/${ready}/download`, { key: other.key });
    expect(foreign.status).toBe(404);
    expect((await json<ErrorEnvelope>(foreign)).error.code).toBe("DISK_NOT_FOUND");
    const otherDisk = await call(`/v1/disks/${other.diskId}/backups/${ready}/download`, { key: other.key });
    expect((await json<ErrorEnvelope>(otherDisk)).error.code).toBe("BACKUP_NOT_FOUND");
    await call(`/v1/disks/${diskId}/backups/${ready}`, { method: "DELETE", key });
    expect((await call(`/v1/disks/${diskId}/backups/${ready}/download`, { key })).status).toBe(404);
  });

  it("restore: presign, PUT, then UPLOAD_NOT_FOUND / UPLOAD_INCOMPLETE / 410 / DISK_IN_USE rules, accepted after stop", async () => {
    const { accountId, key, diskId, app } = await setup();
    await call(`/v1/disks/${diskId}/attach`, { method: "POST", key, body: { app } });
    const archive = new TextEncoder().encode("not really a tarball");

    const presigned = await json<Envelope<{ uploadUrl: string; uploadId: string; expiresAt: string }>>(
      await call(`/v1/disks/${diskId}/backups/restore/presign`, { method: "POST", key, body: { sizeBytes: archive.byteLength } }),
    );
    expect(presigned.status).toBe(200);
    expect(presigned.data.uploadId).toMatch(/^upl_/);

    const restore = (body: unknown) => call(`/v1/disks/${diskId}/backups/restore`, { method: "POST", key, body });
    const unknown = await restore({ uploadId: "upl_AAAAAAAAAAAAAAAAAAAAAAAA" });
    expect([unknown.status, (await json<ErrorEnvelope>(unknown)).error.code]).toEqual([404, "UPLOAD_NOT_FOUND"]);
    const early = await restore({ uploadId: presigned.data.uploadId });
    expect([early.status, (await json<ErrorEnvelope>(early)).error.code]).toEqual([409, "UPLOAD_INCOMPLETE"]);

    const put = await exports.default.fetch(new Request(presigned.data.uploadUrl, { method: "PUT", body: archive }));
    expect(put.status).toBe(200);

    const inUse = await restore({ uploadId: presigned.data.uploadId });
    expect(inUse.status).toBe(409);
    const inUseErr = await json<ErrorEnvelope>(inUse);
    expect(inUseErr.error.code).toBe("DISK_IN_USE");
    expect(inUseErr.error.message).toMatch(/detach the disk or stop the app, restore, then attach/);

    await call(`/v1/apps/${app}/stop`, { method: "POST", key });
    const accepted = await restore({ uploadId: presigned.data.uploadId });
    expect(accepted.status).toBe(202);
    const job = await json<Envelope<{ jobId: string; status: string }>>(accepted);
    expect(job).toMatchObject({ status: 202, data: { status: "running" } });
    expect(job.data.jobId).toMatch(/^rst_/);
    // The upload is consumed, and the disk is busy until the restore ends.
    expect((await restore({ uploadId: presigned.data.uploadId })).status).toBe(404);
    const status = await json<Envelope<{ jobId: string; status: string }>>(
      await call(`/v1/disks/${diskId}/backups/restore/${job.data.jobId}`, { key }),
    );
    expect(status.data.jobId).toBe(job.data.jobId);

    // A window that passed without an upload: 410.
    const expiredId = newId("upload");
    await env.DB.prepare(
      "INSERT INTO restore_uploads (id, account_id, disk_id, size_bytes, object_key, expires_at, created_at) VALUES (?, ?, ?, 10, ?, ?, ?)",
    )
      .bind(expiredId, accountId, diskId, `restore-uploads/${diskId}/${expiredId}.tar.gz`, Date.now() - 1000, Date.now() - 3_601_000)
      .run();
    const gone = await restore({ uploadId: expiredId });
    expect([gone.status, (await json<ErrorEnvelope>(gone)).error.code]).toEqual([410, "PRESIGNED_URL_EXPIRED"]);
  });

  it("an upload of another size than announced is UPLOAD_INCOMPLETE; oversize presign is 413", async () => {
    const { key, diskId } = await setup();
    const presigned = (await json<Envelope<{ uploadId: string }>>(
      await call(`/v1/disks/${diskId}/backups/restore/presign`, { method: "POST", key, body: { sizeBytes: 100 } }),
    )).data;
    const row = await env.DB.prepare("SELECT object_key FROM restore_uploads WHERE id = ?").bind(presigned.uploadId).first<{ object_key: string }>();
    await env.BUCKET.put(row!.object_key, "short");
    const res = await call(`/v1/disks/${diskId}/backups/restore`, { method: "POST", key, body: { uploadId: presigned.uploadId } });
    expect([res.status, (await json<ErrorEnvelope>(res)).error.code]).toEqual([409, "UPLOAD_INCOMPLETE"]);
    const huge = await call(`/v1/disks/${diskId}/backups/restore/presign`, { method: "POST", key, body: { sizeBytes: 60 * 1024 ** 3 } });
    expect(huge.status).toBe(413);
    expect((await json<ErrorEnvelope>(huge)).error.code).toBe("PAYLOAD_TOO_LARGE");
    const big = (await json<Envelope<{ parts?: { sizeBytes: number }[] }>>(
      await call(`/v1/disks/${diskId}/backups/restore/presign`, { method: "POST", key, body: { sizeBytes: 200 * 1024 * 1024 } }),
    )).data;
    expect(big.parts?.reduce((s, p) => s + p.sizeBytes, 0)).toBe(200 * 1024 * 1024);
  });

  it("errors carry the {error, status, data:null} envelope, and every route enforces key, scope and account", async () => {
    const a = await setup();
    const b = await setup();
    const backup = await readyBackup(a.accountId, a.diskId, 5);
    const routes: [string, { method?: string; body?: unknown }][] = [
      [`/v1/disks/${a.diskId}/backups`, { method: "POST", body: {} }],
      [`/v1/disks/${a.diskId}/backups`, {}],
      [`/v1/disks/${a.diskId}/backups/${backup}/download`, {}],
      [`/v1/disks/${a.diskId}/backups/restore/presign`, { method: "POST", body: { sizeBytes: 10 } }],
      [`/v1/disks/${a.diskId}/backups/restore`, { method: "POST", body: { backupId: backup } }],
      [`/v1/disks/${a.diskId}/backups/${backup}`, { method: "DELETE" }],
    ];
    for (const [path, init] of routes) {
      const checks = await expectAuthEnforced(path, init, "deploy", a.accountId);
      expect([checks.unauthenticated, checks.garbage, checks.wrongScope?.error.code], path).toEqual([401, 401, "INSUFFICIENT_SCOPE"]);
      const foreign = await call(path, { ...init, key: b.key });
      expect(foreign.status, path).toBe(404);
      expect(await json<ErrorEnvelope>(foreign)).toMatchObject({ status: 404, data: null });
    }
    const invalid = await call(`/v1/disks/${a.diskId}/backups`, { method: "POST", key: a.key, body: { description: "x".repeat(501) } });
    expect(await json<ErrorEnvelope>(invalid)).toMatchObject({ status: 400, data: null, error: { code: "VALIDATION_ERROR" } });
  });
});
