/**
 * Extracts an untrusted tar stream into a fresh, empty directory, refusing the
 * whole archive at the first member that could reach outside it or exceed a
 * limit. The tar format is parsed by tar-stream (ustar, pax, GNU long names,
 * base-256 numbers); this file is the policy. Nothing is written outside
 * `root`:
 *
 * - member paths must be relative and free of `..` (and of NUL bytes);
 * - no member may pass through a symlink the archive created (every symlink is
 *   remembered), and files are created O_EXCL, so nothing is written through a
 *   link, not even a dangling one;
 * - symlink targets are resolved the way the kernel would (through the links
 *   created so far, and again for all of them once the archive is complete,
 *   since a later link can change where an earlier one leads) and must stay
 *   inside; absolute targets never do;
 * - hardlinks must name an earlier regular file of the archive;
 * - devices, fifos and types tar-stream does not know are refused;
 * - sparse files (GNU pax 1.0 and 0.1, old GNU with up to four regions:
 *   sparse.ts) are recreated sparse, their map checked against their data
 *   first; other sparse formats are refused by name, never written as
 *   something else;
 * - members, paths, uncompressed bytes, restored bytes (the blocks files
 *   allocate, as the disk counts them) and inodes are counted against their
 *   limits before anything is written;
 * - the stream must end with the end-of-archive marker, so an archive cut at a
 *   member boundary (a gzip of several members can be) is not taken as whole.
 *
 * Speed: small files (the many) are gathered in memory and written with
 * synchronous calls, which cost a fraction of the threadpool round trips;
 * large ones stream through asynchronous writes. Directories and links are
 * synchronous calls too. Callers feed it gunzip's output in pieces of
 * {@link GUNZIP_CHUNK_BYTES}.
 *
 * Memory: chunks stream through; what grows with the archive is one record per
 * directory (mode and mtime, applied at the end, deepest first, so read-only
 * directories can still be filled) and one per symlink, both bounded by the
 * member limit.
 */
import {
  chmodSync,
  chownSync,
  closeSync,
  constants,
  createReadStream,
  fchmodSync,
  fchownSync,
  futimesSync,
  lchownSync,
  linkSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  openSync,
  symlinkSync,
  utimesSync,
  writeSync,
} from "node:fs";
import { open, readFile } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { type Gunzip, createGunzip } from "node:zlib";
import { type Header, extract as tarExtract } from "tar-stream";
import { BACKUP_MAX_PATH_BYTES } from "../protocol/disks.js";
import type { JobUser } from "../sandbox/tenants.js";
import { formatBytes, formatCount } from "../units.js";
import { whenWritable } from "./pack.js";
import {
  MapReader,
  OLD_GNU_SPARSE,
  type Region,
  fileAllocation,
  mapProblem,
  parseDecimal,
  parseMap01,
  parseOldGnuHeader,
  regionsAllocation,
  symlinkAllocation,
} from "./sparse.js";

/**
 * gunzip output per threadpool round trip for an extraction's source: larger
 * pieces mean fewer of them (a member's data is a slice of one); zlib's
 * default 16 KiB made a release of 802 entries wait on them for a third of
 * its extraction.
 */
export const GUNZIP_CHUNK_BYTES = 256 * 1024;
/**
 * gunzip input per threadpool round trip, for the same reason: an archive on
 * local disk is read in pieces this large, and a restore's download is read
 * into pieces this large (a socket's 64 KiB reads cost its extraction a
 * fifth more).
 */
export const GUNZIP_INPUT_BYTES = 1024 * 1024;

/** The uncompressed stream of a `.tar.gz` on local disk, in the pieces above; a read error destroys it. */
export function gunzipFile(path: string): Gunzip {
  const gunzip = createGunzip({ chunkSize: GUNZIP_CHUNK_BYTES });
  void pipeline(createReadStream(path, { highWaterMark: GUNZIP_INPUT_BYTES }), gunzip).catch(() => undefined);
  return gunzip;
}

/** A member (or the archive as a whole) that restore refuses; the message names it. */
export class ArchiveRejected extends Error {}

/** A stream that is not a well-formed tar archive (corrupt, truncated, or not tar at all). */
export class TarFormatError extends Error {}

/** Limits and ownership of one extraction. */
export interface ExtractOptions {
  /** The uncompressed tar stream. */
  source: AsyncIterable<Buffer>;
  /** An empty directory only the builder can reach. */
  root: string;
  maxEntries: number;
  /** Most bytes the uncompressed stream may have. */
  maxExpandedBytes: number;
  /**
   * Most bytes restored files may allocate, counted like the disk's usage:
   * whole blocks of `blockSize` for each file's data (a sparse file's regions
   * only), symlinks past ext4's 60-byte inline targets a block, hard links nothing.
   */
  quotaBytes: number;
  /** Block size of the filesystem `root` is on (default 4096). */
  blockSize?: number;
  /** Most files, directories and symlinks (inodes) the archive may create (default: no limit). */
  inodeLimit?: number;
  /** Owner of everything extracted (the job user); null keeps the builder's own. */
  owner: JobUser | null;
}

/** What an extraction restored. */
export interface ExtractSummary {
  entries: number;
  /** Bytes of the uncompressed tar stream, trailing padding included. */
  expandedBytes: number;
  /** Bytes the restored files allocate (see {@link ExtractOptions.quotaBytes}). */
  restoredBytes: number;
}

/** A sparse member, as its headers describe it. */
interface SparseMember {
  /** How messages name the format. */
  format: string;
  /** The real path (the ustar name of pax 1.0 and 0.1 members is a stand-in). */
  name: string;
  realSize: number;
  /** The map, when the headers hold it; pax 1.0 keeps it at the start of the data. */
  regions: Region[] | null;
}

/** Following links, more hops than this is a loop (the kernel's MAXSYMLINKS): it fails, it cannot escape. */
const MAX_LINK_HOPS = 40;
const BLOCK = 512;
/** Two zero blocks end an archive. */
const END_MARKER_BYTES = 2 * BLOCK;
/**
 * Files up to this size are gathered and written with synchronous calls: from
 * memory to the page cache that is a few µs, where each of the four threadpool
 * round trips (open, write, utimes, close) costs several times more, and the
 * event loop waits at most as long as one small write. Larger files stream
 * through asynchronous writes.
 */
const SYNC_WRITE_BYTES = 256 * 1024;
/**
 * Directories, links and the modes and times set at the end are made with
 * synchronous calls too (a metadata change in the page cache, a few µs),
 * the event loop given its turn after every this many of the final pass.
 */
const SYNC_METADATA_BATCH = 256;

interface DirMeta {
  mode: number;
  /** Null for directories the archive implies but does not list. */
  mtime: number | null;
}

/** Member types that are never restored, as messages name them. */
const REFUSED_TYPES = { "character-device": "char device", "block-device": "block device", fifo: "fifo" } as const;

/** tar-stream's own words for what is wrong with a stream, as restore reports them. */
const FORMAT_MESSAGES: [RegExp, string][] = [
  [/^Invalid tar header\. Maybe/, "header checksum mismatch"],
  [/^Invalid tar header: unknown format/, "a header is neither ustar, pax nor GNU tar"],
  [/^Unexpected end of data/, "tar stream ends in the middle of a member (truncated archive)"],
  [/^Header exceeds max size/, "an extended header is larger than 4 MiB"],
  [/^Invalid header/, "a header declares an invalid size"],
];

function formatError(error: unknown): TarFormatError {
  const message = error instanceof Error ? error.message : String(error);
  const known = FORMAT_MESSAGES.find(([pattern]) => pattern.test(message));
  return new TarFormatError(known ? known[1] : message);
}

/**
 * `a/b/c` → ["a", "b", "c"]; "" (or "./") is the root. Absolute paths, `..`,
 * NUL bytes and paths longer than a backup may hold (files are opened by
 * their path below the staging directory, within PATH_MAX) are refused.
 */
function memberPath(raw: string, what: string): string[] {
  if (raw.startsWith("/")) throw new ArchiveRejected(`${what} ${JSON.stringify(raw)} is an absolute path`);
  if (raw.includes("\0")) throw new ArchiveRejected(`${what} ${JSON.stringify(raw)} contains a NUL byte`);
  const parts = raw.split("/").filter((part) => part !== "" && part !== ".");
  if (parts.includes("..")) throw new ArchiveRejected(`${what} ${JSON.stringify(raw)} contains a ".." component`);
  const bytes = Buffer.byteLength(parts.join("/"));
  if (bytes > BACKUP_MAX_PATH_BYTES) {
    throw new ArchiveRejected(
      `${what} ${JSON.stringify(`${raw.slice(0, 60)}…`)} has a path of ${formatCount(bytes)} bytes; at most ${formatCount(BACKUP_MAX_PATH_BYTES)} are restored`,
    );
  }
  return parts;
}

/**
 * The sparse format of a member, from its pax records or its raw header
 * (tar-stream reports GNU's `S` typeflag as an unknown type); null for an
 * ordinary member. Formats restore cannot rebuild exactly are refused.
 */
function sparseMember(header: Header, raw: () => Buffer | null): SparseMember | null {
  const pax = header.pax && typeof header.pax === "object" ? (header.pax as Record<string, string>) : {};
  const keys = Object.keys(pax).filter((key) => key.startsWith("GNU.sparse."));
  const quoted = JSON.stringify(pax["GNU.sparse.name"] ?? header.name);
  if (keys.length > 0) {
    if (header.type !== "file" && header.type !== "contiguous-file") {
      throw new ArchiveRejected(`member ${quoted} has GNU sparse records but is not a regular file`);
    }
    const name = pax["GNU.sparse.name"] ?? header.name;
    const major = pax["GNU.sparse.major"];
    const minor = pax["GNU.sparse.minor"];
    if (major !== undefined || minor !== undefined) {
      if (major !== "1" || minor !== "0") {
        throw new ArchiveRejected(`member ${quoted} is a sparse file in GNU format ${major}.${minor}, which restore does not read`);
      }
      const realSize = parseDecimal(pax["GNU.sparse.realsize"] ?? pax["GNU.sparse.size"]);
      if (realSize === null) throw new ArchiveRejected(`member ${quoted} is a sparse file without a valid GNU.sparse.realsize`);
      return { format: "pax 1.0", name, realSize, regions: null };
    }
    if (pax["GNU.sparse.map"] !== undefined) {
      const realSize = parseDecimal(pax["GNU.sparse.size"] ?? pax["GNU.sparse.realsize"]);
      if (realSize === null) throw new ArchiveRejected(`member ${quoted} is a sparse file without a valid GNU.sparse.size`);
      const regions = parseMap01(pax["GNU.sparse.map"]);
      if (typeof regions === "string") throw new ArchiveRejected(`member ${quoted} is a sparse file (pax 0.1) whose ${regions}`);
      const blocks = pax["GNU.sparse.numblocks"];
      if (blocks !== undefined && parseDecimal(blocks) !== regions.length) {
        throw new ArchiveRejected(`member ${quoted} is a sparse file (pax 0.1) whose GNU.sparse.numblocks does not match its map`);
      }
      return { format: "pax 0.1", name, realSize, regions };
    }
    if (pax["GNU.sparse.offset"] !== undefined || pax["GNU.sparse.numbytes"] !== undefined) {
      throw new ArchiveRejected(
        `member ${quoted} is a sparse file in GNU tar's pax format 0.0 (its map in repeated records), which restore does not read; ` +
          "archive it with tar --sparse-version=1.0 or with bsdtar",
      );
    }
    throw new ArchiveRejected(`member ${quoted} has GNU sparse records (${keys.join(", ")}) of a format restore does not read`);
  }
  if (header.type !== null) return null;
  const block = raw();
  if (block?.[156] !== OLD_GNU_SPARSE) return null;
  const parsed = parseOldGnuHeader(block);
  if (typeof parsed === "string") {
    throw new ArchiveRejected(
      `member ${quoted} is a sparse file in GNU tar's old format whose ${parsed}; archive it with tar --format=pax (pax sparse 1.0) or with bsdtar`,
    );
  }
  return { format: "old GNU", name: header.name, realSize: parsed.realSize, regions: parsed.regions };
}

/** The typeflag of a raw header, for messages. */
function typeflagOf(block: Buffer | null): string {
  return block ? ` (typeflag ${JSON.stringify(String.fromCharCode(block[156] ?? 0))})` : "";
}

/**
 * Where a link's target leads, given the links known so far: the directory
 * stack from the root, or "outside". Links met on the way are followed like
 * the kernel does; a path that does not exist yet counts as a directory.
 */
export function resolveLink(from: string[], target: string, links: Map<string, string>, hops = { count: 0 }): string[] | "outside" | "loop" {
  if (target.startsWith("/")) return "outside";
  const stack = [...from];
  for (const part of target.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (stack.length === 0) return "outside";
      stack.pop();
      continue;
    }
    stack.push(part);
    const next = links.get(stack.join("/"));
    if (next === undefined) continue;
    if (++hops.count > MAX_LINK_HOPS) return "loop";
    stack.pop();
    const resolved = resolveLink(stack, next, links, hops);
    if (typeof resolved === "string") return resolved;
    stack.splice(0, stack.length, ...resolved);
  }
  return stack;
}

const code = (error: unknown) => (error as NodeJS.ErrnoException).code;
const padded = (bytes: number) => Math.ceil(bytes / BLOCK) * BLOCK;

/** The process's umask, from /proc (asking process.umask() would briefly set it to 0 for every thread). */
async function processUmask(): Promise<number> {
  const status = await readFile("/proc/self/status", "latin1");
  const match = /^Umask:\s*([0-7]+)$/m.exec(status);
  return match ? Number.parseInt(match[1]!, 8) : 0o777;
}

/** A pax record of the member's extended header, if it has one. */
function paxValue(header: Header, key: string): string | undefined {
  const pax: unknown = header.pax;
  if (typeof pax !== "object" || pax === null) return undefined;
  const value: unknown = (pax as Record<string, unknown>)[key];
  return typeof value === "string" ? value : undefined;
}

/** Unix seconds: pax `mtime` (which may have a fraction) when present, else the header's. */
function mtimeOf(header: Header): number {
  const pax = Number(paxValue(header, "mtime"));
  return Number.isFinite(pax) ? pax : header.mtime.getTime() / 1000;
}

/** The last chunks fed are kept (at least this many bytes and three chunks) to read a member's raw header back. */
const RECENT_BYTES = 1024 * 1024;

/**
 * The parser, fed from the source. The feeder runs at most one chunk ahead of
 * the parser, so limits are judged where the parser is: the stream is cut at
 * `maxExpandedBytes`, and the limit is reported only if the parser needs what
 * lies beyond; a member whose declared size crosses it is refused by name first.
 */
class FedParser {
  readonly parser = tarExtract();
  /** A failure of the source (gunzip, the download) is reported as it is, not as a format error. */
  sourceError: unknown = null;
  /** Set once the stream went past `maxExpandedBytes` (and was cut there). */
  limitError: ArchiveRejected | null = null;
  expandedBytes = 0;
  /** The stream's last bytes, to check the end-of-archive marker. */
  tail: Buffer = Buffer.alloc(0);
  /**
   * The chunks fed last, with their offsets in the stream: the parser holds
   * at most a chunk and its write buffer unparsed, so the header of the
   * member it just announced is among them (tar-stream keeps no raw header).
   */
  readonly #recent: { start: number; bytes: Buffer }[] = [];
  #recentBytes = 0;

  /** The stream's bytes `[offset, offset + length)` if they are still kept, else null. */
  bytesAt(offset: number, length: number): Buffer | null {
    const pieces: Buffer[] = [];
    let at = offset;
    for (const { start, bytes } of this.#recent) {
      const end = start + bytes.length;
      if (end <= at || start > at) continue;
      const piece = bytes.subarray(at - start, Math.min(bytes.length, offset + length - start));
      pieces.push(piece);
      at += piece.length;
      if (at >= offset + length) return Buffer.concat(pieces);
    }
    return null;
  }

  #remember(chunk: Buffer): void {
    this.#recent.push({ start: this.expandedBytes - chunk.length, bytes: chunk });
    this.#recentBytes += chunk.length;
    while (this.#recent.length > 3 && this.#recentBytes - this.#recent[0]!.bytes.length >= RECENT_BYTES) {
      this.#recentBytes -= this.#recent.shift()!.bytes.length;
    }
  }

  constructor(source: AsyncIterable<Buffer>, maxExpandedBytes: number) {
    // Never rejects: a failure of the source is kept and destroys the parser, which the reader of members sees.
    void this.#feed(source, maxExpandedBytes);
  }

  async #feed(source: AsyncIterable<Buffer>, maxExpandedBytes: number): Promise<void> {
    const { parser } = this;
    try {
      for await (const whole of source) {
        // The extraction stopped (it refused a member): leave the rest unread.
        if (parser.destroying) return;
        let chunk = whole;
        if (this.expandedBytes + chunk.length > maxExpandedBytes) {
          this.limitError = new ArchiveRejected(`archive expands to more than ${formatBytes(maxExpandedBytes)} (maxExpandedBytes)`);
          chunk = chunk.subarray(0, maxExpandedBytes - this.expandedBytes);
        }
        this.expandedBytes += chunk.length;
        this.#remember(chunk);
        this.tail = chunk.length >= END_MARKER_BYTES ? chunk.subarray(-END_MARKER_BYTES) : Buffer.concat([this.tail, chunk]).subarray(-END_MARKER_BYTES);
        if (!parser.write(chunk)) await whenWritable(parser);
        if (this.limitError) break;
      }
      parser.end(undefined);
    } catch (error) {
      this.sourceError = error;
      parser.destroy(error instanceof Error ? error : new Error(String(error)));
    }
  }

  /** What a failed read of the stream means: the source's own failure, the cut at the limit, or a malformed archive. */
  failure(error: unknown): unknown {
    return this.sourceError ?? this.limitError ?? formatError(error);
  }
}

/**
 * Extracts the archive into `root` and answers what it restored; throws
 * {@link ArchiveRejected} or {@link TarFormatError} for a bad archive, leaving
 * `root` for the caller to delete.
 */
export async function extractTar(options: ExtractOptions): Promise<ExtractSummary> {
  const { root, owner } = options;
  const blockSize = options.blockSize ?? 4096;
  const inodeLimit = options.inodeLimit ?? Number.POSITIVE_INFINITY;
  const umask = await processUmask();
  const fed = new FedParser(options.source, options.maxExpandedBytes);
  const members = fed.parser[Symbol.asyncIterator]();
  const dirs = new Map<string, DirMeta>();
  const links = new Map<string, string>();
  let rootMtime: number | null = null;
  let entries = 0;
  let inodes = 0;
  let restoredBytes = 0;
  /** Where the last member's data (padded) ends in the stream. */
  let lastEnd = 0;

  const where = (parts: string[]) => join(root, ...parts);
  const addRestored = (bytes: number, name: string) => {
    restoredBytes += bytes;
    if (restoredBytes > options.quotaBytes) {
      throw new ArchiveRejected(
        `archive holds more than the disk's quota of ${formatBytes(options.quotaBytes)} (reached at ${JSON.stringify(name)})`,
      );
    }
  };
  /** Counts a file, directory or symlink about to be created against the disk's inode limit. */
  const addInode = (name: string) => {
    if (++inodes > inodeLimit) {
      throw new ArchiveRejected(
        `archive holds more than the disk's limit of ${formatCount(inodeLimit)} files, directories and symlinks (reached at ${JSON.stringify(name)})`,
      );
    }
  };
  /** Refuses a member below a symlink, and creates the directories above it that the archive did not list. */
  const prepareParents = (parts: string[], name: string) => {
    for (let depth = 1; depth < parts.length; depth++) {
      const prefix = parts.slice(0, depth).join("/");
      if (links.has(prefix)) {
        throw new ArchiveRejected(`member ${JSON.stringify(name)} would be written through the symlink ${JSON.stringify(prefix)}`);
      }
      if (dirs.has(prefix)) continue;
      addInode(prefix);
      try {
        mkdirSync(where(parts.slice(0, depth)), { mode: 0o700 });
      } catch (error) {
        if (code(error) !== "EEXIST") throw error;
        throw new ArchiveRejected(`member ${JSON.stringify(name)} needs ${JSON.stringify(prefix)} to be a directory`);
      }
      dirs.set(prefix, { mode: 0o755, mtime: null });
    }
  };
  const duplicate = (name: string) => new ArchiveRejected(`member ${JSON.stringify(name)} appears twice in the archive`);
  /** The member's content, chunk by chunk; a failure of the stream is the archive's. */
  async function* body(entry: AsyncIterable<unknown>): AsyncGenerator<Buffer> {
    try {
      // tar-stream passes on slices of what it was fed: Buffers.
      for await (const chunk of entry) yield chunk as Buffer;
    } catch (error) {
      throw fed.failure(error);
    }
  }
  /**
   * Creates a file with all its content, then its owner, mode and mtime. It is
   * created with its mode (the staging directory is the builder's alone), so
   * a chmod is needed only for bits the umask took away.
   */
  /** Opens a new file for `name`, with its mode; a member naming one already restored is refused. */
  const createExclusive = async (at: string, name: string, mode: number) => {
    try {
      return await open(at, "wx", mode);
    } catch (error) {
      if (code(error) === "EEXIST") throw duplicate(name);
      throw error;
    }
  };

  const writeFile = async (at: string, name: string, chunks: AsyncIterable<Buffer> | Buffer, mode: number, mtime: number) => {
    const file = await createExclusive(at, name, mode);
    try {
      for await (const chunk of Buffer.isBuffer(chunks) ? [chunks] : chunks) {
        let offset = 0;
        while (offset < chunk.length) offset += (await file.write(chunk, offset)).bytesWritten;
      }
      if (owner) await file.chown(owner.uid, owner.gid);
      if ((mode & umask) !== 0) await file.chmod(mode);
      await file.utimes(mtime, mtime);
    } finally {
      await file.close();
    }
  };

  /**
   * Creates a sparse file: each region's bytes, from `chunks`, at its offset;
   * the holes between are never written, so they take no blocks; then the
   * file gets its real size, owner, mode and mtime.
   */
  const writeSparseFile = async (at: string, name: string, chunks: AsyncIterable<Buffer>, regions: Region[], realSize: number, mode: number, mtime: number) => {
    const file = await createExclusive(at, name, mode);
    try {
      let region = 0;
      let done = 0;
      for await (const chunk of chunks) {
        let offset = 0;
        while (offset < chunk.length) {
          while (region < regions.length && regions[region]!.length === done) {
            region++;
            done = 0;
          }
          // The map was checked to add up to the data, so this cannot happen; never write outside it.
          if (region >= regions.length) throw new ArchiveRejected(`sparse file ${JSON.stringify(name)} has more data than its map`);
          const { offset: start, length } = regions[region]!;
          const take = Math.min(length - done, chunk.length - offset);
          let written = 0;
          while (written < take) written += (await file.write(chunk, offset + written, take - written, start + done + written)).bytesWritten;
          offset += take;
          done += take;
        }
      }
      try {
        await file.truncate(realSize);
      } catch (error) {
        if (code(error) === "EFBIG" || code(error) === "EINVAL") {
          throw new ArchiveRejected(`sparse file ${JSON.stringify(name)} has a size of ${realSize} bytes, more than the disk's filesystem holds in one file`);
        }
        throw error;
      }
      if (owner) await file.chown(owner.uid, owner.gid);
      if ((mode & umask) !== 0) await file.chmod(mode);
      await file.utimes(mtime, mtime);
    } finally {
      await file.close();
    }
  };

  /** The same, for a small file already in memory, with synchronous calls (see SYNC_WRITE_BYTES). */
  const writeSmallFile = (at: string, name: string, chunks: Buffer[], mode: number, mtime: number) => {
    let fd: number;
    try {
      fd = openSync(at, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, mode);
    } catch (error) {
      if (code(error) === "EEXIST") throw duplicate(name);
      throw error;
    }
    try {
      for (const chunk of chunks) {
        let offset = 0;
        while (offset < chunk.length) offset += writeSync(fd, chunk, offset);
      }
      if (owner) fchownSync(fd, owner.uid, owner.gid);
      if ((mode & umask) !== 0) fchmodSync(fd, mode);
      futimesSync(fd, mtime, mtime);
    } finally {
      closeSync(fd);
    }
  };

  /**
   * A sparse member: its map (from the headers, or read from the start of
   * its data for pax 1.0) is checked against the data and the file's size,
   * its allocation against the quota, then the file is written sparse.
   */
  const extractSparse = async (
    sparse: SparseMember,
    entry: AsyncIterable<unknown>,
    dataBytes: number,
    at: string,
    mode: number,
    mtime: number,
  ) => {
    const quoted = JSON.stringify(sparse.name);
    const chunks = body(entry);
    let regions = sparse.regions;
    let storedBytes = dataBytes;
    let first: Buffer | null = null;
    if (regions === null) {
      const reader = new MapReader();
      for (;;) {
        const next = await chunks.next();
        if (next.done) throw new ArchiveRejected(`sparse file ${quoted} (${sparse.format}) ends inside its map`);
        const read = reader.feed(next.value);
        if (read === null) continue;
        if ("problem" in read) throw new ArchiveRejected(`sparse file ${quoted} (${sparse.format}): ${read.problem}`);
        regions = read.regions;
        storedBytes = dataBytes - read.mapBytes;
        first = next.value.subarray(read.used);
        break;
      }
    }
    const problem = storedBytes < 0 ? "its map is longer than its data" : mapProblem(regions, sparse.realSize, storedBytes);
    if (problem !== null) throw new ArchiveRejected(`sparse file ${quoted} (${sparse.format}) has a map that does not fit: ${problem}`);
    addRestored(regionsAllocation(regions, blockSize), sparse.name);
    const rest = async function* () {
      if (first !== null && first.length > 0) yield first;
      yield* chunks;
    };
    await writeSparseFile(at, sparse.name, rest(), regions, sparse.realSize, mode, mtime);
  };

  try {
    for (;;) {
      let next: Awaited<ReturnType<typeof members.next>>;
      try {
        next = await members.next();
      } catch (error) {
        throw fed.failure(error);
      }
      if (next.done) break;
      const entry = next.value;
      const { header } = entry;
      const raw = () => fed.bytesAt(entry.offset, BLOCK);
      const sparse = sparseMember(header, raw);
      const name = sparse?.name ?? header.name;
      if (++entries > options.maxEntries) {
        throw new ArchiveRejected(`archive has more than ${options.maxEntries} entries (maxEntries; reached at ${JSON.stringify(name)})`);
      }
      const parts = memberPath(name, "member");
      // tar-stream reads no content for directories, whatever their size field says.
      const dataBytes = header.type === "directory" ? 0 : header.size;
      const dataOffset = entry.offset + BLOCK;
      if (dataOffset + dataBytes > options.maxExpandedBytes) {
        throw new ArchiveRejected(
          `member ${JSON.stringify(name)} (${formatBytes(dataBytes)}) takes the archive past ${formatBytes(options.maxExpandedBytes)} expanded (maxExpandedBytes)`,
        );
      }
      lastEnd = dataOffset + padded(dataBytes);
      const mode = header.mode & 0o777;
      const mtime = mtimeOf(header);
      const linkname = header.linkname ?? "";
      if (parts.length === 0 && header.type !== "directory") throw new ArchiveRejected(`member ${JSON.stringify(name)} names the root but is not a directory`);
      if (sparse) {
        prepareParents(parts, name);
        addInode(name);
        await extractSparse(sparse, entry, dataBytes, where(parts), mode, mtime);
        continue;
      }
      switch (header.type) {
        case "directory":
          if (parts.length === 0) {
            rootMtime = mtime; // its mode stays the builder's: a disk's data directory is 0700
            break;
          }
          prepareParents(parts, name);
          if (!dirs.has(parts.join("/"))) addInode(name);
          extractDirectory(name, parts, where(parts), mode, mtime, dirs, links, duplicate);
          break;
        case "file":
        case "contiguous-file": {
          prepareParents(parts, name);
          addInode(name);
          addRestored(fileAllocation(dataBytes, blockSize), name);
          if (dataBytes > SYNC_WRITE_BYTES) {
            await writeFile(where(parts), name, body(entry), mode, mtime);
            break;
          }
          const chunks: Buffer[] = [];
          for await (const chunk of body(entry)) chunks.push(chunk);
          writeSmallFile(where(parts), name, chunks, mode, mtime);
          break;
        }
        case "symlink": {
          prepareParents(parts, name);
          if (linkname === "") throw new ArchiveRejected(`symlink ${JSON.stringify(name)} has an empty target`);
          if (linkname.includes("\0")) throw new ArchiveRejected(`symlink ${JSON.stringify(name)} has a target with a NUL byte`);
          if (resolveLink(parts.slice(0, -1), linkname, links) === "outside") {
            throw new ArchiveRejected(`symlink ${JSON.stringify(name)} -> ${JSON.stringify(linkname)} points outside the disk`);
          }
          addInode(name);
          addRestored(symlinkAllocation(Buffer.byteLength(linkname), blockSize), name);
          try {
            symlinkSync(linkname, where(parts));
          } catch (error) {
            if (code(error) === "EEXIST") throw duplicate(name);
            throw error;
          }
          links.set(parts.join("/"), linkname);
          lutimesSync(where(parts), mtime, mtime);
          if (owner) lchownSync(where(parts), owner.uid, owner.gid);
          break;
        }
        case "link": {
          prepareParents(parts, name);
          const target = memberPath(linkname, `hardlink ${JSON.stringify(name)} target`);
          const targetKey = target.join("/");
          const throughLink = target.some((_, depth) => links.has(target.slice(0, depth + 1).join("/")));
          const stats = throughLink || target.length === 0 ? null : lstatSync(where(target), { throwIfNoEntry: false });
          if (!stats?.isFile()) {
            throw new ArchiveRejected(`hardlink ${JSON.stringify(name)} -> ${JSON.stringify(targetKey)} does not name an earlier file of the archive`);
          }
          try {
            linkSync(where(target), where(parts));
          } catch (error) {
            if (code(error) === "EEXIST") throw duplicate(name);
            throw error;
          }
          break;
        }
        case "character-device":
        case "block-device":
        case "fifo":
          throw new ArchiveRejected(`member ${JSON.stringify(name)} is a ${REFUSED_TYPES[header.type]}; only files, directories and links are restored`);
        default:
          throw new ArchiveRejected(`member ${JSON.stringify(name)} has a tar type that is not supported${typeflagOf(raw())}`);
      }
      // Content a link should not have is read past, so the parser moves on (it reads none for directories).
      if (header.type !== "directory") for await (const _ of body(entry));
    }
    if (fed.limitError) throw fed.limitError;
    if (fed.expandedBytes - lastEnd < END_MARKER_BYTES || fed.tail.some((byte) => byte !== 0)) {
      throw new TarFormatError("tar stream ends without the end-of-archive marker (truncated archive)");
    }
  } catch (error) {
    // Stops the parser; its feeder then leaves the source unread.
    await members.return?.(undefined);
    throw fed.sourceError ?? error;
  }

  // A link may lead elsewhere once later links exist (`a -> b/..` and then `b -> x/y`): judge each against them all.
  for (const [path, target] of links) {
    const parts = path.split("/");
    if (resolveLink(parts.slice(0, -1), target, links) === "outside") {
      throw new ArchiveRejected(`symlink ${JSON.stringify(path)} -> ${JSON.stringify(target)} points outside the disk through other links`);
    }
  }
  const deepestFirst = [...dirs.entries()].sort((a, b) => b[0].split("/").length - a[0].split("/").length);
  for (const [index, [path, meta]] of deepestFirst.entries()) {
    const at = join(root, path);
    if (owner) chownSync(at, owner.uid, owner.gid);
    chmodSync(at, meta.mode);
    if (meta.mtime !== null) utimesSync(at, meta.mtime, meta.mtime);
    if (index % SYNC_METADATA_BATCH === SYNC_METADATA_BATCH - 1) await new Promise(setImmediate);
  }
  if (owner) chownSync(root, owner.uid, owner.gid);
  if (rootMtime !== null) utimesSync(root, rootMtime, rootMtime);
  return { entries, expandedBytes: fed.expandedBytes, restoredBytes };
}

function extractDirectory(
  name: string,
  parts: string[],
  at: string,
  mode: number,
  mtime: number,
  dirs: Map<string, DirMeta>,
  links: Map<string, string>,
  duplicate: (name: string) => ArchiveRejected,
): void {
  const key = parts.join("/");
  if (links.has(key)) throw duplicate(name);
  if (!dirs.has(key)) {
    try {
      mkdirSync(at, { mode: 0o700 });
    } catch (error) {
      // A file of that name exists; a directory would be in `dirs`.
      if (code(error) === "EEXIST") throw duplicate(name);
      throw error;
    }
  }
  dirs.set(key, { mode, mtime });
}
