/**
 * Persistent disks: one directory per disk under the builder's data dir.
 *
 *     disks/<id>/disk.json   quota and creation time (owned by the builder)
 *     disks/<id>/data/       the disk's contents (owned by the job user)
 *
 * A job sees its disk through SVC_DISK_PATH (the `data/` directory) rather than
 * at the app's mountPath: putting the directory at an arbitrary absolute path
 * needs a bind mount, which needs CAP_SYS_ADMIN or a mount namespace the
 * builder's container does not get, and it would let one job's path shadow
 * system directories for everyone. The intended path is still exported as
 * SVC_DISK_MOUNT_PATH, so start scripts can `ln -s "$SVC_DISK_PATH" …` where
 * they own the location. Quotas are enforced by measuring (apparent file sizes,
 * hard links once) during and after each job, because the data dir's filesystem
 * has no per-directory quota the builder could rely on everywhere.
 */
import type { Dirent } from "node:fs";
import { chown, lstat, mkdir, readFile, readdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { DISK_ID_PATTERN, type DiskInfo } from "./protocol.js";
import type { JobUser } from "./sandbox.js";

interface DiskMeta {
  sizeBytes: number;
  createdAt: string;
}

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

/** Where disks live, and the per-disk lock that keeps create, resize and delete in order. */
export class DiskStore {
  readonly #root: string;
  readonly #user: JobUser | null;
  readonly #locks = new Map<string, Promise<unknown>>();

  private constructor(root: string, user: JobUser | null) {
    this.#root = root;
    this.#user = user;
  }

  /** Creates the disks directory (traversable, not listable, by the job user). */
  static async open(root: string, user: JobUser | null): Promise<DiskStore> {
    await mkdir(root, { recursive: true, mode: 0o711 });
    return new DiskStore(root, user);
  }

  /** Whether `id` can name a disk (it becomes a directory name). */
  static isValidId(id: string): boolean {
    return DISK_ID_PATTERN.test(id);
  }

  /** The directory a job sees as SVC_DISK_PATH. */
  dataPath(id: string): string {
    return join(this.#diskDir(id), "data");
  }

  /** The disk's quota and current usage, or null when it does not exist. */
  async info(id: string): Promise<DiskInfo | null> {
    const meta = await this.#readMeta(id);
    if (!meta) return null;
    return { id, sizeBytes: meta.sizeBytes, usedBytes: await measureDirectoryBytes(this.dataPath(id)) };
  }

  /** Creates the disk if absent and sets its quota; existing data is kept. */
  async put(id: string, sizeBytes: number): Promise<{ info: DiskInfo; created: boolean }> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      const existing = await this.#readMeta(id);
      const dir = this.#diskDir(id);
      await mkdir(dir, { recursive: true, mode: 0o711 });
      await mkdir(this.dataPath(id), { recursive: true, mode: 0o700 });
      if (this.#user) await chown(this.dataPath(id), this.#user.uid, this.#user.gid);
      const meta: DiskMeta = { sizeBytes, createdAt: existing?.createdAt ?? new Date().toISOString() };
      const temporary = join(dir, "disk.json.tmp");
      await writeFile(temporary, JSON.stringify(meta), { mode: 0o600 });
      await rename(temporary, join(dir, "disk.json"));
      const usedBytes = await measureDirectoryBytes(this.dataPath(id));
      return { info: { id, sizeBytes, usedBytes }, created: existing === null };
    });
  }

  /** Deletes the disk and its data; false when it did not exist. */
  async remove(id: string): Promise<boolean> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      if (!(await this.#readMeta(id))) return false;
      await rm(this.#diskDir(id), { recursive: true, force: true });
      return true;
    });
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
      const meta = JSON.parse(await readFile(join(this.#diskDir(id), "disk.json"), "utf8")) as DiskMeta;
      return typeof meta.sizeBytes === "number" ? meta : null;
    } catch {
      return null;
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
