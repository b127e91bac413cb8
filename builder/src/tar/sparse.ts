/**
 * Sparse files in tar archives, and what files allocate.
 *
 * A sparse file (`truncate -s 2G app.db`) has holes that read as zeros and
 * take no blocks. Snapshots write such a file as a GNU sparse member in the
 * pax 1.0 format (GNU tar's manual, "Storing Sparse Files", and what bsdtar
 * writes too): a pax header with `GNU.sparse.major=1`, `GNU.sparse.minor=0`,
 * `GNU.sparse.name` (the real path) and `GNU.sparse.realsize`, a ustar name
 * `dir/GNUSparseFile.0/base` (so a reader without sparse support extracts the
 * stored data beside, never as, the file), and data that starts with the map
 * (`N\n` then `offset\nlength\n` per data region, padded with NULs to 512
 * bytes) followed by the regions' bytes. GNU tar, bsdtar and Python's
 * tarfile restore it as the original file.
 *
 * Restores read that format, pax 0.1 (`GNU.sparse.map`) and GNU tar's old
 * format (typeflag `S`, the map in the header) when it needs no extension
 * headers; pax 0.0 (the map in repeated `GNU.sparse.offset` records, which
 * tar-stream keeps only the last of) and old members with more than four
 * regions are refused by name, never extracted as something else. A map must
 * be sorted, non-overlapping, inside the file and describe exactly the data
 * that follows.
 *
 * Allocation: both sides count a file as the blocks its data fills, so the
 * quota a snapshot checks is the one a restore checks, and a restore
 * allocates what the disk allocated.
 */
import { spawn } from "node:child_process";
import { read } from "node:fs";
import { promisify } from "node:util";
import { BACKUP_MAX_SPARSE_REGIONS } from "../protocol/disks.js";

/** Bytes `[offset, offset + length)` of a sparse file hold data; the rest reads as zeros. */
export interface Region {
  offset: number;
  length: number;
}

const BLOCK = 512;
/** ext4 keeps a symlink target shorter than this in the inode itself ("fast" symlinks): no block. */
const FAST_SYMLINK_BYTES = 60;
/** A map's numbers: decimal, at most 16 digits (beyond 2^53 they would not be exact). */
const DECIMAL = /^[0-9]{1,16}$/;
/** Bytes read at once when a sparse file's regions are found by reading it, or its data is read. */
const SCAN_BYTES = 1024 * 1024;

const readAsync = promisify(read);

/** Bytes a regular file of `size` bytes without holes allocates in blocks of `blockSize`. */
export function fileAllocation(size: number, blockSize: number): number {
  return Math.ceil(size / blockSize) * blockSize;
}

/** Bytes a symlink with a target of `targetBytes` allocates: none for a fast symlink, else whole blocks. */
export function symlinkAllocation(targetBytes: number, blockSize: number): number {
  return targetBytes < FAST_SYMLINK_BYTES ? 0 : fileAllocation(targetBytes, blockSize);
}

/** Bytes the data regions of a sparse file allocate: every block they touch, once. */
export function regionsAllocation(regions: readonly Region[], blockSize: number): number {
  let total = 0;
  let lastBlock = -1;
  for (const { offset, length } of regions) {
    if (length === 0) continue;
    const first = Math.max(Math.floor(offset / blockSize), lastBlock + 1);
    const last = Math.floor((offset + length - 1) / blockSize);
    if (last >= first) total += (last - first + 1) * blockSize;
    lastBlock = Math.max(lastBlock, last);
  }
  return total;
}

/** Sum of the regions' lengths: the data bytes an archive stores for them. */
export function regionsBytes(regions: readonly Region[]): number {
  let total = 0;
  for (const { length } of regions) total += length;
  return total;
}

/**
 * Why a map cannot describe a file of `realSize` bytes whose archived data is
 * `dataBytes` long, or null when it can: regions sorted, not overlapping,
 * inside the file, adding up to the data.
 */
export function mapProblem(regions: readonly Region[], realSize: number, dataBytes: number): string | null {
  if (regions.length > BACKUP_MAX_SPARSE_REGIONS) return `it has more than ${BACKUP_MAX_SPARSE_REGIONS} data regions`;
  let end = 0;
  let total = 0;
  for (const { offset, length } of regions) {
    if (offset < end) return `its regions overlap or are not in order (offset ${offset} after ${end})`;
    if (offset + length > realSize) return `a region (${offset}+${length}) ends past the file's size of ${realSize}`;
    end = offset + length;
    total += length;
  }
  if (total !== dataBytes) return `its regions hold ${total} bytes but the member stores ${dataBytes}`;
  return null;
}

/** A decimal number of a map or pax record, or null. */
export function parseDecimal(text: string | undefined): number | null {
  if (text === undefined || !DECIMAL.test(text)) return null;
  const value = Number(text);
  return Number.isSafeInteger(value) ? value : null;
}

/** The pax 1.0 map text a member's data starts with, padded with NULs to whole blocks. */
export function encodeMap(regions: readonly Region[]): Buffer {
  const text = `${regions.length}\n${regions.map(({ offset, length }) => `${offset}\n${length}\n`).join("")}`;
  const bytes = Buffer.byteLength(text);
  const buffer = Buffer.alloc(Math.ceil(bytes / BLOCK) * BLOCK);
  buffer.write(text, 0, "latin1");
  return buffer;
}

/** Parses pax 0.1's `GNU.sparse.map` ("offset,length,offset,length…"): the regions, or why not. */
export function parseMap01(text: string): Region[] | string {
  const fields = text === "" ? [] : text.split(",");
  if (fields.length % 2 !== 0) return "GNU.sparse.map has an odd number of fields";
  if (fields.length / 2 > BACKUP_MAX_SPARSE_REGIONS) return `GNU.sparse.map has more than ${BACKUP_MAX_SPARSE_REGIONS} regions`;
  const regions: Region[] = [];
  for (let i = 0; i < fields.length; i += 2) {
    const offset = parseDecimal(fields[i]);
    const length = parseDecimal(fields[i + 1]);
    if (offset === null || length === null) return `GNU.sparse.map holds ${JSON.stringify(`${fields[i]},${fields[i + 1]}`)}, not two decimal numbers`;
    regions.push({ offset, length });
  }
  return regions;
}

/**
 * Reads pax 1.0's map from the start of a member's data, chunk by chunk:
 * `feed` answers null while it needs more, then the regions, the map's
 * length with its padding and how many bytes of that chunk it took, or why
 * the map is malformed. Memory: the numbers read, at most two per allowed region.
 */
export class MapReader {
  #partial = "";
  #count: number | null = null;
  #values: number[] = [];
  /** Bytes of the map's complete lines so far. */
  #mapBytes = 0;
  /** Bytes fed so far. */
  #fed = 0;
  /** Where the map's padding ends, once the map is complete. */
  #end: number | null = null;
  #regions: Region[] = [];

  feed(chunk: Buffer): { regions: Region[]; mapBytes: number; used: number } | { problem: string } | null {
    const before = this.#fed;
    this.#fed += chunk.length;
    let start = 0;
    while (this.#end === null) {
      const newline = chunk.indexOf(0x0a, start);
      if (newline === -1) {
        this.#partial += chunk.toString("latin1", start);
        return this.#partial.length > 16 ? { problem: `its map holds ${JSON.stringify(this.#partial.slice(0, 20))}…, not a number` } : null;
      }
      const line = this.#partial + chunk.toString("latin1", start, newline);
      this.#partial = "";
      this.#mapBytes += line.length + 1;
      start = newline + 1;
      const value = parseDecimal(line);
      if (value === null) return { problem: `its map holds ${JSON.stringify(line.slice(0, 20))}, not a decimal number` };
      if (this.#count === null) {
        if (value > BACKUP_MAX_SPARSE_REGIONS) return { problem: `its map has more than ${BACKUP_MAX_SPARSE_REGIONS} data regions` };
        this.#count = value;
      } else {
        this.#values.push(value);
      }
      if (this.#values.length === 2 * this.#count) {
        for (let i = 0; i < this.#values.length; i += 2) this.#regions.push({ offset: this.#values[i]!, length: this.#values[i + 1]! });
        this.#values = [];
        this.#end = Math.ceil(this.#mapBytes / BLOCK) * BLOCK;
      }
    }
    return this.#end <= this.#fed ? { regions: this.#regions, mapBytes: this.#end, used: this.#end - before } : null;
  }
}

/** A number field of a GNU header: octal text, or base-256 (first byte 0x80); null when malformed or negative. */
function headerNumber(field: Buffer): number | null {
  if (field[0] === 0x80) {
    let value = 0;
    for (let i = 1; i < field.length; i++) value = value * 256 + field[i]!;
    return Number.isSafeInteger(value) ? value : null;
  }
  if ((field[0]! & 0x80) !== 0) return null;
  const text = field.toString("latin1").replace(/[\0 ]+$/, "").replace(/^ +/, "");
  if (!/^[0-7]{1,16}$/.test(text)) return null;
  const value = Number.parseInt(text, 8);
  return Number.isSafeInteger(value) ? value : null;
}

/** Typeflag of GNU tar's old sparse members. */
export const OLD_GNU_SPARSE = 0x53; // "S"

/**
 * The map and real size of an old GNU sparse member from its raw 512-byte
 * header (typeflag `S`): four map entries at byte 386, "is extended" at 482,
 * the real size at 483. Null map with a reason when it cannot be read.
 */
export function parseOldGnuHeader(header: Buffer): { regions: Region[]; realSize: number } | string {
  if (header[482] !== 0) return "map continues in extension headers (more than 4 data regions), which restore does not read";
  const regions: Region[] = [];
  for (let i = 0; i < 4; i++) {
    const at = 386 + i * 24;
    const offsetField = header.subarray(at, at + 12);
    if (offsetField.every((byte) => byte === 0)) break;
    const offset = headerNumber(offsetField);
    const length = headerNumber(header.subarray(at + 12, at + 24));
    if (offset === null || length === null) return "map holds a number that is not octal";
    regions.push({ offset, length });
  }
  const realSize = headerNumber(header.subarray(483, 495));
  if (realSize === null) return "real size is not a number";
  return { regions, realSize };
}

/**
 * The data regions of the open file `fd` of `size` bytes, in order: from the
 * filesystem's extent map (FIEMAP, through e2fsprogs' filefrag, reading the
 * descriptor through /proc) where it has one, else by reading the file and
 * keeping the blocks that are not all zeros. Extents the filesystem merely
 * reserved (fallocate) count as data: they are allocated. Null when the file
 * has more than {@link BACKUP_MAX_SPARSE_REGIONS} regions.
 */
export async function dataRegions(fd: number, size: number, blockSize: number): Promise<Region[] | null> {
  const mapped = await extentRegions(fd, size).catch(() => undefined);
  if (mapped !== undefined) return mapped;
  return scannedRegions(fd, size, blockSize);
}

/** Adds `[offset, offset + length)` (clipped to `size`) to `regions`, merging it with the last one when they touch. */
function addRegion(regions: Region[], offset: number, length: number, size: number): boolean {
  const end = Math.min(offset + length, size);
  if (end <= offset) return true;
  const last = regions[regions.length - 1];
  if (last && last.offset + last.length >= offset) {
    last.length = Math.max(last.length, end - last.offset);
    return true;
  }
  if (regions.length >= BACKUP_MAX_SPARSE_REGIONS) return false;
  regions.push({ offset, length: end - offset });
  return true;
}

const EXTENT_LINE = /^\s*\d+:\s*(\d+)\.\.\s*(\d+):/;

/** Regions from `filefrag -v -b1` (byte units); undefined when the filesystem has no extent map. */
function extentRegions(fd: number, size: number): Promise<Region[] | null | undefined> {
  return new Promise((resolve, reject) => {
    const child = spawn("filefrag", ["-v", "-b1", `/proc/${process.pid}/fd/${fd}`], { stdio: ["ignore", "pipe", "ignore"] });
    const regions: Region[] = [];
    let overflow = false;
    let pending = "";
    let sawHeader = false;
    const line = (text: string) => {
      if (text.includes("logical_offset")) sawHeader = true;
      const match = EXTENT_LINE.exec(text);
      if (!match || overflow) return;
      const first = Number(match[1]);
      const last = Number(match[2]);
      if (!addRegion(regions, first, last - first + 1, size)) {
        overflow = true;
        child.kill();
      }
    };
    child.stdout.setEncoding("latin1");
    child.stdout.on("data", (text: string) => {
      const lines = (pending + text).split("\n");
      pending = lines.pop() ?? "";
      for (const each of lines) line(each);
    });
    child.on("error", reject);
    child.on("close", (code) => {
      line(pending);
      if (overflow) resolve(null);
      else if (code !== 0 || !sawHeader) resolve(undefined);
      else resolve(regions);
    });
  });
}

/** Regions found by reading: blocks of `blockSize` that are not all zeros. */
async function scannedRegions(fd: number, size: number, blockSize: number): Promise<Region[] | null> {
  const regions: Region[] = [];
  const buffer = Buffer.alloc(Math.max(blockSize, Math.floor(SCAN_BYTES / blockSize) * blockSize));
  const zeros = Buffer.alloc(blockSize);
  for (let position = 0; position < size; ) {
    const { bytesRead } = await readAsync(fd, buffer, 0, Math.min(buffer.length, size - position), position);
    if (bytesRead === 0) break;
    for (let at = 0; at < bytesRead; at += blockSize) {
      const block = buffer.subarray(at, Math.min(at + blockSize, bytesRead));
      if (block.equals(zeros.subarray(0, block.length))) continue;
      if (!addRegion(regions, position + at, block.length, size)) return null;
    }
    position += bytesRead;
  }
  return regions;
}
