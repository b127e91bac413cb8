/**
 * The manifest of a built site: every file of the output folder as URL path →
 * SHA-256, size and content type. The hash is the blob's name in storage, so a
 * redeploy uploads only what changed and a deployment is an immutable list.
 */
import { createHash } from "node:crypto";
import { readdir, realpath, stat } from "node:fs/promises";
import { join } from "node:path";
import { MAX_MANIFEST_BYTES, MAX_MANIFEST_FILES, type ManifestEntry } from "../protocol.js";
import { contentTypeFor } from "./content-types.js";
import { isInside, openInside } from "./files.js";
import { forEachLimited } from "./pool.js";

/**
 * Never part of a site (as in Cloudflare Pages): version-control data, installed
 * packages and Finder litter would only leak source or waste storage.
 */
const IGNORED_NAMES = new Set([".git", "node_modules", ".DS_Store"]);
/** Files hashed at once: small files cost a few syscalls each, which overlap well. */
const PARALLEL_HASHES = 16;
const HASH_CHUNK_BYTES = 256 * 1024;

/** What {@link buildManifest} found. */
export interface ManifestScan {
  /** Sorted by path. */
  entries: ManifestEntry[];
  /** Relative paths left out because they lead outside the folder, or are not files or folders. */
  skipped: string[];
}

/**
 * Walks `root` (a real path, already checked to be inside the job's folder) and
 * hashes each file chunk by chunk, never whole in memory. Symlinks are followed
 * only while they stay inside `root`; a folder reached through a link is entered
 * once, so link loops end.
 */
export async function buildManifest(root: string): Promise<{ ok: true; scan: ManifestScan } | { ok: false; error: string }> {
  const files: string[] = [];
  const skipped: string[] = [];
  const visited = new Set<string>([root]);
  const pending: string[] = [""];
  for (let dir = pending.pop(); dir !== undefined; dir = pending.pop()) {
    const children = await readdir(join(root, dir), { withFileTypes: true });
    for (const child of children) {
      if (IGNORED_NAMES.has(child.name)) continue;
      const relative = dir === "" ? child.name : `${dir}/${child.name}`;
      let kind: "file" | "dir" | null = child.isFile() ? "file" : child.isDirectory() ? "dir" : null;
      if (child.isSymbolicLink()) {
        const target = await realpath(join(root, relative)).catch(() => null);
        if (target === null || !isInside(root, target)) {
          skipped.push(relative);
          continue;
        }
        const info = await stat(target);
        kind = info.isFile() ? "file" : info.isDirectory() ? "dir" : null;
        if (kind === "dir") {
          if (visited.has(target)) continue;
          visited.add(target);
        }
      }
      if (kind === "dir") pending.push(relative);
      else if (kind === "file") files.push(relative);
      else skipped.push(relative);
      if (files.length > MAX_MANIFEST_FILES) {
        return { ok: false, error: `the output has more than ${MAX_MANIFEST_FILES} files, the most one deployment may hold` };
      }
    }
  }
  const entries: ManifestEntry[] = [];
  await forEachLimited(files, PARALLEL_HASHES, async (relative) => {
    const entry = await hashFile(root, relative);
    if (entry) entries.push(entry);
    else skipped.push(relative);
  });
  skipped.sort();
  entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  const bytes = Buffer.byteLength(JSON.stringify(entries));
  if (bytes > MAX_MANIFEST_BYTES) {
    return {
      ok: false,
      error: `the output's file list takes ${Math.ceil(bytes / 1024 / 1024)} MiB, more than the ${MAX_MANIFEST_BYTES / 1024 / 1024} MiB one deployment may hold (shorter paths or fewer files)`,
    };
  }
  return { ok: true, scan: { entries, skipped } };
}

/** SHA-256 and size of one file, read in chunks; null when it cannot be opened inside `root`. */
async function hashFile(root: string, relative: string): Promise<ManifestEntry | null> {
  const handle = await openInside(root, relative);
  if (!handle) return null;
  try {
    // Plain reads into one buffer: a stream per file costs more than hashing a small file.
    const hash = createHash("sha256");
    const chunk = Buffer.allocUnsafe(HASH_CHUNK_BYTES);
    let size = 0;
    for (;;) {
      const { bytesRead } = await handle.read(chunk, 0, chunk.length, null);
      if (bytesRead === 0) break;
      hash.update(chunk.subarray(0, bytesRead));
      size += bytesRead;
    }
    return { path: `/${relative}`, sha256: hash.digest("hex"), size, contentType: contentTypeFor(relative) };
  } finally {
    await handle.close();
  }
}
