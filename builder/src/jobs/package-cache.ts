/**
 * Each account's package-manager caches on this node: what npm, yarn and pip
 * downloaded for one of its builds (`~/.npm`, `~/.cache`), kept for its next
 * builds of any of its apps, so an app whose lockfile changed, or a new app
 * using the packages of another, downloads only what is new. One folder per
 * account, never shown to another account's builds; the package managers
 * check every package against the lockfile's integrity hashes as they take it
 * from there. Bounded per account: a build that leaves the folder above the
 * bound empties it once no other build of the account uses it.
 *
 * Layout: `<dir>/<tenant>/{npm,cache}`, owned by the account's user.
 */
import { execFile } from "node:child_process";
import { chown, mkdir, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { PACKAGE_CACHE_FOLDERS } from "../sandbox/sandbox.js";
import type { JobUser } from "../sandbox/tenants.js";
import { formatBytes } from "../units.js";

const exec = promisify(execFile);

export class PackageCaches {
  readonly #dir: string;
  readonly #maxBytes: number;
  /** Builds of each account using its folder now. */
  readonly #using = new Map<string, number>();

  constructor(dir: string, maxBytesPerAccount: number) {
    this.#dir = dir;
    this.#maxBytes = maxBytesPerAccount;
  }

  /** The account's folder (the tenant id a path segment, as the protocol checks), made for its user when missing; null when caches are off. */
  async take(tenant: string, user: JobUser): Promise<string | null> {
    if (this.#maxBytes === 0) return null;
    const dir = join(this.#dir, tenant);
    await mkdir(this.#dir, { recursive: true, mode: 0o711 });
    for (const folder of [dir, ...Object.keys(PACKAGE_CACHE_FOLDERS).map((name) => join(dir, name))]) {
      await mkdir(folder, { recursive: true, mode: 0o700 });
      await chown(folder, user.uid, user.gid);
    }
    this.#using.set(tenant, (this.#using.get(tenant) ?? 0) + 1);
    return dir;
  }

  /** Gives the folder back; the last build of the account out empties it when it outgrew the bound. Says so, or null. */
  async give(tenant: string): Promise<string | null> {
    const left = (this.#using.get(tenant) ?? 1) - 1;
    if (left > 0) {
      this.#using.set(tenant, left);
      return null;
    }
    this.#using.delete(tenant);
    const dir = join(this.#dir, tenant);
    const { stdout } = await exec("du", ["-sb", "--", dir], { env: { PATH: "/usr/bin:/bin" } }).catch(() => ({ stdout: "0" }));
    const bytes = Number.parseInt(stdout, 10);
    if (!(bytes > this.#maxBytes)) return null;
    for (const folder of Object.keys(PACKAGE_CACHE_FOLDERS)) {
      for (const name of await readdir(join(dir, folder)).catch((): string[] => [])) await rm(join(dir, folder, name), { recursive: true, force: true });
    }
    return `the account's package cache held ${formatBytes(bytes)}, more than this node keeps (${formatBytes(this.#maxBytes)}): emptied`;
  }
}
