import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, open, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SnapshotResult } from "../../builder/src/protocol/disks.js";
import { type BuilderProcess, diskDataPath, putDisk, runToEnd, startBuilder } from "./builder-process.js";
import { type FakeStorage, restoreToEnd, snapshotToEnd, startFakeStorage } from "./snapshot-storage.js";

/**
 * Issue 17, point 8: sparse files. A job's `truncate -s 2G` on a 1 GiB disk
 * uses a few blocks and must not count as 2 GiB; its backup must be ready and
 * restore onto the disk; archives GNU tar and bsdtar write with sparse members
 * restore as the same file, sparse, or are refused by name, never written as
 * something else.
 */

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
let builder: BuilderProcess;
let storage: FakeStorage;
let scratch: string;

beforeAll(async () => {
  builder = await startBuilder();
  storage = await startFakeStorage(builder.secret);
  scratch = await mkdtemp(join(tmpdir(), "svc-sparse-"));
});
afterAll(async () => {
  await storage?.close();
  await builder?.stop();
  await rm(scratch, { recursive: true, force: true });
});

const sha256 = (path: string) => execFileSync("sha256sum", [path], { encoding: "utf8" }).split(" ")[0] ?? "";

/**
 * What a sparse file holds, without reading its holes: its size, and the
 * SHA-256 of its data regions (SEEK_DATA/SEEK_HOLE) with their offsets. Two
 * files with the same answer have the same bytes (a hole reads as zeros).
 */
const SPARSE_DIGEST = `
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
digest, at = hashlib.sha256(), 0
while at < size:
    try:
        start = os.lseek(fd, at, os.SEEK_DATA)
    except OSError:
        break
    end = os.lseek(fd, start, os.SEEK_HOLE)
    data = os.pread(fd, end - start, start)
    stripped = data.strip(b"\\0")
    if stripped:
        first = start + len(data) - len(data.lstrip(b"\\0"))
        digest.update(b"%d:" % first + stripped)
    at = end
print(size, digest.hexdigest())
`;
const sparseDigest = (path: string) => execFileSync("python3", ["-c", SPARSE_DIGEST, path], { encoding: "utf8" }).trim();
const allocated = async (path: string) => (await stat(path)).blocks * 512;

/** An 8 MiB file of holes with data in the middle and at the end (`regions` runs of 5,000 bytes, the last one at the end). */
async function sparseFile(path: string, regions = 2): Promise<void> {
  const file = await open(path, "wx");
  await file.truncate(8 * MiB);
  for (let i = 0; i < regions - 1; i++) await file.write(Buffer.alloc(10_000, 65 + i), 0, 10_000, (i + 1) * 1024 * 1024 + 123);
  await file.write(Buffer.alloc(5_000, 90), 0, 5_000, 8 * MiB - 5_000);
  await file.close();
}

/** Restores `archive` (a .tar, gzipped here) into the disk and waits for the end. */
async function restore(diskId: string, name: string, tarFile: string) {
  const archive = execFileSync("gzip", ["-c", tarFile], { maxBuffer: 64 * MiB });
  return restoreToEnd(builder, { diskId, archiveUrl: storage.serve(name, archive), expectedSizeBytes: archive.length });
}

describe("sparse files on a disk", () => {
  it("a job's 2 GiB sparse file on a 1 GiB disk succeeds, its backup is ready, and restores as the same sparse file", async () => {
    const disk = { id: "sparse_db", mountPath: "/data", sizeBytes: GiB };
    const { status, log } = await runToEnd(builder, {
      command: "truncate -s 2G /data/app.db && printf header | dd of=/data/app.db conv=notrunc status=none && printf tail | dd of=/data/app.db bs=1 seek=2147483000 conv=notrunc status=none",
      disk,
    });
    expect(status.status, log).toBe("succeeded");
    const file = join(diskDataPath(builder.dataDir, "sparse_db"), "app.db");
    const digest = sparseDigest(file);

    const snapshot = await snapshotToEnd(builder, storage, { diskId: "sparse_db" });
    expect(snapshot.status.status, snapshot.log).toBe("succeeded");
    const result = SnapshotResult.parse(snapshot.status.result);
    // The archive holds the data, not 2 GiB of zeros.
    expect(result.expandedBytes).toBeLessThan(64 * 1024);
    const archive = storage.archive();
    const archivePath = join(scratch, "app.tgz");
    await writeFile(archivePath, archive);
    expect(execFileSync("tar", ["-tzf", archivePath], { encoding: "utf8" }).split("\n").filter(Boolean)).toEqual(["./", "./app.db"]);

    // Every ready backup restores onto its disk (before: "archive holds more than the disk's quota").
    await rm(file);
    const restored = await restoreToEnd(builder, {
      diskId: "sparse_db",
      archiveUrl: storage.serve("app.tgz", archive),
      expectedSizeBytes: result.sizeBytes,
      expectedSha256: result.sha256,
      maxEntries: result.entries,
      maxExpandedBytes: result.expandedBytes,
    });
    expect(restored.status.status, restored.log).toBe("succeeded");
    expect((await stat(file)).size).toBe(2 * GiB);
    expect(await allocated(file)).toBeLessThan(64 * 1024);
    expect(sparseDigest(file)).toBe(digest);
    expect(digest).toMatch(/^2147483648 [0-9a-f]{64}$/);
  });
});

describe("restoring sparse members written by GNU tar and bsdtar", () => {
  let source: string;
  let digest: string;
  beforeAll(async () => {
    source = join(scratch, "src");
    await mkdir(source);
    await sparseFile(join(source, "sparse.bin"));
    digest = sha256(join(source, "sparse.bin"));
    expect((await putDisk(builder, "formats", 64 * MiB)).status).toBe(201);
  });

  const writers: [name: string, command: string, args: string[]][] = [
    ["GNU tar's old format (tar --format=gnu --sparse)", "tar", ["--format=gnu", "--sparse"]],
    ["pax 0.1 (tar --format=pax --sparse-version=0.1)", "tar", ["--format=pax", "--sparse", "--sparse-version=0.1"]],
    ["pax 1.0 (tar --format=pax --sparse-version=1.0)", "tar", ["--format=pax", "--sparse", "--sparse-version=1.0"]],
    ["bsdtar --format=pax", "bsdtar", ["--format=pax"]],
    ["bsdtar's default format", "bsdtar", []],
  ];

  it.each(writers)("restores %s as the same file, sparse", async (name, command, args) => {
    const index = writers.findIndex((writer) => writer[0] === name);
    const tarFile = join(scratch, `${index}.tar`);
    execFileSync(command, [...args, "-cf", tarFile, "-C", source, "sparse.bin"]);
    const { status, log } = await restore("formats", `format-${index}`, tarFile);
    expect(status.status, log).toBe("succeeded");
    const restored = join(diskDataPath(builder.dataDir, "formats"), "sparse.bin");
    expect((await stat(restored)).size).toBe(8 * MiB);
    expect(sha256(restored)).toBe(digest);
    expect(await allocated(restored)).toBeLessThan(64 * 1024);
  });

  it("refuses pax 0.0 sparse members by name, leaving the disk as it was", async () => {
    const tarFile = join(scratch, "pax00.tar");
    execFileSync("tar", ["--format=pax", "--sparse", "--sparse-version=0.0", "-cf", tarFile, "-C", source, "sparse.bin"]);
    const { status } = await restore("formats", "pax00", tarFile);
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toMatch(/^archive rejected: member "sparse\.bin" is a sparse file in GNU tar's pax format 0\.0 .* archive it with tar --sparse-version=1\.0/);
  });

  it("refuses an old GNU sparse member whose map needs extension headers, saying what to use", async () => {
    const dir = join(scratch, "six");
    await mkdir(dir);
    await sparseFile(join(dir, "six.bin"), 6);
    const tarFile = join(scratch, "six.tar");
    execFileSync("tar", ["--format=gnu", "--sparse", "-cf", tarFile, "-C", dir, "six.bin"]);
    const { status } = await restore("formats", "six", tarFile);
    expect(status.error).toMatch(/member "six\.bin" is a sparse file in GNU tar's old format whose map continues in extension headers .* tar --format=pax/);
    // The same file in pax 1.0 restores.
    execFileSync("tar", ["--format=pax", "--sparse", "-cf", tarFile, "-C", dir, "six.bin"]);
    const again = await restore("formats", "six-pax", tarFile);
    expect(again.status.status, again.log).toBe("succeeded");
    expect(sha256(join(diskDataPath(builder.dataDir, "formats"), "six.bin"))).toBe(sha256(join(dir, "six.bin")));
  });
});
