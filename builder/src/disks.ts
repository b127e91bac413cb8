/**
 * Persistent disks: one directory per disk under the builder's data dir. With a
 * root builder each disk is its own ext4 filesystem (fs-image.ts), so its quota
 * is a hard limit the kernel enforces:
 *
 *     disks/<id>/disk.json   quota, owner (tenant) and creation time (builder-only)
 *     disks/<id>/disk.img    the filesystem image (sparse)
 *     disks/<id>/mnt/        where it is mounted; jobs see mnt/data at the disk's mountPath
 *
 * A builder that cannot loop-mount (not root) keeps the data in a plain
 * `disks/<id>/data/` and can only measure the quota (see README "Sandbox").
 * Either way, usage is measured as apparent sizes (each hard-linked inode once)
 * during and after every job, which is what `usedBytes` reports.
 *
 * A restore fills a fresh staging filesystem (or directory) named after its
 * job and swaps it in under the disk's lock; renames of `previous-<job>` and
 * `trash-<job>` make the swap recoverable, so a crash anywhere leaves either the
 * old data (rolled back at the next start) or the new one, never a mix.
 */
import type { Dirent } from "node:fs";
import { execFile } from "node:child_process";
import { chown, lstat, mkdir, readFile, readdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { FsImages, IMAGE_DATA_DIR, isMountPoint } from "./fs-image.js";
import { DISK_ID_PATTERN, type DiskInfo } from "./protocol.js";
import type { JobUser } from "./sandbox.js";
import type { TenantUsers } from "./tenants.js";

const run = promisify(execFile);

interface DiskMeta {
  sizeBytes: number;
  createdAt: string;
  /** The account owning the disk; null for disks made before tenants existed. */
  tenant: string | null;
}

async function exists(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    () => false,
  );
}

/** Answer of {@link DiskStore.put} when a disk of another tenant has this id. */
export class DiskOwnedElsewhere extends Error {}

/**
 * Sums the apparent sizes of everything under `root` (symlinks themselves, not
 * their targets; each hard-linked inode once). Unreadable entries count as 0.
 */
export async function measureDirectoryBytes(root: string): Promise<number> {
  let total = 0;
  const linked = new Set<string>();
  const pending = [root];
  for (let dir = pending.pop(); dir !== undefined; dir = pending.pop()) {
    let entries: Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch {
      continue;
    }
    const current = dir;
    const sizes = await Promise.all(
      entries.map(async (entry) => {
        const path = join(current, entry.name);
        if (entry.isDirectory()) {
          pending.push(path);
          return 0;
        }
        try {
          const stats = await lstat(path);
          if (stats.nlink > 1) {
            const inode = `${stats.dev}:${stats.ino}`;
            if (linked.has(inode)) return 0;
            linked.add(inode);
          }
          return stats.size;
        } catch {
          return 0;
        }
      }),
    );
    for (const size of sizes) total += size;
  }
  return total;
}

/** Where disks live, and the per-disk lock that keeps create, resize, restore and delete in order. */
export class DiskStore {
  readonly #root: string;
  readonly #tenants: TenantUsers;
  /** Whether disks are loop-mounted filesystems (hard quotas) rather than directories. */
  readonly images: boolean;
  readonly #locks = new Map<string, Promise<unknown>>();

  private constructor(root: string, tenants: TenantUsers, images: boolean) {
    this.#root = root;
    this.#tenants = tenants;
    this.images = images;
  }

  /**
   * Creates the disks directory, settles what a crash interrupted (restores,
   * mounts) and mounts every disk, before any job can see one.
   */
  static async open(root: string, tenants: TenantUsers, images: boolean): Promise<DiskStore> {
    await mkdir(root, { recursive: true, mode: 0o711 });
    const store = new DiskStore(root, tenants, images);
    await store.#settle();
    return store;
  }

  /** Whether `id` can name a disk (it becomes a directory name). */
  static isValidId(id: string): boolean {
    return DISK_ID_PATTERN.test(id);
  }

  /** The directory a job sees at the disk's mountPath. */
  dataPath(id: string): string {
    return this.images ? join(this.#diskDir(id), "mnt", IMAGE_DATA_DIR) : join(this.#diskDir(id), "data");
  }

  /** The disk's quota and current usage, or null when it does not exist. */
  async info(id: string): Promise<DiskInfo | null> {
    const meta = await this.#readMeta(id);
    if (!meta) return null;
    return { id, sizeBytes: meta.sizeBytes, usedBytes: await measureDirectoryBytes(this.dataPath(id)) };
  }

  /**
   * Creates the disk for `tenant` if absent, else changes its quota; existing
   * data is kept. A disk owned by another tenant is refused (DiskOwnedElsewhere).
   */
  async put(id: string, sizeBytes: number, tenant: string): Promise<{ info: DiskInfo; created: boolean }> {
    const created = await this.ensure(id, sizeBytes, tenant);
    return { info: { id, sizeBytes, usedBytes: await measureDirectoryBytes(this.dataPath(id)) }, created };
  }

  /** {@link put} without measuring usage (what a job start needs); true when the disk was created. */
  async ensure(id: string, sizeBytes: number, tenant: string): Promise<boolean> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      const existing = await this.#readMeta(id);
      if (existing?.tenant && existing.tenant !== tenant) throw new DiskOwnedElsewhere(`disk ${id} belongs to another tenant`);
      if (existing && existing.sizeBytes === sizeBytes && existing.tenant === tenant) return false;
      const dir = this.#diskDir(id);
      await mkdir(dir, { recursive: true, mode: 0o711 });
      const owner = await this.#tenants.userOf(tenant);
      if (!existing) {
        await this.#createData(id, sizeBytes, owner);
      } else if (this.images && existing.sizeBytes !== sizeBytes) {
        await FsImages.resize(join(dir, "disk.img"), join(dir, "mnt"), existing.sizeBytes, sizeBytes);
      }
      if (existing && existing.tenant === null) await chown(this.dataPath(id), owner.uid, owner.gid);
      const meta: DiskMeta = { sizeBytes, createdAt: existing?.createdAt ?? new Date().toISOString(), tenant };
      const temporary = join(dir, "disk.json.tmp");
      await writeFile(temporary, JSON.stringify(meta), { mode: 0o600 });
      await rename(temporary, join(dir, "disk.json"));
      return !existing;
    });
  }

  /** The disk's quota without measuring its usage; null when the disk does not exist. */
  async quotaBytes(id: string): Promise<number | null> {
    return (await this.#readMeta(id))?.sizeBytes ?? null;
  }

  /** The user owning the disk's files (its tenant's), or null when the disk does not exist. */
  async owner(id: string): Promise<JobUser | null> {
    const meta = await this.#readMeta(id);
    if (!meta) return null;
    return meta.tenant === null ? null : this.#tenants.userOf(meta.tenant);
  }

  /** Which tenant owns the disk (null: unknown, or no such disk). */
  async tenantOf(id: string): Promise<string | null> {
    return (await this.#readMeta(id))?.tenant ?? null;
  }

  /**
   * A fresh, empty directory for a restore to fill (only the builder can
   * enter it): the data folder of a new filesystem of the disk's size, or a
   * directory beside the data. Null when the disk does not exist.
   */
  async createStaging(id: string, jobId: string): Promise<string | null> {
    return this.#locked(id, async () => {
      const meta = await this.#readMeta(id);
      if (!meta) return null;
      const staging = join(this.#diskDir(id), `staging-${jobId}`);
      if (!this.images) {
        await mkdir(staging, { mode: 0o700 });
        return staging;
      }
      await FsImages.create(`${staging}.img`, staging, meta.sizeBytes, { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 });
      return join(staging, IMAGE_DATA_DIR);
    });
  }

  /**
   * Puts a filled staging area in place of the disk's data. Directories:
   * data → `previous-<job>`, staging → data, `previous-<job>` → `trash-<job>`.
   * Images: both filesystems are unmounted, then the same three renames on the
   * image files, then the new image is mounted. The rename to `trash-` commits.
   * Returns the trash (a directory or an image file), which the caller deletes.
   */
  async replaceData(id: string, staging: string, jobId: string): Promise<string> {
    return this.#locked(id, async () => {
      const dir = this.#diskDir(id);
      if (!this.images) return this.#swap(this.dataPath(id), staging, dir, jobId, "");
      await FsImages.unmount(join(dir, `staging-${jobId}`));
      await FsImages.unmount(join(dir, "mnt"));
      try {
        return await this.#swap(join(dir, "disk.img"), join(dir, `staging-${jobId}.img`), dir, jobId, ".img");
      } finally {
        await FsImages.mount(join(dir, "disk.img"), join(dir, "mnt"));
      }
    });
  }

  /** Removes what a restore's staging left (after a failure, or the empty mount point after a swap). */
  async discardStaging(id: string, jobId: string): Promise<void> {
    const staging = join(this.#diskDir(id), `staging-${jobId}`);
    if (this.images) {
      await FsImages.unmount(staging).catch((error: unknown) => console.error(`builder: ${String(error)}`));
      await rm(`${staging}.img`, { force: true });
    }
    await rm(staging, { recursive: true, force: true });
  }

  /** Deletes the disk and its data; false when it did not exist. */
  async remove(id: string): Promise<boolean> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      if (!(await this.#readMeta(id))) return false;
      await this.#unmountAll(this.#diskDir(id));
      await rm(this.#diskDir(id), { recursive: true, force: true });
      return true;
    });
  }

  /** Unmounts every disk (a clean shutdown); the next start mounts them again. */
  async close(): Promise<void> {
    if (!this.images) return;
    for (const id of await readdir(this.#root).catch(() => [] as string[])) {
      if (DiskStore.isValidId(id)) await this.#unmountAll(join(this.#root, id));
    }
  }

  async #createData(id: string, sizeBytes: number, owner: JobUser): Promise<void> {
    const dir = this.#diskDir(id);
    if (!this.images) {
      await mkdir(this.dataPath(id), { recursive: true, mode: 0o700 });
      await chown(this.dataPath(id), owner.uid, owner.gid);
      return;
    }
    await rm(join(dir, "disk.img"), { force: true });
    await FsImages.create(join(dir, "disk.img"), join(dir, "mnt"), sizeBytes, owner);
  }

  /** The three renames of a swap; `suffix` is "" for directories and ".img" for images. */
  async #swap(current: string, staging: string, dir: string, jobId: string, suffix: string): Promise<string> {
    const previous = join(dir, `previous-${jobId}${suffix}`);
    const trash = join(dir, `trash-${jobId}${suffix}`);
    await rename(current, previous);
    try {
      await rename(staging, current);
    } catch (error) {
      await rename(previous, current);
      throw error;
    }
    await rename(previous, trash);
    return trash;
  }

  async #unmountAll(diskDir: string): Promise<void> {
    if (!this.images) return;
    for (const name of await readdir(diskDir).catch(() => [] as string[])) {
      if (name === "mnt" || (name.startsWith("staging-") && !name.endsWith(".img"))) await FsImages.unmount(join(diskDir, name));
    }
  }

  #diskDir(id: string): string {
    this.#assertId(id);
    return join(this.#root, id);
  }

  #assertId(id: string): void {
    if (!DiskStore.isValidId(id)) throw new Error(`invalid disk id ${JSON.stringify(id)}`);
  }

  async #readMeta(id: string): Promise<DiskMeta | null> {
    try {
      const meta = JSON.parse(await readFile(join(this.#diskDir(id), "disk.json"), "utf8")) as Partial<DiskMeta>;
      if (typeof meta.sizeBytes !== "number" || typeof meta.createdAt !== "string") return null;
      return { sizeBytes: meta.sizeBytes, createdAt: meta.createdAt, tenant: typeof meta.tenant === "string" ? meta.tenant : null };
    } catch {
      return null;
    }
  }

  /**
   * Per disk: unmounts what a crashed process left mounted, rolls back swaps
   * that did not commit (`previous-*` still there: it becomes the data again,
   * whatever was renamed into its place is discarded), deletes staging and
   * trash, and mounts the disk's filesystem.
   */
  async #settle(): Promise<void> {
    const leftovers: string[] = [];
    for (const id of await readdir(this.#root)) {
      if (!DiskStore.isValidId(id)) continue;
      const dir = this.#diskDir(id);
      await this.#unmountAll(dir);
      const suffix = this.images ? ".img" : "";
      const current = this.images ? join(dir, "disk.img") : this.dataPath(id);
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        if (!name.startsWith("previous-") || !name.endsWith(suffix)) continue;
        const jobPart = name.slice("previous-".length, name.length - suffix.length);
        if (await exists(current)) await rename(current, join(dir, `trash-${jobPart}${suffix}`));
        await rename(join(dir, name), current);
        console.error(`builder: rolled back an interrupted restore of disk ${id}`);
      }
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        if (name.startsWith("staging-") || name.startsWith("trash-")) leftovers.push(join(dir, name));
      }
      if (this.images) await this.#mountOrConvert(id, dir);
    }
    for (const path of leftovers) {
      void rm(path, { recursive: true, force: true }).catch((error: unknown) =>
        console.error(`builder: could not delete ${path}: ${String(error)}`),
      );
    }
  }

  /** Mounts the disk's image; a disk kept as a plain directory by an unprivileged builder becomes an image first. */
  async #mountOrConvert(id: string, dir: string): Promise<void> {
    const meta = await this.#readMeta(id);
    if (!meta) return;
    const image = join(dir, "disk.img");
    const mnt = join(dir, "mnt");
    if (await exists(image)) {
      await mkdir(mnt, { recursive: true, mode: 0o711 });
      if (!(await isMountPoint(mnt))) await FsImages.mount(image, mnt);
      return;
    }
    const owner = (await this.owner(id)) ?? { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
    await FsImages.create(image, mnt, meta.sizeBytes, owner);
    const plain = join(dir, "data");
    if (await exists(plain)) {
      await run("cp", ["-a", `${plain}/.`, join(mnt, IMAGE_DATA_DIR)], { timeout: 3_600_000 });
      await rm(plain, { recursive: true, force: true });
      console.error(`builder: disk ${id} moved into a filesystem of its own (hard quota)`);
    } else {
      console.error(`builder: disk ${id} had no data on this builder; it starts empty`);
    }
  }

  async #locked<T>(id: string, work: () => Promise<T>): Promise<T> {
    const previous = this.#locks.get(id) ?? Promise.resolve();
    const current = previous.then(work, work);
    const tail = current.catch(() => undefined);
    this.#locks.set(id, tail);
    try {
      return await current;
    } finally {
      if (this.#locks.get(id) === tail) this.#locks.delete(id);
    }
  }
}
