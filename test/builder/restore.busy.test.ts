import { execFileSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, readFile, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BuilderProcess, followLog, jobStatus, runToEnd, signedFetch, startBuilder, submitJob } from "./builder-process.js";
import { type FakeStorage, restoreToEnd, snapshotToEnd, startFakeStorage } from "./snapshot-storage.js";

const MiB = 1024 * 1024;
let builder: BuilderProcess;
let storage: FakeStorage;
let scratch: string;
let archive: Buffer;

beforeAll(async () => {
  builder = await startBuilder();
  storage = await startFakeStorage(builder.secret);
  scratch = await mkdtemp(join(tmpdir(), "svc-restore-busy-"));
  await mkdir(join(scratch, "tree/dir"), { recursive: true });
  await writeFile(join(scratch, "tree/dir/file.txt"), "restored\n");
  execFileSync("tar", ["-czf", join(scratch, "tree.tgz"), "-C", join(scratch, "tree"), "."]);
  archive = execFileSync("cat", [join(scratch, "tree.tgz")]);
});
afterAll(async () => {
  await storage?.close();
  await builder?.stop();
  await rm(scratch, { recursive: true, force: true });
});

async function expectBusy(response: Response, message: RegExp): Promise<void> {
  expect(response.status).toBe(409);
  const body = (await response.json()) as { error: { code: string; message: string } };
  expect(body.error.code).toBe("DISK_BUSY");
  expect(body.error.message).toMatch(message);
}

const restoreBody = (diskId: string, archiveUrl: string) => ({
  diskId,
  archiveUrl,
  expectedSizeBytes: archive.length,
  maxEntries: 100,
  maxExpandedBytes: 10 * MiB,
});

describe("restores and the jobs sharing a disk", () => {
  it("refuses a restore while a run job uses the disk (409 DISK_BUSY)", async () => {
    const job = await submitJob(builder, { command: "sleep 1", disk: { id: "used", mountPath: "/data", sizeBytes: MiB } });
    const refused = await signedFetch(builder, "/v1/restores", { method: "POST", body: restoreBody("used", storage.serve("a", archive)) });
    await expectBusy(refused, /^disk used is used by a queued or running job$/);
    await followLog(builder, job.id);
  });

  it("refuses a restore while a snapshot reads the disk", async () => {
    await signedFetch(builder, "/v1/disks/snapped", { method: "PUT", body: { sizeBytes: MiB } });
    storage.failPuts(1, 1); // the retry keeps the snapshot running for half a second
    const snapshot = snapshotToEnd(builder, storage, { diskId: "snapped" });
    await new Promise((resolve) => setTimeout(resolve, 200));
    const refused = await signedFetch(builder, "/v1/restores", { method: "POST", body: restoreBody("snapped", storage.serve("b", archive)) });
    await expectBusy(refused, /is used by a queued or running job/);
    expect((await snapshot).status.status).toBe("succeeded");
  });

  it("refuses runs, snapshots, other restores and deletion while a restore runs, and accepts them after", async () => {
    await signedFetch(builder, "/v1/disks/restoring", { method: "PUT", body: { sizeBytes: MiB } });
    const slow = storage.serve("slow", archive, 1_500);
    const restore = restoreToEnd(builder, { ...restoreBody("restoring", slow) });
    await new Promise((resolve) => setTimeout(resolve, 300));

    const disk = { id: "restoring", mountPath: "/data", sizeBytes: MiB };
    const run = await signedFetch(builder, "/v1/jobs", { method: "POST", body: { command: "true", env: {}, timeoutSeconds: 10, memoryMb: 64, disk } });
    await expectBusy(run, /^disk restoring is being restored; retry once the restore has ended$/);
    const snapshot = await signedFetch(builder, "/v1/snapshots", {
      method: "POST",
      body: { diskId: "restoring", partSizeBytes: 5 * MiB, partUrlEndpoint: storage.partUrlEndpoint },
    });
    await expectBusy(snapshot, /is being restored/);
    const second = await signedFetch(builder, "/v1/restores", { method: "POST", body: restoreBody("restoring", slow) });
    await expectBusy(second, /is being restored/);
    expect((await signedFetch(builder, "/v1/disks/restoring", { method: "DELETE" })).status).toBe(409);

    const { status, log } = await restore;
    expect(status.status, log).toBe("succeeded");
    const after = await runToEnd(builder, { command: 'cat "$SVC_DISK_PATH/dir/file.txt"', disk });
    expect(after.log).toContain("out restored");
  });
});

describe("cancelling a restore", () => {
  it("leaves the disk as it was and frees it for other jobs", async () => {
    await signedFetch(builder, "/v1/disks/kept", { method: "PUT", body: { sizeBytes: MiB } });
    await writeFile(join(builder.dataDir, "disks/kept/data/mine.txt"), "mine");
    const submitted = await signedFetch(builder, "/v1/restores", {
      method: "POST",
      body: restoreBody("kept", storage.serve("never", archive, 5_000)),
    });
    const { id } = (await submitted.json()) as { id: string };
    await new Promise((resolve) => setTimeout(resolve, 300));
    const cancelled = await signedFetch(builder, `/v1/jobs/${id}/cancel`, { method: "POST" });
    expect(await cancelled.json()).toMatchObject({ status: "cancelled", result: null });
    expect((await jobStatus(builder, id)).status).toBe("cancelled");
    expect(await readdir(join(builder.dataDir, "disks/kept"))).toEqual(["data", "disk.json"]);
    expect(await readdir(join(builder.dataDir, "disks/kept/data"))).toEqual(["mine.txt"]);
    const run = await runToEnd(builder, { command: 'cat "$SVC_DISK_PATH/mine.txt"', disk: { id: "kept", mountPath: "/d", sizeBytes: MiB } });
    expect(run.log).toContain("out mine");
  });
});

describe("restores under BUILDER_JOB_USER", () => {
  let isolated: BuilderProcess;
  let isolatedStorage: FakeStorage;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = await mkdtemp(join(tmpdir(), "svc-builder-restore-user-"));
    await chmod(dataDir, 0o711);
    isolated = await startBuilder({ dataDir, env: { BUILDER_JOB_USER: "65534:65534" } });
    isolatedStorage = await startFakeStorage(isolated.secret);
  });
  afterAll(async () => {
    await isolatedStorage?.close();
    await isolated?.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  it("gives the restored files to the job user, so the next job can change them", async () => {
    await signedFetch(isolated, "/v1/disks/owned", { method: "PUT", body: { sizeBytes: MiB } });
    const { status, log } = await restoreToEnd(isolated, restoreBody("owned", isolatedStorage.serve("owned", archive)));
    expect(status.status, log).toBe("succeeded");
    const data = join(dataDir, "disks/owned/data");
    for (const path of [data, join(data, "dir"), join(data, "dir/file.txt")]) {
      expect((await stat(path)).uid, path).toBe(65534);
    }
    expect((await stat(data)).mode & 0o777).toBe(0o700);
    const edit = await runToEnd(isolated, {
      command: 'echo changed >> "$SVC_DISK_PATH/dir/file.txt" && mkdir "$SVC_DISK_PATH/dir/new" && cat "$SVC_DISK_PATH/dir/file.txt"',
      disk: { id: "owned", mountPath: "/data", sizeBytes: MiB },
    });
    expect(edit.status.status, edit.log).toBe("succeeded");
    expect(edit.log).toContain("out changed");
  });
});

describe("restores a crash interrupted", () => {
  it("rolls back a swap that did not commit and finishes one that did, at the next start", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "svc-builder-crash-"));
    const meta = JSON.stringify({ sizeBytes: MiB, createdAt: new Date().toISOString() });
    const layout: Record<string, string> = {
      // Crashed between "staging → data" and the commit: the old data must come back.
      "uncommitted/data/new.txt": "restored copy",
      "uncommitted/previous-job_000000000000000000000001/old.txt": "old data",
      "uncommitted/staging-job_000000000000000000000002/x": "an abandoned staging directory",
      // Crashed after the commit, while deleting the old data: the new data stays.
      "committed/data/new.txt": "restored copy",
      "committed/trash-job_000000000000000000000003/old.txt": "old data",
    };
    for (const [path, content] of Object.entries(layout)) {
      await mkdir(join(dataDir, "disks", path, ".."), { recursive: true });
      await writeFile(join(dataDir, "disks", path), content);
    }
    for (const id of ["uncommitted", "committed"]) await writeFile(join(dataDir, "disks", id, "disk.json"), meta);
    const restarted = await startBuilder({ dataDir });
    try {
      expect(await readFile(join(dataDir, "disks/uncommitted/data/old.txt"), "utf8")).toBe("old data");
      expect(await readdir(join(dataDir, "disks/uncommitted/data"))).toEqual(["old.txt"]);
      expect(await readdir(join(dataDir, "disks/committed/data"))).toEqual(["new.txt"]);
      for (const id of ["uncommitted", "committed"]) {
        await expect.poll(() => readdir(join(dataDir, "disks", id))).toEqual(["data", "disk.json"]);
      }
    } finally {
      await restarted.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
