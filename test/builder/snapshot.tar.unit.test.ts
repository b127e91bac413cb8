import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { extractTar } from "../../builder/src/tar/extract.js";
import { DirectoryPacker, addMember, tarArchive } from "../../builder/src/tar/pack.js";
import { parallelGzip, trialRatio } from "../../builder/src/tar/parallel-gzip.js";
import { describeTree } from "./snapshot-storage.js";

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "svc-tar-unit-"));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function collect(source: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of source) chunks.push(chunk);
  return Buffer.concat(chunks);
}

async function pack(root: string): Promise<{ tar: Buffer; packer: DirectoryPacker; warnings: string[] }> {
  const warnings: string[] = [];
  const packer = new DirectoryPacker(root, (message) => warnings.push(message));
  return { tar: await collect(packer.stream()), packer, warnings };
}

/** Odd-sized pieces, so headers and contents straddle chunk boundaries. */
async function* pieces(buffer: Buffer, size = 777): AsyncGenerator<Buffer> {
  for (let offset = 0; offset < buffer.length; offset += size) yield buffer.subarray(offset, offset + size);
}

describe("tar writing and reading", () => {
  it("writes pax records GNU tar accepts at every length, including across digit boundaries", async () => {
    const root = join(scratch, "lengths");
    await mkdir(root);
    const names: string[] = [];
    // "./" + name: non-ASCII names of 4 to 130 bytes put pax record lengths on both sides of 10 and 100.
    for (let bytes = 2; bytes <= 128; bytes++) {
      const name = `é${"a".repeat(bytes - 2)}`;
      names.push(`./${name}`);
      await writeFile(join(root, name), String(bytes));
    }
    const { tar, packer } = await pack(root);
    const archive = join(scratch, "lengths.tgz");
    await writeFile(archive, gzipSync(tar));
    const listed = execFileSync("tar", ["-tzf", archive], { encoding: "utf8" }).split("\n").filter(Boolean);
    expect(listed).toEqual(["./", ...names.sort()]);
    expect(packer.entries).toBe(names.length + 1);
    expect(packer.bytes).toBe(tar.length);
  });

  it("extracts what it packed, fed in chunks of any size, into an identical tree", async () => {
    const root = join(scratch, "tree");
    await mkdir(join(root, "a/b"), { recursive: true });
    await writeFile(join(root, "a/b/big"), Buffer.alloc(1_000_003, 7));
    await writeFile(join(root, "a/x"), "x");
    await symlink("b/big", join(root, "a/link"));
    const { tar } = await pack(root);
    for (const size of [511, 777, 65_536]) {
      const target = join(scratch, `extracted-${size}`);
      await mkdir(target);
      // What the files allocate in 4 KiB blocks: 245 for big, one for x, none for the short symlink.
      const allocated = (245 + 1) * 4096;
      const summary = await extractTar({ source: pieces(tar, size), root: target, maxEntries: 6, maxExpandedBytes: tar.length, quotaBytes: allocated, owner: null });
      expect(summary).toEqual({ entries: 6, expandedBytes: tar.length, restoredBytes: allocated });
      expect(await describeTree(target)).toEqual(await describeTree(root));
    }
  });

  it("moves mtimes and owner ids that ustar fields cannot hold into pax records", async () => {
    const before1970 = new Date("1969-07-20T20:17:40Z");
    const after2038 = new Date("2100-01-01T00:00:00Z");
    const tar = await collect(
      tarArchive(async (pack) => {
        await addMember(pack, { name: `${"n".repeat(200)}.txt`, type: "file", mode: 0o644, mtime: before1970, size: 2, uid: 3_000_000, gid: 7 }, Buffer.from("hi"));
        await addMember(pack, { name: "future", type: "directory", mode: 0o755, mtime: after2038 });
      }),
    );
    const file = join(scratch, "fields.tar");
    await writeFile(file, tar);
    const listed = execFileSync("tar", ["-tvf", file, "--numeric-owner", "--full-time", "--utc"], { encoding: "utf8" }).trim().split("\n");
    expect(listed[0]).toMatch(new RegExp(`^-rw-r--r-- 3000000/7 +2 1969-07-20 20:17:40 ${"n".repeat(200)}\\.txt$`));
    expect(listed[1]).toMatch(/^drwxr-xr-x 0\/0 +0 2100-01-01 00:00:00 future$/);
  });
});

describe("parallelGzip", () => {
  it("emits one independent gzip member per block, in order, that gunzip reads back as the input", async () => {
    const blockBytes = 64 * 1024;
    for (const length of [0, 1, blockBytes - 1, blockBytes, 3 * blockBytes + 17]) {
      const input = Buffer.concat([randomBytes(Math.floor(length / 2)), Buffer.alloc(length - Math.floor(length / 2), "json ")]);
      for (const concurrency of [1, 3]) {
        const members: Buffer[] = [];
        for await (const member of parallelGzip(pieces(input, 5000), { level: 6, blockBytes, concurrency })) members.push(member);
        const blocks = Array.from({ length: Math.max(1, Math.ceil(length / blockBytes)) }, (_, i) => input.subarray(i * blockBytes, (i + 1) * blockBytes));
        expect(members.map((member) => gunzipSync(member).toString("hex"))).toEqual(blocks.map((block) => block.toString("hex")));
        const output = Buffer.concat(members);
        expect(gunzipSync(output).equals(input)).toBe(true);
      }
    }
  });

  it("stores blocks that cannot shrink and compresses the rest, mixed blocks included", async () => {
    const blockBytes = 1024 * 1024;
    const random = randomBytes(blockBytes);
    const text = Buffer.alloc(blockBytes, '{"id":1,"kind":"order","city":"berlin"}\n');
    // Small files alternating, as a disk of uploads and JSON would give.
    const mixed = Buffer.concat(Array.from({ length: 128 }, (_, i) => (i % 2 ? random : text).subarray(i * 8192, (i + 1) * 8192)));
    const sizes: number[] = [];
    for (const block of [random, text, mixed]) {
      expect(trialRatio(block)).not.toBeNull();
      const output = await collect(parallelGzip(pieces(block, 65_536), { level: 6, blockBytes, concurrency: 2 }));
      expect(gunzipSync(output).equals(block)).toBe(true);
      sizes.push(output.length);
    }
    const [stored, compressed, mixedSize] = sizes as [number, number, number];
    // Stored: the bytes plus 5 per 64 KiB stored block and the gzip wrapper, nothing searched.
    expect(stored).toBeLessThan(blockBytes + 200);
    expect(compressed).toBeLessThan(blockBytes / 50);
    expect(mixedSize).toBeLessThan(0.6 * blockBytes);
  });

  it("passes on a failure of its source and stops", async () => {
    async function* failing(): AsyncGenerator<Buffer> {
      yield Buffer.alloc(200_000, 1);
      throw new Error("disk read failed");
    }
    await expect(collect(parallelGzip(failing(), { level: 6, blockBytes: 64 * 1024, concurrency: 2 }))).rejects.toThrow("disk read failed");
  });
});

describe("DirectoryPacker", () => {
  // Issue 17, point 9: what a restore would refuse, a snapshot refuses first, naming the limit.
  it("refuses a tree with more members than a backup may hold", async () => {
    const root = join(scratch, "entries");
    await mkdir(root);
    for (const name of ["a", "b", "c", "d"]) await writeFile(join(root, name), name);
    const packer = new DirectoryPacker(root, () => undefined, { maxEntries: 4 });
    await expect(collect(packer.stream())).rejects.toThrow(/^the disk holds more than 4 entries \(files, directories, symlinks and hard links; reached at "\.\/d"\)/);
  });

  it("refuses data past the disk's quota, counted in the blocks restore counts (a plain-directory disk's quota is soft)", async () => {
    const root = join(scratch, "quota");
    await mkdir(root);
    for (const name of ["a", "b", "c"]) await writeFile(join(root, name), "x");
    // Three one-byte files take three blocks.
    const packer = new DirectoryPacker(root, () => undefined, { quotaBytes: 2 * 4096 });
    await expect(collect(packer.stream())).rejects.toThrow(/^the disk holds more than its quota of 8\.0 KiB \(reached at "\.\/c"\)/);
    const fits = new DirectoryPacker(root, () => undefined, { quotaBytes: 3 * 4096 });
    await collect(fits.stream());
    expect(fits.allocatedBytes).toBe(3 * 4096);
  });

  it("refuses more header bytes than a backup may hold besides its data", async () => {
    const root = join(scratch, "overhead");
    await mkdir(root);
    for (let i = 0; i < 20; i++) await writeFile(join(root, `${"n".repeat(150)}${i}`), "x");
    const packer = new DirectoryPacker(root, () => undefined, { maxOverheadBytes: 8 * 1024 });
    await expect(collect(packer.stream())).rejects.toThrow(/^the archive's headers, names and sparse maps take more than 8\.0 KiB/);
  });

  it("never follows a directory swapped for a link while the walk runs: it is left out, said so, and nothing outside is packed", async () => {
    const root = join(scratch, "swapped");
    const outside = join(scratch, "swapped-outside");
    await mkdir(join(root, "a"), { recursive: true });
    await mkdir(join(root, "b"));
    await writeFile(join(root, "b", "own.txt"), "own");
    await mkdir(outside);
    await writeFile(join(outside, "secret.txt"), "not the disk's");
    // Large enough that the walk waits on the reader inside ./a/, after ./b/ was listed as a directory.
    await writeFile(join(root, "a", "big.bin"), randomBytes(4 * 1024 * 1024));
    const warnings: string[] = [];
    const packer = new DirectoryPacker(root, (message) => warnings.push(message));
    const stream = packer.stream();
    const chunks: Buffer[] = [];
    const first = await stream.next();
    chunks.push(first.value as Buffer);
    await rm(join(root, "b"), { recursive: true });
    await symlink(outside, join(root, "b"));
    for await (const chunk of stream) chunks.push(chunk);
    const listed = execFileSync("tar", ["-tf", "-"], { input: Buffer.concat(chunks), encoding: "utf8" }).split("\n").filter(Boolean);
    expect(listed).toEqual(["./", "./a/", "./a/big.bin"]);
    expect(warnings).toEqual(["skipped ./b: it changed while the snapshot ran"]);
  });

  it("lists a directory too large to sort in the order the filesystem gives, with every member", async () => {
    const root = join(scratch, "huge");
    await mkdir(join(root, "many"), { recursive: true });
    execFileSync("python3", ["-c", `import os\nfor i in range(60000): open('${join(root, "many")}/f%05d' % i, 'w').close()`]);
    const { tar, packer } = await pack(root);
    expect(packer.entries).toBe(60_002);
    const listed = execFileSync("tar", ["-tf", "-"], { input: tar, encoding: "utf8", maxBuffer: 64 * 1024 * 1024 }).split("\n").filter(Boolean);
    expect(new Set(listed).size).toBe(60_002);
  });

  it("keeps old and far-future mtimes through pax, as GNU tar extracts them", async () => {
    const root = join(scratch, "times");
    await mkdir(root);
    await writeFile(join(root, "old"), "old");
    await writeFile(join(root, "future"), "future");
    await utimes(join(root, "old"), new Date("1960-01-01T00:00:00Z"), new Date("1960-01-01T00:00:00Z"));
    await utimes(join(root, "future"), new Date("2200-01-01T00:00:00Z"), new Date("2200-01-01T00:00:00Z"));
    const { tar } = await pack(root);
    const target = join(scratch, "times-out");
    await mkdir(target);
    execFileSync("tar", ["-xf", "-", "-C", target], { input: tar });
    expect(await describeTree(target)).toEqual(await describeTree(root));
  });
});
