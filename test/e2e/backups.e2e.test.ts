import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { chmod, lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalStack, startLocalStack } from "../../scripts/local-stack";
import { diskDataPath } from "../builder/builder-process";

/**
 * Disk backup and restore through the whole system: the Worker under
 * `wrangler dev` (API, BackupJob/RestoreJob objects, the /storage gateway over
 * local R2) and the real builder streaming real files.
 */
let stack: LocalStack;
let root: string;

type Envelope<T> = { data: T; status: number };
type Backup = { id: string; status: string; sizeBytes: number; sha256?: string; failureReason?: string };

async function api<T>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
  const res = await fetch(`${stack.apiUrl}${path}`, {
    method,
    headers: { Authorization: `Bearer ${stack.adminKey}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as T };
}

async function until<T>(what: string, probe: () => Promise<T | null>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== null) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

/** Every entry under `dir`: type, mode, and content hash or link target. */
async function tree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  async function walk(path: string): Promise<void> {
    for (const entry of await readdir(path, { withFileTypes: true })) {
      const full = join(path, entry.name);
      const rel = relative(dir, full);
      const stat = await lstat(full);
      const mode = (stat.mode & 0o777).toString(8);
      if (entry.isSymbolicLink()) out[rel] = `link -> ${await readlink(full)}`;
      else if (entry.isDirectory()) {
        out[rel] = `dir ${mode}`;
        await walk(full);
      } else out[rel] = `file ${mode} ${createHash("sha256").update(await readFile(full)).digest("hex")}`;
    }
  }
  await walk(dir);
  return out;
}

/** A gzipped tar holding one regular file under an arbitrary (hostile) name. */
function hostileArchive(name: string, content: string): Buffer {
  const header = Buffer.alloc(512);
  header.write(name, 0, 100, "utf8");
  header.write("0000644\0", 100);
  header.write("0000000\0", 108);
  header.write("0000000\0", 116);
  header.write(`${Buffer.byteLength(content).toString(8).padStart(11, "0")}\0`, 124);
  header.write(`${Math.floor(Date.now() / 1000).toString(8).padStart(11, "0")}\0`, 136);
  header.write("        ", 148);
  header.write("0", 156);
  header.write("ustar\0", 257);
  header.write("00", 263);
  let sum = 0;
  for (const byte of header) sum += byte;
  header.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
  const body = Buffer.alloc(Math.ceil(Buffer.byteLength(content) / 512) * 512);
  body.write(content);
  return gzipSync(Buffer.concat([header, body, Buffer.alloc(1024)]));
}

async function restoreFromBytes(diskId: string, archive: Buffer): Promise<{ status: number; body: Envelope<{ jobId: string }> }> {
  const presigned = await api<Envelope<{ uploadUrl: string; uploadId: string }>>(
    "POST",
    `/v1/disks/${diskId}/backups/restore/presign`,
    { sizeBytes: archive.byteLength },
  );
  expect(presigned.status).toBe(200);
  const put = await fetch(presigned.body.data.uploadUrl, { method: "PUT", body: archive });
  expect(put.status).toBe(200);
  return api("POST", `/v1/disks/${diskId}/backups/restore`, { uploadId: presigned.body.data.uploadId });
}

async function restoreOutcome(diskId: string, jobId: string): Promise<{ status: string; error: string | null }> {
  return until("the restore to end", async () => {
    const res = await api<Envelope<{ status: string; error: string | null }>>("GET", `/v1/disks/${diskId}/backups/restore/${jobId}`);
    return res.body.data.status === "running" ? null : res.body.data;
  });
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "svc-e2e-backups-"));
  stack = await startLocalStack({
    port: 0,
    persistDir: join(root, "state"),
    stateDir: join(root, "svc"),
    secretsFile: join(root, "dev.vars"),
    output: "files",
  });
}, 180_000);

afterAll(async () => {
  await stack?.stop();
  await rm(root, { recursive: true, force: true });
});

describe("disk backup and restore, end to end", () => {
  it("round-trips a disk: backup → download (tar tzf) → change → restore from the file → identical", async () => {
    const app = `bk-${Date.now().toString(36)}`;
    expect((await api("POST", "/v1/apps", { name: app, runtime: "node" })).status).toBe(201);
    const disk = (await api<{ data: { id: string } }>("POST", "/v1/disks", { name: "files", sizeGb: 1 })).body.data;
    await api("POST", `/v1/disks/${disk.id}/attach`, { app });
    const data = diskDataPath(join(root, "svc", "builder"), disk.id);

    await mkdir(join(data, "nested", "deeper", "deepest"), { recursive: true });
    await mkdir(join(data, "empty-dir"));
    await writeFile(join(data, "nested", "deeper", "deepest", "notes.txt"), "hello\n".repeat(1000));
    await writeFile(join(data, "random.bin"), randomBytes(12 * 1024 * 1024));
    await writeFile(join(data, "zero-bytes"), "");
    await mkdir(join(data, "café"));
    await writeFile(join(data, "café", "naïve-文件.txt"), "unicode ✓");
    await writeFile(join(data, "run.sh"), "#!/bin/sh\necho hi\n");
    await chmod(join(data, "run.sh"), 0o755);
    await symlink("nested/deeper", join(data, "shortcut"));
    const original = await tree(data);

    const created = await api<Envelope<Backup>>("POST", `/v1/disks/${disk.id}/backups`, { description: "e2e" });
    expect(created.status).toBe(201);
    expect(created.body.data.status).toBe("creating");
    const ready = await until("the backup to be ready", async () => {
      const list = await api<Envelope<Backup[]>>("GET", `/v1/disks/${disk.id}/backups`);
      const backup = list.body.data.find((b) => b.id === created.body.data.id);
      if (backup?.status === "failed") throw new Error(`backup failed: ${backup.failureReason}`);
      return backup?.status === "ready" ? backup : null;
    });
    expect(ready.sizeBytes).toBeGreaterThan(12 * 1024 * 1024);

    const link = await api<Envelope<{ url: string }>>("GET", `/v1/disks/${disk.id}/backups/${ready.id}/download`);
    const archive = Buffer.from(await (await fetch(link.body.data.url)).arrayBuffer());
    expect(archive.byteLength).toBe(ready.sizeBytes);
    expect(createHash("sha256").update(archive).digest("hex")).toBe(ready.sha256);
    const archivePath = join(root, "download.tar.gz");
    await writeFile(archivePath, archive);
    const listing = execFileSync("tar", ["tzf", archivePath], { encoding: "utf8" });
    for (const name of ["random.bin", "zero-bytes", "empty-dir", "café/naïve-文件.txt", "run.sh", "nested/deeper/deepest/notes.txt"]) {
      expect(listing).toContain(name);
    }

    await rm(join(data, "nested"), { recursive: true });
    await writeFile(join(data, "random.bin"), "overwritten");
    await writeFile(join(data, "new-file"), "should disappear");

    const refused = await restoreFromBytes(disk.id, archive);
    expect(refused.status).toBe(409);
    expect((refused.body as unknown as { error: { code: string } }).error.code).toBe("DISK_IN_USE");

    await api("POST", `/v1/apps/${app}/stop`);
    const accepted = await restoreFromBytes(disk.id, archive);
    expect(accepted.status).toBe(202);
    expect(accepted.body.data).toMatchObject({ status: "running" });
    expect(await restoreOutcome(disk.id, accepted.body.data.jobId)).toMatchObject({ status: "succeeded", error: null });
    expect(await tree(data)).toEqual(original);
    // Started again by the restore (a static site with nothing deployed: not_deployed rather than stopped).
    const after = await api<{ data: { status: string } }>("GET", `/v1/apps/${app}`);
    expect(after.body.data.status).toBe("not_deployed");

    // Restoring straight from the backup (no upload) works too.
    await writeFile(join(data, "zero-bytes"), "changed again");
    await api("POST", `/v1/apps/${app}/stop`);
    const fromBackup = await api<Envelope<{ jobId: string }>>("POST", `/v1/disks/${disk.id}/backups/restore`, { backupId: ready.id });
    expect(fromBackup.status).toBe(202);
    expect(await restoreOutcome(disk.id, fromBackup.body.data.jobId)).toMatchObject({ status: "succeeded" });
    expect(await tree(data)).toEqual(original);
  }, 180_000);

  it("a hostile archive fails the restore and leaves the disk and everything outside it untouched", async () => {
    const disk = (await api<{ data: { id: string } }>("POST", "/v1/disks", { name: "guarded", sizeGb: 1 })).body.data;
    const data = diskDataPath(join(root, "svc", "builder"), disk.id);
    await writeFile(join(data, "keep.txt"), "precious");
    const before = await tree(data);
    for (const name of ["../escaped.txt", "/tmp/svc-e2e-absolute.txt"]) {
      const started = await restoreFromBytes(disk.id, hostileArchive(name, "evil"));
      expect(started.status).toBe(202);
      const outcome = await restoreOutcome(disk.id, started.body.data.jobId);
      expect(outcome.status).toBe("failed");
      expect(outcome.error).toBeTruthy();
      expect(await tree(data)).toEqual(before);
    }
    await expect(lstat(join(data, "..", "escaped.txt"))).rejects.toThrow();
    await expect(lstat("/tmp/svc-e2e-absolute.txt")).rejects.toThrow();
    const truncated = hostileArchive("fine.txt", "x".repeat(10_000)).subarray(0, 40);
    const cut = await restoreFromBytes(disk.id, truncated);
    expect((await restoreOutcome(disk.id, cut.body.data.jobId)).status).toBe("failed");
    expect(await tree(data)).toEqual(before);
  }, 120_000);
});
