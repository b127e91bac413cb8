import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BuilderProcess, diskDataPath, diskFolderAtRest, followLog, jobStatus, putDisk, runToEnd, signedFetch, startBuilder, submitJob, TEST_TENANT } from "./builder-process.js";
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
    await putDisk(builder, "snapped", MiB);
    storage.failPuts(1, 1); // the retry keeps the snapshot running for half a second
    const snapshot = snapshotToEnd(builder, storage, { diskId: "snapped" });
    await new Promise((resolve) => setTimeout(resolve, 200));
    const refused = await signedFetch(builder, "/v1/restores", { method: "POST", body: restoreBody("snapped", storage.serve("b", archive)) });
    await expectBusy(refused, /is used by a queued or running job/);
    expect((await snapshot).status.status).toBe("succeeded");
  });

  it("refuses runs, snapshots, other restores and deletion while a restore runs, and accepts them after", async () => {
    await putDisk(builder, "restoring", MiB);
    const slow = storage.serve("slow", archive, 1_500);
    const restore = restoreToEnd(builder, { ...restoreBody("restoring", slow) });
    await new Promise((resolve) => setTimeout(resolve, 300));

    const disk = { id: "restoring", mountPath: "/data", sizeBytes: MiB };
    const run = await signedFetch(builder, "/v1/jobs", { method: "POST", body: { tenant: TEST_TENANT, command: "true", env: {}, timeoutSeconds: 10, memoryMb: 64, disk } });
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
    await putDisk(builder, "kept", MiB);
    await writeFile(join(diskDataPath(builder.dataDir, "kept"), "mine.txt"), "mine");
    const submitted = await signedFetch(builder, "/v1/restores", {
      method: "POST",
      body: restoreBody("kept", storage.serve("never", archive, 5_000)),
    });
    const { id } = (await submitted.json()) as { id: string };
    await new Promise((resolve) => setTimeout(resolve, 300));
    const cancelled = await signedFetch(builder, `/v1/jobs/${id}/cancel`, { method: "POST" });
    expect(await cancelled.json()).toMatchObject({ status: "cancelled", result: null });
    expect((await jobStatus(builder, id)).status).toBe("cancelled");
    expect(await readdir(join(builder.dataDir, "disks/kept"))).toEqual(diskFolderAtRest(builder.dataDir, "kept"));
    expect(await readdir(diskDataPath(builder.dataDir, "kept"))).toEqual(["mine.txt"]);
    const run = await runToEnd(builder, { command: 'cat "$SVC_DISK_PATH/mine.txt"', disk: { id: "kept", mountPath: "/d", sizeBytes: MiB } });
    expect(run.log).toContain("out mine");
  });
});

describe("restored files belong to the disk's tenant", () => {
  it("gives them to the user the tenant's jobs run as, so the next job can change them", async () => {
    await putDisk(builder, "owned", MiB);
    const { status, log } = await restoreToEnd(builder, restoreBody("owned", storage.serve("owned", archive)));
    expect(status.status, log).toBe("succeeded");
    const whoami = await runToEnd(builder, { command: "id -u" });
    const uid = Number(/ out (\d+)$/m.exec(whoami.log)?.[1]);
    const data = diskDataPath(builder.dataDir, "owned");
    for (const path of [data, join(data, "dir"), join(data, "dir/file.txt")]) {
      expect((await stat(path)).uid, path).toBe(uid);
    }
    expect((await stat(data)).mode & 0o777).toBe(0o700);
    const edit = await runToEnd(builder, {
      command: 'echo changed >> "$SVC_DISK_PATH/dir/file.txt" && mkdir "$SVC_DISK_PATH/dir/new" && cat "$SVC_DISK_PATH/dir/file.txt"',
      disk: { id: "owned", mountPath: "/data", sizeBytes: MiB },
    });
    expect(edit.status.status, edit.log).toBe("succeeded");
    expect(edit.log).toContain("out changed");
  });
});

/** Whether the mount holding `path` propagates to its peers (`shared:N` in /proc/self/mountinfo), where the kernel refuses `mount --move`. */
function underSharedMount(path: string): boolean {
  const mounts = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" "))
    .filter((fields) => fields.length > 6 && (path === fields[4] || path.startsWith(fields[4] === "/" ? "/" : `${fields[4]}/`)))
    .sort((a, b) => b[4]!.length - a[4]!.length);
  return mounts.length > 0 && mounts[0]!.slice(6, mounts[0]!.indexOf("-")).some((field) => field.startsWith("shared:"));
}

describe("restores a crash interrupted", () => {
  /**
   * Lays out, with disks a real builder made, what a crash leaves in the middle
   * of a swap: the staging data renamed into place but the old data still
   * `previous-<job>` (not committed), or the old data already `trash-<job>`
   * (committed). Works for both ways of keeping disks (image files or folders).
   */
  it("rolls back a swap that did not commit and finishes one that did, at the next start", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "svc-builder-crash-"));
    const first = await startBuilder({ dataDir });
    for (const [id, file] of [["uncommitted", "old.txt"], ["committed", "old.txt"], ["new-a", "new.txt"], ["new-b", "new.txt"]] as const) {
      await putDisk(first, id, MiB);
      const wrote = await runToEnd(first, { command: `echo ${id} > "$SVC_DISK_PATH/${file}"`, disk: { id, mountPath: "/data", sizeBytes: MiB } });
      expect(wrote.status.status, wrote.log).toBe("succeeded");
    }
    const images = existsSync(join(dataDir, "disks/uncommitted/disk.img"));
    await first.stop();
    const disks = join(dataDir, "disks");
    const data = (id: string) => join(disks, id, images ? "disk.img" : "data");
    const named = (id: string, name: string) => join(disks, id, `${name}${images ? ".img" : ""}`);
    // Not committed: the old data is `previous-…`, the restored data already in its place, staging left over.
    await rename(data("uncommitted"), named("uncommitted", "previous-job_000000000000000000000001"));
    await rename(data("new-a"), data("uncommitted"));
    await mkdir(join(disks, "uncommitted/staging-job_000000000000000000000002"));
    // Committed: the old data is `trash-…`, being deleted when the builder stopped.
    await rename(data("committed"), named("committed", "trash-job_000000000000000000000003"));
    await rename(data("new-b"), data("committed"));
    for (const id of ["new-a", "new-b"]) await rm(join(disks, id), { recursive: true });
    if (images) {
      // A swap moves filesystems as they are: the crash left the old ones mounted at `retiring-…` and the new one at `mnt`.
      const mountAt = async (image: string, dir: string) => {
        await mkdir(dir, { recursive: true });
        execFileSync("mount", ["-o", "loop,nosuid,nodev", image, dir]);
      };
      await mountAt(named("uncommitted", "previous-job_000000000000000000000001"), join(disks, "uncommitted/retiring-job_000000000000000000000001"));
      await mountAt(data("uncommitted"), join(disks, "uncommitted/mnt"));
      await mountAt(named("committed", "trash-job_000000000000000000000003"), join(disks, "committed/retiring-job_000000000000000000000003"));
    }
    const restarted = await startBuilder({ dataDir });
    try {
      const read = async (id: string) => (await runToEnd(restarted, { command: 'ls "$SVC_DISK_PATH"; cat "$SVC_DISK_PATH"/*', disk: { id, mountPath: "/data", sizeBytes: MiB } })).log;
      const uncommitted = await read("uncommitted");
      expect(uncommitted).toMatch(/ out old\.txt$/m);
      expect(uncommitted).toMatch(/ out uncommitted$/m);
      expect(uncommitted).not.toContain("new.txt");
      expect(await read("committed")).toMatch(/ out new\.txt\n.* out new-b$/m);
      for (const id of ["uncommitted", "committed"]) {
        await expect.poll(() => readdir(join(disks, id))).toEqual(diskFolderAtRest(dataDir, id));
      }
      expect(readFileSync("/proc/self/mountinfo", "utf8")).not.toContain(`${disks}/committed/retiring-`);
      expect(readFileSync("/proc/self/mountinfo", "utf8")).not.toContain(`${disks}/uncommitted/retiring-`);
    } finally {
      await restarted.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe("the swap's mounts", () => {
  it.runIf(process.getuid?.() === 0)(
    "moves the restored filesystem into place without unmounting it, also where the data dir is a shared mount (shown to jobs through an alias)",
    async () => {
      // A parent jobs cannot traverse (mode 0700): the builder shows its data dir to jobs through a shared bind mount.
      const parent = await mkdtemp(join(tmpdir(), "svc-restore-shared-"));
      const dataDir = join(parent, "data");
      const node = await startBuilder({ dataDir });
      const store = await startFakeStorage(node.secret);
      try {
        await putDisk(node, "moved", MiB);
        expect(underSharedMount(dataDir)).toBe(true);
        // Twice: the second swap moves aside the first one's filesystem, still dirty.
        for (const round of [1, 2]) {
          const restored = await restoreToEnd(node, restoreBody("moved", store.serve(`moved-${round}`, archive)));
          expect(restored.status.status, restored.log).toBe("succeeded");
        }
        expect(node.output()).not.toContain("unmounts and mounts the images instead");
        // Moved with its mount options: no setuid binary or device file of a restored archive takes effect.
        const mounted = readFileSync("/proc/self/mountinfo", "utf8")
          .split("\n")
          .find((line) => line.split(" ")[4] === `${dataDir}/disks/moved/mnt`);
        expect(mounted?.split(" ")[5]?.split(",")).toEqual(expect.arrayContaining(["nosuid", "nodev"]));
        // Jobs see the disk through the alias: the new filesystem reached it.
        const read = await runToEnd(node, { command: 'cat "$SVC_DISK_PATH/dir/file.txt"', disk: { id: "moved", mountPath: "/data", sizeBytes: MiB } });
        expect(read.log).toContain("out restored");
        await expect.poll(() => readdir(join(dataDir, "disks/moved"))).toEqual(diskFolderAtRest(dataDir, "moved"));
        await expect.poll(() => readFileSync("/proc/self/mountinfo", "utf8").includes(`${dataDir}/disks/moved/retiring-`)).toBe(false);
      } finally {
        await store.close();
        await node.stop();
        await rm(parent, { recursive: true, force: true });
      }
    },
    30_000,
  );
});
