import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { type AddressInfo, createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGzip, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RestoreSpec } from "../../builder/src/protocol/disks.js";
import { type BuilderProcess, diskDataPath, diskFolderAtRest, putDisk, startBuilder } from "./builder-process.js";
import { type FakeStorage, describeTree, restoreToEnd, startFakeStorage } from "./snapshot-storage.js";

const MiB = 1024 * 1024;

// A tar writer of its own, independent of the builder's, that writes whatever it is told.

interface MemberOptions {
  type?: string;
  linkname?: string;
  mode?: number;
  /** Declared size when it differs from the content (bombs). */
  size?: number;
  /** Spoils the checksum. */
  corrupt?: boolean;
}

function header(name: string, size: number, options: MemberOptions): Buffer {
  const block = Buffer.alloc(512);
  block.write(name, 0, 100);
  block.write(`${(options.mode ?? 0o644).toString(8).padStart(7, "0")}\0`, 100, "latin1");
  block.write("0000000\0", 108, "latin1");
  block.write("0000000\0", 116, "latin1");
  block.write(`${size.toString(8).padStart(11, "0")}\0`, 124, "latin1");
  block.write("14000000000\0", 136, "latin1");
  block.write(options.type ?? "0", 156, "latin1");
  block.write(options.linkname ?? "", 157, 100);
  block.write("ustar\x0000", 257, "latin1");
  block.fill(0x20, 148, 156);
  const sum = block.reduce((total, byte) => total + byte, 0) + (options.corrupt ? 1 : 0);
  block.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "latin1");
  return block;
}

function member(name: string, content: string | Buffer = "", options: MemberOptions = {}): Buffer {
  const body = Buffer.from(content);
  const padding = Buffer.alloc((512 - (body.length % 512)) % 512);
  return Buffer.concat([header(name, options.size ?? body.length, options), body, padding]);
}
const dir = (name: string) => member(name, "", { type: "5", mode: 0o755 });
const symlinkMember = (name: string, target: string) => member(name, "", { type: "2", linkname: target });
const hardlinkMember = (name: string, target: string) => member(name, "", { type: "1", linkname: target });
/** A pax extended header carrying one record, for the member that follows it. */
function pax(key: string, value: string): Buffer {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length++;
  return member("PaxHeader", `${length}${body}`, { type: "x" });
}
/** A pax extended header carrying several records. */
function paxRecords(records: Record<string, string>): Buffer {
  const body = Object.entries(records)
    .map(([key, value]) => {
      const record = ` ${key}=${value}\n`;
      let length = Buffer.byteLength(record) + 1;
      while (String(length).length + Buffer.byteLength(record) !== length) length++;
      return `${length}${record}`;
    })
    .join("");
  return member("PaxHeader", body, { type: "x" });
}
/** A GNU pax 1.0 sparse member: the map text (padded to 512 bytes), then the data. */
function sparse10(name: string, realSize: string, map: string, data: Buffer, records: Record<string, string> = {}): Buffer {
  const mapBlock = Buffer.alloc(Math.ceil(Buffer.byteLength(map) / 512) * 512);
  mapBlock.write(map, "latin1");
  return Buffer.concat([
    paxRecords({ "GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name, "GNU.sparse.realsize": realSize, ...records }),
    member(`GNUSparseFile.0/${name}`, Buffer.concat([mapBlock, data])),
  ]);
}
/** A map of `count` one-byte regions `spacing` bytes apart, with their data. */
function tinyRegions(count: number, spacing: number): [map: string, data: Buffer] {
  const lines = [String(count)];
  for (let i = 0; i < count; i++) lines.push(String(i * spacing), "1");
  return [`${lines.join("\n")}\n`, Buffer.alloc(count, 1)];
}
const tar = (...members: Buffer[]) => Buffer.concat([...members, Buffer.alloc(1024)]);
const tgz = (...members: Buffer[]) => gzipSync(tar(...members));

/** `prefix` followed by `zeros` zero bytes, gzipped as a stream (a few hundred KiB for 200 MiB). */
async function gzippedZeros(prefix: Buffer, zeros: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  async function* source() {
    yield prefix;
    const block = Buffer.alloc(MiB);
    for (let left = zeros; left > 0; left -= MiB) yield block.subarray(0, Math.min(MiB, left));
  }
  await pipeline(Readable.from(source()), createGzip({ level: 9 }), async (gzipped: AsyncIterable<Buffer>) => {
    for await (const chunk of gzipped) chunks.push(chunk);
  });
  return Buffer.concat(chunks);
}

let builder: BuilderProcess;
let storage: FakeStorage;
let sentinel: string;
let victim: string;
let original: string[];

beforeAll(async () => {
  builder = await startBuilder();
  storage = await startFakeStorage(builder.secret);
  sentinel = await mkdtemp(join(tmpdir(), "svc-sentinel-"));
  const created = await putDisk(builder, "victim", MiB);
  expect(created.status).toBe(201);
  victim = diskDataPath(builder.dataDir, "victim");
  await mkdir(join(victim, "sub/inner"), { recursive: true });
  await writeFile(join(victim, "sub/inner/data.bin"), randomBytes(4096));
  await writeFile(join(victim, "keep.txt"), "the disk's own data\n", { mode: 0o640 });
  await symlink("sub/inner", join(victim, "shortcut"));
  original = await describeTree(victim);
});
afterAll(async () => {
  await storage?.close();
  await builder?.stop();
  await rm(sentinel, { recursive: true, force: true });
});

type Case = [name: string, archive: () => Buffer | Promise<Buffer>, error: RegExp, spec?: Partial<RestoreSpec>];

const cases: Case[] = [
  ["path traversal (../evil)", () => tgz(member("../evil", "x")), /member "\.\.\/evil" contains a "\.\." component/],
  ["traversal inside a path", () => tgz(dir("a/"), member("a/../../evil", "x")), /"a\/\.\.\/\.\.\/evil" contains a "\.\." component/],
  ["an absolute path", () => tgz(member(`${sentinel}/evil`, "x")), /is an absolute path/],
  ["a symlink to an absolute path", () => tgz(symlinkMember("link", sentinel)), /symlink "link" -> ".*" points outside the disk/],
  ["a symlink climbing out", () => tgz(symlinkMember("link", "../../x")), /symlink "link" -> "\.\.\/\.\.\/x" points outside the disk/],
  [
    "a file written through a symlink",
    () => tgz(dir("inside/"), symlinkMember("link", "inside"), member("link/evil", "x")),
    /member "link\/evil" would be written through the symlink "link"/,
  ],
  [
    "a symlink that escapes through a later symlink",
    () => tgz(dir("a/"), dir("a/b/"), dir("x/"), symlinkMember("a/b/t", "s/../.."), symlinkMember("a/b/s", "../../x")),
    /symlink "a\/b\/t" -> "s\/\.\.\/\.\." points outside the disk through other links/,
  ],
  ["a hardlink climbing out", () => tgz(hardlinkMember("h", "../../etc/passwd")), /hardlink "h" target "\.\.\/\.\.\/etc\/passwd" contains a "\.\."/],
  ["a hardlink to an absolute path", () => tgz(hardlinkMember("h", "/etc/passwd")), /hardlink "h" target "\/etc\/passwd" is an absolute path/],
  [
    "a hardlink to a member that comes later",
    () => tgz(hardlinkMember("h", "later"), member("later", "x")),
    /hardlink "h" -> "later" does not name an earlier file of the archive/,
  ],
  [
    "a hardlink through a symlink",
    () => tgz(dir("d/"), member("d/f", "x"), symlinkMember("l", "d"), hardlinkMember("h", "l/f")),
    /hardlink "h" -> "l\/f" does not name an earlier file/,
  ],
  ["a fifo", () => tgz(member("pipe", "", { type: "6" })), /member "pipe" is a fifo/],
  ["a character device", () => tgz(member("null", "", { type: "3" })), /member "null" is a char device/],
  ["a block device", () => tgz(member("sda", "", { type: "4" })), /member "sda" is a block device/],
  [
    "a gzip bomb declaring one 200 MiB member",
    () => gzippedZeros(header("bomb", 200 * MiB, {}), 200 * MiB),
    /member "bomb" \(200\.0 MiB\) takes the archive past 10\.0 MiB expanded/,
    { maxExpandedBytes: 10 * MiB },
  ],
  [
    "a gzip bomb of bare zeros",
    () => gzippedZeros(Buffer.alloc(0), 200 * MiB),
    /archive expands to more than 10\.0 MiB \(maxExpandedBytes\)/,
    { maxExpandedBytes: 10 * MiB },
  ],
  [
    "many small members past maxExpandedBytes",
    () => tgz(...Array.from({ length: 8 }, (_, i) => member(`f${i}`, Buffer.alloc(100 * 1024, i)))),
    /member "f5" \(100\.0 KiB\) takes the archive past 512\.0 KiB expanded/,
    { maxExpandedBytes: 512 * 1024 },
  ],
  ["more members than maxEntries", () => tgz(...["a", "b", "c", "d"].map((name) => member(name, name))), /more than 3 entries/, { maxEntries: 3 }],
  ["more data than the disk's quota", () => tgz(member("big", Buffer.alloc(2 * MiB, 1))), /more than the disk's quota of 1\.0 MiB/],
  ["a truncated gzip stream", () => tgz(member("f", randomBytes(64 * 1024))).subarray(0, 30_000), /not a valid gzip stream/],
  ["something that is not gzip", () => Buffer.from("just some text, not an archive"), /not a valid gzip stream/],
  ["a corrupt tar header", () => tgz(member("f", "x", { corrupt: true })), /not a valid tar stream: header checksum mismatch/],
  ["a tar stream cut inside a member", () => gzipSync(member("f", randomBytes(4096)).subarray(0, 2048)), /truncated archive/],
  ["the same member twice", () => tgz(member("twice", "1"), member("twice", "2")), /member "twice" appears twice/],
  [
    "an archive cut at a gzip member boundary (no end-of-archive marker)",
    // Each member its own gzip member, as snapshots are written: the first alone is valid gzip.
    () => Buffer.concat([gzipSync(member("first", randomBytes(2000))), gzipSync(member("second", "x"))]),
    /tar stream ends without the end-of-archive marker \(truncated archive\)/,
  ],
  ["a NUL byte in a pax path", () => tgz(pax("path", "evil\0/../x"), member("ordinary", "x")), /member "evil\\u0000\/\.\.\/x" contains a NUL byte/],
  ["a member type restore does not know", () => tgz(member("volume", "", { type: "V" })), /member "volume" has a tar type that is not supported/],
  [
    "a path longer than a backup may hold",
    () => tgz(pax("path", `${"d/".repeat(1600)}f`), member("short", "x")),
    /member "d\/d\/.*" has a path of 3,201 bytes; at most 3,072 are restored/,
  ],
  [
    "a sparse map reaching past the file's size",
    () => tgz(sparse10("s", "100", "1\n200\n10\n", Buffer.alloc(10, 1))),
    /sparse file "s" \(pax 1\.0\) has a map that does not fit: a region \(200\+10\) ends past the file's size of 100/,
  ],
  [
    "sparse regions that overlap",
    () => tgz(sparse10("s", "100", "2\n0\n10\n5\n10\n", Buffer.alloc(20, 1))),
    /sparse file "s" \(pax 1\.0\) has a map that does not fit: its regions overlap or are not in order/,
  ],
  [
    "sparse regions out of order",
    () => tgz(sparse10("s", "100", "2\n50\n10\n0\n10\n", Buffer.alloc(20, 1))),
    /its regions overlap or are not in order/,
  ],
  [
    "a sparse map that does not add up to the data",
    () => tgz(sparse10("s", "100", "1\n0\n10\n", Buffer.alloc(30, 1))),
    /its regions hold 10 bytes but the member stores 30/,
  ],
  [
    "a negative number in a sparse map",
    () => tgz(sparse10("s", "100", "1\n-5\n10\n", Buffer.alloc(10, 1))),
    /sparse file "s" \(pax 1\.0\): its map holds "-5", not a decimal number/,
  ],
  [
    "a sparse map that is not numbers",
    () => tgz(sparse10("s", "100", "one\n0\n10\n", Buffer.alloc(10, 1))),
    /its map holds "one", not a decimal number/,
  ],
  [
    "a sparse map announcing millions of regions",
    () => tgz(sparse10("s", "100", "99999999\n0\n10\n", Buffer.alloc(10, 1))),
    /its map has more than 1048576 data regions/,
  ],
  [
    "a sparse file whose size is not a number",
    () => tgz(sparse10("s", "1e9", "1\n0\n10\n", Buffer.alloc(10, 1))),
    /member "s" is a sparse file without a valid GNU\.sparse\.realsize/,
  ],
  [
    "a sparse file larger than any file the disk can hold (holes are free, but not endless)",
    () => tgz(sparse10("s", String(2 ** 52), "1\n0\n10\n", Buffer.alloc(10, 1))),
    /sparse file "s" has a size of 4503599627370496 bytes, more than the disk's filesystem holds in one file/,
  ],
  [
    "tiny sparse regions whose blocks fill more than the quota (an allocation bomb)",
    () => tgz(sparse10("s", String(3000 * 65536), ...tinyRegions(3000, 65536))),
    /archive holds more than the disk's quota of 1\.0 MiB \(reached at "s"\)/,
  ],
  [
    "a pax 0.1 sparse map with an odd number of fields",
    () => tgz(paxRecords({ "GNU.sparse.size": "100", "GNU.sparse.map": "0,10,50" }), member("s", Buffer.alloc(10, 1))),
    /member "s" is a sparse file \(pax 0\.1\) whose GNU\.sparse\.map has an odd number of fields/,
  ],
  [
    "sparse records on a symlink",
    () => tgz(paxRecords({ "GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "10" }), symlinkMember("l", "x")),
    /member "l" has GNU sparse records but is not a regular file/,
  ],
  [
    "an unknown GNU sparse format version",
    () => tgz(sparse10("s", "100", "1\n0\n10\n", Buffer.alloc(10, 1), { "GNU.sparse.major": "2" })),
    /member "s" is a sparse file in GNU format 2\.0, which restore does not read/,
  ],
];

describe("POST /v1/restores refuses hostile archives whole", () => {
  it.each(cases)("refuses %s, leaving the disk as it was and nothing outside it", async (name, make, error, spec = {}) => {
    const archive = await make();
    const { status, log } = await restoreToEnd(builder, {
      diskId: "victim",
      archiveUrl: storage.serve(`case-${cases.findIndex((entry) => entry[0] === name)}`, archive),
      expectedSizeBytes: archive.length,
      ...spec,
    });
    expect(status, log).toMatchObject({ status: "failed", reason: "error", result: null });
    expect(status.error).toMatch(error);
    expect(log).toContain(`job failed: ${status.error}`);
    // Refusals come at the first bad byte: a bomb never gets to expand.
    expect(Date.parse(status.finishedAt!) - Date.parse(status.startedAt!)).toBeLessThan(5_000);
    expect(await describeTree(victim)).toEqual(original);
    expect(await readdir(join(builder.dataDir, "disks/victim"))).toEqual(diskFolderAtRest(builder.dataDir, "victim"));
    expect(await readdir(join(builder.dataDir, "disks"))).toEqual(["victim"]);
    expect(await readdir(sentinel)).toEqual([]);
  });

  it("refuses a download whose size or SHA-256 differs from the expected one", async () => {
    const archive = tgz(member("fine.txt", "fine"));
    const url = storage.serve("checked", archive);
    const digest = createHash("sha256").update(archive).digest("hex");
    const longer = await restoreToEnd(builder, { diskId: "victim", archiveUrl: url, expectedSizeBytes: archive.length + 1 });
    expect(longer.status.error).toBe(`archive rejected: the download is ${archive.length} bytes, expected ${archive.length + 1} (expectedSizeBytes)`);
    const wrongDigest = "0".repeat(64);
    const tampered = await restoreToEnd(builder, {
      diskId: "victim",
      archiveUrl: url,
      expectedSizeBytes: archive.length,
      expectedSha256: wrongDigest,
    });
    expect(tampered.status.error).toBe(`archive rejected: the download's SHA-256 is ${digest}, expected ${wrongDigest} (expectedSha256)`);
    const missing = await restoreToEnd(builder, { diskId: "victim", archiveUrl: `${storage.url}/archives/none`, expectedSizeBytes: 10 });
    expect(missing.status.error).toBe("archive download failed: HTTP 404");
    expect(await describeTree(victim)).toEqual(original);
    expect(await readdir(join(builder.dataDir, "disks/victim"))).toEqual(diskFolderAtRest(builder.dataDir, "victim"));
  });

  it("fails a download the server cuts short, or answers with something other than HTTP, as a download failure", async () => {
    const archive = tgz(member("big.bin", randomBytes(700 * 1024)));
    const sent = 300 * 1024 + 77;
    const server = createNetServer((socket) => {
      socket.on("error", () => undefined);
      socket.once("data", (request) => {
        if (request.toString().startsWith("GET /garbage ")) return socket.end("220 mail.example.com ESMTP\r\n\r\n");
        socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${archive.length}\r\n\r\n`);
        socket.end(archive.subarray(0, sent));
      });
    });
    await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
    const origin = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const cut = await restoreToEnd(builder, { diskId: "victim", archiveUrl: `http://${origin}/cut`, expectedSizeBytes: archive.length });
      expect(cut.status.error).toBe(`archive download failed: ${origin} closed the connection ${archive.length - sent} bytes before the body's end`);
      const garbage = await restoreToEnd(builder, { diskId: "victim", archiveUrl: `http://${origin}/garbage`, expectedSizeBytes: archive.length });
      expect(garbage.status.error).toBe(`archive download failed: bad response from ${origin}: not an HTTP/1.1 status line: "220 mail.example.com ESMTP"`);
    } finally {
      server.close();
    }
    expect(await describeTree(victim)).toEqual(original);
    expect(await readdir(join(builder.dataDir, "disks/victim"))).toEqual(diskFolderAtRest(builder.dataDir, "victim"));
  });
});
