/**
 * The node's dependency cache: what a build's install step left in the project
 * (node_modules, or a requirements.txt app's .venv), kept per app of an
 * account on this node and keyed by everything that install read: the
 * lockfile's bytes, package.json's install fields, the package manager's
 * files and command, where packages come from, the app's variables and the
 * runtime's version. A later build of the same app whose key is the same gets
 * the folder back instead of installing (`dependencies: from cache (lockfile
 * unchanged)`); nothing is ever shared between apps, let alone accounts.
 *
 * An install is cached only when the folder is all it leaves: a project whose
 * own package.json runs scripts at install (`postinstall: prisma generate`
 * reads the source, which the key does not hold), an npm/yarn/pnpm workspace
 * (its packages get node_modules of their own), a pyproject.toml project (pip
 * installs the project itself) or a requirements.txt naming local paths
 * installs every time, and the log says why.
 *
 * Copies into and out of the cache run between the job's sandboxed steps,
 * when nothing of the tenant's runs (each step's processes end with its PID
 * namespace), with `cp -a`: it follows no link and reads no FIFO, keeping
 * links, owners and modes as they are, so a tree the tenant's code shaped
 * (`node_modules` a link to `/etc`, a link to `/root` inside it) is copied as
 * that shape and never leads the copy anywhere. The cache's folders are on
 * the host only, never shown to a sandbox. Bounded in bytes across the node
 * (apparent sizes: a sparse file counts whole), the least recently used
 * entries go first; an entry a build is copying is never evicted.
 *
 * Layout: `<dir>/<tenant>/<app>/<key>.json` (the builder's record: folder,
 * bytes, last use) beside `<dir>/<tenant>/<app>/<key>/<folder>` (the tenant's).
 */
import { execFile } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { lstat, mkdir, readFile, readdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { openInside } from "../static/files.js";
import type { ProjectFiles } from "../static/detect.js";
import { formatBytes } from "../units.js";
import type { InstallStep } from "./install.js";

const exec = promisify(execFile);

/** Files besides the lockfile that change what a node package manager installs. */
const NODE_INSTALL_FILES = [".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs"];

/** package.json fields that decide what installs. */
const INSTALL_FIELDS = [
  "dependencies",
  "devDependencies",
  "optionalDependencies",
  "peerDependencies",
  "peerDependenciesMeta",
  "bundleDependencies",
  "bundledDependencies",
  "overrides",
  "resolutions",
  "pnpm",
  "packageManager",
  "engines",
];

/** The project's own scripts a package manager runs at install: their effects outside node_modules are not cached. */
const INSTALL_SCRIPTS = ["preinstall", "install", "postinstall", "prepare"];

/** A requirements.txt line naming something other than a package of the index (a local path, another file). */
const LOCAL_REQUIREMENT = /^(?:-[rcef]\b|--(?:requirement|constraint|editable|find-links)\b|\.|\/|~)|\bfile:/;

/** The app a build belongs to on this node: its cache is its own. */
export interface CacheScope {
  tenant: string;
  app: string;
}

/** Whether and under which key an install can come from the cache, or why it cannot. */
export type CacheKey = { ok: true; key: string; folder: string } | { ok: false; why: string };

/** The builder's record of one entry. */
interface Entry {
  folder: string;
  bytes: number;
  usedAt: number;
}

export class DependencyCache {
  readonly #dir: string;
  readonly #maxBytes: number;
  /** `<tenant>/<app>/<key>` → its record. */
  readonly #entries = new Map<string, Entry>();
  /** Entries being copied out now: never evicted under a build. */
  readonly #reading = new Map<string, number>();

  private constructor(dir: string, maxBytes: number) {
    this.#dir = dir;
    this.#maxBytes = maxBytes;
  }

  /** Opens the cache at `dir` (made when missing), dropping what an interrupted save left; `maxBytes` 0 keeps nothing. */
  static async open(dir: string, maxBytes: number): Promise<DependencyCache> {
    const cache = new DependencyCache(dir, maxBytes);
    await mkdir(dir, { recursive: true, mode: 0o711 });
    for (const tenant of await readdir(dir)) {
      for (const app of await readdir(join(dir, tenant)).catch((): string[] => [])) {
        const appDir = join(dir, tenant, app);
        const names = await readdir(appDir).catch((): string[] => []);
        for (const name of names) {
          if (name.endsWith(".json")) {
            const key = name.slice(0, -".json".length);
            const entry = await readFile(join(appDir, name), "utf8").then((text) => JSON.parse(text) as Entry, () => null);
            if (entry !== null && names.includes(key)) cache.#entries.set(`${tenant}/${app}/${key}`, entry);
            else await rm(join(appDir, name), { force: true });
          } else if (!names.includes(`${name}.json`)) {
            await rm(join(appDir, name), { recursive: true, force: true }); // a save cut short
          }
        }
      }
    }
    if (maxBytes === 0) for (const id of [...cache.#entries.keys()]) await cache.#evict(id);
    return cache;
  }

  get enabled(): boolean {
    return this.#maxBytes > 0;
  }

  /** Bytes the entries hold now. */
  get bytes(): number {
    let total = 0;
    for (const entry of this.#entries.values()) total += entry.bytes;
    return total;
  }

  has(scope: CacheScope, key: string): boolean {
    return this.#entries.has(entryId(scope, key));
  }

  /** Copies the cached folder into `workDir` (replacing what the source brought there); false when it could not. */
  async restore(scope: CacheScope, key: string, workDir: string, signal: AbortSignal): Promise<boolean> {
    const id = entryId(scope, key);
    const entry = this.#entries.get(id);
    if (!entry) return false;
    this.#reading.set(id, (this.#reading.get(id) ?? 0) + 1);
    try {
      await rm(join(workDir, entry.folder), { recursive: true, force: true });
      await copy(join(this.#dir, id, entry.folder), workDir, signal);
      entry.usedAt = Date.now();
      await this.#record(id, entry);
      return true;
    } catch {
      await rm(join(workDir, entry.folder), { recursive: true, force: true });
      return false;
    } finally {
      const left = (this.#reading.get(id) ?? 1) - 1;
      if (left === 0) this.#reading.delete(id);
      else this.#reading.set(id, left);
    }
  }

  /**
   * Keeps `workDir/<folder>` under `key`, then evicts the least recently used
   * entries beyond the bound. Says what happened, for the build's log.
   */
  async save(scope: CacheScope, key: string, folder: string, workDir: string, signal: AbortSignal): Promise<string> {
    const id = entryId(scope, key);
    if (this.#entries.has(id)) return "dependencies: already cached";
    let bytes: number | null;
    try {
      bytes = await sizeOf(join(workDir, folder), signal);
    } catch (error) {
      return `dependencies: not cached (${firstLine(error)})`;
    }
    if (bytes === null) return `dependencies: not cached (the install left no ${folder} folder)`;
    if (bytes > this.#maxBytes) return `dependencies: not cached (${formatBytes(bytes)}, more than this node's cache of ${formatBytes(this.#maxBytes)})`;
    const appDir = join(this.#dir, scope.tenant, scope.app);
    await mkdir(appDir, { recursive: true, mode: 0o711 });
    const staging = join(appDir, `${key}.saving-${randomUUID()}`);
    await mkdir(staging, { mode: 0o700 });
    try {
      await copy(join(workDir, folder), staging, signal);
      await rename(staging, join(this.#dir, id));
    } catch (error) {
      await rm(staging, { recursive: true, force: true });
      if (this.#entries.has(id)) return "dependencies: already cached"; // another build of the app saved the same key first
      return `dependencies: not cached (${firstLine(error)})`;
    }
    const entry: Entry = { folder, bytes, usedAt: Date.now() };
    this.#entries.set(id, entry);
    await this.#record(id, entry);
    const evicted = await this.#shrink(id);
    const dropped = evicted === 0 ? "" : `; ${evicted} least recently used entr${evicted === 1 ? "y" : "ies"} dropped`;
    return `dependencies cached for the next build with this lockfile (${formatBytes(bytes)}${dropped})`;
  }

  /** Evicts least recently used entries (never `keep`, nor one being copied out) until the bound holds. */
  async #shrink(keep: string): Promise<number> {
    let evicted = 0;
    let total = this.bytes;
    const order = [...this.#entries].filter(([id]) => id !== keep).sort((a, b) => a[1].usedAt - b[1].usedAt);
    for (const [id, entry] of order) {
      if (total <= this.#maxBytes) break;
      if (this.#reading.has(id)) continue;
      await this.#evict(id);
      total -= entry.bytes;
      evicted++;
    }
    return evicted;
  }

  async #evict(id: string): Promise<void> {
    this.#entries.delete(id);
    await rm(join(this.#dir, `${id}.json`), { force: true });
    await rm(join(this.#dir, id), { recursive: true, force: true });
  }

  async #record(id: string, entry: Entry): Promise<void> {
    const file = join(this.#dir, `${id}.json`);
    await writeFile(`${file}.tmp`, JSON.stringify(entry));
    await rename(`${file}.tmp`, file);
  }
}

/** Inputs of {@link installKey}. */
export interface InstallKeyInput {
  step: InstallStep;
  files: ProjectFiles;
  /** The project's real root on the host. */
  root: string;
  /** Every variable the install sees. */
  env: Record<string, string>;
  /** The PATH the install searches: the runtime whose version counts. */
  searchPath: string;
  /** The folder of wheels pip installs from, if any. */
  wheels: string | null;
}

/** The cache key of an install, or why it is not cached. */
export async function installKey(input: InstallKeyInput): Promise<CacheKey> {
  const { step, files } = input;
  const parts: unknown[] = [step.packageManager, step.command, step.viaNpx, step.lockfile, input.env];
  if (step.packageManager === "pip") {
    if (step.lockfile !== "requirements.txt") return { ok: false, why: `pip installs the ${step.lockfile} project itself, so its install is not cached` };
    const requirements = (await files.read("requirements.txt")) ?? "";
    const local = requirements.split("\n").map((line) => line.trim()).find((line) => LOCAL_REQUIREMENT.test(line));
    if (local !== undefined) return { ok: false, why: `requirements.txt names more than packages (${local.slice(0, 80)}), so its install is not cached` };
    parts.push(requirements, await runtimeVersion("python3", input.searchPath), input.wheels === null ? null : await wheelsListing(input.wheels));
    return { ok: true, key: digest(parts), folder: ".venv" };
  }
  const pkgText = await files.read("package.json");
  const pkg = pkgText === null ? {} : (JSON.parse(pkgText) as Record<string, unknown>);
  const scripts = typeof pkg.scripts === "object" && pkg.scripts !== null ? (pkg.scripts as Record<string, unknown>) : {};
  const hook = INSTALL_SCRIPTS.find((name) => name in scripts);
  if (hook !== undefined) return { ok: false, why: `package.json runs a "${hook}" script at install, so its install is not cached` };
  if ("workspaces" in pkg || (await files.exists("pnpm-workspace.yaml"))) return { ok: false, why: "a workspace's install is not cached" };
  const lockfile = await fileDigest(input.root, step.lockfile);
  if (lockfile === null) return { ok: false, why: `${step.lockfile} could not be read` };
  parts.push(lockfile, INSTALL_FIELDS.map((field) => pkg[field] ?? null));
  for (const name of NODE_INSTALL_FILES) parts.push(await files.read(name));
  parts.push(await runtimeVersion("node", input.searchPath));
  return { ok: true, key: digest(parts), folder: "node_modules" };
}

/** How long a runtime's version is trusted: a runtime upgraded on the host reaches the keys within this. */
const VERSION_TTL_MS = 60_000;
/** `<tool> --version` as the sandbox runs it, asked at most once a minute per tool and PATH. */
const versions = new Map<string, { version: Promise<string | null>; at: number }>();
function runtimeVersion(tool: "node" | "python3", searchPath: string): Promise<string | null> {
  const id = `${tool}\n${searchPath}`;
  const known = versions.get(id);
  if (known && Date.now() - known.at < VERSION_TTL_MS) return known.version;
  const version = exec(tool, ["--version"], { env: { PATH: searchPath }, timeout: 10_000 }).then(
    ({ stdout, stderr }) => (stdout || stderr).trim(),
    () => null,
  );
  versions.set(id, { version, at: Date.now() });
  return version;
}

/** Names and sizes of the wheels pip may install from. */
async function wheelsListing(dir: string): Promise<string[]> {
  const names = (await readdir(dir).catch(() => [])).sort();
  return Promise.all(names.map(async (name) => `${name} ${(await lstat(join(dir, name)).catch(() => null))?.size ?? "?"}`));
}

/** SHA-256 of a project file, streamed, read without following it out of the project; null when it cannot be read. */
async function fileDigest(root: string, path: string): Promise<string | null> {
  const handle = await openInside(root, path);
  if (!handle) return null;
  const hash = createHash("sha256");
  for await (const chunk of handle.createReadStream()) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

function digest(parts: unknown[]): string {
  return createHash("sha256").update(JSON.stringify(parts)).digest("hex").slice(0, 32);
}

function entryId(scope: CacheScope, key: string): string {
  return `${scope.tenant}/${scope.app}/${key}`;
}

/** Apparent bytes of a folder (not a link to one), links and all counted as they are; null when it is not a folder. */
async function sizeOf(path: string, signal: AbortSignal): Promise<number | null> {
  const stat = await lstat(path).catch(() => null);
  if (!stat?.isDirectory()) return null;
  const { stdout } = await exec("du", ["-sb", "--", path], { env: { PATH: "/usr/bin:/bin" }, signal });
  return Number.parseInt(stdout, 10);
}

/** `cp -a` of a folder into `into`: no link followed, no FIFO read, owners and modes kept. */
async function copy(folder: string, into: string, signal: AbortSignal): Promise<void> {
  await exec("cp", ["-a", "--no-dereference", "--", folder, `${into}/`], { env: { PATH: "/usr/bin:/bin" }, signal, maxBuffer: 1024 * 1024 });
}

/** What a failed copy said: the command's own first complaint rather than "Command failed: …". */
function firstLine(error: unknown): string {
  const stderr = typeof error === "object" && error !== null && "stderr" in error ? String(error.stderr).trim() : "";
  const text = stderr !== "" ? stderr : error instanceof Error ? error.message : String(error);
  return text.split("\n")[0] ?? text;
}
