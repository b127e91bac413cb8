/**
 * What this host offers the sandbox, found out once at startup: bubblewrap and
 * user namespaces (required: without them every job fails, naming what is
 * missing), cgroups (memory, process and CPU limits), the run network, the
 * registry proxy for builds, and loop-mounted filesystems (hard disk quotas).
 * The builder prints one line per mechanism, so an operator sees exactly which
 * limits hold on this machine.
 */
import { execFile } from "node:child_process";
import { constants } from "node:fs";
import { access, lstat, mkdir, readdir, readlink, realpath, rmdir } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { type Cgroups, detectCgroups } from "./cgroups.js";
import { FsImages, isMountPoint } from "./fs-image.js";
import { RunNetwork, hostResolvers } from "./network.js";
import { RegistryProxy } from "./registry-proxy.js";
import type { JobUser } from "./tenants.js";

const run = promisify(execFile);
const BWRAP_CANDIDATES = ["/usr/bin/bwrap", "/usr/local/bin/bwrap"];
const ALIAS_DIR = "/run/svc-builder";

/** Top-level system directories a job sees read-only (symlinks are recreated as symlinks). */
const SYSTEM_DIRS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];


export interface SandboxHostOptions {
  dataDir: string;
  /** The registry builds may reach (the builder's NPM_CONFIG_REGISTRY); null: the public npm registry. */
  npmRegistry: string | null;
  /** The python package index builds may reach too (BUILDER_PIP_INDEX_URL); null: none. */
  pipIndexUrl?: string | null;
  /** A uid to try the sandbox with at startup (the first tenant uid of a root builder). */
  probeUser: JobUser | null;
}

function errorLine(error: unknown): string {
  const stderr = (error as { stderr?: string }).stderr?.trim();
  return (stderr || (error instanceof Error ? error.message : String(error))).split("\n")[0]!;
}

export class SandboxHost {
  /** Why no sandbox can be made here; every job then fails with this (fail closed). */
  readonly failure: string | null;
  readonly bwrap: string;
  readonly cgroups: Cgroups | null;
  /** Namespaces with outbound access for runs; null: runs get no network. */
  readonly network: RunNetwork | null;
  readonly registry: RegistryProxy;
  /** Disks and build scratch space are loop-mounted filesystems (hard limits). */
  readonly images: boolean;
  /** Argument pairs that give a job the host's system directories, read-only. */
  readonly systemArgs: string[];
  /** Printed at startup: one line per mechanism. */
  readonly summary: string[];
  readonly #alias: { from: string; to: string } | null;

  private constructor(fields: {
    failure: string | null;
    bwrap: string;
    cgroups: Cgroups | null;
    network: RunNetwork | null;
    registry: RegistryProxy;
    images: boolean;
    systemArgs: string[];
    summary: string[];
    alias: { from: string; to: string } | null;
  }) {
    this.failure = fields.failure;
    this.bwrap = fields.bwrap;
    this.cgroups = fields.cgroups;
    this.network = fields.network;
    this.registry = fields.registry;
    this.images = fields.images;
    this.systemArgs = fields.systemArgs;
    this.summary = fields.summary;
    this.#alias = fields.alias;
  }

  static async open(options: SandboxHostOptions): Promise<SandboxHost> {
    const summary: string[] = [];
    const bwrap = await firstExecutable(BWRAP_CANDIDATES);
    const systemArgs = await systemBinds();
    const cgroups = await detectCgroups();
    summary.push(
      "reason" in cgroups
        ? `limits: ${cgroups.reason}; memory by RSS sampling, no process or CPU limit`
        : `limits: ${cgroups.description}: memory (OOMKilled), processes, CPU share`,
    );
    const imagesProblem = await FsImages.probe();
    summary.push(
      imagesProblem === null
        ? "disks and build scratch: loop-mounted ext4 filesystems (hard quotas)"
        : `disks and build scratch: plain directories, quota measured only (${imagesProblem})`,
    );
    const network = await RunNetwork.open();
    summary.push(`network: ${"reason" in network ? network.reason : network.description}; builds reach only the package registry`);
    const registry = await RegistryProxy.open(await socketPath(options.dataDir), options.npmRegistry, options.pipIndexUrl ?? null);

    let failure: string | null = null;
    let alias: { from: string; to: string } | null = null;
    if (bwrap === null) {
      failure = "bubblewrap (bwrap) is not installed on the builder host (Debian/Ubuntu: apt-get install bubblewrap)";
    } else {
      const probe = await probeSandbox(bwrap, systemArgs, options.dataDir, options.probeUser);
      if (probe !== null && options.probeUser && process.getuid?.() === 0 && /Permission denied/.test(probe)) {
        // A parent of the data dir is closed to other users (e.g. under /root): show it to jobs through an alias.
        alias = await aliasDataDir(options.dataDir);
        const retry = await probeSandbox(bwrap, systemArgs, alias.to, options.probeUser);
        failure = retry === null ? null : describeProbeFailure(retry);
      } else if (probe !== null) {
        failure = describeProbeFailure(probe);
      }
    }
    summary.unshift(
      failure === null
        ? `sandbox: bubblewrap (${bwrap}): own user, PID, mount, IPC, UTS and network namespaces per job${alias ? `; data dir shown to jobs through ${alias.to}` : ""}`
        : `sandbox: UNAVAILABLE, every job will fail: ${failure}`,
    );
    return new SandboxHost({
      failure,
      bwrap: bwrap ?? "bwrap",
      cgroups: "reason" in cgroups ? null : cgroups,
      network: "reason" in network ? null : network,
      registry,
      images: imagesProblem === null,
      systemArgs,
      summary,
      alias,
    });
  }

  /** The path bubblewrap (running as the job's user) opens for a host path under the data dir. */
  visible(path: string): string {
    if (this.#alias && (path === this.#alias.from || path.startsWith(`${this.#alias.from}/`))) {
      return this.#alias.to + path.slice(this.#alias.from.length);
    }
    return path;
  }

  async close(): Promise<void> {
    await this.registry.close();
    await this.network?.close();
    if (this.#alias) {
      await FsImages.unmount(this.#alias.to).catch(() => undefined);
      await rmdir(this.#alias.to).catch(() => undefined);
      // The data dir's own bind (made shared for the alias) goes too, so nothing stays mounted.
      await FsImages.unmount(this.#alias.from).catch(() => undefined);
    }
  }
}

async function firstExecutable(paths: string[]): Promise<string | null> {
  for (const path of paths) {
    try {
      await access(path, constants.X_OK);
      return path;
    } catch {
      // try the next
    }
  }
  return null;
}

/** `--ro-bind /usr /usr`, `--symlink usr/bin /bin`, … for what this host has. */
async function systemBinds(): Promise<string[]> {
  const args: string[] = [];
  for (const dir of SYSTEM_DIRS) {
    const stats = await lstat(dir).catch(() => null);
    if (!stats) continue;
    if (stats.isSymbolicLink()) {
      args.push("--symlink", await readlink(dir), dir);
    } else if (stats.isDirectory()) {
      args.push("--ro-bind", dir, dir);
    }
  }
  // Jobs can resolve names only through a resolver they can reach: not a host-local stub (127.0.0.53).
  const resolvers = await hostResolvers();
  if (resolvers.length > 0 && resolvers.every((address) => address.startsWith("127."))) {
    const upstream = "/run/systemd/resolve/resolv.conf";
    if ((await hostResolvers(upstream)).length > 0) args.push("--ro-bind", upstream, "/etc/resolv.conf");
  }
  return args;
}

/** Where the registry proxy listens: beside the data, unless that path is too long for a unix socket. */
async function socketPath(dataDir: string): Promise<string> {
  const inData = join(dataDir, "registry.sock");
  if (Buffer.byteLength(inData) < 100) return inData;
  const dir = join(ALIAS_DIR, `sockets-${process.pid}`);
  await mkdir(dir, { recursive: true, mode: 0o711 });
  return join(dir, "registry.sock");
}

/** Runs `/bin/true` in a minimal sandbox as `user`, with the data dir bound; null when it worked, else bwrap's complaint. */
async function probeSandbox(bwrap: string, systemArgs: string[], dataDir: string, user: JobUser | null): Promise<string | null> {
  const args = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--die-with-parent",
    ...systemArgs,
    "--proc",
    "/proc",
    "--ro-bind",
    dataDir,
    "/probe",
    "--",
    "/bin/true",
  ];
  try {
    await run(bwrap, args, { timeout: 10_000, env: { PATH: "/usr/bin:/bin" }, ...(user ? { uid: user.uid, gid: user.gid } : {}) });
    return null;
  } catch (error) {
    return errorLine(error);
  }
}

function describeProbeFailure(line: string): string {
  if (/setting up uid map|Creating new namespace failed|No permissions to creat|Operation not permitted/.test(line)) {
    return `user namespaces are not available to the builder (${line}); enable them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) or allow them in the container's seccomp/AppArmor profile`;
  }
  return `bubblewrap could not create a sandbox: ${line}`;
}

/**
 * Shows the data dir where any user can traverse (root only): the data dir is
 * made a shared mount and bound at /run/svc-builder/data-<pid>, so filesystems
 * mounted below it later (disks, build scratch space) appear there too. Aliases
 * of builders that died go first.
 */
async function aliasDataDir(dataDir: string): Promise<{ from: string; to: string }> {
  await mkdir(ALIAS_DIR, { recursive: true, mode: 0o711 });
  for (const name of await readdir(ALIAS_DIR).catch(() => [] as string[])) {
    const owner = Number(/^data-(\d+)$/.exec(name)?.[1]);
    if (!owner || owner === process.pid) continue;
    let alive = true;
    try {
      process.kill(owner, 0);
    } catch {
      alive = false;
    }
    if (alive) continue;
    await FsImages.unmount(join(ALIAS_DIR, name)).catch(() => undefined);
    await rmdir(join(ALIAS_DIR, name)).catch(() => undefined);
  }
  const source = await realpath(dataDir);
  if (!(await isMountPoint(source))) await run("mount", ["--bind", source, source]);
  await run("mount", ["--make-shared", source]);
  const to = join(ALIAS_DIR, `data-${process.pid}`);
  await mkdir(to, { recursive: true, mode: 0o711 });
  if (!(await isMountPoint(to))) await run("mount", ["--bind", source, to]);
  return { from: dataDir, to };
}
