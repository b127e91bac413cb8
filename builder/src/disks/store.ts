/**
 * Persistent disks: one directory per disk under the builder's data dir. With a
 * root builder each disk is its own ext4 filesystem (sandbox/fs-image.ts), so its quota
 * is a hard limit the kernel enforces:
 *
 *     disks/<id>/disk.json   quota, owner (tenant) and creation time (builder-only)
 *     disks/<id>/disk.img    the filesystem image (sparse)
 *     disks/<id>/mnt/        where it is mounted; jobs see mnt/data at the disk's mountPath
 *
 * A builder that cannot loop-mount (not root) keeps the data in a plain
 * `disks/<id>/data/` and can only measure the quota (see README "Sandbox").
 * Either way, usage counts allocated blocks (a sparse file only its data), and
 * a disk holds at most {@link diskInodeLimit} files, directories and links:
 * an image's statfs says both at once; a plain directory is walked in bounded
 * memory (sandbox/usage.ts).
 *
 * Disk images are sparse, so the host's free space cannot protect itself:
 * creating or growing a disk (and a restore's staging copy) is refused while
 * the quotas already promised would no longer fit the data dir's free space
 * less a reserve (sandbox/host-room.ts, InsufficientStorage).
 *
 * A restore fills a fresh staging filesystem (or directory) named after its
 * job and swaps it in under the disk's lock; renames of `previous-<job>` and
 * `trash-<job>` make the swap recoverable, so a crash anywhere leaves either the
 * old data (rolled back at the next start) or the new one, never a mix.
 */
import { execFile } from "node:child_process";
import { chown, lstat, mkdir, readFile, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { FsImages, IMAGE_DATA_DIR, imageLayout, isMountPoint } from "../sandbox/fs-image.js";
import type { DiskInfo } from "../protocol/disks.js";
import type { HeldDisk, QuarantinedDisk } from "../protocol/node.js";
import { DISK_ID_PATTERN } from "../protocol/shared.js";
import { formatBytes } from "../units.js";
import type { HostRoom } from "../sandbox/host-room.js";
import type { JobUser, TenantUsers } from "../sandbox/tenants.js";
import { type DiskUsage, measureDisk } from "../sandbox/usage.js";

const run = promisify(execFile);

interface DiskMeta {
  sizeBytes: number;
  createdAt: string;
  /** The account owning the disk; null for disks made before tenants existed. */
  tenant: string | null;
  /** The control plane's generation of the disk this copy was made at (1 for disks made before fencing). */
  generation: number;
}

async function exists(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    () => false,
  );
}

/** Answer of {@link DiskStore.put} when a disk of another tenant has this id. */
export class DiskOwnedElsewhere extends Error {}

/** The request names another generation of the disk than this copy (HTTP 409 DISK_FENCED). */
export class DiskFenced extends Error {}

function fenceMessage(id: string, held: number, asked: number): string {
  return held < asked
    ? `disk ${id}: this node's copy is generation ${held}, the disk's record is at ${asked}; the stale copy is set aside and never used again`
    : `disk ${id}: the request names generation ${asked}, older than this node's copy (${held}); refused`;
}

/** Options of {@link DiskStore.open}. */
export interface DiskStoreOptions {
  /** The host's room: disks are made only where it holds them beside every other promise (sandbox/host-room.ts). */
  room: HostRoom;
}

/** Where disks live, and the per-disk lock that keeps create, resize, restore and delete in order. */
export class DiskStore {
  readonly #root: string;
  readonly #tenants: TenantUsers;
  /** Whether disks are loop-mounted filesystems (hard quotas) rather than directories. */
  readonly images: boolean;
  readonly #room: HostRoom;
  readonly #locks = new Map<string, Promise<unknown>>();
  /** Whether the log said once that moving a mount failed here. */
  #moveFailedSaid = false;

  private constructor(root: string, tenants: TenantUsers, images: boolean, options: DiskStoreOptions) {
    this.#root = root;
    this.#tenants = tenants;
    this.images = images;
    this.#room = options.room;
    options.room.addDiskPromises(() => this.#promisedBytes());
  }

  /**
   * Creates the disks directory, settles what a crash interrupted (restores,
   * mounts) and mounts every disk, before any job can see one.
   */
  static async open(root: string, tenants: TenantUsers, images: boolean, options: DiskStoreOptions): Promise<DiskStore> {
    await mkdir(root, { recursive: true, mode: 0o711 });
    const store = new DiskStore(root, tenants, images, options);
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
    return this.#describe(id, meta.sizeBytes);
  }

  /**
   * Creates the disk for `tenant` if absent, else changes its quota; existing
   * data is kept. A disk owned by another tenant is refused (DiskOwnedElsewhere),
   * a disk or growth the host cannot hold too (InsufficientStorage).
   */
  async put(id: string, sizeBytes: number, tenant: string, generation?: number): Promise<{ info: DiskInfo; created: boolean }> {
    const created = await this.ensure(id, sizeBytes, tenant, generation);
    return { info: await this.#describe(id, sizeBytes), created };
  }

  /** The disk's usage; quota and data path as given. */
  async usage(id: string, sizeBytes: number): Promise<DiskUsage> {
    return measureDisk(this.dataPath(id), sizeBytes);
  }

  async #describe(id: string, sizeBytes: number): Promise<DiskInfo> {
    const usage = await this.usage(id, sizeBytes);
    return { id, sizeBytes, ...usage };
  }

  /** {@link put} without measuring usage (what a job start needs); true when the disk was created. */
  async ensure(id: string, sizeBytes: number, tenant: string, generation?: number): Promise<boolean> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      let existing = await this.#readMeta(id);
      if (existing && generation !== undefined && existing.generation !== generation) {
        // The disk is placed here again at a newer generation (restored onto this node after it
        // was lost): the old copy is set aside, never mixed with the new one.
        if (existing.generation > generation) throw new DiskFenced(fenceMessage(id, existing.generation, generation));
        await this.#quarantine(id, existing);
        existing = null;
      }
      if (existing?.tenant && existing.tenant !== tenant) throw new DiskOwnedElsewhere(`disk ${id} belongs to another tenant`);
      if (existing && existing.sizeBytes === sizeBytes && existing.tenant === tenant) return false;
      const dir = this.#diskDir(id);
      const owner = await this.#tenants.userOf(tenant);
      if (!existing) {
        await this.#room.withDiskRoom(this.#hostBytes(sizeBytes), `a disk of ${formatBytes(sizeBytes)}`, async () => {
          await mkdir(dir, { recursive: true, mode: 0o711 });
          await this.#createData(id, sizeBytes, owner);
        });
      } else if (sizeBytes > existing.sizeBytes) {
        await this.#room.withDiskRoom(sizeBytes - existing.sizeBytes, `growing the disk to ${formatBytes(sizeBytes)}`, async () => {
          if (this.images) await FsImages.resize(join(dir, "disk.img"), join(dir, "mnt"), existing.sizeBytes, sizeBytes);
        });
      } else if (this.images && existing.sizeBytes !== sizeBytes) {
        await FsImages.resize(join(dir, "disk.img"), join(dir, "mnt"), existing.sizeBytes, sizeBytes);
      }
      if (existing && existing.tenant === null) await chown(this.dataPath(id), owner.uid, owner.gid);
      const meta: DiskMeta = {
        sizeBytes,
        createdAt: existing?.createdAt ?? new Date().toISOString(),
        tenant,
        generation: existing?.generation ?? generation ?? 1,
      };
      const temporary = join(dir, "disk.json.tmp");
      await writeFile(temporary, JSON.stringify(meta), { mode: 0o600 });
      await rename(temporary, join(dir, "disk.json"));
      return !existing;
    });
  }

  /**
   * Why a request naming `generation` of the disk must not touch this copy, or
   * null when it may (or names none, or the disk is not here: the job's own
   * checks say so). A newer generation means this copy is stale: it is set
   * aside at once.
   */
  async fenceProblem(id: string, generation: number | undefined): Promise<string | null> {
    if (generation === undefined || !DiskStore.isValidId(id)) return null;
    return this.#locked(id, async () => {
      const meta = await this.#readMeta(id);
      if (!meta || meta.generation === generation) return null;
      if (meta.generation < generation) await this.#quarantine(id, meta);
      return fenceMessage(id, meta.generation, generation);
    });
  }

  /** Every disk this node holds, with its generation (what heartbeats report). */
  async held(): Promise<HeldDisk[]> {
    const held: HeldDisk[] = [];
    for (const id of await readdir(this.#root).catch(() => [] as string[])) {
      if (!DiskStore.isValidId(id)) continue;
      const meta = await this.#readMeta(id);
      if (meta) held.push({ id, generation: meta.generation });
    }
    return held;
  }

  /** Sets the disk's copy aside (the control plane holds its record elsewhere); false when it is not here. */
  async fence(id: string): Promise<boolean> {
    this.#assertId(id);
    return this.#locked(id, async () => {
      const meta = await this.#readMeta(id);
      if (!meta) return false;
      await this.#quarantine(id, meta);
      return true;
    });
  }

  /** Stale copies set aside, oldest first: never served, written or snapshotted, removed only by the operator. */
  async quarantined(): Promise<QuarantinedDisk[]> {
    const found: QuarantinedDisk[] = [];
    for (const name of await readdir(this.#quarantineRoot()).catch(() => [] as string[])) {
      try {
        const record = JSON.parse(await readFile(join(this.#quarantineRoot(), name, "quarantine.json"), "utf8")) as QuarantinedDisk;
        found.push({ ...record, name });
      } catch {
        // a set-aside copy still being moved, or not ours
      }
    }
    return found.sort((a, b) => a.quarantinedAt.localeCompare(b.quarantinedAt));
  }

  /** Deletes a quarantined copy (the operator's decision); false when there is none of that name. */
  async removeQuarantined(name: string): Promise<boolean> {
    if (!/^[A-Za-z0-9_.-]{1,128}$/.test(name) || name.startsWith(".")) return false;
    const dir = join(this.#quarantineRoot(), name);
    if (!(await exists(join(dir, "quarantine.json")))) return false;
    await this.#unmountAll(dir);
    await rm(dir, { recursive: true, force: true });
    return true;
  }

  #quarantineRoot(): string {
    return join(this.#root, ".quarantine");
  }

  /** Unmounts the copy and moves it under `.quarantine/`, recording what it was. Caller holds the disk's lock. */
  async #quarantine(id: string, meta: DiskMeta): Promise<void> {
    const quarantinedAt = new Date().toISOString();
    const name = `${id}-g${meta.generation}-${quarantinedAt.replace(/[:.]/g, "")}`;
    await mkdir(this.#quarantineRoot(), { recursive: true, mode: 0o700 });
    await this.#unmountAll(this.#diskDir(id));
    await rename(this.#diskDir(id), join(this.#quarantineRoot(), name));
    const record: Omit<QuarantinedDisk, "name"> = { diskId: id, generation: meta.generation, quarantinedAt };
    await writeFile(join(this.#quarantineRoot(), name, "quarantine.json"), JSON.stringify(record), { mode: 0o600 });
    console.error(`builder: disk ${id} (generation ${meta.generation}) is no longer the copy of record; set aside as ${name}`);
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
      return this.#room.withDiskRoom(this.#hostBytes(meta.sizeBytes), `the restore's staging copy of the disk (${formatBytes(meta.sizeBytes)})`, async () => {
        if (!this.images) {
          await mkdir(staging, { mode: 0o700 });
          return staging;
        }
        await FsImages.create(`${staging}.img`, staging, meta.sizeBytes, { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 });
        return join(staging, IMAGE_DATA_DIR);
      });
    });
  }

  /** Host bytes a disk of `sizeBytes` may come to take: its whole image, or its quota. */
  #hostBytes(sizeBytes: number): number {
    return this.images ? imageLayout(sizeBytes).imageBytes : sizeBytes;
  }

  /**
   * What existing disks may still take from the host: for images, the part
   * of every image file (disks, stagings) not allocated yet, since a sparse
   * image fills up to its size; for directories, their whole quotas.
   */
  async #promisedBytes(): Promise<number> {
    let total = 0;
    for (const id of await readdir(this.#root).catch(() => [] as string[])) {
      if (!DiskStore.isValidId(id)) continue;
      const dir = join(this.#root, id);
      if (!this.images) {
        total += (await this.#readMeta(id))?.sizeBytes ?? 0;
        continue;
      }
      for (const name of await readdir(dir).catch(() => [] as string[])) {
        if (!name.endsWith(".img") || name.startsWith("trash-")) continue;
        const image = await stat(join(dir, name)).catch(() => null);
        if (image) total += Math.max(0, image.size - image.blocks * 512);
      }
    }
    return total;
  }

  /**
   * Puts a filled staging area in place of the disk's data. Directories:
   * data → `previous-<job>`, staging → data, `previous-<job>` → `trash-<job>`.
   * Images: the disk's filesystem is moved aside to `retiring-<job>` and the
   * staging one to the disk's mount point, both as they are (FsImages.move),
   * then the same three renames on the image files (a loop device follows its
   * file). Should a move fail, both are unmounted and the new image mounted
   * after the renames, which first writes every page the extraction left
   * dirty. The rename to `trash-` commits. Returns what deletes the old
   * data (the trash, and the retired filesystem unmounted, which writes its
   * dirty pages away from the restore's time).
   */
  async replaceData(id: string, staging: string, jobId: string): Promise<() => Promise<void>> {
    return this.#locked(id, async () => {
      const dir = this.#diskDir(id);
      if (!this.images) {
        const trash = await this.#swap(this.dataPath(id), staging, dir, jobId, "");
        return () => rm(trash, { recursive: true, force: true });
      }
      const stagingMount = join(dir, `staging-${jobId}`);
      const mnt = join(dir, "mnt");
      const retiring = join(dir, `retiring-${jobId}`);
      let mounted = await this.#moveMounts(mnt, retiring, stagingMount);
      if (!mounted) {
        await FsImages.unmount(stagingMount);
        await FsImages.unmount(mnt);
      }
      try {
        const trash = await this.#swap(join(dir, "disk.img"), join(dir, `staging-${jobId}.img`), dir, jobId, ".img");
        return async () => {
          await FsImages.unmount(retiring);
          await rm(retiring, { recursive: true, force: true });
          await rm(trash, { force: true });
        };
      } catch (error) {
        // The renames were rolled back: the old image is the disk's again, mounted afresh below once
        // nothing of it is mounted elsewhere (and `retiring` is removed only once it is no mount point).
        if (mounted) await FsImages.unmount(mnt);
        mounted = false;
        await FsImages.unmount(retiring);
        await rm(retiring, { recursive: true, force: true });
        throw error;
      } finally {
        if (!mounted) await FsImages.mount(join(dir, "disk.img"), mnt);
      }
    });
  }

  /** The disk's filesystem to `retiring`, the staging one to `mnt`; false when a move failed (the disk's filesystem back at `mnt` if it can be). */
  async #moveMounts(mnt: string, retiring: string, stagingMount: string): Promise<boolean> {
    const failed = (error: unknown): false => {
      if (!this.#moveFailedSaid) console.error(`builder: ${String(error)}; a restore's swap unmounts and mounts the images instead`);
      this.#moveFailedSaid = true;
      return false;
    };
    await mkdir(retiring, { mode: 0o700 });
    if (!(await FsImages.move(mnt, retiring).then(() => true, failed))) return false;
    if (await FsImages.move(stagingMount, mnt).then(() => true, failed)) return true;
    await FsImages.move(retiring, mnt).catch(failed);
    return false;
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

  /**
   * Mounts every disk's filesystem that is not mounted (the lease watchdog
   * unmounted them when the node's lease ran out; it holds again). An image
   * still attached to a loop device (a lazily unmounted filesystem some
   * process has not let go of yet) is left for the next call: mounting it
   * twice would corrupt it.
   */
  async remount(): Promise<void> {
    if (!this.images) return;
    for (const id of await readdir(this.#root).catch(() => [] as string[])) {
      if (!DiskStore.isValidId(id)) continue;
      await this.#locked(id, async () => {
        const dir = this.#diskDir(id);
        const image = join(dir, "disk.img");
        const mnt = join(dir, "mnt");
        if (!(await exists(image)) || (await isMountPoint(mnt))) return;
        const { stdout } = await run("losetup", ["-j", image], { timeout: 10_000 });
        if (stdout.trim() !== "") {
          console.error(`builder: disk ${id} is still attached to a loop device; it is mounted again once that lets go`);
          return;
        }
        await FsImages.mount(image, mnt);
        console.error(`builder: disk ${id} mounted again (the node holds its lease again)`);
      });
    }
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
      if (name === "mnt" || name.startsWith("retiring-") || (name.startsWith("staging-") && !name.endsWith(".img"))) await FsImages.unmount(join(diskDir, name));
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
      return {
        sizeBytes: meta.sizeBytes,
        createdAt: meta.createdAt,
        tenant: typeof meta.tenant === "string" ? meta.tenant : null,
        generation: typeof meta.generation === "number" && meta.generation > 0 ? meta.generation : 1,
      };
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
        if (name.startsWith("staging-") || name.startsWith("trash-") || name.startsWith("retiring-")) leftovers.push(join(dir, name));
      }
      if (this.images) await this.#mountOrConvert(id, dir);
      await this.#reown(id);
    }
    for (const path of leftovers) {
      void rm(path, { recursive: true, force: true }).catch((error: unknown) =>
        console.error(`builder: could not delete ${path}: ${String(error)}`),
      );
    }
  }

  /**
   * A disk whose tenant has another uid on this host than the data directory
   * once gave it (tenants.ts) gets its files re-owned: theirs stay theirs.
   */
  async #reown(id: string): Promise<void> {
    const meta = await this.#readMeta(id);
    const old = meta?.tenant ? this.#tenants.moved.get(meta.tenant) : undefined;
    if (!meta?.tenant || old === undefined) return;
    const owner = await this.#tenants.userOf(meta.tenant);
    await run("chown", ["-R", "--no-dereference", `--from=${old}`, `${owner.uid}:${owner.gid}`, this.dataPath(id)], { timeout: 3_600_000 });
    console.error(`builder: disk ${id}'s files re-owned from uid ${old} to ${owner.uid} (one uid per account per host)`);
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
