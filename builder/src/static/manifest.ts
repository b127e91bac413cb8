/**
 * The manifest of a built site: every file of the output folder as URL path →
 * SHA-256, size and content type. The hash is the blob's name in storage, so a
 * redeploy uploads only what changed and a deployment is an immutable list.
 */
import { createHash } from "node:crypto";
import { readdir, realpath, stat } from "node:fs/promises";
import { join } from "node:path";
import { leftOutOfPlainFolder } from "./detect.js";
import { MAX_MANIFEST_BYTES, MAX_MANIFEST_FILES, type ManifestEntry } from "../protocol/static.js";
import { contentTypeFor } from "./content-types.js";
import { isInside, openInside } from "./files.js";
import { isIgnored, parseIgnoreFile, type RuleSet } from "./ignore.js";
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
  /** Paths of a plain folder that are not site content (config, dotfiles, `.gitignore`d); folders end in `/`. */
  leftOut: string[];
}

/** Largest `.gitignore` read from a plain folder. */
const MAX_IGNORE_FILE_BYTES = 1024 * 1024;

/** The rules of `dir/.gitignore` (a file really inside `root`), or null when there is none. */
async function ignoreRules(root: string, dir: string): Promise<RuleSet | null> {
  const handle = await openInside(root, dir === "" ? ".gitignore" : `${dir}/.gitignore`);
  if (!handle) return null;
  try {
    if ((await handle.stat()).size > MAX_IGNORE_FILE_BYTES) return null;
    return { base: dir, rules: parseIgnoreFile(await handle.readFile("utf8")) };
  } finally {
    await handle.close();
  }
}

/**
 * Walks `root` (a real path, already checked to be inside the job's folder) and
 * hashes each file chunk by chunk, never whole in memory. Symlinks are followed
 * only while they stay inside `root`; a folder reached through a link is entered
 * once, so link loops end. With `plainFolder` (the project root is the site),
 * what is not site content is left out: `.gitignore`d paths at every level and
 * what detect.ts's `leftOutOfPlainFolder` names (svc.json, dotfiles).
 */
export async function buildManifest(
  root: string,
  options: { plainFolder?: boolean } = {},
): Promise<{ ok: true; scan: ManifestScan } | { ok: false; error: string }> {
  const files: string[] = [];
  const skipped: string[] = [];
  const leftOut: string[] = [];
  const visited = new Set<string>([root]);
  const pending: { dir: string; rules: RuleSet[] }[] = [{ dir: "", rules: [] }];
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const { dir } = next;
    let rules = next.rules;
    if (options.plainFolder) {
      const own = await ignoreRules(root, dir);
      if (own) rules = [...rules, own];
    }
    const children = await readdir(join(root, dir), { withFileTypes: true });
    for (const child of children) {
      if (IGNORED_NAMES.has(child.name)) continue;
      const relative = dir === "" ? child.name : `${dir}/${child.name}`;
      if (options.plainFolder && (leftOutOfPlainFolder(relative) || isIgnored(relative, child.isDirectory(), rules))) {
        leftOut.push(child.isDirectory() ? `${relative}/` : relative);
        continue;
      }
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
      if (kind === "dir") pending.push({ dir: relative, rules });
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
  leftOut.sort();
  entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  const bytes = Buffer.byteLength(JSON.stringify(entries));
  if (bytes > MAX_MANIFEST_BYTES) {
    return {
      ok: false,
      error: `the output's file list takes ${Math.ceil(bytes / 1024 / 1024)} MiB, more than the ${MAX_MANIFEST_BYTES / 1024 / 1024} MiB one deployment may hold (shorter paths or fewer files)`,
    };
  }
  return { ok: true, scan: { entries, skipped, leftOut } };
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
