/**
 * Reading what a build job left behind without being led out of its folder.
 * The builder runs as root and the job's files may be symlinks to anything on
 * the host (other jobs' records, `/proc/<builder>/environ`), so every file is
 * opened first and checked afterwards through `/proc/self/fd`, which names what
 * was really opened: swapping a path component between a check and the open
 * cannot get past that. FIFOs cannot stall the builder either (`O_NONBLOCK`, and
 * anything but a regular file is refused after `fstat`).
 */
import { constants } from "node:fs";
import { type FileHandle, open, readlink, realpath } from "node:fs/promises";
import { join } from "node:path";
import type { ProjectFiles } from "./detect.js";

const OPEN_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY;
/** Largest configuration file read into memory (package.json, svc.json, framework configs). */
const MAX_TEXT_BYTES = 1024 * 1024;

/** Whether `path` is `root` or below it (both real, absolute paths). */
export function isInside(root: string, path: string): boolean {
  return path === root || path.startsWith(root.endsWith("/") ? root : `${root}/`);
}

/**
 * Opens a regular file under `root` (a real path) for reading; null when it does
 * not exist, is not a regular file, or really lives outside `root`.
 */
export async function openInside(root: string, relativePath: string): Promise<FileHandle | null> {
  let handle: FileHandle;
  try {
    handle = await open(join(root, relativePath), OPEN_FLAGS);
  } catch {
    return null;
  }
  try {
    const real = await readlink(`/proc/self/fd/${handle.fd}`);
    if (isInside(root, real) && (await handle.stat()).isFile()) return handle;
  } catch {
    // fall through: treated as absent
  }
  await handle.close();
  return null;
}

/** The real path of a folder under `root`, or null when it is missing, not a folder, or escapes `root`. */
export async function realDirInside(root: string, relativePath: string): Promise<string | null> {
  try {
    const real = await realpath(join(root, relativePath));
    const handle = await open(real, constants.O_RDONLY | constants.O_DIRECTORY);
    try {
      const opened = await readlink(`/proc/self/fd/${handle.fd}`);
      return isInside(root, opened) ? opened : null;
    } finally {
      await handle.close();
    }
  } catch {
    return null;
  }
}

/** {@link ProjectFiles} over an extracted project whose real root path is `root`. */
export function projectFiles(root: string): ProjectFiles {
  return {
    async read(path) {
      const handle = await openInside(root, path);
      if (!handle) return null;
      try {
        const { size } = await handle.stat();
        if (size > MAX_TEXT_BYTES) throw new Error(`${path} is larger than 1 MiB`);
        return await handle.readFile("utf8");
      } finally {
        await handle.close();
      }
    },
    async exists(path) {
      const handle = await openInside(root, path);
      await handle?.close();
      return handle !== null;
    },
  };
}
