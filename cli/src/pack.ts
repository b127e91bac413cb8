/**
 * Packs a deploy's source folder into a `.tar.gz` in a temporary file: what
 * git would commit (`.gitignore` files at every level, see ignore.ts), never
 * `node_modules` or `.git`. The archive is streamed file by file (nothing is
 * held in memory whole) and refused as soon as the compressed bytes pass the
 * upload limit, so an oversized source costs neither an upload nor a full pack.
 *
 * Members are plain relative paths (`static/index.html`, folders with a trailing
 * `/`), sorted, owned by uid/gid 0; symlinks are archived as links, not
 * followed. The tar format is tar-stream's, through the builder's packer helpers.
 */
import type { Stats } from "node:fs";
import { createWriteStream } from "node:fs";
import { lstat, mkdtemp, open, readdir, readFile, readlink, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGzip } from "node:zlib";
import { addMember, tarArchive } from "../../builder/src/tar/pack.js";
import { alwaysExcluded, isIgnored, parseIgnoreFile, type RuleSet } from "../../builder/src/static/ignore.js";
import { CliError } from "./output.js";
import { formatBytes } from "./progress.js";

/** The platform's build upload limit (spec: 100 MB tarball), in bytes as the API counts them. */
export const MAX_UPLOAD_BYTES = 100_000_000;

/** One member of the archive. */
export type SourceEntry = {
  /** Relative to the source root, `/`-separated, without a trailing slash. */
  path: string;
  type: "file" | "directory" | "symlink";
  /** Content bytes (files only). */
  size: number;
  mode: number;
  mtime: number;
  linkpath: string;
  /** Where it is on disk. */
  absolute: string;
};

/**
 * What {@link listSource} found: the members in archive order, the paths
 * `.gitignore` files left out, and those never packed (ALWAYS_EXCLUDED).
 */
export type SourceListing = { entries: SourceEntry[]; ignored: string[]; excluded: string[] };

/** A packed source in a temporary file; `remove()` deletes it. */
export type PackedSource = {
  file: string;
  /** The `.tar.gz` size: what is uploaded and counted against the limit. */
  sizeBytes: number;
  fileCount: number;
  /** Content bytes before compression. */
  totalBytes: number;
  /** The regular files packed, with their sizes. */
  files: { path: string; size: number }[];
  /** What `.gitignore` files left out. */
  ignored: string[];
  /** What is never packed (node_modules, .git, .venv, __pycache__, …). */
  excluded: string[];
  remove(): Promise<void>;
};

/** Bytes read from a file at once. */
const CHUNK_BYTES = 512 * 1024;

async function readRules(dir: string, base: string): Promise<RuleSet | null> {
  const file = join(dir, ".gitignore");
  const stats = await lstat(file).catch(() => null);
  if (!stats?.isFile()) return null;
  return { base, rules: parseIgnoreFile(await readFile(file, "utf8")) };
}

/**
 * Walks the source folder top-down, reading each folder's `.gitignore` before
 * its children are judged, and never entering an ignored folder.
 */
export async function listSource(root: string): Promise<SourceListing> {
  const entries: SourceEntry[] = [];
  const ignored: string[] = [];
  const excluded: string[] = [];
  const walk = async (dir: string, prefix: string, sets: RuleSet[]): Promise<void> => {
    const own = await readRules(dir, prefix);
    const rules = own ? [...sets, own] : sets;
    const names = (await readdir(dir)).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const name of names) {
      const absolute = join(dir, name);
      const path = prefix === "" ? name : `${prefix}/${name}`;
      let stats: Stats;
      try {
        stats = await lstat(absolute);
      } catch {
        continue; // deleted since the listing
      }
      const isDir = stats.isDirectory();
      if (isIgnored(path, isDir, rules)) {
        (alwaysExcluded(path) ? excluded : ignored).push(isDir ? `${path}/` : path);
        continue;
      }
      const common = { path, mode: stats.mode & 0o777, mtime: Math.floor(stats.mtimeMs / 1000), absolute };
      if (isDir) {
        entries.push({ ...common, type: "directory", size: 0, linkpath: "" });
        await walk(absolute, path, rules);
      } else if (stats.isFile()) {
        entries.push({ ...common, type: "file", size: stats.size, linkpath: "" });
      } else if (stats.isSymbolicLink()) {
        entries.push({ ...common, type: "symlink", size: 0, linkpath: await readlink(absolute) });
      }
      // Sockets, fifos and devices are not source: left out.
    }
  };
  await walk(root, "", []);
  return { entries, ignored, excluded };
}

/** A file's bytes as listed: `size` of them, zero-filled if it shrank since. */
async function* fileContent(entry: SourceEntry): AsyncGenerator<Buffer> {
  const handle = await open(entry.absolute, "r");
  try {
    let position = 0;
    while (position < entry.size) {
      const buffer = Buffer.allocUnsafe(Math.min(CHUNK_BYTES, entry.size - position));
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, position);
      if (bytesRead === 0) {
        // The file shrank after it was listed; the header promised entry.size bytes.
        yield Buffer.alloc(entry.size - position);
        break;
      }
      position += bytesRead;
      yield buffer.subarray(0, bytesRead);
    }
  } finally {
    await handle.close();
  }
}

/** The archive bytes: each member, then the end marker. */
function tarStream(entries: readonly SourceEntry[]): AsyncGenerator<Buffer> {
  return tarArchive(async (pack) => {
    for (const entry of entries) {
      const header = {
        name: entry.type === "directory" ? `${entry.path}/` : entry.path,
        type: entry.type,
        mode: entry.mode,
        mtime: new Date(entry.mtime * 1000),
        size: entry.size,
        linkname: entry.linkpath,
        uid: 0,
        gid: 0,
      };
      await addMember(pack, header, entry.type === "file" && entry.size > 0 ? fileContent(entry) : undefined);
    }
  });
}

/** The largest top-level entries (folders summed) and the largest files, for the "too large" message. */
export function biggestEntries(entries: readonly SourceEntry[], count = 5): { topLevel: [string, number][]; files: [string, number][] } {
  const top = new Map<string, number>();
  for (const entry of entries) {
    if (entry.type !== "file") continue;
    const slash = entry.path.indexOf("/");
    const key = slash === -1 ? entry.path : `${entry.path.slice(0, slash)}/`;
    top.set(key, (top.get(key) ?? 0) + entry.size);
  }
  const files = entries.filter((e) => e.type === "file").map((e): [string, number] => [e.path, e.size]);
  const total = files.reduce((sum, [, size]) => sum + size, 0);
  // The few that matter: at most `count`, each at least 1% of the whole (but always the largest).
  const pick = (items: [string, number][]) =>
    items
      .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
      .filter(([, size], i) => i === 0 || size >= total / 100)
      .slice(0, count);
  return { topLevel: pick([...top]), files: pick(files) };
}

/** Decimal megabytes, the unit the limit is stated in (`100 MB`). */
const megabytes = (bytes: number) => `${Number((bytes / 1_000_000).toFixed(1))} MB`;

/** A source whose archive would pass the upload limit; raised before anything is uploaded. */
export class SourceTooLarge extends CliError {
  constructor(
    readonly limit: number,
    readonly listing: SourceListing,
  ) {
    const files = listing.entries.filter((e) => e.type === "file");
    const total = files.reduce((sum, e) => sum + e.size, 0);
    const { topLevel, files: largest } = biggestEntries(listing.entries);
    const list = (items: [string, number][]) => items.map(([path, size]) => `${path} (${formatBytes(size)})`).join(", ");
    super(
      "the source is too large to deploy",
      [
        `packed and compressed it is over the build upload limit of ${megabytes(limit)} (${limit} bytes); nothing was uploaded`,
        `${files.length} files, ${formatBytes(total)} before compression`,
        `biggest entries: ${list(topLevel)}`,
        `biggest files: ${list(largest)}`,
      ],
      "leave build output, media and archives out of the source with .gitignore, or point --source at a smaller folder",
    );
    this.name = "SourceTooLarge";
  }
}

/** Counts compressed bytes and stops the pack as soon as they pass the limit. */
function limitTo(limit: number, onTooLarge: () => Error): Transform & { bytes: number } {
  const counter = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      counter.bytes += chunk.length;
      if (counter.bytes > limit) done(onTooLarge());
      else done(null, chunk);
    },
  }) as Transform & { bytes: number };
  counter.bytes = 0;
  return counter;
}

/**
 * Packs `root` into a temporary `.tar.gz`; throws {@link SourceTooLarge} once
 * the archive passes `maxBytes` (the temporary file is then removed).
 */
export async function packSource(root: string, options: { maxBytes?: number } = {}): Promise<PackedSource> {
  const maxBytes = options.maxBytes ?? MAX_UPLOAD_BYTES;
  const listing = await listSource(root);
  const dir = await mkdtemp(join(tmpdir(), "svc-deploy-"));
  const remove = () => rm(dir, { recursive: true, force: true });
  const file = join(dir, "source.tar.gz");
  const counter = limitTo(maxBytes, () => new SourceTooLarge(maxBytes, listing));
  try {
    await pipeline(Readable.from(tarStream(listing.entries)), createGzip(), counter, createWriteStream(file, { mode: 0o600 }));
  } catch (err) {
    await remove();
    throw err;
  }
  const files = listing.entries.filter((e) => e.type === "file");
  return {
    file,
    sizeBytes: counter.bytes,
    fileCount: files.length,
    totalBytes: files.reduce((sum, e) => sum + e.size, 0),
    files: files.map((e) => ({ path: e.path, size: e.size })),
    ignored: listing.ignored,
    excluded: listing.excluded,
    remove,
  };
}
