import { statSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DiskInfo } from "../../builder/src/protocol/disks.js";
import { parseLogLine } from "../../builder/src/protocol/jobs.js";
import {
  type BuilderProcess,
  diskDataPath,
  followLog,
  putDisk,
  runToEnd,
  signedFetch,
  startBuilder,
  submitJob,
} from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

const MiB = 1024 * 1024;
const out = (log: string) =>
  log
    .split("\n")
    .map((line) => parseLogLine(line))
    .filter((record) => record?.stream === "out")
    .map((record) => record!.text);

describe("PUT/GET/DELETE /v1/disks/:id", () => {
  it("creates a disk (201), changes its quota (200), reports usage and deletes it (204)", async () => {
    const created = await putDisk(builder, "disk_a", 5 * MiB);
    expect(created.status).toBe(201);
    const info = DiskInfo.parse(await created.json());
    expect(info).toEqual({ id: "disk_a", sizeBytes: 5 * MiB, usedBytes: 0, usedInodes: 0, inodeLimit: info.inodeLimit });
    // One inode per 4 KiB of quota (an image rounds up to fill its inode tables).
    expect(info.inodeLimit).toBeGreaterThanOrEqual((5 * MiB) / 4096);
    expect(info.inodeLimit).toBeLessThan((5 * MiB) / 4096 + 64);
    const resized = await putDisk(builder, "disk_a", 6 * MiB);
    expect(resized.status).toBe(200);
    expect(await resized.json()).toMatchObject({ id: "disk_a", sizeBytes: 6 * MiB, usedBytes: 0, usedInodes: 0 });

    const deleted = await signedFetch(builder, "/v1/disks/disk_a", { method: "DELETE" });
    expect(deleted.status).toBe(204);
    const gone = await signedFetch(builder, "/v1/disks/disk_a");
    expect(gone.status).toBe(404);
    expect(await gone.json()).toEqual({ error: { code: "DISK_NOT_FOUND", message: "disk not found" } });
  });

  it("rejects ids that could leave the data directory", async () => {
    // `..` and `%2e%2e` segments never arrive: URL parsing resolves them on the client.
    for (const id of ["a.b", "a%2Fb", "%00", "x".repeat(65)]) {
      const response = await putDisk(builder, id, MiB);
      expect(response.status, id).toBe(400);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("VALIDATION_ERROR");
    }
  });

  it("refuses to delete a disk while a job uses it (409 DISK_BUSY)", async () => {
    const job = await submitJob(builder, { command: "sleep 1", disk: { id: "disk_busy", mountPath: "/data", sizeBytes: MiB } });
    const busy = await signedFetch(builder, "/v1/disks/disk_busy", { method: "DELETE" });
    expect(busy.status).toBe(409);
    expect(((await busy.json()) as { error: { code: string } }).error.code).toBe("DISK_BUSY");
    await followLog(builder, job.id);
    expect((await signedFetch(builder, "/v1/disks/disk_busy", { method: "DELETE" })).status).toBe(204);
  });
});

describe("disks in jobs", () => {
  it("keeps data written through SVC_DISK_PATH for the next job", async () => {
    const disk = { id: "disk_keep", mountPath: "/var/lib/app", sizeBytes: 10 * MiB };
    const first = await runToEnd(builder, {
      command: 'echo persisted > "$SVC_DISK_PATH/state.txt"; echo "$SVC_DISK_MOUNT_PATH"',
      disk,
    });
    expect(first.status.status).toBe("succeeded");
    expect(out(first.log)).toEqual(["/var/lib/app"]);
    const second = await runToEnd(builder, { command: 'cat "$SVC_DISK_PATH/state.txt"', disk });
    expect(out(second.log)).toEqual(["persisted"]);
    // Usage counts allocated blocks, as df does: the 10-byte file takes one block.
    const info = DiskInfo.parse(await (await signedFetch(builder, "/v1/disks/disk_keep")).json());
    const blocks = statSync(join(diskDataPath(builder.dataDir, "disk_keep"), "state.txt")).blocks * 512;
    expect(blocks).toBeGreaterThanOrEqual("persisted\n".length);
    expect(info).toMatchObject({ id: "disk_keep", sizeBytes: 10 * MiB, usedBytes: blocks, usedInodes: 1 });
  });

  it("counts a sparse file by its allocated blocks: truncate -s 2G on a 1 GiB disk is not over quota", async () => {
    const disk = { id: "disk_sparse", mountPath: "/data", sizeBytes: 1024 * MiB };
    const { status, log } = await runToEnd(builder, {
      command: 'truncate -s 2G /data/app.db && printf x | dd of=/data/app.db bs=1 seek=1000000000 conv=notrunc status=none && ls -ls /data/app.db',
      disk,
    });
    expect(status.status, log).toBe("succeeded");
    const info = DiskInfo.parse(await (await signedFetch(builder, "/v1/disks/disk_sparse")).json());
    expect(info.usedBytes).toBeGreaterThan(0);
    expect(info.usedBytes).toBeLessThan(64 * 1024);
    expect(statSync(join(diskDataPath(builder.dataDir, "disk_sparse"), "app.db")).size).toBe(2 * 1024 * MiB);
  });

  // The inode limit: one per 4 KiB of quota (a 1 MiB disk holds about 256 files); the kernel refuses more.
  it.runIf(process.getuid?.() === 0)("fails a job that runs out of inodes, saying the limit", async () => {
    const disk = { id: "disk_inodes", mountPath: "/data", sizeBytes: MiB };
    const { status, log } = await runToEnd(builder, {
      command: 'i=0; while touch "/data/f$i"; do i=$((i+1)); done; echo "made $i"; exit 1',
      disk,
    });
    const info = DiskInfo.parse(await (await signedFetch(builder, "/v1/disks/disk_inodes")).json());
    expect(info.inodeLimit).toBeGreaterThanOrEqual(256);
    expect(info.usedInodes).toBe(info.inodeLimit);
    expect(out(log)).toEqual([`made ${info.inodeLimit}`]);
    expect(status).toMatchObject({ status: "failed", reason: "disk_quota" });
    expect(status.error).toBe(`inode limit reached (${info.inodeLimit!.toLocaleString("en-US")} files): creating more failed, then exit code 1`);
    expect(log).toMatch(/ err .*No space left on device/);
  });

  // A root builder makes each disk a filesystem of exactly its size: the kernel refuses the writes.
  it.runIf(process.getuid?.() === 0)("refuses writes past the quota and fails the job that hit it", async () => {
    const disk = { id: "disk_small", mountPath: "/data", sizeBytes: MiB };
    const { status, log } = await runToEnd(builder, { command: 'head -c 3000000 /dev/zero > "$SVC_DISK_PATH/big"', disk });
    expect(status).toMatchObject({ status: "failed", reason: "disk_quota" });
    expect(status.error).toBe("disk quota reached (1.0 MiB): writes beyond it failed, then exit code 1");
    expect(log).toMatch(/ err head: .*No space left on device/);
    const kept = await runToEnd(builder, { command: 'wc -c < "$SVC_DISK_PATH/big"', disk });
    const size = Number(out(kept.log)[0]);
    expect(size).toBeGreaterThan(MiB - 64 * 1024);
    expect(size).toBeLessThanOrEqual(MiB);
    // The quota was never exceeded, so nothing had to be killed: a command that copes with the refusal succeeds.
    const coping = await runToEnd(builder, { command: 'head -c 3000000 /dev/zero >> "$SVC_DISK_PATH/big" || echo refused', disk });
    expect(coping.status.status).toBe("succeeded");
    expect(out(coping.log)).toEqual(["refused"]);
  });

  // Without loop mounts (not root) the quota is measured during and after the job.
  it.runIf(process.getuid?.() !== 0)("kills a running job that writes past the quota", async () => {
    const started = Date.now();
    const { status, log } = await runToEnd(builder, {
      command: 'head -c 3000000 /dev/zero > "$SVC_DISK_PATH/big"; echo written; sleep 30',
      disk: { id: "disk_small", mountPath: "/data", sizeBytes: MiB },
    });
    expect(status).toMatchObject({ status: "failed", reason: "disk_quota" });
    expect(status.error).toBe("disk quota exceeded (used 2.9 MiB of 1.0 MiB)");
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(log).toContain("job failed: disk quota exceeded");
  });
});

describe("room on the builder's host", () => {
  const GiB = 1024 * MiB;
  let small: BuilderProcess;
  beforeAll(async () => {
    // Disk images are sparse: the host must not promise more than it has. Keep all but 8 GiB of the free space in reserve.
    const fs = await statfs(tmpdir());
    const reserveMb = Math.floor((fs.bavail * fs.bsize - 8 * GiB) / MiB);
    small = await startBuilder({ env: { BUILDER_HOST_RESERVE_MB: String(reserveMb) } });
  });
  afterAll(async () => {
    await small?.stop();
  });

  const refusal = async (response: Response) => {
    expect(response.status).toBe(507);
    const body = (await response.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("INSUFFICIENT_STORAGE");
    return body.error.message;
  };

  it("refuses a disk larger than the host's free space (507 INSUFFICIENT_STORAGE), saying why", async () => {
    const message = await refusal(await putDisk(builder, "disk_huge", 1024 * 1024 * GiB));
    expect(message).toMatch(/^the builder's host cannot hold a disk of 1024\.0 TiB: .* free, of which .* is kept in reserve/);
    expect((await signedFetch(builder, "/v1/disks/disk_huge")).status).toBe(404);
  });

  it("counts every disk's whole quota as taken: creating or growing past the room is refused", async () => {
    expect((await putDisk(small, "disk_one", 3 * GiB)).status).toBe(201);
    expect((await putDisk(small, "disk_two", 3 * GiB)).status).toBe(201);
    expect(await refusal(await putDisk(small, "disk_three", 3 * GiB))).toMatch(/cannot hold a disk of 3\.0 GiB: .* is promised to existing disks/);
    expect(await refusal(await putDisk(small, "disk_one", 6 * GiB))).toMatch(/cannot hold growing the disk to 6\.0 GiB/);
    expect(DiskInfo.parse(await (await signedFetch(small, "/v1/disks/disk_one")).json()).sizeBytes).toBe(3 * GiB);
    // A job naming a disk the host cannot hold fails with the same reason.
    const { status } = await runToEnd(small, { command: "true", disk: { id: "disk_four", mountPath: "/data", sizeBytes: 3 * GiB } });
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toMatch(/cannot hold a disk of 3\.0 GiB/);
    // Shrinking is always allowed; deleting a disk gives its room back.
    expect((await putDisk(small, "disk_two", 1 * GiB)).status).toBe(200);
    expect((await signedFetch(small, "/v1/disks/disk_two", { method: "DELETE" })).status).toBe(204);
    expect((await putDisk(small, "disk_three", 3 * GiB)).status).toBe(201);
  });
});
