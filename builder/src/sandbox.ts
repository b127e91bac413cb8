/**
 * Everything that touches a user's processes lives here: spawning the command
 * in its own process group with a scrubbed environment, the limits (wall clock,
 * memory, disk quota) and the capture of its output into the job log.
 *
 * Memory is limited by cgroup v2 (`memory.max`, one child cgroup per job) when the
 * builder can delegate one; otherwise by sampling the summed RSS of the job's
 * process tree from /proc every 100 ms and killing the tree past the limit. The
 * fallback is best effort: a process can overshoot the limit between samples,
 * and pages shared between processes of the tree count once per process.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, constants, openSync, readFileSync, readSync, readdirSync } from "node:fs";
import { type FileHandle, access, appendFile, mkdir, open, readFile, readdir, rmdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Readable, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { measureDirectoryBytes } from "./disks.js";
import {
  type JobFailureReason,
  LOG_LIMIT_BYTES,
  LOG_MAX_LINE_BYTES,
  LOG_TRUNCATION_MARKER,
  type LogStream,
} from "./protocol.js";

/** PATH a job gets unless its own env sets one. */
export const DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin";
/** Time a job's processes get between SIGTERM and SIGKILL. */
const KILL_GRACE_MS = 2_000;
/** Longest wait for a finished job's pipes to be read to the end (only a process that escaped the tree can hold them open). */
const OUTPUT_DRAIN_MS = 30_000;
const MEMORY_SAMPLE_MS = 100;
const DISK_SAMPLE_MIN_MS = 2_000;
/** Room kept below the log cap for the builder's own closing lines. */
const LOG_RESERVE_BYTES = 4_096;
const NEWLINE = Buffer.from("\n");
const MIB = 1024 * 1024;

/** Unix user the job's processes run as (only when the builder runs as root). */
export interface JobUser {
  uid: number;
  gid: number;
}

// ---------------------------------------------------------------------------
// Job log
// ---------------------------------------------------------------------------

/**
 * The log file of one job. Output is split into timestamped lines (format in
 * protocol.ts), appended through one queue per job so lines of different jobs
 * can never mix, and capped at LOG_LIMIT_BYTES with a single truncation marker.
 * `bytes` counts what is already on disk, so followers never read past it.
 */
export class JobLog {
  readonly #file: FileHandle;
  readonly #onChange: () => void;
  readonly #partial = new Map<LogStream, Buffer>();
  #queue: Buffer[] = [];
  #draining: Promise<void> | null = null;
  #accepted = 0;
  #flushed = 0;
  #truncated = false;
  #writeFailed = false;

  private constructor(file: FileHandle, onChange: () => void) {
    this.#file = file;
    this.#onChange = onChange;
  }

  /** Opens (creating or appending to) the log at `path`; `onChange` fires after each flush. */
  static async open(path: string, onChange: () => void): Promise<JobLog> {
    return new JobLog(await open(path, "a", 0o600), onChange);
  }

  /** Bytes written to the file so far. */
  get bytes(): number {
    return this.#flushed;
  }

  /** Whether the command's output was cut at the cap. */
  get truncated(): boolean {
    return this.#truncated;
  }

  /** Appends one builder message (`svc` line). */
  note(text: string): void {
    for (const line of text.split("\n")) {
      const record = Buffer.from(`${new Date().toISOString()} svc ${line}\n`);
      if (this.#accepted + record.length > LOG_LIMIT_BYTES) return;
      this.#accepted += record.length;
      this.#enqueue(record);
    }
  }

  /** Copies a child's stdout or stderr into the log, line by line. */
  capture(stream: "out" | "err", source: Readable): void {
    source.on("data", (chunk: Buffer) => this.#ingest(stream, chunk));
    source.on("end", () => this.#flushPartial(stream));
  }

  /** Writes pending partial lines, waits for the queue to reach the file, closes it. */
  async close(): Promise<void> {
    this.#flushPartial("out");
    this.#flushPartial("err");
    while (this.#draining) await this.#draining;
    await this.#file.close();
  }

  #ingest(stream: "out" | "err", chunk: Buffer): void {
    if (this.#truncated) return; // keep reading so the child never blocks, but drop it
    const pending = this.#partial.get(stream);
    const data = pending ? Buffer.concat([pending, chunk]) : chunk;
    const prefix = Buffer.from(`${new Date().toISOString()} ${stream} `);
    const parts: Buffer[] = [];
    let start = 0;
    for (;;) {
      const newline = data.indexOf(0x0a, start);
      let line: Buffer;
      if (newline !== -1 && newline - start <= LOG_MAX_LINE_BYTES) {
        line = data.subarray(start, newline);
        start = newline + 1;
      } else if (data.length - start >= LOG_MAX_LINE_BYTES) {
        line = data.subarray(start, start + LOG_MAX_LINE_BYTES);
        start += LOG_MAX_LINE_BYTES;
      } else {
        break;
      }
      if (!this.#admit(prefix.length + line.length + 1)) break;
      parts.push(prefix, line, NEWLINE);
    }
    if (this.#truncated) this.#partial.clear();
    else this.#partial.set(stream, Buffer.from(data.subarray(start)));
    if (parts.length > 0) this.#enqueue(Buffer.concat(parts));
  }

  #flushPartial(stream: "out" | "err"): void {
    const pending = this.#partial.get(stream);
    this.#partial.delete(stream);
    if (!pending || pending.length === 0 || this.#truncated) return;
    const record = Buffer.concat([Buffer.from(`${new Date().toISOString()} ${stream} `), pending, NEWLINE]);
    if (this.#admit(record.length)) this.#enqueue(record);
  }

  /** Reserves room for command output; at the cap, writes the marker instead. */
  #admit(length: number): boolean {
    if (this.#accepted + length <= LOG_LIMIT_BYTES - LOG_RESERVE_BYTES) {
      this.#accepted += length;
      return true;
    }
    this.#truncated = true;
    this.note(LOG_TRUNCATION_MARKER);
    return false;
  }

  #enqueue(record: Buffer): void {
    if (this.#writeFailed) return;
    this.#queue.push(record);
    this.#draining ??= this.#drain();
  }

  async #drain(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        const batch = Buffer.concat(this.#queue);
        this.#queue = [];
        await this.#file.appendFile(batch);
        this.#flushed += batch.length;
        this.#onChange();
      }
    } catch (error) {
      this.#writeFailed = true;
      this.#queue = [];
      console.error(`builder: job log write failed: ${String(error)}`);
    } finally {
      this.#draining = null;
    }
  }
}

// ---------------------------------------------------------------------------
// Process tree (from /proc)
// ---------------------------------------------------------------------------

interface ProcEntry {
  pid: number;
  ppid: number;
  pgid: number;
  state: string;
  startTime: string;
}

const statBuffer = Buffer.alloc(4096);

/**
 * Reads /proc/<pid>/stat. Synchronous on purpose: procfs never blocks on a
 * disk, and a scan this way costs about a tenth of the promise-based one.
 */
function readProcEntry(pid: string): ProcEntry | null {
  let stat: string;
  try {
    const fd = openSync(`/proc/${pid}/stat`, "r");
    try {
      stat = statBuffer.toString("latin1", 0, readSync(fd, statBuffer, 0, statBuffer.length, 0));
    } finally {
      closeSync(fd);
    }
  } catch {
    return null; // exited meanwhile
  }
  // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return {
    pid: Number(pid),
    state: fields[0] ?? "",
    ppid: Number(fields[1]),
    pgid: Number(fields[2]),
    startTime: fields[19] ?? "",
  };
}

let procTableCache: { at: number; entries: ProcEntry[] } | null = null;

/**
 * Every process on the host. Concurrent jobs sample their trees on the same
 * 100 ms rhythm, so a scan younger than `maxAgeMs` is shared between them;
 * killing always asks for a fresh one (maxAgeMs 0).
 */
function procTable(maxAgeMs: number): ProcEntry[] {
  const now = performance.now();
  if (procTableCache && now - procTableCache.at <= maxAgeMs) return procTableCache.entries;
  const entries: ProcEntry[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const entry = readProcEntry(name);
    if (entry) entries.push(entry);
  }
  procTableCache = { at: now, entries };
  return entries;
}

function residentBytes(pid: number): number {
  try {
    const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return match ? Number(match[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Whether any process is still in the process group (signal 0 only checks). */
function groupExists(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * The processes of one job: its process group, everything descending from the
 * root by parent pid (including processes that called setsid), and every process
 * seen in an earlier scan (matched by start time, so a reused pid is never
 * mistaken for a member) even after it was orphaned.
 */
class ProcessTree {
  readonly #rootPid: number;
  #rootAlive = true;
  #known = new Map<number, string>();

  constructor(rootPid: number) {
    this.#rootPid = rootPid;
  }

  /** After the root is reaped its pid may be reused, so it no longer seeds the scan. */
  rootExited(): void {
    this.#rootAlive = false;
  }

  /** Current members; `maxAgeMs` allows a shared recent scan (see procTable). */
  members(maxAgeMs: number): ProcEntry[] {
    // Nothing can be left when the group is empty and no earlier scan saw a member
    // outside it: skip the scan, which dominates the cost of a short job's cleanup.
    if (!this.#rootAlive && this.#known.size === 0 && !groupExists(this.#rootPid)) return [];
    const table = procTable(maxAgeMs);
    const members = new Map<number, ProcEntry>();
    const children = new Map<number, ProcEntry[]>();
    for (const entry of table) {
      if (entry.pid === process.pid) continue;
      const siblings = children.get(entry.ppid);
      if (siblings) siblings.push(entry);
      else children.set(entry.ppid, [entry]);
      const seed =
        (this.#rootAlive && entry.pid === this.#rootPid) ||
        entry.pgid === this.#rootPid ||
        this.#known.get(entry.pid) === entry.startTime;
      if (seed) members.set(entry.pid, entry);
    }
    const pending = [...members.values()];
    for (let entry = pending.pop(); entry; entry = pending.pop()) {
      for (const child of children.get(entry.pid) ?? []) {
        if (members.has(child.pid) || child.pid === process.pid) continue;
        members.set(child.pid, child);
        pending.push(child);
      }
    }
    this.#known = new Map([...members.values()].map((entry) => [entry.pid, entry.startTime]));
    return [...members.values()];
  }
}

// ---------------------------------------------------------------------------
// cgroup v2
// ---------------------------------------------------------------------------

async function writable(path: string): Promise<boolean> {
  try {
    await access(path, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

async function readNumber(path: string): Promise<number | null> {
  try {
    const value = Number((await readFile(path, "utf8")).trim());
    return Number.isFinite(value) ? value : null;
  } catch {
    return null;
  }
}

async function writeOptional(path: string, value: string): Promise<void> {
  try {
    await writeFile(path, value);
  } catch {
    // Older kernels lack memory.swap.max / memory.oom.group; memory.max still holds.
  }
}

/**
 * The cgroup v2 subtree the builder delegates to its jobs, or null when the host
 * cannot provide one (cgroup v1 or hybrid, read-only /sys/fs/cgroup, no memory
 * controller). Layout under the builder's own cgroup: `svc-builder/` holds the
 * builder process (cgroup v2 forbids processes in a cgroup whose controllers are
 * delegated), `svc-jobs/<job id>/` one cgroup per running job.
 */
export class CgroupV2 {
  readonly #jobsDir: string;

  private constructor(jobsDir: string) {
    this.#jobsDir = jobsDir;
  }

  /** Sets the subtree up; any failure means "use the RSS fallback", with the reason logged. */
  static async detect(mountPoint = "/sys/fs/cgroup"): Promise<CgroupV2 | null> {
    try {
      await access(join(mountPoint, "cgroup.controllers"));
    } catch {
      return null; // not a cgroup v2 host: the normal case on v1 and hybrid hosts
    }
    try {
      const self = await readFile("/proc/self/cgroup", "utf8");
      const ownPath = /^0::(.*)$/m.exec(self)?.[1];
      if (ownPath === undefined) return null;
      const base = join(mountPoint, ownPath);
      const controllers = (await readFile(join(base, "cgroup.controllers"), "utf8")).split(/\s+/);
      if (!controllers.includes("memory") || !(await writable(join(base, "cgroup.subtree_control")))) {
        console.error(`builder: cgroup ${base} is read-only or lacks the memory controller; using the RSS memory fallback`);
        return null;
      }
      if (!(await CgroupV2.#enableMemory(base))) {
        // Move the builder out of `base` so that `base` may delegate controllers.
        const procs = (await readFile(join(base, "cgroup.procs"), "utf8")).split("\n").filter(Boolean).map(Number);
        const foreign = procs.filter((pid) => pid !== process.pid);
        if (foreign.length > 0 && ownPath !== "/") {
          console.error(`builder: cgroup ${base} holds other processes; using the RSS memory fallback`);
          return null;
        }
        await mkdir(join(base, "svc-builder"), { recursive: true });
        for (const pid of procs) await writeFile(join(base, "svc-builder", "cgroup.procs"), String(pid));
        if (!(await CgroupV2.#enableMemory(base))) return null;
      }
      const jobsDir = join(base, "svc-jobs");
      await mkdir(jobsDir, { recursive: true });
      await appendFile(join(jobsDir, "cgroup.subtree_control"), "+memory");
      for (const stale of await readdir(jobsDir, { withFileTypes: true })) {
        if (stale.isDirectory()) await rmdir(join(jobsDir, stale.name)).catch(() => undefined);
      }
      return new CgroupV2(jobsDir);
    } catch (error) {
      console.error(`builder: cgroup v2 unavailable (${String(error)}); using the RSS memory fallback`);
      return null;
    }
  }

  static async #enableMemory(dir: string): Promise<boolean> {
    try {
      await appendFile(join(dir, "cgroup.subtree_control"), "+memory");
      return true;
    } catch {
      return false;
    }
  }

  /** Creates the job's cgroup with its memory limit (no swap, whole group killed on OOM). */
  async create(jobId: string, memoryLimitBytes: number): Promise<JobCgroup> {
    const dir = join(this.#jobsDir, jobId);
    await mkdir(dir);
    try {
      await writeFile(join(dir, "memory.max"), String(memoryLimitBytes));
      await writeOptional(join(dir, "memory.swap.max"), "0");
      await writeOptional(join(dir, "memory.oom.group"), "1");
    } catch (error) {
      await rmdir(dir).catch(() => undefined);
      throw error;
    }
    return new JobCgroup(dir);
  }
}

/** One job's cgroup: membership, peak memory, OOM kills. */
class JobCgroup {
  readonly #dir: string;
  #peak = 0;

  constructor(dir: string) {
    this.#dir = dir;
  }

  async add(pid: number): Promise<void> {
    await writeFile(join(this.#dir, "cgroup.procs"), String(pid));
  }

  async pids(): Promise<number[]> {
    try {
      return (await readFile(join(this.#dir, "cgroup.procs"), "utf8")).split("\n").filter(Boolean).map(Number);
    } catch {
      return [];
    }
  }

  /** Peak bytes (memory.peak where the kernel has it, else sampled memory.current) and whether the kernel OOM-killed. */
  async sample(): Promise<{ peakBytes: number; oomKilled: boolean }> {
    const peak = (await readNumber(join(this.#dir, "memory.peak"))) ?? (await readNumber(join(this.#dir, "memory.current")));
    if (peak !== null) this.#peak = Math.max(this.#peak, peak);
    let oomKilled = false;
    try {
      const events = await readFile(join(this.#dir, "memory.events"), "utf8");
      oomKilled = Number(/^oom_kill (\d+)$/m.exec(events)?.[1] ?? 0) > 0;
    } catch {
      oomKilled = false;
    }
    return { peakBytes: this.#peak, oomKilled };
  }

  /** Kills whatever is left and removes the cgroup (it must be empty first). */
  async remove(): Promise<void> {
    await writeOptional(join(this.#dir, "cgroup.kill"), "1");
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        await rmdir(this.#dir);
        return;
      } catch {
        for (const pid of await this.pids()) signal(pid, "SIGKILL");
        await sleep(20);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Running a command
// ---------------------------------------------------------------------------

/** Inputs of {@link runInSandbox}. */
export interface SandboxOptions {
  jobId: string;
  command: string;
  /** The job's own variables. */
  env: Record<string, string>;
  workDir: string;
  timeoutMs: number;
  memoryLimitBytes: number;
  disk: { path: string; mountPath: string; quotaBytes: number } | null;
  user: JobUser | null;
  cgroups: CgroupV2 | null;
  log: JobLog;
  /** Aborting cancels the job; `signal.reason === "shutdown"` marks a builder shutdown. */
  signal: AbortSignal;
}

/** Why the builder ended a job, or "shutdown" when the builder itself is stopping. */
type KillCause = Exclude<JobFailureReason, "exit_code" | "error"> | "shutdown";

/** How a sandboxed command ended. */
export interface SandboxOutcome {
  exitCode: number | null;
  signal: string | null;
  reason: JobFailureReason | null;
  error: string | null;
  peakMemoryBytes: number;
}

/**
 * Exactly what the command sees: defaults for PATH and HOME (which the job's env
 * may override, e.g. to add a toolchain), the job's variables, and the builder's
 * SVC_* variables (which it may not). Nothing of the builder's own environment.
 */
function jobEnvironment(options: Pick<SandboxOptions, "jobId" | "env" | "workDir" | "disk">): Record<string, string> {
  return {
    PATH: DEFAULT_PATH,
    HOME: options.workDir,
    ...options.env,
    SVC_JOB_ID: options.jobId,
    ...(options.disk ? { SVC_DISK_PATH: options.disk.path, SVC_DISK_MOUNT_PATH: options.disk.mountPath } : {}),
  };
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // already gone
  }
}

/** Formats a byte count as whole MiB, the unit memory limits are given in. */
function formatMiB(bytes: number): string {
  return `${Math.round(bytes / MIB)} MiB`;
}

/** Formats a byte count for people (disk usage). */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/**
 * The command's shell first waits on fd 3 until the builder has moved it into
 * its cgroup, so not one instruction of user code runs outside the limit.
 */
const CGROUP_GATE = 'read -r svc_gate <&3 || exit 125; exec 3<&-; exec /bin/sh -c "$1"';

/**
 * Runs one command under the job's limits and reports how it ended. Never
 * throws for anything the command does; the caller records the outcome.
 */
export async function runInSandbox(options: SandboxOptions): Promise<SandboxOutcome> {
  const { log } = options;
  let cgroup: JobCgroup | null = null;
  if (options.cgroups) {
    try {
      cgroup = await options.cgroups.create(options.jobId, options.memoryLimitBytes);
    } catch (error) {
      log.note(`cgroup unavailable (${String(error)}); memory is watched by sampling instead`);
    }
  }

  let child: ChildProcess;
  try {
    child = spawn("/bin/sh", cgroup ? ["-c", CGROUP_GATE, "svc-job", options.command] : ["-c", options.command], {
      cwd: options.workDir,
      env: jobEnvironment(options),
      detached: true,
      stdio: cgroup ? ["ignore", "pipe", "pipe", "pipe"] : ["ignore", "pipe", "pipe"],
      ...(options.user ? { uid: options.user.uid, gid: options.user.gid } : {}),
    });
  } catch (error) {
    await cgroup?.remove();
    return failedToStart(error);
  }
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null } | { error: Error }>((resolve) => {
    child.once("exit", (code, signalName) => resolve({ code, signal: signalName }));
    child.once("error", (error) => resolve({ error }));
  });
  const rootPid = child.pid;
  if (rootPid === undefined) {
    await cgroup?.remove();
    const result = await exited;
    return failedToStart("error" in result ? result.error : new Error("spawn failed"));
  }
  const stdout = child.stdout;
  const stderr = child.stderr;
  const outputClosed = Promise.all([stdout, stderr].map((stream) => (stream ? streamClosed(stream) : Promise.resolve())));
  if (stdout) log.capture("out", stdout);
  if (stderr) log.capture("err", stderr);

  if (cgroup) {
    try {
      await cgroup.add(rootPid);
    } catch (error) {
      log.note(`could not enter cgroup (${String(error)}); memory is watched by sampling instead`);
      await cgroup.remove();
      cgroup = null;
    }
    const gate = child.stdio[3] as Writable | null;
    gate?.on("error", () => undefined); // the shell may already be gone
    gate?.end("go\n");
  }

  const tree = new ProcessTree(rootPid);
  let cause: KillCause | null = null;
  let peakMemory = 0;
  let running = true;
  let killing: Promise<void> | null = null;

  const livePids = async (): Promise<number[]> => {
    const members = tree
      .members(0)
      .filter((entry) => entry.state !== "Z")
      .map((entry) => entry.pid);
    return [...new Set([...members, ...((await cgroup?.pids()) ?? [])])];
  };
  /** SIGTERM the whole tree, wait up to `graceMs`, then SIGKILL whatever is left. */
  const killTree = async (graceMs: number): Promise<void> => {
    let pids = await livePids();
    if (pids.length > 0 && graceMs > 0) {
      signal(-rootPid, "SIGTERM");
      for (const pid of pids) signal(pid, "SIGTERM");
      const deadline = Date.now() + graceMs;
      while (pids.length > 0 && Date.now() < deadline) {
        await sleep(50);
        pids = await livePids();
      }
    }
    for (let round = 0; round < 20 && pids.length > 0; round++) {
      signal(-rootPid, "SIGKILL");
      for (const pid of pids) signal(pid, "SIGKILL");
      await sleep(20);
      pids = await livePids();
    }
  };
  const terminate = (why: KillCause, graceMs: number): void => {
    if (cause !== null || !running) return;
    cause = why;
    killing = killTree(graceMs);
  };

  const timeout = setTimeout(() => terminate("timeout", KILL_GRACE_MS), options.timeoutMs);
  const onAbort = () => terminate(options.signal.reason === "shutdown" ? "shutdown" : "cancelled", KILL_GRACE_MS);
  if (options.signal.aborted) onAbort();
  else options.signal.addEventListener("abort", onAbort, { once: true });

  const sampleMemory = async (): Promise<void> => {
    if (cgroup) {
      const sample = await cgroup.sample();
      peakMemory = Math.max(peakMemory, sample.peakBytes);
      if (sample.oomKilled) terminate("OOMKilled", 0);
      return;
    }
    let total = 0;
    for (const entry of tree.members(MEMORY_SAMPLE_MS / 2)) total += residentBytes(entry.pid);
    peakMemory = Math.max(peakMemory, total);
    if (total > options.memoryLimitBytes) terminate("OOMKilled", 0);
  };
  const stopWatching = new AbortController();
  const pause = (ms: number) => sleep(ms, undefined, { signal: stopWatching.signal }).catch(() => undefined);
  const memoryWatch = (async () => {
    while (running) {
      await pause(MEMORY_SAMPLE_MS);
      if (running && cause === null) await sampleMemory();
    }
  })();

  let diskUsed = 0;
  const diskOver = async (): Promise<boolean> => {
    if (!options.disk) return false;
    diskUsed = await measureDirectoryBytes(options.disk.path);
    return diskUsed > options.disk.quotaBytes;
  };
  const diskWatch = (async () => {
    // Walking a big disk is costly, so the pause grows with the walk's duration.
    let interval = DISK_SAMPLE_MIN_MS;
    while (options.disk && running) {
      await pause(interval);
      if (!running || cause !== null) continue;
      const started = Date.now();
      if (await diskOver()) terminate("disk_quota", 0);
      interval = Math.max(DISK_SAMPLE_MIN_MS, (Date.now() - started) * 10);
    }
  })();

  const result = await exited;
  running = false;
  stopWatching.abort();
  clearTimeout(timeout);
  options.signal.removeEventListener("abort", onAbort);
  tree.rootExited();
  // Anything the shell left behind dies with it (a finished job owns no processes).
  if (killing) await killing;
  await killTree(KILL_GRACE_MS);
  // Every writer is dead now: what is left in the pipes is output already produced, so
  // wait for it to be read (a loaded builder can take seconds) rather than drop it.
  await Promise.race([outputClosed, sleep(OUTPUT_DRAIN_MS)]);
  stdout?.destroy();
  stderr?.destroy();
  await Promise.all([memoryWatch, diskWatch]);

  if (cgroup) {
    const sample = await cgroup.sample();
    peakMemory = Math.max(peakMemory, sample.peakBytes);
    if (sample.oomKilled && cause === null) cause = "OOMKilled";
    await cgroup.remove();
  }
  if (cause === null && (await diskOver())) cause = "disk_quota";

  if ("error" in result) return { ...failedToStart(result.error), peakMemoryBytes: peakMemory };
  const outcome = { exitCode: result.code, signal: result.signal, peakMemoryBytes: peakMemory };
  // `cause` is set from timer and watcher callbacks, which control-flow analysis cannot see.
  const finalCause = cause as KillCause | null;
  switch (finalCause) {
    case "timeout":
      return { ...outcome, reason: "timeout", error: `timed out after ${options.timeoutMs / 1000} s` };
    case "OOMKilled":
      return {
        ...outcome,
        reason: "OOMKilled",
        error: `memory limit ${formatMiB(options.memoryLimitBytes)} exceeded (peak ${formatMiB(peakMemory)})`,
      };
    case "disk_quota":
      return {
        ...outcome,
        reason: "disk_quota",
        error: `disk quota exceeded (used ${formatBytes(diskUsed)} of ${formatBytes(options.disk?.quotaBytes ?? 0)})`,
      };
    case "cancelled":
      return { ...outcome, reason: "cancelled", error: "cancelled" };
    case "shutdown":
      return { ...outcome, reason: "error", error: "builder shut down before the job finished" };
    case null:
      if (result.code === 0) return { ...outcome, reason: null, error: null };
      return { ...outcome, reason: "exit_code", error: describeExit(result.code, result.signal) };
  }
}

function describeExit(code: number | null, signalName: NodeJS.Signals | null): string {
  if (code === null) return `killed by signal ${signalName ?? "unknown"}`;
  if (code === 127) return "exit code 127 (command not found)";
  if (code === 126) return "exit code 126 (command not executable)";
  return `exit code ${code}`;
}

function failedToStart(error: unknown): SandboxOutcome {
  return {
    exitCode: null,
    signal: null,
    reason: "error",
    error: `could not start the command: ${error instanceof Error ? error.message : String(error)}`,
    peakMemoryBytes: 0,
  };
}

function streamClosed(stream: Readable): Promise<void> {
  return new Promise((resolve) => {
    if (stream.closed || stream.destroyed) resolve();
    else stream.once("close", () => resolve());
  });
}
