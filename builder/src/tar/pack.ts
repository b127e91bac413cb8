/**
 * Packs a directory into an uncompressed tar stream, one bounded chunk at a
 * time (never a whole file in memory), depth first with names in byte order.
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
import { constants } from "node:fs";
import { type FileHandle, lstat, open, readdir, readlink } from "node:fs/promises";
import { END_OF_ARCHIVE, type HeaderInput, encodeHeader, paddingAfter } from "./format.js";

/** Bytes read from a file at once, and the size below which output is gathered before it is passed on. */
const CHUNK_BYTES = 512 * 1024;

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

  /** The archive: members as `./path`, then the end-of-archive marker. */
  async *stream(): AsyncGenerator<Buffer> {
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    // Small members are gathered so the compressor gets few large writes instead of many tiny ones.
    for await (const piece of this.#members()) {
      this.bytes += piece.length;
      if (pendingBytes === 0 && piece.length >= CHUNK_BYTES) {
        yield piece;
        continue;
      }
      pending.push(piece);
      pendingBytes += piece.length;
      if (pendingBytes >= CHUNK_BYTES) {
        yield Buffer.concat(pending, pendingBytes);
        pending = [];
        pendingBytes = 0;
      }
    }
    pending.push(END_OF_ARCHIVE);
    this.bytes += END_OF_ARCHIVE.length;
    yield Buffer.concat(pending);
  }

  async *#members(): AsyncGenerator<Buffer> {
    const root = await open(this.#root, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      yield this.#header("./", "directory", await root.stat());
      yield* this.#directory(root, "./");
    } finally {
      await root.close();
    }
  }

  #header(path: string, type: HeaderInput["type"], stats: Stats, extra: Partial<HeaderInput> = {}): Buffer {
    this.entries++;
    return encodeHeader({
      path,
      type,
      mode: stats.mode,
      mtime: Math.floor(stats.mtimeMs / 1000),
      size: 0,
      linkpath: "",
      uid: stats.uid,
      gid: stats.gid,
      ...extra,
    });
  }

  async *#directory(dir: FileHandle, prefix: string): AsyncGenerator<Buffer> {
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
          yield this.#header(`${path}/`, "directory", await opened.stat());
          yield* this.#directory(opened, `${path}/`);
        } finally {
          await opened.close();
        }
      } else if (child.isFile()) {
        const opened = await this.#open(at, path, constants.O_NONBLOCK);
        if (!opened) continue;
        try {
          yield* this.#file(opened, path);
        } finally {
          await opened.close();
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
        else yield this.#header(path, "symlink", stats, { linkpath: target });
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

  async *#file(file: FileHandle, path: string): AsyncGenerator<Buffer> {
    const stats = await file.stat();
    if (!stats.isFile()) {
      this.#skip(path, "it changed while the snapshot ran");
      return;
    }
    if (stats.nlink > 1) {
      const inode = `${stats.dev}:${stats.ino}`;
      const first = this.#linked.get(inode);
      if (first !== undefined) {
        yield this.#header(path, "hardlink", stats, { linkpath: first });
        return;
      }
      this.#linked.set(inode, path);
    }
    yield this.#header(path, "file", stats, { size: stats.size });
    let position = 0;
    while (position < stats.size) {
      const buffer = Buffer.allocUnsafe(Math.min(CHUNK_BYTES, stats.size - position));
      const { bytesRead } = await file.read(buffer, 0, buffer.length, position);
      if (bytesRead === 0) {
        // The header already promised stats.size bytes: keep the archive well-formed.
        this.#warn(`${path} shrank while the snapshot ran; zero-filled from byte ${position}`);
        buffer.fill(0);
        for (let left = stats.size - position; left > 0; left -= buffer.length) yield buffer.subarray(0, Math.min(left, buffer.length));
        break;
      }
      position += bytesRead;
      yield buffer.subarray(0, bytesRead);
    }
    const padding = paddingAfter(stats.size);
    if (padding > 0) yield Buffer.alloc(padding);
  }
}
