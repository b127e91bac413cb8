/**
 * Packs a directory into an uncompressed tar stream, depth first with names in
 * byte order, one bounded chunk at a time (never a whole file in memory). The
 * tar format itself is tar-stream's: POSIX ustar headers, with a pax extended
 * header for what ustar cannot hold (names or link targets over 100 bytes or
 * not ASCII, sizes over 8 GiB as base-256); {@link addMember} adds what
 * tar-stream leaves to its caller, pax records for mtimes and owner ids its
 * ustar fields would get wrong.
 *
 * The builder runs as root while jobs writing the same disk may still run, so
 * the walk never follows a symlink: every directory is opened with O_NOFOLLOW
 * and its children are reached through `/proc/self/fd/<dir fd>/<name>`, which
 * resolves relative to the opened directory like openat(2) would. Swapping a
 * directory for a link to `/` mid-walk therefore cannot pull files from outside
 * the disk into an archive its owner can download. Files are opened O_NOFOLLOW
 * and O_NONBLOCK (a fifo swapped in cannot hang the walk) and checked with
 * fstat to still be the regular file that was listed.
 *
 * Sparse files (fewer blocks allocated than their size) become GNU sparse
 * members in the pax 1.0 format (sparse.ts), holding only their data.
 *
 * Memory does not grow with what a tenant stores: one chunk in flight, the
 * names of at most {@link SORTED_ENTRIES} members per directory on the
 * current path (a larger directory is archived in the order the filesystem
 * lists it, a few names at a time), the map of one sparse file, and the first
 * path of each hard-linked file until all its links are archived (at most
 * {@link LINKED_PATHS_BYTES}).
 *
 * Limits: what a restore would refuse, a snapshot refuses first (protocol/disks.ts,
 * "one set of limits"), so the backup fails with the reason instead of being
 * `ready` and unrestorable: more than `maxEntries` members, a path longer than
 * `maxPathBytes`, more than `maxOverheadBytes` of headers and maps, more data
 * than the quota (counted in allocated blocks, as restore counts it), a
 * sparse file with too many regions.
 */
import type { Dirent, Stats } from "node:fs";
import { closeSync, constants, fstatSync, lstatSync, opendirSync, openSync, read, readlinkSync, readSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { promisify } from "node:util";
import { type Header, type Pack, pack as tarPack } from "tar-stream";
import { BACKUP_MAX_ENTRIES, BACKUP_MAX_OVERHEAD_BYTES, BACKUP_MAX_PATH_BYTES, BACKUP_MAX_SPARSE_REGIONS } from "../protocol/disks.js";
import { formatBytes, formatCount } from "../units.js";
import { type Region, dataRegions, encodeMap, fileAllocation, regionsAllocation, regionsBytes, symlinkAllocation } from "./sparse.js";

/** Bytes read from a file at once. */
const CHUNK_BYTES = 512 * 1024;
/**
 * Files up to this size are opened, checked and read with synchronous calls:
 * from the page cache that is a few µs, where each of the four threadpool round
 * trips (open, fstat, read, close) costs several times more, and the event
 * loop waits at most as long as one small read. Larger files are read
 * asynchronously.
 */
const SYNC_READ_BYTES = 256 * 1024;
/**
 * A directory with at most this many entries is archived with its names in
 * byte order (reproducible archives); a larger one in the order the
 * filesystem lists it, so memory never holds more names than this.
 */
const SORTED_ENTRIES = 50_000;
/** Directory entries read at once. */
const LIST_BUFFER_ENTRIES = 256;
/** Most bytes of paths kept to write later links of hard-linked files as hardlink members. */
const LINKED_PATHS_BYTES = 64 * 1024 * 1024;
/** Bytes tar-stream may hold before a write waits for the consumer. */
const PACK_BUFFER_BYTES = 256 * 1024;
/** tar-stream writes mtime as a signed 32-bit number of seconds and ids in 6 octal digits; beyond that they go to pax. */
const MAX_USTAR_MTIME = 2 ** 31 - 1;
const MAX_USTAR_ID = 0o777777;

const NO_CONTENT = Buffer.alloc(0);
const readAsync = promisify(read);

/** A member's header as tar-stream's `entry` takes it. */
export type TarHeader = Partial<Header> & Pick<Header, "name">;

const utf8Exact = (raw: Buffer): string | null => {
  const text = raw.toString("utf8");
  return Buffer.from(text, "utf8").equals(raw) ? text : null;
};

/** Why a member was left out, as the job log says it. */
function kindOf(stats: Stats | Dirent<string>): string {
  if (stats.isSocket()) return "socket";
  if (stats.isFIFO()) return "fifo";
  if (stats.isCharacterDevice()) return "character device";
  if (stats.isBlockDevice()) return "block device";
  return "special file";
}

/** Resolves once a streamx stream (tar-stream's) can take more data, or is being destroyed. */
export function whenWritable(stream: {
  destroying: boolean;
  on(event: "drain" | "close", listener: () => void): unknown;
  off(event: "drain" | "close", listener: () => void): unknown;
}): Promise<void> {
  if (stream.destroying) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      stream.off("drain", done);
      stream.off("close", done);
      resolve();
    };
    stream.on("drain", done);
    stream.on("close", done);
  });
}

/**
 * The bytes of a tar archive whose members `produce` adds (with
 * {@link addMember}), ending with the end-of-archive marker. A failure of
 * `produce` ends the stream with that error; stopping early stops `produce`.
 */
export async function* tarArchive(produce: (pack: Pack) => Promise<void>): AsyncGenerator<Buffer> {
  const pack = tarPack({ highWaterMark: PACK_BUFFER_BYTES });
  const producing = produce(pack).then(
    () => pack.finalize(),
    (error: unknown) => pack.destroy(error instanceof Error ? error : new Error(String(error))),
  );
  try {
    yield* pack as AsyncIterable<Buffer>;
  } finally {
    if (!pack.destroyed) pack.destroy();
    await producing;
  }
}

/**
 * A member's stream emits "error" when the archive is torn down under it (the
 * consumer stopped, a read failed); the failure already reaches the caller
 * through the member's callback, and an "error" nobody listens to would crash
 * the process.
 */
function quiet<T extends { on(event: "error", listener: () => void): unknown }>(entry: T): T {
  entry.on("error", () => undefined);
  return entry;
}

/**
 * The header with what tar-stream's ustar fields would get wrong moved to pax
 * records: it writes mtime as a signed 32-bit number of seconds and owner ids
 * in 6 octal digits.
 */
function fitted(header: TarHeader): TarHeader {
  const seconds = Math.floor((header.mtime?.getTime() ?? 0) / 1000);
  const uid = header.uid ?? 0;
  const gid = header.gid ?? 0;
  const pax: Record<string, string> = { ...(header.pax as Record<string, string> | undefined) };
  if (seconds < 0 || seconds > MAX_USTAR_MTIME) pax.mtime = String(seconds);
  if (uid > MAX_USTAR_ID) pax.uid = String(uid);
  if (gid > MAX_USTAR_ID) pax.gid = String(gid);
  if (Object.keys(pax).length === 0) return header;
  return {
    ...header,
    mtime: new Date(Math.min(Math.max(seconds, 0), MAX_USTAR_MTIME) * 1000),
    uid: uid > MAX_USTAR_ID ? 0 : uid,
    gid: gid > MAX_USTAR_ID ? 0 : gid,
    pax,
  };
}

/**
 * Adds one member and waits until tar-stream has taken all of it, so memory
 * holds one chunk at a time. A file's content is exactly `header.size` bytes:
 * one Buffer, or chunks streamed as the reader waits for the consumer.
 */
export async function addMember(pack: Pack, input: TarHeader, content?: Buffer | AsyncIterable<Buffer>): Promise<void> {
  const header = fitted(input);
  let settle: (error?: Error | null) => void = () => undefined;
  const added = new Promise<void>((resolve, reject) => {
    settle = (error) => (error ? reject(error) : resolve());
  });
  if (content === undefined || Buffer.isBuffer(content)) {
    // A member without content still gets an (empty) body, or tar-stream would wait for one.
    quiet(pack.entry(header, content ?? NO_CONTENT, settle));
    return added;
  }
  // Awaited below; a reader that fails first must not leave it to reject unhandled.
  added.catch(() => undefined);
  const entry = quiet(pack.entry(header, settle));
  for await (const chunk of content) {
    if (!entry.write(chunk)) await whenWritable(entry);
    if (entry.destroying) break;
  }
  entry.end(undefined);
  await added;
}

/** A snapshot that would make a backup a restore refuses: the message says which limit and where. */
export class SnapshotLimitExceeded extends Error {}

/** Limits of one packing (defaults: the backup limits of protocol/disks.ts, no quota). */
export interface PackLimits {
  maxEntries: number;
  maxPathBytes: number;
  maxOverheadBytes: number;
  /** Most bytes the files may allocate (counted as restore counts them). */
  quotaBytes: number;
}

const DEFAULT_LIMITS: PackLimits = {
  maxEntries: BACKUP_MAX_ENTRIES,
  maxPathBytes: BACKUP_MAX_PATH_BYTES,
  maxOverheadBytes: BACKUP_MAX_OVERHEAD_BYTES,
  quotaBytes: Number.POSITIVE_INFINITY,
};

/** A listed member: its name as latin1 (one char per byte: lossless, byte-ordered) and its type. */
type Listed = Dirent<string>;

const byName = (a: Listed, b: Listed) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
/** Whether a latin1 name has bytes past ASCII (then it must be checked to be UTF-8). */
function notAscii(name: string): boolean {
  for (let i = 0; i < name.length; i++) if (name.charCodeAt(i) > 0x7f) return true;
  return false;
}

/** Reads one directory tree into tar; counts what it wrote. */
export class DirectoryPacker {
  readonly #root: string;
  readonly #warn: (message: string) => void;
  readonly #limits: PackLimits;
  /** First archive path of every inode with more than one link, and how many of its links remain to be archived. */
  readonly #linked = new Map<string, { path: string; remaining: number }>();
  #linkedBytes = 0;
  /** Block size of the filesystem packed: allocation is counted in its blocks. */
  #blockSize = 4096;
  /** Members written (what `tar tzf` lists). */
  entries = 0;
  /** Bytes of the tar stream so far. */
  bytes = 0;
  /** File data in the stream (sparse files: their regions); the rest is headers, maps and padding. */
  dataBytes = 0;
  /** What the files allocate, as restore counts it (whole blocks of data; fast symlinks none). */
  allocatedBytes = 0;

  /** `warn` hears about members left out (sockets, fifos, devices, names that are not UTF-8) or changed mid-read. */
  constructor(root: string, warn: (message: string) => void, limits: Partial<PackLimits> = {}) {
    this.#root = root;
    this.#warn = warn;
    this.#limits = { ...DEFAULT_LIMITS, ...limits };
  }

  #skip(path: string, why: string): void {
    this.#warn(`skipped ${path}: ${why}`);
  }

  /** The archive: members as `./path`, then the end-of-archive marker. Stopping early stops the walk. */
  async *stream(): AsyncGenerator<Buffer> {
    for await (const chunk of tarArchive((pack) => this.#members(pack))) {
      this.bytes += chunk.length;
      yield chunk;
    }
    this.#checkOverhead("the end");
  }

  async #members(pack: Pack): Promise<void> {
    const root = openSync(this.#root, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      this.#blockSize = (await statfs(`/proc/self/fd/${root}`)).bsize;
      await addMember(pack, this.#header("./", "directory", fstatSync(root)));
      await this.#directory(pack, root, "./");
    } finally {
      closeSync(root);
    }
  }

  #header(name: string, type: Header["type"], stats: Stats, extra: Partial<Header> = {}): TarHeader {
    if (++this.entries > this.#limits.maxEntries) {
      throw new SnapshotLimitExceeded(
        `the disk holds more than ${formatCount(this.#limits.maxEntries)} entries (files, directories, symlinks and hard links; ` +
          `reached at ${JSON.stringify(name)}): a backup holds at most that many`,
      );
    }
    const pathBytes = Buffer.byteLength(name) - 2 - (name.endsWith("/") && name !== "./" ? 1 : 0);
    if (pathBytes > this.#limits.maxPathBytes) {
      throw new SnapshotLimitExceeded(
        `${JSON.stringify(`${name.slice(0, 60)}…`)} is a path of ${formatCount(pathBytes)} bytes: a backup holds paths of at most ${formatCount(this.#limits.maxPathBytes)} bytes`,
      );
    }
    this.#checkOverhead(JSON.stringify(name));
    return {
      name,
      type,
      // Permission bits only: setuid, setgid and sticky are not archived.
      mode: stats.mode & 0o777,
      mtime: new Date(Math.floor(stats.mtimeMs / 1000) * 1000),
      uid: stats.uid,
      gid: stats.gid,
      size: 0,
      ...extra,
    };
  }

  /** Counts a member's data and what it allocates, refusing data past the quota. */
  #addData(name: string, dataBytes: number, allocated: number): void {
    this.dataBytes += dataBytes;
    this.allocatedBytes += allocated;
    if (this.allocatedBytes > this.#limits.quotaBytes) {
      throw new SnapshotLimitExceeded(
        `the disk holds more than its quota of ${formatBytes(this.#limits.quotaBytes)} (reached at ${JSON.stringify(name)}): ` +
          "a restore of this backup would not fit the disk",
      );
    }
  }

  #checkOverhead(where: string): void {
    const overhead = this.bytes - this.dataBytes;
    if (overhead > this.#limits.maxOverheadBytes) {
      throw new SnapshotLimitExceeded(
        `the archive's headers, names and sparse maps take more than ${formatBytes(this.#limits.maxOverheadBytes)} (reached at ${where}): ` +
          "a backup holds at most that much besides file data",
      );
    }
  }

  /** A directory's members, listed and opened with synchronous calls (as small files are read: SYNC_READ_BYTES). */
  async #directory(pack: Pack, dir: number, prefix: string): Promise<void> {
    const base = `/proc/self/fd/${dir}`;
    // Names read as latin1 are the raw bytes, one char each: nothing is lost, and they sort in byte order.
    const listing = opendirSync(base, { encoding: "latin1", bufferSize: LIST_BUFFER_ENTRIES });
    try {
      const first: Listed[] = [];
      // One name more than are sorted tells a huge directory.
      let next = listing.readSync();
      while (next !== null && first.length < SORTED_ENTRIES) {
        first.push(next);
        next = listing.readSync();
      }
      if (next === null) first.sort(byName);
      for (const child of first) await this.#child(pack, base, prefix, child);
      // A huge directory: the rest as it comes, a few names at a time.
      for (; next !== null; next = listing.readSync()) await this.#child(pack, base, prefix, next);
    } finally {
      try {
        listing.closeSync();
      } catch {
        // already closed
      }
    }
  }

  async #child(pack: Pack, base: string, prefix: string, child: Listed): Promise<void> {
    const raw = child.name;
    const name = notAscii(raw) ? utf8Exact(Buffer.from(raw, "latin1")) : raw;
    if (name === null) {
      this.#skip(`${prefix}${Buffer.from(raw, "latin1").toString("utf8")}`, "its name is not valid UTF-8");
      return;
    }
    const at = `${base}/${name}`;
    const path = `${prefix}${name}`;
    if (child.isDirectory()) {
      const opened = this.#open(at, path, constants.O_DIRECTORY);
      if (opened === null) return;
      try {
        await addMember(pack, this.#header(`${path}/`, "directory", fstatSync(opened)));
        await this.#directory(pack, opened, `${path}/`);
      } finally {
        closeSync(opened);
      }
    } else if (child.isFile()) {
      await this.#file(pack, at, path);
    } else if (child.isSymbolicLink()) {
      let stats: Stats;
      let target: string | null;
      try {
        stats = lstatSync(at);
        target = utf8Exact(readlinkSync(at, { encoding: "buffer" }));
      } catch {
        return; // deleted or replaced since the listing
      }
      if (target === null) {
        this.#skip(path, "its target is not valid UTF-8");
        return;
      }
      const header = this.#header(path, "symlink", stats, { linkname: target });
      this.#addData(path, 0, symlinkAllocation(Buffer.byteLength(target), this.#blockSize));
      await addMember(pack, header);
    } else {
      this.#skip(path, `${kindOf(child)}s are not archived`);
    }
  }

  /** Opens a listed member without following links: its descriptor, or null (and a warning unless it is gone) when that fails. */
  #open(at: string, path: string, flags: number): number | null {
    try {
      return openSync(at, constants.O_RDONLY | constants.O_NOFOLLOW | flags);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") this.#skip(path, "it changed while the snapshot ran");
      return null;
    }
  }

  /**
   * A regular file. An empty one is archived from lstat alone (many tiny
   * files are common and opening costs most); others are opened without
   * following links and checked with fstat, which the header then describes.
   */
  async #file(pack: Pack, at: string, path: string): Promise<void> {
    let listed: Stats;
    try {
      listed = lstatSync(at);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") this.#skip(path, "it changed while the snapshot ran");
      return;
    }
    if (!listed.isFile()) {
      this.#skip(path, "it changed while the snapshot ran");
      return;
    }
    if (listed.size === 0) {
      await this.#regular(pack, null, path, listed);
      return;
    }
    const fd = this.#open(at, path, constants.O_NONBLOCK);
    if (fd === null) return;
    try {
      const stats = fstatSync(fd);
      if (!stats.isFile()) {
        this.#skip(path, "it changed while the snapshot ran");
        return;
      }
      await this.#regular(pack, fd, path, stats);
    } finally {
      closeSync(fd);
    }
  }

  async #regular(pack: Pack, fd: number | null, path: string, stats: Stats): Promise<void> {
    if (stats.nlink > 1) {
      const inode = `${stats.dev}:${stats.ino}`;
      const first = this.#linked.get(inode);
      if (first !== undefined) {
        if (--first.remaining <= 0) {
          this.#linked.delete(inode);
          this.#linkedBytes -= first.path.length;
        }
        await addMember(pack, this.#header(path, "link", stats, { linkname: first.path }));
        return;
      }
      this.#linkedBytes += path.length;
      if (this.#linkedBytes > LINKED_PATHS_BYTES) {
        throw new SnapshotLimitExceeded(
          `the disk's hard-linked files have more than ${formatBytes(LINKED_PATHS_BYTES)} of paths to remember (reached at ${JSON.stringify(path)})`,
        );
      }
      this.#linked.set(inode, { path, remaining: stats.nlink - 1 });
    }
    if (fd !== null && stats.blocks * 512 < stats.size) {
      const regions = await dataRegions(fd, stats.size, this.#blockSize);
      if (regions === null) {
        throw new SnapshotLimitExceeded(
          `${JSON.stringify(path)} has more than ${formatCount(BACKUP_MAX_SPARSE_REGIONS)} separate data regions: a backup holds sparse files of at most that many`,
        );
      }
      if (regionsBytes(regions) < stats.size) {
        await this.#sparse(pack, fd, path, stats, regions);
        return;
      }
    }
    const header = this.#header(path, "file", stats, { size: stats.size });
    this.#addData(path, stats.size, fileAllocation(stats.size, this.#blockSize));
    if (fd === null) await addMember(pack, header);
    else if (stats.size <= SYNC_READ_BYTES) await addMember(pack, header, this.#read(fd, path, stats.size));
    else await addMember(pack, header, this.#chunks(fd, path, [{ offset: 0, length: stats.size }]));
  }

  /** A sparse file as a pax 1.0 sparse member: the map, then only its data regions. */
  async #sparse(pack: Pack, fd: number, path: string, stats: Stats, found: Region[]): Promise<void> {
    const regions = [...found];
    // As GNU tar writes it: a last empty region at the end gives the file its size.
    const last = regions[regions.length - 1];
    if (!last || last.offset + last.length < stats.size) regions.push({ offset: stats.size, length: 0 });
    const map = encodeMap(regions);
    const data = regionsBytes(regions);
    const slash = path.lastIndexOf("/");
    const header = this.#header(`${path.slice(0, slash)}/GNUSparseFile.0/${path.slice(slash + 1)}`, "file", stats, {
      size: map.length + data,
      pax: {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": path,
        "GNU.sparse.realsize": String(stats.size),
      },
    });
    this.#addData(path, data, regionsAllocation(regions, this.#blockSize));
    const chunks = this.#chunks(fd, path, regions);
    await addMember(pack, header, (async function* () {
      yield map;
      yield* chunks;
    })());
  }

  /** The bytes of `regions` of the file, a bounded chunk at a time. */
  async *#chunks(fd: number, path: string, regions: readonly Region[]): AsyncGenerator<Buffer> {
    for (const { offset, length: regionLength } of regions) {
      const end = offset + regionLength;
      for (let position = offset; position < end; position += CHUNK_BYTES) {
        const length = Math.min(CHUNK_BYTES, end - position);
        const buffer = Buffer.allocUnsafe(length);
        let filled = 0;
        while (filled < length) {
          const { bytesRead } = await readAsync(fd, buffer, filled, length - filled, position + filled);
          if (bytesRead === 0) {
            this.#shrank(path, position + filled, buffer, filled);
            break;
          }
          filled += bytesRead;
        }
        yield buffer;
      }
    }
  }

  /** A small file's `length` bytes, read synchronously. */
  #read(fd: number, path: string, length: number): Buffer {
    const buffer = Buffer.allocUnsafe(length);
    let filled = 0;
    while (filled < length) {
      const bytesRead = readSync(fd, buffer, filled, length - filled, filled);
      if (bytesRead === 0) {
        this.#shrank(path, filled, buffer, filled);
        break;
      }
      filled += bytesRead;
    }
    return buffer;
  }

  /** The header already promised the bytes, so a file that shrank meanwhile is zero-filled (and said so) to keep the archive well-formed. */
  #shrank(path: string, at: number, buffer: Buffer, filled: number): void {
    this.#warn(`${path} shrank while the snapshot ran; zero-filled from byte ${at}`);
    buffer.fill(0, filled);
  }
}
