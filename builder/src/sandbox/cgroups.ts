/**
 * Per-job resource limits through cgroups, on whichever hierarchy the host
 * offers the builder:
 *
 * - cgroup v2 (unified): one cgroup per job with `memory.max` (no swap,
 *   `memory.oom.group`), `pids.max`, and `cpu.weight`;
 * - cgroup v1 (this project's development VM, many older hosts): one cgroup per
 *   job in each of the `memory` (`memory.limit_in_bytes`, `memory.memsw…` where
 *   swap accounting exists), `pids` (`pids.max`) and `cpu` (`cpu.shares`)
 *   hierarchies, and `cpuacct` for the CPU time used (app metrics).
 *
 * Both read what a job uses (CPU seconds, memory charged) for app processes'
 * metrics (docs/metrics.md): `cpu.stat` and `memory.current` on v2,
 * `cpuacct.usage` and `memory.usage_in_bytes` on v1.
 *
 * A job's cgroup is made, joined, read and removed with synchronous calls: they
 * are in-kernel operations that never block on a disk, and a round trip through
 * the thread pool for each would cost more than the work itself.
 *
 * Jobs live under a parent named after the builder process (`svc-builder-<pid>`),
 * so several builders on one host never touch each other's jobs, and parents
 * left by a builder that died are removed at the next start. With neither
 * (read-only cgroupfs, an unprivileged builder without delegation) the caller
 * falls back to sampling memory and has no process or CPU limit, and says so.
 */
import { constants, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { access, appendFile, mkdir, readFile, readdir, realpath, rmdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/** What one job may use. */
export interface JobLimits {
  memoryBytes: number;
  /** Most processes (threads count too) alive at once: a fork bomb stops here. */
  pids: number;
  /** Relative CPU weight, 1–10000 (100 = one ordinary job). */
  cpuWeight: number;
}

/** What a sandbox's processes use: CPU seconds since it started (null: not measured), and memory now. */
export type ProcessUsage = { cpuSeconds: number | null; memoryBytes: number };

/** One job's cgroup(s): membership, peak memory, usage, OOM kills. */
export interface JobCgroup {
  /**
   * The `cgroup.procs` files a process writes its own pid to, before it starts
   * the job, to enter the job's cgroups with everything it will start.
   */
  readonly procsFiles: string[];
  /** Peak bytes so far and whether the kernel's OOM killer struck. */
  sample(): Promise<{ peakBytes: number; oomKilled: boolean }>;
  /** CPU seconds the cgroup's processes used so far (null without the accounting: cpuacct on v1) and the memory it is charged now. */
  usage(): ProcessUsage;
  /** SIGKILLs every process in the cgroup(s) now; how many there were. */
  kill(): number;
  /** Kills whatever is left and removes the cgroup(s). */
  remove(): Promise<void>;
}

/** Creates job cgroups on one kind of hierarchy. */
export interface Cgroups {
  /** `cgroup v1 (memory, pids, cpu)` or `cgroup v2 (memory, pids, cpu)`, for the startup line. */
  readonly description: string;
  /** This builder's parent directories, one per hierarchy: every job's cgroup is a child of each. */
  readonly parents: readonly string[];
  create(jobId: string, limits: JobLimits): Promise<JobCgroup>;
}

const PARENT_PREFIX = "svc-builder-";

async function exists(path: string, mode = constants.F_OK): Promise<boolean> {
  try {
    await access(path, mode);
    return true;
  } catch {
    return false;
  }
}

function readNumber(path: string): number | null {
  try {
    const value = Number(readFileSync(path, "utf8").trim());
    return Number.isFinite(value) ? value : null;
  } catch {
    return null;
  }
}

/** Writes a control file that some kernels lack (swap accounting, oom.group); the main limit still holds. */
function writeOptional(path: string, value: string): void {
  try {
    writeFileSync(path, value);
  } catch {
    // not on this kernel
  }
}

/** Whether a process of that id exists (one of another user's counts: EPERM). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function pidsOf(dir: string): number[] {
  try {
    return readFileSync(join(dir, "cgroup.procs"), "utf8").split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Removes a cgroup directory, killing its members until the kernel lets it go (exiting tasks leave it a moment late). */
async function removeDir(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 200; attempt++) {
    try {
      rmdirSync(dir);
      return;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
      killMembers(dir);
      await sleep(attempt < 10 ? 1 : 20);
    }
  }
  console.error(`builder: could not remove cgroup ${dir}`);
}

function killMembers(dir: string): number {
  const pids = pidsOf(dir);
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
  return pids.length;
}

/** Removes the job parents of builders that are no longer running (and their empty job cgroups). */
async function removeStaleParents(base: string): Promise<void> {
  for (const entry of await readdir(base, { withFileTypes: true }).catch(() => [])) {
    if (!entry.isDirectory() || !entry.name.startsWith(PARENT_PREFIX)) continue;
    const owner = Number(entry.name.slice(PARENT_PREFIX.length));
    if (owner === process.pid || (Number.isInteger(owner) && pidAlive(owner))) continue;
    const parent = join(base, entry.name);
    for (const job of await readdir(parent, { withFileTypes: true }).catch(() => [])) {
      if (job.isDirectory()) await removeDir(join(parent, job.name));
    }
    await rmdir(parent).catch(() => undefined);
  }
}

// ---------------------------------------------------------------------------
// cgroup v2
// ---------------------------------------------------------------------------

class V2Cgroups implements Cgroups {
  readonly description: string;
  readonly parents: readonly string[];
  readonly #parent: string;
  readonly #controllers: Set<string>;

  constructor(parent: string, controllers: Set<string>) {
    this.#parent = parent;
    this.parents = [parent];
    this.#controllers = controllers;
    this.description = `cgroup v2 (${[...controllers].join(", ")})`;
  }

  /** The delegated subtree under the builder's own cgroup, or null when the host cannot give one. */
  static async detect(mountPoint: string): Promise<V2Cgroups | null> {
    if (!(await exists(join(mountPoint, "cgroup.controllers")))) return null;
    const ownPath = /^0::(.*)$/m.exec(await readFile("/proc/self/cgroup", "utf8"))?.[1];
    if (ownPath === undefined) return null;
    const base = join(mountPoint, ownPath);
    const available = new Set((await readFile(join(base, "cgroup.controllers"), "utf8")).split(/\s+/).filter(Boolean));
    if (!available.has("memory") || !(await exists(join(base, "cgroup.subtree_control"), constants.W_OK))) return null;
    const wanted = ["memory", "pids", "cpu"].filter((name) => available.has(name));
    const enable = async (dir: string) => {
      for (const name of wanted) await appendFile(join(dir, "cgroup.subtree_control"), `+${name}`);
    };
    try {
      await enable(base);
    } catch {
      // "No internal processes": the builder must leave `base` before `base` may delegate.
      const members = pidsOf(base);
      if (members.some((pid) => pid !== process.pid) && ownPath !== "/") return null;
      await mkdir(join(base, "svc-builder"), { recursive: true });
      for (const pid of members) await writeFile(join(base, "svc-builder", "cgroup.procs"), String(pid));
      await enable(base);
    }
    await removeStaleParents(base);
    const parent = join(base, `${PARENT_PREFIX}${process.pid}`);
    await mkdir(parent, { recursive: true });
    await enable(parent);
    return new V2Cgroups(parent, new Set(wanted));
  }

  async create(jobId: string, limits: JobLimits): Promise<JobCgroup> {
    const dir = join(this.#parent, jobId);
    mkdirSync(dir);
    try {
      writeFileSync(join(dir, "memory.max"), String(limits.memoryBytes));
      writeOptional(join(dir, "memory.swap.max"), "0");
      writeOptional(join(dir, "memory.oom.group"), "1");
      if (this.#controllers.has("pids")) writeFileSync(join(dir, "pids.max"), String(limits.pids));
      if (this.#controllers.has("cpu")) writeFileSync(join(dir, "cpu.weight"), String(limits.cpuWeight));
    } catch (error) {
      await removeDir(dir);
      throw error;
    }
    return new V2JobCgroup(dir);
  }
}

class V2JobCgroup implements JobCgroup {
  readonly #dir: string;
  #peak = 0;

  constructor(dir: string) {
    this.#dir = dir;
  }

  get procsFiles(): string[] {
    return [join(this.#dir, "cgroup.procs")];
  }

  async sample(): Promise<{ peakBytes: number; oomKilled: boolean }> {
    const peak = readNumber(join(this.#dir, "memory.peak")) ?? readNumber(join(this.#dir, "memory.current"));
    if (peak !== null) this.#peak = Math.max(this.#peak, peak);
    let events = "";
    try {
      events = readFileSync(join(this.#dir, "memory.events"), "utf8");
    } catch {
      // gone with the job
    }
    return { peakBytes: this.#peak, oomKilled: Number(/^oom_kill (\d+)$/m.exec(events)?.[1] ?? 0) > 0 };
  }

  usage(): ProcessUsage {
    let stat = "";
    try {
      stat = readFileSync(join(this.#dir, "cpu.stat"), "utf8");
    } catch {
      // gone with the job
    }
    const micros = /^usage_usec (\d+)$/m.exec(stat)?.[1];
    return { cpuSeconds: micros === undefined ? null : Number(micros) / 1e6, memoryBytes: readNumber(join(this.#dir, "memory.current")) ?? 0 };
  }

  kill(): number {
    return killMembers(this.#dir);
  }

  async remove(): Promise<void> {
    writeOptional(join(this.#dir, "cgroup.kill"), "1");
    await removeDir(this.#dir);
  }
}

// ---------------------------------------------------------------------------
// cgroup v1
// ---------------------------------------------------------------------------

/** CPU shares of one job on v1: the same as one ordinary process, whatever the job's process count. */
const V1_SHARES_PER_WEIGHT = 1024 / 100;

class V1Cgroups implements Cgroups {
  readonly description: string;
  readonly parents: readonly string[];
  /** Controller name → this builder's parent directory in that hierarchy. */
  readonly #parents: Map<string, string>;

  constructor(parents: Map<string, string>) {
    this.#parents = parents;
    this.parents = [...parents.values()];
    this.description = `cgroup v1 (${[...parents.keys()].join(", ")})`;
  }

  /** The memory, pids, cpu and cpuacct hierarchies, when mounted and writable (memory is required). */
  static async detect(mountPoint: string): Promise<V1Cgroups | null> {
    const own = new Map<string, string>();
    for (const line of (await readFile("/proc/self/cgroup", "utf8")).split("\n")) {
      const [, controllers, path] = line.split(":");
      if (controllers === undefined || path === undefined) continue;
      for (const name of controllers.split(",")) own.set(name, path);
    }
    const parents = new Map<string, string>();
    const hierarchies = new Set<string>();
    for (const name of ["memory", "pids", "cpu", "cpuacct"]) {
      const path = own.get(name);
      const base = path === undefined ? null : join(mountPoint, name, path);
      if (!base || !(await exists(join(base, "cgroup.procs"), constants.W_OK))) continue;
      // cpu and cpuacct mounted together are one hierarchy: one directory serves both.
      const hierarchy = await realpath(base);
      if (hierarchies.has(hierarchy)) continue;
      hierarchies.add(hierarchy);
      try {
        await removeStaleParents(base);
        const parent = join(base, `${PARENT_PREFIX}${process.pid}`);
        await mkdir(parent, { recursive: true });
        parents.set(name, parent);
      } catch {
        // read-only or not delegated: this controller is not ours
      }
    }
    return parents.has("memory") ? new V1Cgroups(parents) : null;
  }

  async create(jobId: string, limits: JobLimits): Promise<JobCgroup> {
    const dirs = new Map<string, string>();
    try {
      for (const [name, parent] of this.#parents) {
        const dir = join(parent, jobId);
        mkdirSync(dir);
        dirs.set(name, dir);
      }
      const memory = dirs.get("memory")!;
      writeFileSync(join(memory, "memory.limit_in_bytes"), String(limits.memoryBytes));
      // Memory plus swap capped at the same value: the job cannot swap its way past the limit.
      writeOptional(join(memory, "memory.memsw.limit_in_bytes"), String(limits.memoryBytes));
      const pids = dirs.get("pids");
      if (pids) writeFileSync(join(pids, "pids.max"), String(limits.pids));
      const cpu = dirs.get("cpu");
      if (cpu) writeFileSync(join(cpu, "cpu.shares"), String(Math.max(2, Math.round(limits.cpuWeight * V1_SHARES_PER_WEIGHT))));
    } catch (error) {
      for (const dir of dirs.values()) await removeDir(dir);
      throw error;
    }
    return new V1JobCgroup(dirs);
  }
}

class V1JobCgroup implements JobCgroup {
  readonly #dirs: Map<string, string>;
  readonly #memory: string;

  constructor(dirs: Map<string, string>) {
    this.#dirs = dirs;
    this.#memory = dirs.get("memory")!;
  }

  get procsFiles(): string[] {
    return [...this.#dirs.values()].map((dir) => join(dir, "cgroup.procs"));
  }

  async sample(): Promise<{ peakBytes: number; oomKilled: boolean }> {
    const peak = readNumber(join(this.#memory, "memory.max_usage_in_bytes")) ?? 0;
    // v1 kills one process, not the group; the caller ends the rest once it sees the count.
    let control = "";
    try {
      control = readFileSync(join(this.#memory, "memory.oom_control"), "utf8");
    } catch {
      // gone with the job
    }
    return { peakBytes: peak, oomKilled: Number(/^oom_kill (\d+)$/m.exec(control)?.[1] ?? 0) > 0 };
  }

  usage(): ProcessUsage {
    // cpuacct is its own hierarchy on some hosts and mounted with cpu on others (then the cpu directory has its files).
    const accounting = this.#dirs.get("cpuacct") ?? this.#dirs.get("cpu");
    const nanos = accounting === undefined ? null : readNumber(join(accounting, "cpuacct.usage"));
    return { cpuSeconds: nanos === null ? null : nanos / 1e9, memoryBytes: readNumber(join(this.#memory, "memory.usage_in_bytes")) ?? 0 };
  }

  kill(): number {
    let killed = 0;
    for (const dir of this.#dirs.values()) killed = Math.max(killed, killMembers(dir));
    return killed;
  }

  async remove(): Promise<void> {
    for (const dir of this.#dirs.values()) await removeDir(dir);
  }
}

/**
 * The job cgroups this host lets the builder create (v2 preferred, then v1),
 * or null with the reason when it lets it create none.
 */
export async function detectCgroups(mountPoint = "/sys/fs/cgroup"): Promise<Cgroups | { reason: string }> {
  try {
    const found = (await V2Cgroups.detect(mountPoint)) ?? (await V1Cgroups.detect(mountPoint));
    if (found) return found;
    return { reason: "no writable cgroup v2 subtree or cgroup v1 memory hierarchy" };
  } catch (error) {
    return { reason: `cgroups unavailable: ${error instanceof Error ? error.message : String(error)}` };
  }
}
