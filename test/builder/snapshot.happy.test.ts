import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { chmod, link, mkdir, mkdtemp, readdir, rm, stat, symlink, utimes, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gunzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SnapshotResult } from "../../builder/src/protocol/disks.js";
import { type BuilderProcess, diskDataPath, diskFolderAtRest, followLog, jobStatus, putDisk, runToEnd, signedFetch, startBuilder } from "./builder-process.js";
import { type FakeStorage, describeTree, restoreToEnd, snapshotToEnd, startFakeStorage } from "./snapshot-storage.js";

const MiB = 1024 * 1024;
let builder: BuilderProcess;
let storage: FakeStorage;
let scratch: string;
beforeAll(async () => {
  builder = await startBuilder();
  scratch = await mkdtemp(join(tmpdir(), "svc-snapshot-"));
});
afterAll(async () => {
  await builder?.stop();
  await rm(scratch, { recursive: true, force: true });
});

/** A fresh fake storage per test, so parts never mix. */
async function freshStorage(): Promise<FakeStorage> {
  await storage?.close();
  storage = await startFakeStorage(builder.secret);
  return storage;
}

async function createDisk(id: string, sizeBytes = 64 * MiB): Promise<string> {
  const response = await putDisk(builder, id, sizeBytes);
  expect(response.status).toBeLessThan(300);
  return diskDataPath(builder.dataDir, id);
}

/** Every member `tar tzf` (system GNU tar) lists. */
function gnuTarList(archive: Buffer): string[] {
  const path = join(scratch, `list-${Date.now()}.tgz`);
  execFileSync("sh", ["-c", 'cat > "$1"', "sh", path], { input: archive });
  return execFileSync("tar", ["-tzf", path], { encoding: "utf8" }).split("\n").filter(Boolean);
}

const old = new Date("2001-02-03T04:05:06Z");

describe("POST /v1/snapshots and /v1/restores", () => {
  it("round-trips a disk: parts, SHA-256, GNU tar listing, then restore gives back files, modes, bytes and mtimes", async () => {
    const store = await freshStorage();
    const data = await createDisk("round");
    await mkdir(join(data, "a/b/c"), { recursive: true });
    await writeFile(join(data, "a/b/c/random.bin"), randomBytes(11 * MiB));
    await writeFile(join(data, "a/b/c/small.txt"), "small\n");
    await link(join(data, "a/b/c/small.txt"), join(data, "a/hardlink.txt"));
    const json = Array.from({ length: 20_000 }, (_, i) => JSON.stringify({ id: i, name: `item ${i}`, ok: i % 3 === 0 }));
    await writeFile(join(data, "a/items.json"), json.join("\n"));
    await mkdir(join(data, "empty"));
    await writeFile(join(data, "zero"), "");
    await mkdir(join(data, "café"));
    await writeFile(join(data, "café/naïve-文件.txt"), "unicode ✓\n");
    const longDir = join(data, "d".repeat(50), "e".repeat(50));
    await mkdir(longDir, { recursive: true });
    await writeFile(join(longDir, `${"f".repeat(60)}.txt`), "long path\n");
    await mkdir(join(data, "bin"));
    await writeFile(join(data, "bin/run.sh"), "#!/bin/sh\necho run\n", { mode: 0o755 });
    await writeFile(join(data, "readonly.txt"), "ro", { mode: 0o444 });
    await symlink("a/b", join(data, "link"));
    await symlink("nowhere", join(data, "dangling"));
    await utimes(join(data, "zero"), old, old);
    await utimes(join(data, "a/b"), old, old);
    const original = await describeTree(data);

    const { status, log } = await snapshotToEnd(builder, store, { diskId: "round", partSizeBytes: 5 * MiB });
    expect(status, log).toMatchObject({ status: "succeeded", reason: null });
    const result = SnapshotResult.parse(status.result);
    const archive = store.archive();
    expect(result.parts.map((part) => part.partNumber)).toEqual([...store.parts.keys()].sort((a, b) => a - b));
    expect(result.parts.length).toBeGreaterThanOrEqual(2);
    expect(result.parts.map((part) => part.partNumber)).toEqual(result.parts.map((_, index) => index + 1));
    for (const part of result.parts.slice(0, -1)) expect(store.parts.get(part.partNumber)!.length).toBe(5 * MiB);
    expect(store.parts.get(result.parts.length)!.length).toBeGreaterThan(0);
    expect(store.parts.get(result.parts.length)!.length).toBeLessThanOrEqual(5 * MiB);
    for (const part of result.parts) {
      expect(part.etag).toBe(`"${createHash("md5").update(store.parts.get(part.partNumber)!).digest("hex")}"`);
    }
    expect(result.sizeBytes).toBe(archive.length);
    expect(result.sha256).toBe(createHash("sha256").update(archive).digest("hex"));
    expect(result.expandedBytes).toBe(gunzipSync(archive).length);
    expect(store.badSignatures).toBe(0);

    const listed = gnuTarList(archive);
    expect(listed.length).toBe(result.entries);
    const expectedNames = original.map((line) => `./${line.split(/ (?:dir|file|->) /)[0]}`);
    expect(listed.sort()).toEqual(["./", ...expectedNames].sort());
    // Parts upload several at once, so they may end in any order; each is logged once.
    for (const part of result.parts) expect(log.match(new RegExp(`uploaded part ${part.partNumber} \\(`, "g"))).toHaveLength(1);
    expect(log).toMatch(/uploaded part 2 \(5\.0 MiB; \d+\.\d MiB so far\)/);

    // Change the disk, then restore it from the same archive, with the snapshot's own numbers as limits.
    await rm(join(data, "bin/run.sh"));
    await writeFile(join(data, "zero"), "not empty any more");
    await writeFile(join(data, "new.txt"), "new");
    await chmod(join(data, "readonly.txt"), 0o600);
    const restored = await restoreToEnd(builder, {
      diskId: "round",
      archiveUrl: store.serve("round.tgz", archive),
      expectedSizeBytes: result.sizeBytes,
      expectedSha256: result.sha256,
      maxEntries: result.entries,
      maxExpandedBytes: result.expandedBytes,
    });
    expect(restored.status, restored.log).toMatchObject({
      status: "succeeded",
      result: { kind: "restore", entries: result.entries, expandedBytes: result.expandedBytes },
    });
    expect(await describeTree(data)).toEqual(original);
    if (existsSync(join(builder.dataDir, "disks/round/disk.img"))) {
      // The staging filesystem was moved into place as it is (not unmounted and mounted again), on the one loop device of its image.
      expect(builder.output()).not.toContain("a restore's swap unmounts and mounts the images instead");
      expect(execFileSync("losetup", ["-j", join(builder.dataDir, "disks/round/disk.img")], { encoding: "utf8" }).trim().split("\n")).toHaveLength(1);
    }
    const [small, hard] = await Promise.all([stat(join(data, "a/b/c/small.txt")), stat(join(data, "a/hardlink.txt"))]);
    expect(hard.ino).toBe(small.ino);
    await expect.poll(() => readdir(join(builder.dataDir, "disks/round"))).toEqual(diskFolderAtRest(builder.dataDir, "round"));

    const after = await runToEnd(builder, {
      command: 'cat "$SVC_DISK_PATH/café/naïve-文件.txt" && "$SVC_DISK_PATH/bin/run.sh"',
      disk: { id: "round", mountPath: "/data", sizeBytes: 64 * MiB },
    });
    expect(after.status.status).toBe("succeeded");
    expect(after.log).toContain("out unicode ✓");
    expect(after.log).toContain("out run");
  });

  it("snapshots an empty disk as one part holding only ./", async () => {
    const store = await freshStorage();
    await createDisk("blank");
    const { status } = await snapshotToEnd(builder, store, { diskId: "blank" });
    const result = SnapshotResult.parse(status.result);
    expect(result.parts).toHaveLength(1);
    expect(result.entries).toBe(1);
    expect(gnuTarList(store.archive())).toEqual(["./"]);
  });

  it("fails clearly for a disk that does not exist, for snapshots and restores alike", async () => {
    const store = await freshStorage();
    const snapshot = await snapshotToEnd(builder, store, { diskId: "nope" });
    expect(snapshot.status).toMatchObject({ status: "failed", reason: "error", error: "disk nope does not exist", result: null });
    const restore = await restoreToEnd(builder, { diskId: "nope", archiveUrl: store.serve("x", Buffer.from("x")) });
    expect(restore.status).toMatchObject({ status: "failed", error: "disk nope does not exist" });
    expect(store.parts.size).toBe(0);
  });

  // Issue 17, point 9: a snapshot a restore would refuse fails with the reason instead of a ready, unrestorable backup.
  it("refuses a disk holding a path longer than a backup may hold", async () => {
    const store = await freshStorage();
    const data = await createDisk("deep");
    const deep = join(data, ...Array.from({ length: 32 }, (_, i) => `${String(i).padStart(2, "0")}${"d".repeat(98)}`));
    await mkdir(deep, { recursive: true });
    await writeFile(join(deep, "f"), "x");
    const { status, log } = await snapshotToEnd(builder, store, { diskId: "deep" });
    expect(status, log).toMatchObject({ status: "failed", reason: "error", result: null });
    expect(status.error).toMatch(/^snapshot refused: ".*…" is a path of 3,130 bytes: a backup holds paths of at most 3,072 bytes$/);
  });

  it("retries a part whose PUT failed, with a fresh URL, and logs each failed attempt", async () => {
    const store = await freshStorage();
    const data = await createDisk("flaky");
    await writeFile(join(data, "f"), randomBytes(1024));
    store.failPuts(1, 2);
    const { status, log } = await snapshotToEnd(builder, store, { diskId: "flaky" });
    expect(status.status, log).toBe("succeeded");
    expect(log).toContain("part 1 upload attempt 1 failed (PUT answered HTTP 500 <Error><Code>InternalError</Code></Error>); retrying in 0.5 s");
    expect(log).toContain("part 1 upload attempt 2 failed");
    expect(gnuTarList(store.archive())).toEqual(["./", "./f"]);
  });

  it("uploads three parts at once when the store is slow, and the archive is whole and in order", async () => {
    const store = await freshStorage();
    // Long enough that the next two parts are full while the first is still uploading, even on a loaded machine.
    store.putDelayMs = 1500;
    const data = await createDisk("slow-store");
    // Random bytes: six parts of 5 MiB that compress to themselves.
    for (let i = 0; i < 6; i++) await writeFile(join(data, `blob-${i}`), randomBytes(5 * MiB));
    const { status, log } = await snapshotToEnd(builder, store, { diskId: "slow-store" });
    expect(status.status, log).toBe("succeeded");
    const result = SnapshotResult.parse(status.result);
    expect(result.parts.map((part) => part.partNumber)).toEqual(result.parts.map((_, index) => index + 1));
    expect(result.parts.length).toBeGreaterThanOrEqual(6);
    expect(store.maxPutsAtOnce).toBe(3);
    expect(createHash("sha256").update(store.archive()).digest("hex")).toBe(result.sha256);
    expect(gnuTarList(store.archive())).toEqual(["./", ...Array.from({ length: 6 }, (_, i) => `./blob-${i}`)]);
  });

  it("cancels a snapshot between retries, removing its spooled parts", async () => {
    const store = await freshStorage();
    const data = await createDisk("cancelled");
    await writeFile(join(data, "f"), randomBytes(1024));
    store.failPuts(1, 4);
    const submitted = await signedFetch(builder, "/v1/snapshots", {
      method: "POST",
      body: { diskId: "cancelled", partSizeBytes: 5 * MiB, partUrlEndpoint: store.partUrlEndpoint },
    });
    const { id } = (await submitted.json()) as { id: string };
    await new Promise((resolve) => setTimeout(resolve, 300));
    const cancelled = await signedFetch(builder, `/v1/jobs/${id}/cancel`, { method: "POST" });
    expect(await cancelled.json()).toMatchObject({ status: "cancelled", reason: "cancelled", result: null });
    expect(await followLog(builder, id)).toMatch(/svc job cancelled\n$/);
    expect((await jobStatus(builder, id)).status).toBe("cancelled");
    expect(await readdir(join(builder.dataDir, "jobs", id))).toEqual(["log", "status.json"]);
    expect(store.parts.size).toBe(0);
  });

  it("skips sockets and fifos with a warning line instead of failing", async () => {
    const store = await freshStorage();
    const data = await createDisk("special");
    await writeFile(join(data, "kept"), "kept");
    execFileSync("mkfifo", [join(data, "fifo")]);
    const socketServer = createServer();
    await new Promise<void>((resolve) => socketServer.listen(join(data, "sock"), resolve));
    try {
      const { status, log } = await snapshotToEnd(builder, store, { diskId: "special" });
      expect(status.status, log).toBe("succeeded");
      expect(log).toContain("svc skipped ./fifo: fifos are not archived");
      expect(log).toContain("svc skipped ./sock: sockets are not archived");
      expect(gnuTarList(store.archive())).toEqual(["./", "./kept"]);
    } finally {
      socketServer.close();
    }
  });

  it("restores archives written by GNU tar in its gnu (long-name) and pax formats", async () => {
    const source = join(scratch, "gnu-source");
    const deep = join(source, "g".repeat(80), "h".repeat(80));
    await mkdir(deep, { recursive: true });
    await writeFile(join(deep, `${"i".repeat(90)}-ünïcødé.txt`), randomBytes(3000));
    await writeFile(join(source, "script.sh"), "#!/bin/sh\n", { mode: 0o750 });
    await symlink(`${"g".repeat(80)}/${"h".repeat(80)}`, join(source, "deep-link"));
    await mkdir(join(source, "empty"));
    await utimes(join(source, "script.sh"), old, old);
    const expected = await describeTree(source);
    for (const format of ["gnu", "pax"]) {
      const store = await freshStorage();
      const data = await createDisk(`from_${format}`);
      await writeFile(join(data, "previous"), "replaced by the restore");
      const archivePath = join(scratch, `${format}.tgz`);
      execFileSync("tar", [`--format=${format}`, "-czf", archivePath, "-C", source, "."]);
      const archive = execFileSync("cat", [archivePath]);
      const { status, log } = await restoreToEnd(builder, {
        diskId: `from_${format}`,
        archiveUrl: store.serve(`${format}.tgz`, archive),
        expectedSizeBytes: archive.length,
      });
      expect(status.status, log).toBe("succeeded");
      expect(await describeTree(data)).toEqual(expected);
    }
  });
});
