/**
 * A process's own working tree: its release unpacked into a filesystem of its
 * own (an ext4 image with a hard size, like a build's scratch space; a plain
 * folder when the builder cannot loop-mount), owned by the tenant's user and
 * writable, shown as /work in the sandbox. Restarts after a crash reuse it
 * (what the app wrote stays, as on a VM that rebooted); a new process (a
 * deploy, a restart asked for) gets a fresh one from the release.
 *
 *     processes/<id>/tree.img     the filesystem image (sparse)
 *     processes/<id>/tree/data/   /work
 *     processes/<id>/tree/home/   HOME (/home/svc)
 *
 * The release is unpacked by the builder with the hardened extractor
 * (tar/extract.ts: no absolute or `..` paths, no link leading out, no devices,
 * bounded entries and bytes), never by a shell in the sandbox, so the archive
 * is judged by the same rules as a restore.
 */
import { chown, mkdir, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { FsImages, IMAGE_DATA_DIR } from "../sandbox/fs-image.js";
import type { HostRoom } from "../sandbox/host-room.js";
import type { SandboxHost } from "../sandbox/host.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";
import { extractTar, gunzipFile } from "../tar/extract.js";

const GIB = 1024 * 1024 * 1024;
/** A tar member takes at least one 512-byte header: the most members an archive of N bytes can hold. */
const TAR_BLOCK = 512;

/** Where a process's tree lives on the host. */
export interface WorkTree {
  /** Shown as /work. */
  work: string;
  /** Shown as HOME. */
  home: string;
}

/**
 * Room a process's tree gets: twice the unpacked release (what the app may
 * add: caches, uploads, compiled files), and at least 1 GiB. It is a sparse
 * image, so unused room costs nothing on the host.
 */
export function workTreeBytes(expandedBytes: number): number {
  return Math.max(2 * expandedBytes, GIB);
}

function paths(processDir: string): { image: string; root: string } & WorkTree {
  const root = join(processDir, "tree");
  return { image: `${root}.img`, root, work: join(root, IMAGE_DATA_DIR), home: join(root, "home") };
}

/**
 * Makes the tree and unpacks the release into it; returns its paths. Throws
 * ArchiveRejected or TarFormatError (tar/extract.ts) for a bad release; the
 * caller removes the tree either way when done.
 */
export async function createWorkTree(input: {
  host: SandboxHost;
  /** The host's room: the tree's image is made only where it fits beside every other promise. */
  room: HostRoom;
  processDir: string;
  archive: string;
  expandedBytes: number;
  user: JobUser;
}): Promise<WorkTree & { entries: number; sizeBytes: number }> {
  const { image, root, work, home } = paths(input.processDir);
  const sizeBytes = workTreeBytes(input.expandedBytes);
  if (input.host.images) {
    await input.room.withDiskRoom(sizeBytes, `a working tree of ${formatBytes(sizeBytes)}`, () => FsImages.create(image, root, sizeBytes, input.user));
  } else {
    await mkdir(work, { recursive: true, mode: 0o700 });
    await chown(work, input.user.uid, input.user.gid);
  }
  await mkdir(home, { mode: 0o700 });
  await chown(home, input.user.uid, input.user.gid);
  // A read error fails the extraction; the extractor's own refusal ends the read below.
  const gunzip = gunzipFile(input.archive);
  try {
    const summary = await extractTar({
      source: gunzip,
      root: work,
      maxEntries: Math.max(1, Math.ceil(input.expandedBytes / TAR_BLOCK)),
      maxExpandedBytes: input.expandedBytes,
      quotaBytes: sizeBytes,
      owner: input.user,
    });
    return { work, home, entries: summary.entries, sizeBytes };
  } finally {
    gunzip.destroy();
  }
}

/** What the working trees under `processesDir` may still take from the host: the unallocated part of each sparse image. */
export async function promisedTreeBytes(processesDir: string): Promise<number> {
  let total = 0;
  for (const id of await readdir(processesDir).catch(() => [] as string[])) {
    const image = await stat(join(processesDir, id, "tree.img")).catch(() => null);
    if (image) total += Math.max(0, image.size - image.blocks * 512);
  }
  return total;
}

/** Unmounts and deletes a process's tree (whatever of it exists). */
export async function removeWorkTree(host: SandboxHost, processDir: string): Promise<void> {
  const { image, root } = paths(processDir);
  if (host.images) {
    await FsImages.unmount(root).catch((error: unknown) => console.error(`builder: ${String(error)}`));
    await rm(image, { force: true });
  }
  await rm(root, { recursive: true, force: true });
}
