/**
 * Everything that touches a user's processes lives here: the job's sandbox, its
 * limits, and the capture of its output into the job log.
 *
 * Every command (cron run, install, build, the unpacking of a source archive)
 * runs under bubblewrap, an established sandboxing tool, never as a plain child
 * of the builder:
 *
 * - its own user namespace, mapping only the tenant's unprivileged uid (see
 *   tenants.ts): no root inside, no other user;
 * - its own PID namespace and /proc: it sees and can signal only its own
 *   processes (`kill -9 -1` ends only them), and when its first process ends
 *   every other one is killed by the kernel;
 * - its own mount namespace: the host's /usr, /etc (and /bin, /lib… links)
 *   read-only, a private /tmp and /dev/shm, a working directory (/work), its
 *   source, and only its own app's disk at the disk's mountPath. The builder's
 *   data dir, other jobs and disks, the repository and its secrets do not exist
 *   there; the root itself is read-only;
 * - its own network namespace: runs get outbound access through the builder's
 *   NAT with every host and private address blocked (network.ts), builds only a
 *   relay to the package registry (registry-proxy.ts), and without either only
 *   their own loopback;
 * - IPC and UTS namespaces, no new user namespaces inside, a new session;
 * - an environment made of the job's variables and SVC_* values only; no value
 *   appears on a command line (they reach bubblewrap through a pipe);
 * - limits: memory (cgroup; else RSS sampling), processes and CPU share
 *   (cgroup), wall clock, /tmp and in-memory work dirs bounded by tmpfs sizes,
 *   and the disk quota (a filesystem of exactly that size when the builder can
 *   loop-mount, else measured).
 *
 * If the sandbox cannot be made (no bubblewrap, no user namespaces) the job
 * fails with the reason; it never runs unsandboxed.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { join } from "node:path";
import { closeSync, openSync, readFileSync, readSync, readdirSync, readlinkSync, statfsSync } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import type { Readable, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { type DiskUsage, measureDisk } from "./usage.js";
import { type JobFailureReason, LOG_LIMIT_BYTES, LOG_MAX_LINE_BYTES, LOG_TRUNCATION_MARKER, type LogStream, mountPathProblem } from "../protocol/jobs.js";
import { FORWARDER_SOURCE, PROXY_ENV, SANDBOX_SOCKET_PATH } from "./registry-proxy.js";
import type { JobCgroup, ProcessUsage } from "./cgroups.js";
import type { NetworkSlot } from "./network.js";
import type { SandboxHost } from "./host.js";
import type { JobUser } from "./tenants.js";
import { formatBytes, formatCount } from "../units.js";

/** PATH a job gets unless its own env sets one. */
export const DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin";
/** The job's working directory inside the sandbox. */
export const SANDBOX_WORK_DIR = "/work";
/** HOME of a build step (its own folder of the build's scratch space). */
export const SANDBOX_HOME_DIR = "/home/svc";
/** Where a build's helper commands (yarn/pnpm through npx) appear, read-only. */
export const SANDBOX_TOOLS_DIR = "/run/svc/tools";
/** Where a python build sees the builder's folder of wheels (BUILDER_PIP_FIND_LINKS), read-only. */
export const SANDBOX_WHEELS_DIR = "/run/svc/wheels";
/** The folders of an account's package-manager cache (its host folder's `npm` and `cache`), as a build sees them in HOME. */
export const PACKAGE_CACHE_FOLDERS = { npm: ".npm", cache: ".cache" } as const;
/** Where a run's source archive appears inside the sandbox (unpacked into /work before the command). */
const SANDBOX_SOURCE_PATH = "/run/svc/source.tar.gz";
/** Time a job's processes get between SIGTERM and SIGKILL. */
const KILL_GRACE_MS = 2_000;
/** Longest wait for a finished job's pipes to be read to the end. */
const OUTPUT_DRAIN_MS = 30_000;
const MEMORY_SAMPLE_MS = 100;
const DISK_SAMPLE_MIN_MS = 2_000;
/** Room kept below the log cap for the builder's own closing lines. */
const LOG_RESERVE_BYTES = 4_096;
/**
 * /tmp and /dev/shm of every job live in memory and count against its memory
 * limit; each gets a quarter of it (at most 1 GiB), so filling one ends in
 * ENOSPC, not in an OOM kill.
 */
function scratchTmpfsBytes(memoryLimitBytes: number): number {
  return Math.min(1024 * 1024 * 1024, Math.floor(memoryLimitBytes / 4));
}
/** Most processes (and threads) of one job alive at once. */
const MAX_PROCESSES = 1024;
/** The cgroup name prefix of a sandbox that holds a disk (what the lease watchdog ends). */
export const DISK_HOLDER_CGROUP_PREFIX = "disk-";

/** A disk with less free room than this after a failed job was what made it fail. */
const DISK_FULL_BYTES = 64 * 1024;
const NEWLINE = Buffer.from("\n");
const MIB = 1024 * 1024;


// ---------------------------------------------------------------------------
// Job log
// ---------------------------------------------------------------------------

/**
 * Where a sandbox's output and the builder's notes about it go: a job's log
 * ({@link JobLog}), or an app's runtime log (processes/app-log.ts). Both write
 * the same line format (protocol/jobs.ts).
 */
export interface OutputLog {
  /** Appends one builder message (`svc` line). */
  note(text: string): void;
  /** Copies a child's stdout or stderr into the log, line by line. */
  capture(stream: "out" | "err", source: Readable): void;
}

/**
 * The log file of one job. Output is split into timestamped lines (format in
 * protocol/jobs.ts), appended through one queue per job so lines of different jobs
 * can never mix, and capped at LOG_LIMIT_BYTES with a single truncation marker.
 * `bytes` counts what is already on disk, so followers never read past it.
 */
export class JobLog implements OutputLog {
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

  /** Resolves once every line accepted so far is in the file, so a step's output can be read back from it. */
  async settled(): Promise<void> {
    while (this.#draining) await this.#draining;
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
      line = withoutAnsi(line);
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
    const record = Buffer.concat([Buffer.from(`${new Date().toISOString()} ${stream} `), withoutAnsi(pending), NEWLINE]);
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


/**
 * Terminal escape sequences (colours, cursor moves, titles, links): CSI
 * `ESC [ … final`, OSC `ESC ] … BEL|ESC \\`, and the short escapes (`ESC ( B`, `ESC 7`). Build tools
 * colour their output when they see `CI` (picocolors does), but a stored log is
 * read in browsers, files and `--json`, where the codes are noise; `svc deploy`
 * colours a log it streams to a terminal itself.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: ESC and BEL are what these sequences are made of
const ANSI_SEQUENCE = /\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -/]*[0-~])/g;

/** A line of output without escape sequences; bytes, not text, so a line cut inside a UTF-8 character stays as it was. */
export function withoutAnsi(line: Buffer): Buffer {
  if (!line.includes(0x1b)) return line;
  return Buffer.from(line.toString("latin1").replace(ANSI_SEQUENCE, ""), "latin1");
}

// ---------------------------------------------------------------------------
// The processes of one sandbox (from /proc)
// ---------------------------------------------------------------------------

const readBuffer = Buffer.alloc(4096);

/** A small procfs file, synchronously: procfs never blocks, and this is ten times cheaper than promises. */
function readProc(path: string): string | null {
  try {
    const fd = openSync(path, "r");
    try {
      return readBuffer.toString("latin1", 0, readSync(fd, readBuffer, 0, readBuffer.length, 0));
    } finally {
      closeSync(fd);
    }
  } catch {
    return null;
  }
}

/** `ppid` of a process, from /proc/<pid>/stat (comm may hold spaces and parentheses). */
function parentOf(pid: string): number | null {
  const stat = readProc(`/proc/${pid}/stat`);
  return stat === null ? null : Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
}

/**
 * Host pids of every process in the sandbox whose bubblewrap runs as `rootPid`:
 * the processes in the PID namespace of bubblewrap's child (the namespace's
 * init). Nothing in a sandbox can leave its PID namespace.
 */
function sandboxMembers(rootPid: number): number[] {
  const pids = readdirSync("/proc").filter((name) => /^\d+$/.test(name));
  const init = pids.find((pid) => parentOf(pid) === rootPid);
  if (init === undefined) return [];
  let namespace: string;
  try {
    namespace = readlinkSync(`/proc/${init}/ns/pid`);
  } catch {
    return [];
  }
  const members: number[] = [];
  for (const pid of pids) {
    try {
      if (readlinkSync(`/proc/${pid}/ns/pid`) === namespace) members.push(Number(pid));
    } catch {
      // exited meanwhile
    }
  }
  return members;
}

/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on every Linux architecture Node runs on). */
const USER_HZ = 100;

/** CPU seconds and resident memory of these processes, from /proc. */
function membersUsage(pids: number[]): ProcessUsage {
  let ticks = 0;
  let memoryBytes = 0;
  for (const pid of pids) {
    const stat = readProc(`/proc/${pid}/stat`);
    if (stat === null) continue;
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command's closing parenthesis.
    ticks += Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
    memoryBytes += residentBytes(pid);
  }
  return { cpuSeconds: ticks / USER_HZ, memoryBytes };
}

function residentBytes(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readProc(`/proc/${pid}/status`) ?? "");
  return match ? Number(match[1]) * 1024 : 0;
}

// ---------------------------------------------------------------------------
// Running a command
// ---------------------------------------------------------------------------

/** Inputs of {@link runInSandbox}. */
export interface SandboxOptions {
  host: SandboxHost;
  jobId: string;
  command: string;
  /** The job's own variables. */
  env: Record<string, string>;
  user: JobUser;
  /**
   * /work: a fresh in-memory filesystem of this size (a run), or a host
   * directory (a build's scratch space, kept between its steps); `home`, when
   * set, is a host directory shown as HOME.
   */
  work: { tmpfsBytes: number } | { path: string; home: string };
  /** Host path of a `.tar.gz` unpacked into /work (inside the sandbox) before the command starts. */
  source: string | null;
  /** `egress`: outbound like an app (runs); `registry`: only the package registry (builds); `none`: loopback only. */
  network: "egress" | "registry" | "none";
  /** Host folder of builder-made helper commands, shown read-only at {@link SANDBOX_TOOLS_DIR}. */
  tools: string | null;
  /** Host folder of python wheels, shown read-only at {@link SANDBOX_WHEELS_DIR} (it must be readable by every user). */
  wheels?: string | null;
  /** Host folder of the account's package-manager caches (jobs/package-cache.ts): its folders are shown in HOME. Builds only. */
  packageCache?: string | null;
  /** Wall-clock limit; null for none (an app's long-running process). */
  timeoutMs: number | null;
  memoryLimitBytes: number;
  disk: { path: string; mountPath: string; quotaBytes: number } | null;
  log: OutputLog;
  /** Aborting cancels the job; `signal.reason === "shutdown"` marks a builder shutdown. */
  signal: AbortSignal;
  /** After an abort, how long the processes get between SIGTERM and SIGKILL; 2 s when absent. */
  killGraceMs?: number;
  /**
   * A run staged before its second (jobs/manager.ts): the sandbox is made and
   * the source unpacked now, then the prelude waits on fd 6 until this
   * resolves (the second came and a slot is free), and only the command's exec
   * is left. The time limit counts from then.
   */
  hold?: Promise<void>;
  /** Called once a held sandbox is made and waits for its start (the prelude's `staged` report). */
  onStaged?: () => void;
  /**
   * Called once the command has started (the sandbox is made, the prelude
   * handed over), with its address on the run network (null without one) and
   * bubblewrap's pid: a long-running process is reached (health check,
   * proxied traffic) at that address. `usage` reads what the sandbox uses
   * now (app metrics).
   */
  onStart?: (instance: { address: string | null; pid: number; usage: () => ProcessUsage }) => void;
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
 * may override), the job's variables, and the builder's SVC_* variables (which it
 * may not). The disk is where the app expects it: SVC_DISK_PATH and
 * SVC_DISK_MOUNT_PATH both name its mountPath.
 */
function jobEnvironment(options: SandboxOptions): Record<string, string> {
  const home = "home" in options.work ? SANDBOX_HOME_DIR : SANDBOX_WORK_DIR;
  return {
    PATH: DEFAULT_PATH,
    HOME: home,
    TMPDIR: "/tmp",
    // No "a new version is available" notes in every build and run log: the platform chooses the versions.
    NPM_CONFIG_UPDATE_NOTIFIER: "false",
    PIP_DISABLE_PIP_VERSION_CHECK: "1",
    ...options.env,
    ...(options.network === "registry" ? PROXY_ENV : {}),
    SVC_JOB_ID: options.jobId,
    ...(options.disk ? { SVC_DISK_PATH: options.disk.mountPath, SVC_DISK_MOUNT_PATH: options.disk.mountPath } : {}),
  };
}

/**
 * Runs inside the sandbox before the command: reports that the sandbox exists,
 * unpacks the source, starts the registry relay (builds), for a staged run
 * reports that and waits for the builder's word on fd 6 (EOF, the builder gone
 * or the run cancelled, ends it unstarted), reports the start, and replaces
 * itself with the command. fd 5 carries those reports to the builder; 5 and 6
 * are closed before any user code runs.
 */
const PRELUDE = [
  "exec 4<&-",
  "printf 'sandbox\\n' >&5",
  `if [ -n "$2" ]; then /usr/bin/tar -xzf ${SANDBOX_SOURCE_PATH} -C ${SANDBOX_WORK_DIR} --no-same-owner || { printf 'source\\n' >&5; exit 125; }; fi`,
  `if [ -n "$3" ]; then PATH=${DEFAULT_PATH} mkfifo /tmp/.svc-relay && { PATH=${DEFAULT_PATH} node -e "$3" >/tmp/.svc-relay & read -r svc_relay </tmp/.svc-relay; /bin/rm -f /tmp/.svc-relay; }; fi`,
  `if [ -n "$4" ]; then printf 'staged\\n' >&5; read -r svc_go <&6 || exit 125; fi`,
  "exec 6<&-",
  "printf 'started\\n' >&5",
  "exec 5>&-",
  'exec /bin/sh -c "$1"',
].join("\n");

/**
 * Processes (threads included) all of one account's sandboxes on a host may
 * have at once: RLIMIT_NPROC counts per uid, and each account has its own
 * (tenants.ts), so one account's fork storm across many jobs stops here and
 * leaves the host's pid space to the others. A quarter of the host's pid_max,
 * between 1,024 and 8,192.
 */
export const ACCOUNT_PROCESSES = (() => {
  let pidMax = 32_768;
  try {
    pidMax = Number(readFileSync("/proc/sys/kernel/pid_max", "utf8").trim()) || pidMax;
  } catch {
    // not Linux: the default
  }
  return Math.min(8_192, Math.max(1_024, Math.floor(pidMax / 4)));
})();

/**
 * Enters the job's cgroups (`$1` files to write its pid to follow), sets the
 * account's process limit (RLIMIT_NPROC, {@link ACCOUNT_PROCESSES}), then
 * becomes the sandbox: everything the job starts is counted from its first
 * instruction, at the cost of no process but this shell (builtins only).
 */
const CGROUP_GATE = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1" || exit 125; shift; n=$((n - 1)); done; ulimit -p ${ACCOUNT_PROCESSES} || exit 125; exec "$@"`;

/**
 * The bubblewrap options of one job, passed through a pipe (NUL-separated) so
 * that no variable's value shows on a command line; the command itself
 * ({@link commandArguments}) must be on bubblewrap's own.
 */
function bwrapOptions(options: SandboxOptions, env: Record<string, string>, withNetwork: boolean): string[] {
  const { host } = options;
  const args = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    ...(withNetwork ? [] : ["--unshare-net"]),
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--hostname",
    "svc",
    ...host.systemArgs,
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--size",
    String(scratchTmpfsBytes(options.memoryLimitBytes)),
    "--tmpfs",
    "/dev/shm",
    "--remount-ro",
    "/dev",
    "--size",
    String(scratchTmpfsBytes(options.memoryLimitBytes)),
    "--tmpfs",
    "/tmp",
  ];
  if ("tmpfsBytes" in options.work) {
    args.push("--size", String(options.work.tmpfsBytes), "--tmpfs", SANDBOX_WORK_DIR);
  } else {
    args.push("--bind", host.visible(options.work.path), SANDBOX_WORK_DIR);
    args.push("--bind", host.visible(options.work.home), SANDBOX_HOME_DIR);
    if (options.packageCache) {
      for (const [folder, at] of Object.entries(PACKAGE_CACHE_FOLDERS)) args.push("--bind", host.visible(join(options.packageCache, folder)), `${SANDBOX_HOME_DIR}/${at}`);
    }
  }
  if (options.disk) args.push("--bind", host.visible(options.disk.path), options.disk.mountPath);
  if (options.source) args.push("--ro-bind", host.visible(options.source), SANDBOX_SOURCE_PATH);
  if (options.tools) args.push("--ro-bind", host.visible(options.tools), SANDBOX_TOOLS_DIR);
  if (options.wheels) args.push("--ro-bind", options.wheels, SANDBOX_WHEELS_DIR);
  if (options.network === "registry") args.push("--bind", host.visible(host.registry.socketPath), SANDBOX_SOCKET_PATH);
  args.push("--remount-ro", "/", "--chdir", SANDBOX_WORK_DIR, "--clearenv");
  for (const [name, value] of Object.entries(env)) args.push("--setenv", name, value);
  return args;
}

/** The prelude and its arguments: the user's command, whether to unpack a source, the registry relay. */
function commandArguments(options: SandboxOptions): string[] {
  return [
    "--",
    "/bin/sh",
    "-c",
    PRELUDE,
    "svc-job",
    options.command,
    options.source ? "1" : "",
    options.network === "registry" ? FORWARDER_SOURCE : "",
    options.hold ? "1" : "",
  ];
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



/** Free bytes of the filesystem holding `path` (the disk's own, when disks are images). */
function freeBytes(path: string): number {
  try {
    const fs = statfsSync(path);
    return fs.bavail * fs.bsize;
  } catch {
    return Number.POSITIVE_INFINITY;
  }
}

/**
 * The reports the prelude writes on fd 5, read as they come, and the first
 * line of stderr before the command started (bubblewrap's or tar's complaint),
 * which names the cause when setting up fails.
 */
class PreludeReports {
  #text = "";
  #stderr = "";

  constructor(reports: Readable, stderr: Readable | null, on: { staged?: (() => void) | undefined; started?: (() => void) | undefined }) {
    reports.setEncoding("latin1");
    reports.on("data", (chunk: string) => {
      const before = { staged: this.has("staged"), started: this.has("started") };
      this.#text += chunk;
      if (!before.staged && this.has("staged")) on.staged?.();
      if (!before.started && this.has("started")) on.started?.();
    });
    reports.on("error", () => undefined);
    const tap = (chunk: Buffer) => {
      if (this.has("started") || this.#stderr.includes("\n")) stderr?.off("data", tap);
      else this.#stderr += chunk.toString("utf8", 0, Math.min(chunk.length, 512));
    };
    stderr?.on("data", tap);
  }

  /** `sandbox` (it exists), `source` (unpacking failed), `staged` (made, waiting for its start), `started` (the command runs). */
  has(report: "sandbox" | "source" | "staged" | "started"): boolean {
    return this.#text.split("\n").includes(report);
  }

  /** What went wrong before the command started, in the words of the tool that failed. */
  get setupError(): string {
    return this.#stderr.split("\n")[0]!.trim().slice(0, 300) || "see the log";
  }
}

/**
 * Runs one command in a new sandbox under the job's limits and reports how it
 * ended. Never throws for anything the command does; the caller records the
 * outcome.
 */
export async function runInSandbox(options: SandboxOptions): Promise<SandboxOutcome> {
  const { log, host } = options;
  if (host.failure !== null) return failedToStart(`the sandbox cannot be created on this builder: ${host.failure}`);
  const mountProblem = options.disk ? mountPathProblem(options.disk.mountPath) : null;
  if (mountProblem !== null) return failedToStart(`the disk's mountPath ${options.disk?.mountPath} is not allowed: it ${mountProblem}`);

  let cgroup: JobCgroup | null = null;
  if (host.cgroups) {
    try {
      // A sandbox holding a disk is named for it: the node's lease watchdog ends exactly these (node/lease.ts).
      cgroup = await host.cgroups.create(options.disk ? `${DISK_HOLDER_CGROUP_PREFIX}${options.jobId}` : options.jobId, {
        memoryBytes: options.memoryLimitBytes,
        pids: MAX_PROCESSES,
        cpuWeight: 100,
      });
    } catch (error) {
      return failedToStart(`the job's cgroup could not be created: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
  let slot: NetworkSlot | null = null;
  if (options.network === "egress" && host.network) {
    try {
      slot = await host.network.acquire();
    } catch (error) {
      await cgroup?.remove();
      return failedToStart(`the run's network could not be set up: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  const env = jobEnvironment(options);
  const bwrap = [host.bwrap, "--args", "4", ...commandArguments(options)];
  const root = process.getuid?.() === 0;
  // Root enters the job's cgroups (the gate), joins the run's network namespace and drops to the
  // tenant's user (nsenter) in one process; otherwise it starts as the builder's own user.
  const user = ["-S", String(options.user.uid), "-G", String(options.user.gid)];
  const sandbox = root ? ["/usr/bin/nsenter", ...(slot ? [`--net=${slot.path}`] : []), ...user, "--", ...bwrap] : bwrap;
  const argv = cgroup ? ["/bin/sh", "-c", CGROUP_GATE, "svc-gate", String(cgroup.procsFiles.length), ...cgroup.procsFiles, ...sandbox] : sandbox;
  let child: ChildProcess;
  try {
    child = spawn(argv[0]!, argv.slice(1), {
      cwd: "/",
      env: { PATH: "/usr/bin:/bin" },
      stdio: ["ignore", "pipe", "pipe", "ignore", "pipe", "pipe", options.hold ? "pipe" : "ignore"],
    });
  } catch (error) {
    slot?.release();
    await cgroup?.remove();
    return failedToStart(error instanceof Error ? error.message : String(error));
  }
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null } | { error: Error }>((resolve) => {
    child.once("exit", (code, signalName) => resolve({ code, signal: signalName }));
    child.once("error", (error) => resolve({ error }));
  });
  const rootPid = child.pid;
  if (rootPid === undefined) {
    slot?.release();
    await cgroup?.remove();
    const result = await exited;
    return failedToStart("error" in result ? result.error.message : "spawn failed");
  }
  const pipes = child.stdio as ReadonlyArray<Readable | Writable | null | undefined>;
  const args = pipes[4] as Writable;
  args.on("error", () => undefined);
  args.end(`${bwrapOptions(options, env, slot !== null).join("\0")}\0`);
  const stdout = child.stdout;
  const stderr = child.stderr;
  const onStart = options.onStart;
  // With cgroups the kernel counts for the sandbox; without, its live processes are summed (CPU of those gone is not).
  const usage = (): ProcessUsage => cgroup?.usage() ?? membersUsage(sandboxMembers(rootPid));
  const reports = new PreludeReports(pipes[5] as Readable, stderr, {
    staged: options.onStaged,
    started: onStart && (() => onStart({ address: slot?.address ?? null, pid: rootPid, usage })),
  });
  const outputClosed = Promise.all([stdout, stderr].map((stream) => (stream ? streamClosed(stream) : Promise.resolve())));
  if (stdout) log.capture("out", stdout);
  if (stderr) log.capture("err", stderr);

  let cause: KillCause | null = null;
  let peakMemory = 0;
  let running = true;
  let killing: Promise<void> | null = null;

  /**
   * SIGTERM every process of the sandbox, wait up to `graceMs`, then kill
   * bubblewrap: the kernel ends the rest. A sandbox still being made (the
   * command not started) has nothing to end gracefully: it is killed at once.
   */
  const killSandbox = async (graceMs: number): Promise<void> => {
    if (graceMs > 0 && reports.has("started")) {
      for (const pid of sandboxMembers(rootPid)) signal(pid, "SIGTERM");
      const deadline = Date.now() + graceMs;
      while (running && Date.now() < deadline) await sleep(50);
    }
    if (running) signal(rootPid, "SIGKILL");
    // Killed while it was being made, bubblewrap's child may not yet have asked to die with its
    // parent, and would run on, holding the job's output open: everything in the job's cgroup goes.
    for (let round = 0; cgroup && round < 40 && cgroup.kill() > 0; round++) await sleep(50);
  };
  const terminate = (why: KillCause, graceMs: number): void => {
    if (cause !== null || !running) return;
    cause = why;
    killing = killSandbox(graceMs);
  };

  let timeout: NodeJS.Timeout | undefined;
  const startClock = () => {
    if (running && options.timeoutMs !== null) timeout = setTimeout(() => terminate("timeout", KILL_GRACE_MS), options.timeoutMs);
  };
  if (options.hold) {
    // The word to start: one line on fd 6. Until then the prelude waits, and the time limit has not begun.
    const go = pipes[6] as Writable;
    go.on("error", () => undefined);
    void options.hold.then(() => {
      startClock();
      go.end("go\n");
    });
  } else startClock();
  const onAbort = () => terminate(options.signal.reason === "shutdown" ? "shutdown" : "cancelled", options.killGraceMs ?? KILL_GRACE_MS);
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
    for (const pid of sandboxMembers(rootPid)) total += residentBytes(pid);
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

  // An image answers from statfs (and its kernel refuses writes past the quota and the inode limit
  // itself); a plain directory is walked in bounded memory.
  let diskUsage: DiskUsage = { usedBytes: 0, usedInodes: 0, inodeLimit: Number.POSITIVE_INFINITY };
  const diskOver = async (): Promise<boolean> => {
    if (!options.disk) return false;
    diskUsage = await measureDisk(options.disk.path, options.disk.quotaBytes);
    return diskUsage.usedBytes > options.disk.quotaBytes || diskUsage.usedInodes > diskUsage.inodeLimit;
  };
  const diskWatch = (async () => {
    // Walking a big directory is costly, so the pause grows with the walk's duration.
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
  if (killing) await killing;
  // bubblewrap is gone, so its PID namespace is too: every process the job started is dead, and
  // what is left in the pipes is output already produced. Wait for it rather than drop it.
  await Promise.race([outputClosed, sleep(OUTPUT_DRAIN_MS)]);
  stdout?.destroy();
  stderr?.destroy();
  (pipes[6] as Writable | null | undefined)?.destroy();
  await Promise.all([memoryWatch, diskWatch]);
  slot?.release();

  if (cgroup) {
    const sample = await cgroup.sample();
    peakMemory = Math.max(peakMemory, sample.peakBytes);
    if (sample.oomKilled && cause === null) cause = "OOMKilled";
    await cgroup.remove();
  }
  if (cause === null && (await diskOver())) cause = "disk_quota";

  if ("error" in result) return { ...failedToStart(result.error.message), peakMemoryBytes: peakMemory };
  // `cause` is set from timer and watcher callbacks, which control-flow analysis cannot see.
  const finalCause = cause as KillCause | null;
  const killedBy = finalCause === "OOMKilled" || finalCause === "disk_quota" ? "SIGKILL" : null;
  const outcome = { exitCode: killedBy ? null : result.code, signal: killedBy ?? result.signal, peakMemoryBytes: peakMemory };
  if (finalCause === null && !reports.has("started")) {
    if (reports.has("source")) return { ...outcome, reason: "error", error: `the source archive could not be unpacked: ${reports.setupError}` };
    return { ...outcome, reason: "error", error: `the sandbox could not be created: ${reports.setupError}` };
  }
  switch (finalCause) {
    case "timeout":
      return { ...outcome, reason: "timeout", error: `timed out after ${(options.timeoutMs ?? 0) / 1000} s` };
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
        error:
          diskUsage.usedInodes > diskUsage.inodeLimit
            ? `inode limit exceeded (used ${formatCount(diskUsage.usedInodes)} of ${formatCount(diskUsage.inodeLimit)} files)`
            : `disk quota exceeded (used ${formatBytes(diskUsage.usedBytes)} of ${formatBytes(options.disk?.quotaBytes ?? 0)})`,
      };
    case "cancelled":
      return { ...outcome, reason: "cancelled", error: "cancelled" };
    case "shutdown":
      return { ...outcome, reason: "error", error: "builder shut down before the job finished" };
    case null:
      if (result.code === 0) return { ...outcome, reason: null, error: null };
      // With a hard quota the kernel refused the writes past it; say so rather than only "exit code 1".
      if (options.disk && diskUsage.usedInodes >= diskUsage.inodeLimit) {
        return {
          ...outcome,
          reason: "disk_quota",
          error: `inode limit reached (${formatCount(diskUsage.inodeLimit)} files): creating more failed, then ${describeExit(result.code, result.signal)}`,
        };
      }
      if (options.disk && freeBytes(options.disk.path) < DISK_FULL_BYTES) {
        return {
          ...outcome,
          reason: "disk_quota",
          error: `disk quota reached (${formatBytes(options.disk.quotaBytes)}): writes beyond it failed, then ${describeExit(result.code, result.signal)}`,
        };
      }
      return { ...outcome, reason: "exit_code", error: describeExit(result.code, result.signal) };
  }
}

/** Shells and bubblewrap report a process killed by signal N as exit code 128 + N. */
function describeExit(code: number | null, signalName: NodeJS.Signals | null): string {
  if (code === null) return `killed by signal ${signalName ?? "unknown"}`;
  if (code === 127) return "exit code 127 (command not found)";
  if (code === 126) return "exit code 126 (command not executable)";
  if (code > 128 && code <= 128 + 64) return `exit code ${code} (killed by signal ${code - 128})`;
  return `exit code ${code}`;
}

function failedToStart(message: string): SandboxOutcome {
  return { exitCode: null, signal: null, reason: "error", error: `could not start the command: ${message}`, peakMemoryBytes: 0 };
}

function streamClosed(stream: Readable): Promise<void> {
  return new Promise((resolve) => {
    if (stream.closed || stream.destroyed) resolve();
    else stream.once("close", () => resolve());
  });
}
