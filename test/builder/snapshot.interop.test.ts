import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, link, mkdir, mkdtemp, open, rm, stat, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SnapshotResult } from "../../builder/src/protocol/disks.js";
import { type BuilderProcess, diskDataPath, putDisk, startBuilder } from "./builder-process.js";
import { type FakeStorage, describeTree, restoreToEnd, snapshotToEnd, startFakeStorage } from "./snapshot-storage.js";

/**
 * A snapshot is written on every core as concatenated gzip members: it must
 * still be one ordinary .tar.gz. The real builder snapshots a disk full of
 * awkward members, and GNU tar, bsdtar (libarchive) and Python's tarfile each
 * extract the archive into a tree identical to the disk, as does the
 * builder's own restore. .ci/run installs bsdtar (libarchive-tools) and python3.
 */

const MiB = 1024 * 1024;
let builder: BuilderProcess;
let storage: FakeStorage;
let scratch: string;
let original: string[];
let archivePath: string;
let archive: Buffer;
let result: SnapshotResult;

/** Python: the number of gzip members in the file, then tarfile extracts it. */
const PYTHON = `
import sys, tarfile, zlib
data = open(sys.argv[1], "rb").read()
members = 0
while data:
    stream = zlib.decompressobj(31)
    stream.decompress(data)
    data = stream.unused_data
    members += 1
print(members)
with tarfile.open(sys.argv[1]) as archive:
    options = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
    archive.extractall(sys.argv[2], **options)
`;

const old = new Date("2001-02-03T04:05:06Z");

beforeAll(async () => {
  builder = await startBuilder();
  storage = await startFakeStorage(builder.secret);
  scratch = await mkdtemp(join(tmpdir(), "svc-interop-"));
  for (const id of ["interop", "again"]) {
    const created = await putDisk(builder, id, 64 * MiB);
    expect(created.status).toBe(201);
  }
  const data = diskDataPath(builder.dataDir, "interop");
  // Several gzip members: compressible text and incompressible bytes, each past the 1 MiB block.
  await writeFile(join(data, "random.bin"), randomBytes(3 * MiB));
  await writeFile(join(data, "log.jsonl"), Array.from({ length: 60_000 }, (_, i) => JSON.stringify({ i, ok: i % 3 === 0 })).join("\n"));
  // Many small files, which restore writes several at a time.
  for (let i = 0; i < 300; i++) {
    await mkdir(join(data, `small/d${i % 10}`), { recursive: true });
    await writeFile(join(data, `small/d${i % 10}/f${i}.txt`), `file ${i}\n`.repeat(i % 50));
  }
  await mkdir(join(data, "café/日本"), { recursive: true });
  await writeFile(join(data, "café/日本/naïve.txt"), "unicode ✓\n");
  const deep = join(data, "a".repeat(60), "b".repeat(60));
  await mkdir(deep, { recursive: true });
  await writeFile(join(deep, `${"c".repeat(90)}.txt`), "a path past 100 bytes\n");
  await symlink(`${"a".repeat(60)}/${"b".repeat(60)}/${"c".repeat(90)}.txt`, join(data, "long-link"));
  await symlink("café/日本", join(data, "unicode-link"));
  await link(join(data, "log.jsonl"), join(data, "hardlink.jsonl"));
  await mkdir(join(data, "empty"));
  await writeFile(join(data, "run.sh"), "#!/bin/sh\necho hi\n", { mode: 0o755 });
  await writeFile(join(data, "readonly.txt"), "ro\n");
  await chmod(join(data, "readonly.txt"), 0o444);
  await mkdir(join(data, "private"), { mode: 0o700 });
  // A sparse file: 8 MiB of holes with data in the middle and at the end.
  const sparse = await open(join(data, "sparse.db"), "wx");
  await sparse.truncate(8 * MiB);
  await sparse.write(Buffer.alloc(10_000, "m"), 0, 10_000, 3 * MiB + 100);
  await sparse.write(Buffer.alloc(5_000, "e"), 0, 5_000, 8 * MiB - 5_000);
  await sparse.close();
  await utimes(join(data, "run.sh"), old, old);
  await utimes(join(data, "empty"), old, old);
  original = await describeTree(data);

  const { status, log } = await snapshotToEnd(builder, storage, { diskId: "interop", partSizeBytes: 5 * MiB });
  expect(status.status, log).toBe("succeeded");
  result = SnapshotResult.parse(status.result);
  archive = storage.archive();
  archivePath = join(scratch, "snapshot.tar.gz");
  await writeFile(archivePath, archive);
});

afterAll(async () => {
  await storage?.close();
  await builder?.stop();
  await rm(scratch, { recursive: true, force: true });
});

/** The sparse file stays sparse: what it allocates is its data, not its 8 MiB. */
async function expectSparse(dir: string): Promise<void> {
  const stats = await stat(join(dir, "sparse.db"));
  expect(stats.size).toBe(8 * MiB);
  expect(stats.blocks * 512).toBeLessThan(64 * 1024);
}

async function target(name: string): Promise<string> {
  const dir = join(scratch, name);
  await mkdir(dir);
  return dir;
}

describe("a snapshot is one standard .tar.gz", () => {
  it("GNU tar extracts it into the disk's tree", async () => {
    const dir = await target("gnu");
    execFileSync("tar", ["-xzf", archivePath, "-C", dir]);
    expect(await describeTree(dir)).toEqual(original);
    await expectSparse(dir);
    const listed = execFileSync("tar", ["-tzf", archivePath], { encoding: "utf8" }).split("\n").filter(Boolean);
    expect(listed.length).toBe(result.entries);
  });

  it("bsdtar (libarchive) extracts it into the disk's tree", async () => {
    const dir = await target("bsd");
    execFileSync("bsdtar", ["-xzf", archivePath, "-C", dir]);
    expect(await describeTree(dir)).toEqual(original);
    await expectSparse(dir);
  });

  it("Python's tarfile extracts it into the disk's tree, and it holds several gzip members", async () => {
    const dir = await target("python");
    const members = Number(execFileSync("python3", ["-c", PYTHON, archivePath, dir], { encoding: "utf8" }).trim());
    expect(members).toBeGreaterThan(4);
    expect(await describeTree(dir)).toEqual(original);
    await expectSparse(dir);
  });

  it("the builder restores it into another disk, identical", async () => {
    const restored = await restoreToEnd(builder, {
      diskId: "again",
      archiveUrl: storage.serve("interop.tgz", archive),
      expectedSizeBytes: result.sizeBytes,
      expectedSha256: result.sha256,
      maxEntries: result.entries,
      maxExpandedBytes: result.expandedBytes,
    });
    expect(restored.status.status, restored.log).toBe("succeeded");
    expect(await describeTree(diskDataPath(builder.dataDir, "again"))).toEqual(original);
    await expectSparse(diskDataPath(builder.dataDir, "again"));
  });
});
