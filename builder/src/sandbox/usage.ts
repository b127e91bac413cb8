/**
 * What a disk (or any tree a sandbox writes) holds: bytes and inodes against
 * its limits. The sandbox watches a job's disk with it; the disks and restores
 * measure with it too.
 */
import { type Dir, lstatSync } from "node:fs";
import { access, opendir } from "node:fs/promises";
import { join } from "node:path";
import { diskInodeLimit } from "../protocol/disks.js";
import { FsImages, RESERVE_FILE } from "./fs-image.js";

/** What a disk holds, and the most files, directories and links it may hold. */
export interface DiskUsage {
  /** Allocated bytes (blocks), as `df` and `du` count them. */
  usedBytes: number;
  usedInodes: number;
  inodeLimit: number;
}

/**
 * Usage of the disk whose data is at `dataPath` with `quotaBytes` of room. An
 * image (its root holds the reserve file, which a job cannot reach) answers
 * from statfs in O(1); a plain directory is walked ({@link measureTree}).
 */
export async function measureDisk(dataPath: string, quotaBytes: number): Promise<DiskUsage> {
  if (await access(join(dataPath, "..", RESERVE_FILE)).then(() => true, () => false)) {
    const { usedBytes, usedInodes, inodeLimit } = await FsImages.usage(dataPath, quotaBytes);
    return { usedBytes, usedInodes, inodeLimit };
  }
  return { ...(await measureTree(dataPath)), inodeLimit: diskInodeLimit(quotaBytes) };
}

/** Entries read from a directory at once: the walk holds this many names per open directory. */
const WALK_BUFFER_ENTRIES = 64;

/**
 * Allocated bytes and inodes below `root` (not counting `root` itself), in
 * memory that does not grow with the tree: directories are read a few entries
 * at a time (opendir), one open directory per level of the current path, and
 * a file with N links counts 1/N at each of them (all its links are on the
 * disk), so no set of seen inodes is kept. Unreadable entries count as 0.
 * Time is linear in the number of entries (about 1 s per 300,000 from the
 * page cache); only builders without filesystem images walk.
 */
export async function measureTree(root: string): Promise<{ usedBytes: number; usedInodes: number }> {
  let bytes = 0;
  let inodes = 0;
  const levels: { dir: Dir; path: string }[] = [];
  const enter = async (path: string) => {
    try {
      levels.push({ dir: await opendir(path, { bufferSize: WALK_BUFFER_ENTRIES }), path });
    } catch {
      // deleted meanwhile, unreadable, or a path too long to open: counted as empty
    }
  };
  await enter(root);
  try {
    while (levels.length > 0) {
      const current = levels[levels.length - 1]!;
      const entry = await current.dir.read();
      if (entry === null) {
        levels.pop();
        await current.dir.close().catch(() => undefined);
        continue;
      }
      const path = join(current.path, entry.name);
      let stats: ReturnType<typeof lstatSync>;
      try {
        stats = lstatSync(path);
      } catch {
        continue;
      }
      if (!stats) continue;
      const share = stats.isDirectory() ? 1 : 1 / Math.max(1, stats.nlink);
      bytes += stats.blocks * 512 * share;
      inodes += share;
      if (stats.isDirectory()) await enter(path);
    }
  } finally {
    for (const { dir } of levels) await dir.close().catch(() => undefined);
  }
  return { usedBytes: Math.round(bytes), usedInodes: Math.round(inodes) };
}
