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
 * Memory: one chunk in flight, the name lists of the directories on the
 * current path, and the first path of each file with several hard links.
 */
import type { Dirent, Stats } from "node:fs";
import { closeSync, constants, fstatSync, openSync, read, readSync } from "node:fs";
import { type FileHandle, lstat, open, readdir, readlink } from "node:fs/promises";
import { promisify } from "node:util";
import { type Header, type Pack, pack as tarPack } from "tar-stream";

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
function kindOf(stats: Stats | Dirent<Buffer>): string {
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
  const pax: Record<string, string> = {};
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

/** Reads one directory tree into tar; counts what it wrote. */
export class DirectoryPacker {
  readonly #root: string;
  readonly #warn: (message: string) => void;
  /** First archive path of every inode with more than one link, so later links become hardlink members. */
  readonly #linked = new Map<string, string>();
  /** Members written (what `tar tzf` lists). */
  entries = 0;
  /** Bytes of the tar stream so far. */
  bytes = 0;

  /** `warn` hears about members left out (sockets, fifos, devices, names that are not UTF-8) or changed mid-read. */
  constructor(root: string, warn: (message: string) => void) {
    this.#root = root;
    this.#warn = warn;
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
  }

  async #members(pack: Pack): Promise<void> {
    const root = await open(this.#root, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      await addMember(pack, this.#header("./", "directory", await root.stat()));
      await this.#directory(pack, root, "./");
    } finally {
      await root.close();
    }
  }

  #header(name: string, type: Header["type"], stats: Stats, extra: Partial<Header> = {}): TarHeader {
    this.entries++;
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

  async #directory(pack: Pack, dir: FileHandle, prefix: string): Promise<void> {
    const base = `/proc/self/fd/${dir.fd}`;
    // The listing's types spare an lstat per member; opening and fstat then check them.
    const children = await readdir(base, { encoding: "buffer", withFileTypes: true });
    children.sort((a, b) => Buffer.compare(a.name, b.name));
    for (const child of children) {
      const name = utf8Exact(child.name);
      if (name === null) {
        this.#skip(`${prefix}${child.name.toString("utf8")}`, "its name is not valid UTF-8");
        continue;
      }
      const at = `${base}/${name}`;
      const path = `${prefix}${name}`;
      if (child.isDirectory()) {
        const opened = await this.#open(at, path, constants.O_DIRECTORY);
        if (!opened) continue;
        try {
          await addMember(pack, this.#header(`${path}/`, "directory", await opened.stat()));
          await this.#directory(pack, opened, `${path}/`);
        } finally {
          await opened.close();
        }
      } else if (child.isFile()) {
        const fd = this.#openFile(at, path);
        if (fd === null) continue;
        try {
          await this.#file(pack, fd, path);
        } finally {
          closeSync(fd);
        }
      } else if (child.isSymbolicLink()) {
        let stats: Stats;
        let target: string | null;
        try {
          stats = await lstat(at);
          target = utf8Exact(await readlink(at, { encoding: "buffer" }));
        } catch {
          continue; // deleted or replaced since the listing
        }
        if (target === null) this.#skip(path, "its target is not valid UTF-8");
        else await addMember(pack, this.#header(path, "symlink", stats, { linkname: target }));
      } else {
        this.#skip(path, `${kindOf(child)}s are not archived`);
      }
    }
  }

  /** Opens a listed member without following links; null (and a warning unless it is gone) when that fails. */
  async #open(at: string, path: string, flags: number): Promise<FileHandle | null> {
    try {
      return await open(at, constants.O_RDONLY | constants.O_NOFOLLOW | flags);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") this.#skip(path, "it changed while the snapshot ran");
      return null;
    }
  }

  /** Like {@link #open} for a regular file, synchronously (see SYNC_READ_BYTES): its descriptor, or null. */
  #openFile(at: string, path: string): number | null {
    try {
      return openSync(at, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") this.#skip(path, "it changed while the snapshot ran");
      return null;
    }
  }

  async #file(pack: Pack, fd: number, path: string): Promise<void> {
    const stats = fstatSync(fd);
    if (!stats.isFile()) {
      this.#skip(path, "it changed while the snapshot ran");
      return;
    }
    if (stats.nlink > 1) {
      const inode = `${stats.dev}:${stats.ino}`;
      const first = this.#linked.get(inode);
      if (first !== undefined) {
        await addMember(pack, this.#header(path, "link", stats, { linkname: first }));
        return;
      }
      this.#linked.set(inode, path);
    }
    const header = this.#header(path, "file", stats, { size: stats.size });
    if (stats.size <= SYNC_READ_BYTES) await addMember(pack, header, this.#read(fd, path, stats.size));
    else await addMember(pack, header, this.#chunks(fd, path, stats.size));
  }

  async *#chunks(fd: number, path: string, size: number): AsyncGenerator<Buffer> {
    for (let position = 0; position < size; position += CHUNK_BYTES) {
      const length = Math.min(CHUNK_BYTES, size - position);
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
