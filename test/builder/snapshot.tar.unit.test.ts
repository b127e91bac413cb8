import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { END_OF_ARCHIVE, encodeHeader } from "../../builder/src/tar/format.js";
import { extractTar } from "../../builder/src/tar/extract.js";
import { DirectoryPacker } from "../../builder/src/tar/pack.js";
import { TarReader } from "../../builder/src/tar/reader.js";
import { describeTree } from "./snapshot-storage.js";

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "svc-tar-unit-"));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function pack(root: string): Promise<{ tar: Buffer; packer: DirectoryPacker; warnings: string[] }> {
  const warnings: string[] = [];
  const packer = new DirectoryPacker(root, (message) => warnings.push(message));
  const chunks: Buffer[] = [];
  for await (const chunk of packer.stream()) chunks.push(chunk);
  return { tar: Buffer.concat(chunks), packer, warnings };
}

async function* once(buffer: Buffer): AsyncGenerator<Buffer> {
  // Odd-sized pieces, so headers and contents straddle chunk boundaries.
  for (let offset = 0; offset < buffer.length; offset += 777) yield buffer.subarray(offset, offset + 777);
}

describe("tar writer and reader", () => {
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

  it("reads back what it wrote, in chunks of any size, and extracts an identical tree", async () => {
    const root = join(scratch, "tree");
    await mkdir(join(root, "a/b"), { recursive: true });
    await writeFile(join(root, "a/b/big"), Buffer.alloc(1_000_003, 7));
    await writeFile(join(root, "a/x"), "x");
    const { tar } = await pack(root);
    const reader = new TarReader(once(tar));
    const seen: string[] = [];
    for (let entry = await reader.next(); entry !== null; entry = await reader.next()) seen.push(`${entry.type} ${entry.path} ${entry.size}`);
    expect(seen).toEqual(["directory ./ 0", "directory ./a/ 0", "directory ./a/b/ 0", "file ./a/b/big 1000003", "file ./a/x 1"]);

    const target = join(scratch, "extracted");
    await mkdir(target);
    const summary = await extractTar({ source: once(tar), root: target, maxEntries: 5, maxExpandedBytes: tar.length, quotaBytes: 1_000_004, owner: null });
    expect(summary).toEqual({ entries: 5, expandedBytes: tar.length, restoredBytes: 1_000_004 });
    expect(await describeTree(target)).toEqual(await describeTree(root));
  });

  it("moves sizes, mtimes and names that do not fit ustar into pax records", async () => {
    const header = encodeHeader({
      path: `./${"n".repeat(200)}`,
      type: "file",
      mode: 0o644,
      mtime: -1,
      size: 9 * 1024 ** 3,
      linkpath: "",
      uid: 0,
      gid: 0,
    });
    const reader = new TarReader(once(Buffer.concat([header, END_OF_ARCHIVE])));
    const entry = await reader.next();
    expect(entry).toMatchObject({ path: `./${"n".repeat(200)}`, size: 9 * 1024 ** 3, mtime: -1, type: "file" });
    expect(header.toString("latin1", 156, 157)).toBe("x"); // the pax header comes first
  });
});
