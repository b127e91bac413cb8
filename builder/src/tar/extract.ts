/**
 * Extracts an untrusted tar stream into a fresh, empty directory, refusing the
 * whole archive at the first member that could reach outside it or exceed a
 * limit. Nothing is written outside `root`:
 *
 * - member paths must be relative and free of `..`;
 * - no member may pass through a symlink the archive created (every symlink is
 *   remembered), and files are created O_EXCL, so nothing is written through a
 *   link, not even a dangling one;
 * - symlink targets are resolved the way the kernel would (through the links
 *   created so far, and again for all of them once the archive is complete,
 *   since a later link can change where an earlier one leads) and must stay
 *   inside; absolute targets never do;
 * - hardlinks must name an earlier regular file of the archive;
 * - devices and fifos are refused;
 * - members, uncompressed bytes and restored bytes are counted against their
 *   limits before anything is written.
 *
 * Memory: chunks stream through; what grows with the archive is one record per
 * directory (mode and mtime, applied at the end, deepest first, so read-only
 * directories can still be filled) and one per symlink, both bounded by the
 * member limit.
 */
import { chmod, chown, lchown, link, lstat, lutimes, mkdir, open, symlink, utimes } from "node:fs/promises";
import { join } from "node:path";
import type { JobUser } from "../sandbox.js";
import { formatBytes } from "../sandbox.js";
import { TarFormatError } from "./format.js";
import { type TarEntry, TarReader } from "./reader.js";

/** A member (or the archive as a whole) that restore refuses; the message names it. */
export class ArchiveRejected extends Error {}

/** Limits and ownership of one extraction. */
export interface ExtractOptions {
  /** The uncompressed tar stream. */
  source: AsyncIterable<Buffer>;
  /** An empty directory only the builder can reach. */
  root: string;
  maxEntries: number;
  /** Most bytes the uncompressed stream may have. */
  maxExpandedBytes: number;
  /** Most bytes of restored data, counted like the disk's usage (file sizes, symlink lengths, hard links once). */
  quotaBytes: number;
  /** Owner of everything extracted (the job user); null keeps the builder's own. */
  owner: JobUser | null;
}

/** What an extraction restored. */
export interface ExtractSummary {
  entries: number;
  /** Bytes of the uncompressed tar stream, trailing padding included. */
  expandedBytes: number;
  restoredBytes: number;
}

/** Following links, more hops than this is a loop (the kernel's MAXSYMLINKS): it fails, it cannot escape. */
const MAX_LINK_HOPS = 40;

interface DirMeta {
  mode: number;
  /** Null for directories the archive implies but does not list. */
  mtime: number | null;
}

/** `a/b/c` → ["a", "b", "c"]; "" (or "./") is the root. Absolute paths and `..` are refused. */
function memberPath(raw: string, what: string): string[] {
  if (raw.startsWith("/")) throw new ArchiveRejected(`${what} ${JSON.stringify(raw)} is an absolute path`);
  const parts = raw.split("/").filter((part) => part !== "" && part !== ".");
  if (parts.includes("..")) throw new ArchiveRejected(`${what} ${JSON.stringify(raw)} contains a ".." component`);
  return parts;
}

/**
 * Where a link's target leads, given the links known so far: the directory
 * stack from the root, or "outside". Links met on the way are followed like
 * the kernel does; a path that does not exist yet counts as a directory.
 */
function resolveLink(from: string[], target: string, links: Map<string, string>, hops = { count: 0 }): string[] | "outside" | "loop" {
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

/**
 * Extracts the archive into `root` and answers what it restored; throws
 * {@link ArchiveRejected} or {@link TarFormatError} for a bad archive, leaving
 * `root` for the caller to delete.
 */
export async function extractTar(options: ExtractOptions): Promise<ExtractSummary> {
  const { root, owner } = options;
  let expandedBytes = 0;
  async function* counted(): AsyncGenerator<Buffer> {
    for await (const chunk of options.source) {
      expandedBytes += chunk.length;
      if (expandedBytes > options.maxExpandedBytes) {
        throw new ArchiveRejected(`archive expands to more than ${formatBytes(options.maxExpandedBytes)} (maxExpandedBytes)`);
      }
      yield chunk;
    }
  }
  const reader = new TarReader(counted());
  const dirs = new Map<string, DirMeta>();
  const links = new Map<string, string>();
  let rootMtime: number | null = null;
  let entries = 0;
  let restoredBytes = 0;

  const where = (parts: string[]) => join(root, ...parts);
  const addRestored = (bytes: number, name: string) => {
    restoredBytes += bytes;
    if (restoredBytes > options.quotaBytes) {
      throw new ArchiveRejected(
        `archive holds more than the disk's quota of ${formatBytes(options.quotaBytes)} (reached at ${JSON.stringify(name)})`,
      );
    }
  };
  /** Refuses a member below a symlink, and creates the directories above it that the archive did not list. */
  const prepareParents = async (parts: string[], name: string) => {
    for (let depth = 1; depth < parts.length; depth++) {
      const prefix = parts.slice(0, depth).join("/");
      if (links.has(prefix)) {
        throw new ArchiveRejected(`member ${JSON.stringify(name)} would be written through the symlink ${JSON.stringify(prefix)}`);
      }
      if (dirs.has(prefix)) continue;
      try {
        await mkdir(where(parts.slice(0, depth)), { mode: 0o700 });
      } catch (error) {
        if (code(error) !== "EEXIST") throw error;
        throw new ArchiveRejected(`member ${JSON.stringify(name)} needs ${JSON.stringify(prefix)} to be a directory`);
      }
      dirs.set(prefix, { mode: 0o755, mtime: null });
    }
  };
  const duplicate = (name: string) => new ArchiveRejected(`member ${JSON.stringify(name)} appears twice in the archive`);

  for (let entry = await reader.next(); entry !== null; entry = await reader.next()) {
    const name = entry.path;
    if (++entries > options.maxEntries) {
      throw new ArchiveRejected(`archive has more than ${options.maxEntries} entries (maxEntries; reached at ${JSON.stringify(name)})`);
    }
    const parts = memberPath(name, "member");
    if (entry.dataOffset + entry.size > options.maxExpandedBytes) {
      throw new ArchiveRejected(
        `member ${JSON.stringify(name)} (${formatBytes(entry.size)}) takes the archive past ${formatBytes(options.maxExpandedBytes)} expanded (maxExpandedBytes)`,
      );
    }
    if (parts.length === 0 && entry.type !== "directory") throw new ArchiveRejected(`member ${JSON.stringify(name)} names the root but is not a directory`);
    switch (entry.type) {
      case "directory":
        if (parts.length === 0) {
          rootMtime = entry.mtime; // its mode stays the builder's: a disk's data directory is 0700
          break;
        }
        await prepareParents(parts, name);
        await extractDirectory(entry, parts, where(parts), dirs, links, duplicate);
        break;
      case "file":
        await prepareParents(parts, name);
        addRestored(entry.size, name);
        await extractFile(entry, where(parts), reader, owner, duplicate);
        break;
      case "symlink": {
        await prepareParents(parts, name);
        if (entry.linkpath === "") throw new ArchiveRejected(`symlink ${JSON.stringify(name)} has an empty target`);
        if (resolveLink(parts.slice(0, -1), entry.linkpath, links) === "outside") {
          throw new ArchiveRejected(`symlink ${JSON.stringify(name)} -> ${JSON.stringify(entry.linkpath)} points outside the disk`);
        }
        addRestored(Buffer.byteLength(entry.linkpath), name);
        try {
          await symlink(entry.linkpath, where(parts));
        } catch (error) {
          if (code(error) === "EEXIST") throw duplicate(name);
          throw error;
        }
        links.set(parts.join("/"), entry.linkpath);
        await lutimes(where(parts), entry.mtime, entry.mtime);
        if (owner) await lchown(where(parts), owner.uid, owner.gid);
        break;
      }
      case "hardlink": {
        await prepareParents(parts, name);
        const target = memberPath(entry.linkpath, `hardlink ${JSON.stringify(name)} target`);
        const targetKey = target.join("/");
        const throughLink = target.some((_, depth) => links.has(target.slice(0, depth + 1).join("/")));
        const stats = throughLink || target.length === 0 ? null : await lstat(where(target)).catch(() => null);
        if (!stats?.isFile()) {
          throw new ArchiveRejected(`hardlink ${JSON.stringify(name)} -> ${JSON.stringify(targetKey)} does not name an earlier file of the archive`);
        }
        try {
          await link(where(target), where(parts));
        } catch (error) {
          if (code(error) === "EEXIST") throw duplicate(name);
          throw error;
        }
        break;
      }
      case "char-device":
      case "block-device":
      case "fifo":
        throw new ArchiveRejected(`member ${JSON.stringify(name)} is a ${entry.type.replace("-", " ")}; only files, directories and links are restored`);
      case "unsupported":
        throw new ArchiveRejected(`member ${JSON.stringify(name)} has the unsupported tar type ${JSON.stringify(entry.typeflag)}`);
    }
  }
  await reader.drain();

  // A link may lead elsewhere once later links exist (`a -> b/..` and then `b -> x/y`): judge each against them all.
  for (const [path, target] of links) {
    const parts = path.split("/");
    if (resolveLink(parts.slice(0, -1), target, links) === "outside") {
      throw new ArchiveRejected(`symlink ${JSON.stringify(path)} -> ${JSON.stringify(target)} points outside the disk through other links`);
    }
  }
  const deepestFirst = [...dirs.entries()].sort((a, b) => b[0].split("/").length - a[0].split("/").length);
  for (const [path, meta] of deepestFirst) {
    const at = join(root, path);
    if (owner) await chown(at, owner.uid, owner.gid);
    await chmod(at, meta.mode);
    if (meta.mtime !== null) await utimes(at, meta.mtime, meta.mtime);
  }
  if (owner) await chown(root, owner.uid, owner.gid);
  if (rootMtime !== null) await utimes(root, rootMtime, rootMtime);
  return { entries, expandedBytes, restoredBytes };
}

async function extractDirectory(
  entry: TarEntry,
  parts: string[],
  at: string,
  dirs: Map<string, DirMeta>,
  links: Map<string, string>,
  duplicate: (name: string) => ArchiveRejected,
): Promise<void> {
  const key = parts.join("/");
  if (links.has(key)) throw duplicate(entry.path);
  if (!dirs.has(key)) {
    try {
      await mkdir(at, { mode: 0o700 });
    } catch (error) {
      // A file of that name exists; a directory would be in `dirs`.
      if (code(error) === "EEXIST") throw duplicate(entry.path);
      throw error;
    }
  }
  dirs.set(key, { mode: entry.mode & 0o777, mtime: entry.mtime });
}

async function extractFile(
  entry: TarEntry,
  at: string,
  reader: TarReader,
  owner: JobUser | null,
  duplicate: (name: string) => ArchiveRejected,
): Promise<void> {
  let file: Awaited<ReturnType<typeof open>>;
  try {
    file = await open(at, "wx", 0o600);
  } catch (error) {
    if (code(error) === "EEXIST") throw duplicate(entry.path);
    throw error;
  }
  try {
    for await (const chunk of reader.body()) {
      let offset = 0;
      while (offset < chunk.length) offset += (await file.write(chunk, offset)).bytesWritten;
    }
    if (owner) await file.chown(owner.uid, owner.gid);
    await file.chmod(entry.mode & 0o777);
    await file.utimes(entry.mtime, entry.mtime);
  } finally {
    await file.close();
  }
}
