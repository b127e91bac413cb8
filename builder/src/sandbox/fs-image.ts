/**
 * Filesystems with a hard size: sparse ext4 image files, loop-mounted. A disk's
 * quota and a build's scratch space are such filesystems, so a job that writes
 * past its limit gets ENOSPC from the kernel at once instead of being caught by
 * a later measurement.
 *
 * An image is made a little larger than asked (ext4 spends some blocks on its
 * own structures) and a root-owned file `.svc-reserve` in the filesystem's root,
 * outside the `data/` folder jobs see, takes up the surplus, so exactly the
 * asked number of bytes stays free for data. Changing the size moves the
 * reserve (growing the image with resize2fs when it has to), so nothing is
 * ever unmounted to resize.
 *
 * Loop mounts need root (CAP_SYS_ADMIN) and loop devices; `FsImages.probe`
 * says whether this host has them.
 */
import { execFile } from "node:child_process";
import { chown, mkdir, open, readFile, realpath, stat, statfs, truncate } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { BACKUP_MAX_ENTRIES, diskInodeLimit } from "../protocol/disks.js";
import type { JobUser } from "./tenants.js";

const run = promisify(execFile);
const MIB = 1024 * 1024;
/** Root-owned file in the filesystem's root (beside `data/`) whose blocks keep the free room at the quota. */
export const RESERVE_FILE = ".svc-reserve";
/** Folder of the image's root that holds what jobs see. */
export const IMAGE_DATA_DIR = "data";
/**
 * Inodes an image spends before its data: ext4's reserved ones (1–10),
 * `lost+found`, the `data/` folder (the archive's root member) and the reserve file.
 */
const OWN_INODES = 13;
/** ext4's inode size (mkfs default), for the room the inode tables take. */
const INODE_BYTES = 256;
/** Blocks per ext4 block group with 4 KiB blocks; mkfs gives every group at least 16 inodes (one table block). */
const GROUP_BYTES = 32768 * 4096;
const MIN_INODES_PER_GROUP = 16;

/** What a disk image holds, from statfs: O(1) whatever the tree. */
export interface ImageUsage {
  /** Bytes allocated to data (files, directories, symlinks), as `df` counts them. */
  usedBytes: number;
  /** Free bytes for data (the kernel refuses writes past them). */
  freeBytes: number;
  inodeLimit: number;
  usedInodes: number;
}

/** Runs a system tool; a failure carries its stderr's first line. */
async function tool(command: string, args: string[]): Promise<string> {
  try {
    return (await run(command, args, { timeout: 120_000 })).stdout;
  } catch (error) {
    const stderr = (error as { stderr?: string }).stderr?.trim().split("\n")[0];
    throw new Error(`${command} ${args[0] ?? ""} failed: ${stderr || (error as Error).message}`);
  }
}

/** Bytes free for an unprivileged writer. */
async function freeBytes(dir: string): Promise<number> {
  const fs = await statfs(dir);
  return fs.bavail * fs.bsize;
}

async function fileSize(path: string): Promise<number> {
  return stat(path).then(
    (s) => s.size,
    () => 0,
  );
}

/** Whether `dir` is a mount point (bind mounts of the same filesystem included), from /proc/self/mountinfo. */
export async function isMountPoint(dir: string): Promise<boolean> {
  const target = await realpath(dir).catch(() => null);
  if (target === null) return false;
  const mounts = await readFile("/proc/self/mountinfo", "utf8");
  // Field 5 is the mount point, with space, tab, newline and backslash written as octal escapes.
  return mounts.split("\n").some((line) => line.split(" ")[4]?.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8))) === target);
}

/**
 * Sizes the reserve file to `wanted` bytes; a negative wish first grows the
 * image by at least that much. Growing is done offline (unmount, resize2fs on
 * the image file, mount): resizing a mounted ext4 needs CAP_SYS_RESOURCE, which
 * containers rarely grant. Unmounting fails while a job uses the disk; the
 * caller then reports the disk busy.
 */
async function setReserve(image: string, dir: string, wanted: number): Promise<void> {
  const reserve = join(dir, RESERVE_FILE);
  let size = wanted;
  if (size < 0) {
    const before = await freeBytes(dir);
    await tool("umount", [dir]);
    try {
      // Groups added by resize2fs bring their inode tables (up to 1/16 of their size at one inode per 4 KiB).
      await truncate(image, (await fileSize(image)) + Math.ceil((-size * 1.12) / MIB + 2) * MIB);
      await tool("e2fsck", ["-f", "-y", image]);
      await tool("resize2fs", ["-f", image]);
    } finally {
      await FsImages.mount(image, dir);
    }
    size += (await freeBytes(dir)) - before;
  }
  const current = await fileSize(reserve);
  if (size > current) await tool("fallocate", ["-l", String(size), reserve]);
  else if (size < current) await truncate(reserve, Math.max(0, size));
}

/**
 * The image file's size and inode count for `usableBytes` of data: the data,
 * the inode tables ({@link diskInodeLimit}: one inode per 4 KiB of quota), the
 * journal (up to 1 GiB on big filesystems), group descriptors and bitmaps. An
 * estimate short of the truth only costs a resize when the reserve is sized.
 * mkfs rounds the inode count up to fill each group's table, so the request
 * leaves room for that below the backup entry limit.
 */
export function imageLayout(usableBytes: number): { imageBytes: number; inodes: number } {
  const journal = Math.min(Math.max(usableBytes / 32, 4 * MIB), 1024 * MIB);
  const wanted = diskInodeLimit(usableBytes);
  const imageBytes = Math.ceil((usableBytes * 1.05 + wanted * INODE_BYTES + journal + 8 * MIB) / MIB) * MIB;
  const rounding = Math.ceil(imageBytes / GROUP_BYTES) * MIN_INODES_PER_GROUP;
  const ceiling = BACKUP_MAX_ENTRIES - 1 + OWN_INODES - rounding;
  return { imageBytes, inodes: Math.max(MIN_INODES_PER_GROUP, Math.min(wanted, ceiling) + OWN_INODES) };
}

/** Most a reserve is corrected by: its own extent blocks, never what a job writes meanwhile. */
const SETTLE_MAX_BYTES = 256 * 1024;

/**
 * A large reserve needs extent-tree blocks of its own, which the free room
 * pays for: adjusts it until exactly `freeWanted` bytes are free, so usage
 * (quota less free room) reads true.
 */
async function settleReserve(image: string, dir: string, freeWanted: number): Promise<void> {
  for (let round = 0; round < 3; round++) {
    const surplus = (await freeBytes(dir)) - freeWanted;
    if (surplus === 0 || Math.abs(surplus) > SETTLE_MAX_BYTES) return;
    await setReserve(image, dir, (await fileSize(join(dir, RESERVE_FILE))) + surplus);
  }
}

export const FsImages = {
  /** Null when loop-mounted images work here, else why not. */
  async probe(): Promise<string | null> {
    if (process.getuid?.() !== 0) return "the builder is not root (loop mounts need CAP_SYS_ADMIN)";
    try {
      await tool("mkfs.ext4", ["-V"]);
      await tool("losetup", ["--version"]);
    } catch {
      return "mkfs.ext4 (e2fsprogs) or losetup (util-linux) is missing";
    }
    return null;
  },

  /**
   * Creates `image` with room for `usableBytes` of data, mounts it at `dir` and
   * creates `dir/data` owned by `owner` (mode 0700).
   */
  async create(image: string, dir: string, usableBytes: number, owner: JobUser): Promise<void> {
    const { imageBytes, inodes } = imageLayout(usableBytes);
    const handle = await open(image, "wx", 0o600);
    await handle.close();
    await truncate(image, imageBytes);
    await tool("mkfs.ext4", ["-q", "-F", "-m", "0", "-N", String(inodes), "-E", "lazy_itable_init=1,lazy_journal_init=1", image]);
    await mkdir(dir, { recursive: true, mode: 0o711 });
    await this.mount(image, dir);
    await mkdir(join(dir, IMAGE_DATA_DIR), { mode: 0o700 });
    await chown(join(dir, IMAGE_DATA_DIR), owner.uid, owner.gid);
    await setReserve(image, dir, (await freeBytes(dir)) - usableBytes);
    await settleReserve(image, dir, usableBytes);
  },

  /**
   * Usage of the image mounted at `dir` (any path inside it) whose room for
   * data is `quotaBytes`. The reserve file was sized so that exactly the quota
   * was free on the empty filesystem, so what is used is what is no longer
   * free: every allocated block (data, directories, extent trees), as the
   * kernel counts it when it refuses a write. Inodes likewise, less the
   * filesystem's own.
   */
  async usage(dir: string, quotaBytes: number): Promise<ImageUsage> {
    const fs = await statfs(dir);
    const freeBytes = fs.bavail * fs.bsize;
    const inodeLimit = Math.max(0, fs.files - OWN_INODES);
    return {
      usedBytes: Math.max(0, quotaBytes - freeBytes),
      freeBytes,
      inodeLimit,
      usedInodes: Math.min(inodeLimit, Math.max(0, fs.files - fs.ffree - OWN_INODES)),
    };
  },

  async mount(image: string, dir: string): Promise<void> {
    await tool("mount", ["-o", "loop,nosuid,nodev", image, dir]);
  },

  /**
   * Moves the filesystem mounted at `from` to `to` (which must be no mount
   * point) as it is: bound at `to`, then `from` let go lazily, so the
   * filesystem never stops being mounted and its dirty pages stay in memory
   * for the kernel's own writeback, where unmounting and mounting again would
   * write them all first. A bind, not `mount --move`: the kernel refuses to
   * move a mount under a shared one, as the data dir is (sandbox/host.ts), and
   * a bind there reaches its peers as a mount does.
   */
  async move(from: string, to: string): Promise<void> {
    await tool("mount", ["--bind", from, to]);
    await tool("umount", ["-l", from]);
  },

  /** Unmounts (the loop device goes with it); lazily, so a straggling reader cannot block a shutdown. */
  async unmount(dir: string): Promise<void> {
    if (!(await isMountPoint(dir))) return;
    try {
      await tool("umount", ["-l", dir]);
    } catch (error) {
      // Unmounted meanwhile by another hand (the lease watchdog, when the node's lease runs out as it shuts down): done.
      if (await isMountPoint(dir)) throw error;
    }
  },

  /**
   * Changes the room for data from `fromBytes` to `toBytes` by moving the
   * reserve (growing the image when the reserve cannot give enough), so data
   * already on the disk is never in the way.
   */
  async resize(image: string, dir: string, fromBytes: number, toBytes: number): Promise<void> {
    const used = fromBytes - (await freeBytes(dir));
    await setReserve(image, dir, (await fileSize(join(dir, RESERVE_FILE))) - (toBytes - fromBytes));
    await settleReserve(image, dir, toBytes - used);
  },
};
