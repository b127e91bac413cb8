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
 *
 * A restore works beside `data/`, in directories named after its job:
 *
 *     disks/<id>/staging-<job>/    the archive is extracted here (builder-only, 0700)
 *     disks/<id>/previous-<job>/   the old data, for the instant of the swap
 *     disks/<id>/trash-<job>/      the old data once the swap committed, being deleted
 *
 * so a crash anywhere leaves either the old data (rolled back at the next start)
 * or the new one (the commit was the rename to `trash-`), never a mix.
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

  /**
   * Creates the disks directory (traversable, not listable, by the job user) and
   * settles the restores a crash interrupted, before any job can see a disk.
   */
  static async open(root: string, user: JobUser | null): Promise<DiskStore> {
    await mkdir(root, { recursive: true, mode: 0o711 });
    const store = new DiskStore(root, user);
    await store.#settleRestores();
    return store;
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

  /** The disk's quota without measuring its usage; null when the disk does not exist. */
  async quotaBytes(id: string): Promise<number | null> {
    return (await this.#readMeta(id))?.sizeBytes ?? null;
  }

  /**
   * A fresh, empty directory beside the disk's data for a restore to fill (only
   * the builder can enter it), or null when the disk does not exist.
   */
  async createStaging(id: string, jobId: string): Promise<string | null> {
    return this.#locked(id, async () => {
      if (!(await this.#readMeta(id))) return null;
      const staging = join(this.#diskDir(id), `staging-${jobId}`);
      await mkdir(staging, { mode: 0o700 });
      return staging;
    });
  }

  /**
   * Puts a filled staging directory in place of the disk's data: data →
   * `previous-<job>`, staging → data, then `previous-<job>` → `trash-<job>`,
   * which commits. Returns the trash directory, which the caller deletes.
   */
  async replaceData(id: string, staging: string, jobId: string): Promise<string> {
    return this.#locked(id, async () => {
      const data = this.dataPath(id);
      const previous = join(this.#diskDir(id), `previous-${jobId}`);
      const trash = join(this.#diskDir(id), `trash-${jobId}`);
      await rename(data, previous);
      try {
        await rename(staging, data);
      } catch (error) {
        await rename(previous, data);
        throw error;
      }
      await rename(previous, trash);
      return trash;
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

  /**
   * Rolls back swaps that did not commit (`previous-*` still there: it goes back
   * to `data/`, and whatever was already renamed into its place is discarded),
   * then deletes staging and trash directories in the background.
   */
  async #settleRestores(): Promise<void> {
    const leftovers: string[] = [];
    for (const id of await readdir(this.#root)) {
      if (!DiskStore.isValidId(id)) continue;
      const dir = this.#diskDir(id);
      const names = await readdir(dir).catch(() => [] as string[]);
      for (const name of names) {
        if (!name.startsWith("previous-")) continue;
        const discarded = join(dir, `trash-${name.slice("previous-".length)}`);
        const restored = await lstat(this.dataPath(id)).then(
          () => true,
          () => false,
        );
        if (restored) await rename(this.dataPath(id), discarded);
        await rename(join(dir, name), this.dataPath(id));
        console.error(`builder: rolled back an interrupted restore of disk ${id}`);
      }
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        if (name.startsWith("staging-") || name.startsWith("trash-")) leftovers.push(join(dir, name));
      }
    }
    for (const path of leftovers) {
      void rm(path, { recursive: true, force: true }).catch((error: unknown) =>
        console.error(`builder: could not delete ${path}: ${String(error)}`),
      );
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
