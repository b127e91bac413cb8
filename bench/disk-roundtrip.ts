/**
 * A disk's whole backup and whole restore as a user waits for them, through
 * the running system (the API on the local Worker, wrangler's dev server under
 * workerd as the local stack runs it; local R2 behind the Worker's `/storage`
 * gateway; the builder node holding the disk), against the standard
 * tools on the same files on the same machine in the same run:
 *
 * - backup: `POST /v1/disks/{disk}/backups` until the backup is `ready`
 *   (polling `GET /v1/disks/{disk}/backups` every 100 ms), against `tar czf`
 *   of the disk's files; ratio = tar czf time / ours (target ≥ 1.3x);
 * - restore: `POST /v1/disks/{disk}/backups/restore` with `{"backupId"}` until
 *   the restore job has `succeeded` (polling its status every 100 ms), against
 *   `tar xzf` of the same archive (downloaded once through the backup's
 *   presigned download URL) into an empty directory; ratio = tar xzf time /
 *   ours (target ≥ 0.9x).
 *
 * Each side runs ROUNDS times (default 2), alternating with its tool; the best
 * run counts and all are printed, with the load average before each round (the
 * development VM is shared). Every run of ours is split into where the time
 * went, as far as the system shows it: the API gives the backup's `createdAt`
 * and `completedAt` (the restore's `createdAt` and `finishedAt`); the builder
 * job's `createdAt`, `startedAt` and `finishedAt` and its timestamped log (one
 * line per uploaded part; download progress lines for a restore) are read from
 * the node with a signed request, as the Worker reads them; where the job
 * logs nothing, the node's files are sampled from outside every 20 ms (the
 * snapshot's spool directory: when each part was full and when its upload
 * ended; the restore's staging filesystem: when its data stopped growing and
 * when it was unmounted for the swap); CPU seconds are read from /proc for the
 * builder's and the Worker's process trees. What no one exposes is said so in
 * the output. References, to tell the phases' limits apart: the gateway's GET
 * (the archive's download) and PUT (8 MiB objects, one at a time and four at
 * once) speed, Node's zlib gunzip (what the restore uses) and `gzip -dc` of
 * the archive, once; `tar | pigz -p<cores>` and `sync -f` after tar xzf (not
 * counted in its time) every round. Every timed run starts after a `sync`
 * (not counted), so that no run pays for the writeback the one before left.
 *
 * The disk's data is bench/disk-data.ts's generate() (the issue asks for "half
 * random, half text"; this is close: 40 % JSON lines in 8 MiB files, 40 %
 * random bytes in 16 MiB files, 20 % small files, half of each kind), written
 * straight into the disk's folder on the node. The whole stack runs in a
 * temporary directory that is removed at the end, also on failure.
 *
 *     WRANGLER_SEND_METRICS=false npx tsx bench/disk-roundtrip.ts [MiB, default 256]      (ROUNDS=2)
 */
import { execFileSync, spawn } from "node:child_process";
import { closeSync, createReadStream, createWriteStream, existsSync, openSync, readdirSync, readFileSync, statSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, stat, statfs } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { createGunzip } from "node:zlib";
import { RestoreResult, SnapshotResult } from "../builder/src/protocol/disks.js";
import { JobStatus } from "../builder/src/protocol/job-status.js";
import { nodeKey } from "../builder/src/protocol/node.js";
import { type LocalStack, startLocalStack } from "../scripts/local-stack.js";
import { type BuilderTarget, diskDataPath, diskFolderAtRest, signedFetch } from "../test/builder/builder-process.js";
import { generate, MiB } from "./disk-data.js";

const SIZE_MIB = Number(process.argv[2] ?? 256);
const ROUNDS = Number(process.env.ROUNDS ?? 2);
const POLL_MS = 100;
/** The backup's part size as BackupJob chooses it for a disk of `sizeGb` (durable-objects/backup-job.ts). */
const partSizeOf = (sizeGb: number) => Math.max(8 * MiB, Math.ceil((sizeGb * 1024 ** 3) / 9_000));
/** How often the samplers look at the node's files from outside. */
const SAMPLE_MS = 20;
const PROBE_OBJECT_BYTES = 8 * MiB;
const PROBE_OBJECTS = 8;
const PROBE_PARALLEL = 4;
const CORES = availableParallelism();

if (!Number.isFinite(SIZE_MIB) || SIZE_MIB <= 0) throw new Error(`size must be a positive number of MiB, not ${process.argv[2]}`);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) throw new Error(`ROUNDS must be a positive integer, not ${process.env.ROUNDS}`);

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

type BackupView = {
  id: string;
  status: "creating" | "ready" | "failed";
  sizeBytes: number;
  createdAt: string;
  completedAt?: string;
  failureReason?: string;
};
type RestoreView = { jobId: string; status: "running" | "succeeded" | "failed"; error: string | null; createdAt: string; finishedAt: string | null };

const load = () =>
  loadavg()
    .map((value) => value.toFixed(2))
    .join(" ");
const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB`;
const rate = (bytes: number, ms: number) => `${(bytes / MiB / (ms / 1000)).toFixed(1)} MiB/s`;
const best = (runs: { ms: number }[]) => Math.min(...runs.map((run) => run.ms));
const all = (runs: { ms: number }[]) => runs.map((run) => (run.ms / 1000).toFixed(2)).join(" / ");
const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? Number.NaN : sorted[Math.floor(sorted.length / 2)]!;
};

/**
 * utime + stime + cutime + cstime (seconds) of `root` and every live
 * descendant, from /proc (100 ticks a second), by command name (`workerd`,
 * `node`, …).
 */
function treeCpu(root: number): Map<string, number> {
  const children = new Map<number, number[]>();
  const seconds = new Map<number, { name: string; cpu: number }>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue; // ended meanwhile
    }
    // "pid (comm) state ppid …": fields after the command name start at field 3 (state); ppid is 4, utime..cstime 14..17.
    const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
    const pid = Number(entry);
    const parent = fields[1] ?? 0;
    seconds.set(pid, { name, cpu: ((fields[11] ?? 0) + (fields[12] ?? 0) + (fields[13] ?? 0) + (fields[14] ?? 0)) / 100 });
    children.set(parent, [...(children.get(parent) ?? []), pid]);
  }
  const byName = new Map<string, number>();
  const queue = [root];
  for (let pid = queue.pop(); pid !== undefined; pid = queue.pop()) {
    const own = seconds.get(pid);
    if (own) byName.set(own.name, (byName.get(own.name) ?? 0) + own.cpu);
    queue.push(...(children.get(pid) ?? []));
  }
  return byName;
}

const total = (byName: Map<string, number>) => [...byName.values()].reduce((sum, cpu) => sum + cpu, 0);

/**
 * Before every timed run, ours or a tool's (not counted): the writeback the
 * previous one left (a restore leaves hundreds of MiB dirty) is done, so it
 * does not slow the next one down.
 */
function settle(): void {
  execFileSync("sync");
}

/** Runs a tool to its end (stdout to `stdoutTo` when given, e.g. /dev/null); wall milliseconds. */
function timeTool(command: string, args: string[], stdoutTo?: string): Promise<{ ms: number }> {
  return new Promise((resolve, reject) => {
    const out = stdoutTo === undefined ? "inherit" : openSync(stdoutTo, "w");
    const started = performance.now();
    const child = spawn(command, args, { stdio: ["ignore", out, "inherit"] });
    const done = () => {
      if (typeof out === "number") closeSync(out);
    };
    child.once("error", (error) => {
      done();
      reject(error);
    });
    child.once("exit", (code) => {
      done();
      if (code !== 0) return reject(new Error(`${command} ${args.join(" ")} exited ${code}`));
      resolve({ ms: performance.now() - started });
    });
  });
}

/** GET `url` into `path` (node:http, as the builder downloads); the bytes received. */
function download(url: string, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const request = httpRequest(new URL(url), { method: "GET" }, (response) => {
      if (response.statusCode !== 200) {
        response.resume();
        reject(new Error(`download answered HTTP ${response.statusCode}`));
        return;
      }
      pipeline(response, createWriteStream(path)).then(() => resolve(statSync(path).size), reject);
    });
    request.on("error", reject);
    request.end();
  });
}

/** PUT `body` to a presigned URL with its exact Content-Length (as the builder PUTs parts). */
function put(url: string, body: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const request = httpRequest(new URL(url), { method: "PUT", headers: { "Content-Length": String(body.length) } }, (response) => {
      let detail = "";
      response.setEncoding("utf8");
      response.on("data", (text: string) => {
        detail += text;
      });
      response.on("end", () => {
        const status = response.statusCode ?? 0;
        if (status < 200 || status > 299) reject(new Error(`PUT answered HTTP ${status} ${detail.slice(0, 300)}`));
        else resolve();
      });
      response.on("error", reject);
    });
    request.on("error", reject);
    request.end(body);
  });
}

/** Timestamped `svc` lines of a builder job log (protocol/jobs.ts's line format). */
function svcLines(log: string): { at: number; text: string }[] {
  return log.split("\n").flatMap((line) => {
    const match = /^(\S+) svc (.*)$/.exec(line);
    return match ? [{ at: Date.parse(match[1]!), text: match[2]! }] : [];
  });
}

/** Mount points at or below `dir`, deepest first. */
function mountsUnder(dir: string): string[] {
  return readFileSync("/proc/mounts", "utf8")
    .split("\n")
    .map((line) => (line.split(" ")[1] ?? "").replace(/\\(\d{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8))))
    .filter((point) => point === dir || point.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
}

/** utime + stime (seconds) of one process alone: cheap enough to read every few milliseconds. */
function ownCpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
    return ((fields[11] ?? 0) + (fields[12] ?? 0)) / 100;
  } catch {
    return Number.NaN;
  }
}

/** Runs `tick` every SAMPLE_MS (never two at once) until stopped; stop() waits for a tick under way. */
function every(tick: () => Promise<void>): { stop(): Promise<void> } {
  let running: Promise<void> | null = null;
  const timer = setInterval(() => {
    running ??= tick()
      .catch(() => undefined)
      .finally(() => {
        running = null;
      });
  }, SAMPLE_MS);
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}

/** One spooled part of a snapshot as seen from outside: created, last grown, full, deleted (epoch ms). */
type SpooledPart = { first: number; grew: number; full: number | null; gone: number | null; size: number };

/**
 * Watches the snapshot's spool directory on the node (`jobs/<job>/work/part-N`,
 * builder/src/tar/multipart-upload.ts): a part's file grows while the archive
 * is packed and compressed into it, is full when sealed, and is deleted once
 * its upload (part URL from the Worker, PUT through the gateway) succeeded.
 */
function watchSpool(jobsDir: string, known: Set<string>, partBytes: number): { stop(): Promise<Map<number, SpooledPart>> } {
  const parts = new Map<number, SpooledPart>();
  let work: string | null = null;
  const sampler = every(async () => {
    const now = Date.now();
    if (work === null) {
      for (const name of await readdir(jobsDir)) {
        if (!known.has(name) && existsSync(join(jobsDir, name, "work"))) work = join(jobsDir, name, "work");
      }
      if (work === null) return;
    }
    const present = new Set<number>();
    for (const name of await readdir(work).catch(() => [] as string[])) {
      const match = /^part-(\d+)$/.exec(name);
      const size = match ? (await stat(join(work, name)).catch(() => null))?.size : undefined;
      if (!match || size === undefined) continue;
      const n = Number(match[1]);
      present.add(n);
      const part = parts.get(n) ?? { first: now, grew: now, full: null, gone: null, size: 0 };
      parts.set(n, part);
      if (size > part.size) {
        part.size = size;
        part.grew = now;
      }
      if (size >= partBytes) part.full ??= now;
    }
    for (const [n, part] of parts) if (!present.has(n)) part.gone ??= now;
  });
  return {
    async stop() {
      await sampler.stop();
      return parts;
    },
  };
}

/** The restore's staging filesystem as seen from outside: its used bytes over time, and when it was unmounted (the swap). */
type StagingSeen = {
  used: { at: number; bytes: number }[];
  unmountedAt: number | null;
  dirtyAtUnmountKiB: number;
  builderCpu: { at: number; cpu: number }[];
};

function watchStaging(diskDir: string, builderPid: () => number): { stop(): Promise<StagingSeen> } {
  const seen: StagingSeen = { used: [], unmountedAt: null, dirtyAtUnmountKiB: 0, builderCpu: [] };
  let size: number | null = null;
  let dirtyKiB = 0;
  const sampler = every(async () => {
    const now = Date.now();
    seen.builderCpu.push({ at: now, cpu: ownCpuSeconds(builderPid()) });
    if (seen.unmountedAt !== null) return;
    const staging = (await readdir(diskDir).catch(() => [] as string[])).find((name) => name.startsWith("staging-") && !name.endsWith(".img"));
    const point = staging === undefined ? null : join(diskDir, staging);
    const mounted = point !== null && mountsUnder(point).length > 0;
    if (!mounted) {
      if (seen.used.length > 0) {
        seen.unmountedAt = now;
        seen.dirtyAtUnmountKiB = dirtyKiB;
      }
      return;
    }
    const fs = await statfs(point);
    // Unmounted between the two looks, statfs answers for the filesystem below: not the staging one (another size).
    if (size !== null && fs.blocks !== size) return;
    size = fs.blocks;
    seen.used.push({ at: now, bytes: (fs.blocks - fs.bfree) * fs.bsize });
    const meminfo = readFileSync("/proc/meminfo", "utf8");
    dirtyKiB = ["Dirty", "Writeback"].reduce((sum, field) => sum + Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(meminfo)?.[1] ?? 0), 0);
  });
  return {
    async stop() {
      await sampler.stop();
      return seen;
    },
  };
}

/**
 * What the staging filesystem's samples say of the extraction, which starts
 * after `from` (the job's first line, once the filesystem is made): the bytes
 * it allocated, and when they stopped growing.
 */
function extraction(seen: StagingSeen, from: number): { bytes: number; endedAt: number } {
  const samples = seen.used.filter((sample) => sample.at >= from);
  const baseline = samples[0]?.bytes ?? 0;
  const peak = samples.reduce((most, sample) => Math.max(most, sample.bytes), baseline);
  return { bytes: peak - baseline, endedAt: samples.find((sample) => sample.bytes === peak)?.at ?? Number.NaN };
}

/** CPU seconds `samples` rose by between two times (epoch ms). */
function cpuBetween(samples: { at: number; cpu: number }[], from: number, to: number): number {
  const at = (time: number) => samples.filter((sample) => sample.at <= time).at(-1)?.cpu ?? samples[0]?.cpu ?? 0;
  return at(to) - at(from);
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

/** What every round of ours measures, backup or restore. */
type Round = {
  ms: number;
  load: string;
  postMs: number;
  /** Client's POST → the builder job exists (API, D1, the object, the submission; a backup's R2 CreateMultipartUpload). */
  submitMs: number;
  queuedMs: number;
  runMs: number;
  /** Builder's finishedAt → the API's completedAt/finishedAt (callback, D1; a backup's CompleteMultipartUpload). */
  bookkeepingMs: number;
  /** completedAt/finishedAt → this poller saw the end. */
  pollMs: number;
  cpu: { builder: number; worker: number; workerd: number };
};

/** A round's common part: what this poller saw, the builder job's times, and the API's end time (`endedAt`). */
function roundOf(
  seen: Pick<Round, "ms" | "load" | "postMs" | "cpu"> & { postedAt: number; seenAt: number },
  job: { createdAt: string; startedAt: string; finishedAt: string },
  endedAt: string,
): Round {
  const startedAt = Date.parse(job.startedAt);
  const finishedAt = Date.parse(job.finishedAt);
  return {
    ms: seen.ms,
    load: seen.load,
    postMs: seen.postMs,
    submitMs: Date.parse(job.createdAt) - seen.postedAt,
    queuedMs: startedAt - Date.parse(job.createdAt),
    runMs: finishedAt - startedAt,
    bookkeepingMs: Date.parse(endedAt) - finishedAt,
    pollMs: seen.seenAt - Date.parse(endedAt),
    cpu: seen.cpu,
  };
}

type BackupRound = Round & {
  result: SnapshotResult;
  parts: number;
  firstPartMs: number;
  partGapMs: number[];
  lastPartToEndMs: number;
  /** From the spool directory: per part, filling it (pack + gzip + spool) and uploading it (part URL + PUT + ETag). */
  fillMs: number[];
  uploadMs: number[];
  /** Time some part was uploading (the builder uploads several at once), and time none was (compression-bound). */
  uploadingMs: number;
  uploaderIdleMs: number;
  spoolSeenParts: number;
};

type RestoreRound = Round & {
  /** startedAt → the job's first log line (disk quota, staging filesystem made). */
  setupMs: number;
  /** First line → last download progress line, and the bytes downloaded by then. */
  streamMs: number;
  streamBytes: number;
  /** Last progress line → the `restored` line (the rest of the download and extraction, hash and size checks, the swap). */
  tailMs: number;
  /** From the staging filesystem (sampled): when its data stopped growing and when it was unmounted, after the first log line. */
  extractEndMs: number;
  extractedBytes: number;
  unmountMs: number;
  restoredMs: number;
  dirtyAtSwapKiB: number;
  /** The builder process's own CPU seconds while streaming (first line → last progress line) and in the tail. */
  streamCpu: number;
  tailCpu: number;
  entries: number;
};

/** Milliseconds covered by the union of [start, end] intervals. */
function covered(intervals: [number, number][]): number {
  let total = 0;
  let reach = Number.NEGATIVE_INFINITY;
  for (const [start, end] of [...intervals].sort((a, b) => a[0] - b[0])) {
    if (end <= reach) continue;
    total += end - Math.max(start, reach);
    reach = end;
  }
  return total;
}

const work = await mkdtemp(join(tmpdir(), "svc-bench-roundtrip-"));
let stack: LocalStack | undefined;
let diskId: string | undefined;
const builderPids = new Set<number>();
const lines: string[] = [];
/** The report, printed at the end; progress goes to stderr as it happens. */
const say = (line = "") => {
  lines.push(line);
};

try {
  say(`load average at start: ${load()}; ${CORES} cores`);
  // What bench/load.ts's benchStack() does, in a directory of this script's own, so that it goes also when the start fails.
  const starting = performance.now();
  stack = await startLocalStack({
    port: 0,
    persistDir: join(work, "state"),
    stateDir: join(work, "svc"),
    secretsFile: join(work, "dev.vars"),
    output: "files",
  });
  const running = stack;
  builderPids.add(running.builderPid());
  process.stderr.write(`stack up in ${s(performance.now() - starting)}: ${running.apiUrl}, builder ${running.builderUrl}\n`);
  const node = running.nodes[0]!;
  const builder: BuilderTarget = { url: running.builderUrl, secret: await nodeKey(running.secrets.BUILDER_SECRET, node.id) };

  const api = async <T>(method: string, path: string, body?: object): Promise<{ status: number; data: T }> => {
    const response = await fetch(`${running.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${running.adminKey}`, ...(body ? { "Content-Type": "application/json" } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
    });
    const text = await response.text();
    if (!response.ok) throw new Error(`${method} ${path} answered ${response.status}: ${text.slice(0, 500)}`);
    return { status: response.status, data: (JSON.parse(text) as { data: T }).data };
  };
  const builderJob = async (key: string): Promise<{ status: JobStatus; log: { at: number; text: string }[] }> => {
    const response = await signedFetch(builder, `/v1/jobs?key=${encodeURIComponent(key)}`);
    if (response.status !== 200) throw new Error(`builder job ${key}: ${response.status} ${await response.text()}`);
    const status = JobStatus.parse(await response.json());
    const logResponse = await signedFetch(builder, `/v1/jobs/${status.id}/logs`);
    if (logResponse.status !== 200) throw new Error(`builder job log ${status.id}: ${logResponse.status}`);
    return { status, log: svcLines(await logResponse.text()) };
  };
  /** CPU seconds so far: the builder's tree, and the Worker's (workerd, and the Node process of wrangler's dev server above it, scripts/worker-dev.ts). */
  const cpu = () => {
    const worker = treeCpu(running.workerPid());
    return { builder: total(treeCpu(running.builderPid())), worker: total(worker), workerd: worker.get("workerd") ?? 0 };
  };
  type Cpu = ReturnType<typeof cpu>;
  const cpuSince = (before: Cpu) => {
    const after = cpu();
    return { builder: after.builder - before.builder, worker: after.worker - before.worker, workerd: after.workerd - before.workerd };
  };
  const workerCpuText = (used: Cpu, bytes: number) =>
    `Worker ${used.worker.toFixed(2)} s (workerd ${used.workerd.toFixed(2)} s, wrangler's Node process ${(used.worker - used.workerd).toFixed(2)} s; ` +
    `${((used.worker * 1000) / (bytes / MiB)).toFixed(0)} ms per MiB)`;

  // The disk, its data written straight into its folder on the node.
  const sizeGb = Math.max(1, Math.ceil((SIZE_MIB * MiB * 1.5) / 1024 ** 3));
  const disk = (await api<{ id: string }>("POST", "/v1/disks", { name: "bench-roundtrip", sizeGb, mountPath: "/data" })).data;
  diskId = disk.id;
  const data = diskDataPath(node.dataDir, disk.id);
  statSync(data); // throws when the disk is not where the node keeps disks
  const generating = performance.now();
  const files = await generate(data, SIZE_MIB * MiB);
  execFileSync("sync");
  process.stderr.write(`generated ${files} files in ${s(performance.now() - generating)}\n`);
  say(
    `data: ${SIZE_MIB} MiB in ${files} files on a ${sizeGb} GB disk (bench/disk-data.ts generate(): 40 % JSON lines in 8 MiB files, ` +
      `40 % random bytes in 16 MiB files, 20 % small 1-16 KiB files, half JSON, half random; so ~50 % random, ~50 % text), ` +
      `generated in ${s(performance.now() - generating)}`,
  );
  say(`every timed run (ours and the tools') starts after an untimed sync; ours are polled every ${POLL_MS} ms`);

  // --- Backups ------------------------------------------------------------------------------
  const backups: BackupRound[] = [];
  const tarC: { ms: number }[] = [];
  const pigzC: { ms: number }[] = [];
  const tarOut = join(work, "tool.tgz");
  let tarBytes = 0;
  let lastBackup: BackupView | undefined;
  for (let round = 0; round < ROUNDS; round++) {
    settle();
    const roundLoad = load();
    const jobsDir = join(node.dataDir, "jobs");
    const spool = watchSpool(jobsDir, new Set(await readdir(jobsDir).catch(() => [] as string[])), partSizeOf(sizeGb));
    const cpuBefore = cpu();
    const postedAt = Date.now();
    const started = performance.now();
    const created = (await api<BackupView>("POST", `/v1/disks/${disk.id}/backups`, { description: `bench round ${round + 1}` })).data;
    const postMs = performance.now() - started;
    let view: BackupView | undefined;
    for (;;) {
      view = (await api<BackupView[]>("GET", `/v1/disks/${disk.id}/backups`)).data.find((backup) => backup.id === created.id);
      if (view?.status === "ready") break;
      if (!view || view.status === "failed") throw new Error(`backup ${created.id} ${view ? `failed: ${view.failureReason}` : "vanished"}`);
      await sleep(POLL_MS);
    }
    const seenAt = Date.now();
    const ms = performance.now() - started;
    const used = cpuSince(cpuBefore);
    const spooled = [...(await spool.stop()).entries()].sort(([a], [b]) => a - b).map(([, part]) => part);
    lastBackup = view;
    const { status: job, log } = await builderJob(created.id);
    if (job.startedAt === null || job.finishedAt === null || !view.completedAt) throw new Error("the backup's job has no start or end time");
    const result = SnapshotResult.parse(job.result);
    const partLines = log.filter((line) => /^uploaded part \d+/.test(line.text));
    const startedAtMs = Date.parse(job.startedAt);
    const finishedAtMs = Date.parse(job.finishedAt);
    const filled = (part: SpooledPart) => part.full ?? part.grew;
    const gone = (part: SpooledPart) => part.gone ?? finishedAtMs;
    const complete = spooled.length === result.parts.length;
    backups.push({
      ...roundOf({ ms, load: roundLoad, postMs, postedAt, seenAt, cpu: used }, { createdAt: job.createdAt, startedAt: job.startedAt, finishedAt: job.finishedAt }, view.completedAt),
      result,
      parts: result.parts.length,
      firstPartMs: (partLines[0]?.at ?? Number.NaN) - startedAtMs,
      partGapMs: partLines.slice(1).map((line, i) => line.at - partLines[i]!.at),
      lastPartToEndMs: finishedAtMs - (partLines.at(-1)?.at ?? Number.NaN),
      fillMs: spooled.map((part) => filled(part) - part.first),
      uploadMs: spooled.map((part) => gone(part) - filled(part)),
      uploadingMs: complete ? covered(spooled.map((part) => [filled(part), gone(part)])) : Number.NaN,
      uploaderIdleMs: complete ? finishedAtMs - startedAtMs - covered(spooled.map((part) => [filled(part), gone(part)])) : Number.NaN,
      spoolSeenParts: spooled.length,
    });
    process.stderr.write(`backup round ${round + 1}: ${s(ms)} (load ${roundLoad})\n`);
    settle();
    tarC.push(await timeTool("tar", ["czf", tarOut, "-C", data, "."]));
    tarBytes = statSync(tarOut).size;
    settle();
    pigzC.push(await timeTool("tar", ["-I", `pigz -p${CORES} -6`, "-cf", tarOut, "-C", data, "."]));
    process.stderr.write(`  tar czf ${s(tarC.at(-1)!.ms)}, tar | pigz -p${CORES} ${s(pigzC.at(-1)!.ms)}\n`);
  }
  await rm(tarOut, { force: true });
  if (!lastBackup) throw new Error("no backup ran");

  // --- The archive, once: its size, the tar xzf baseline's input, and the gateway's GET speed --------
  const archive = join(work, "backup.tar.gz");
  const link = (await api<{ url: string }>("GET", `/v1/disks/${disk.id}/backups/${lastBackup.id}/download`)).data;
  const downloadCpu = cpu();
  const downloading = performance.now();
  const archiveBytes = await download(link.url, archive);
  const downloadMs = performance.now() - downloading;
  const downloadUsed = cpuSince(downloadCpu);
  if (archiveBytes !== lastBackup.sizeBytes) throw new Error(`downloaded ${archiveBytes} bytes, the backup has ${lastBackup.sizeBytes}`);

  // --- References: gateway PUT speed (one at a time, and several at once), gunzip speed --------------
  const archiveBuffer = readFileSync(archive);
  const slice = (i: number) => {
    const offset = (i * PROBE_OBJECT_BYTES) % Math.max(1, archiveBuffer.length - PROBE_OBJECT_BYTES);
    return archiveBuffer.subarray(offset, offset + PROBE_OBJECT_BYTES);
  };
  const presignedPuts = async (count: number) => {
    const urls: string[] = [];
    for (let i = 0; i < count; i++) {
      urls.push((await api<{ uploadUrl: string }>("POST", `/v1/disks/${disk.id}/backups/restore/presign`, { sizeBytes: PROBE_OBJECT_BYTES })).data.uploadUrl);
    }
    return urls;
  };
  const serialUrls = await presignedPuts(PROBE_OBJECTS);
  const serialCpu = cpu();
  const serialStarted = performance.now();
  for (const [i, url] of serialUrls.entries()) await put(url, slice(i));
  const putSerialMs = performance.now() - serialStarted;
  const serialUsed = cpuSince(serialCpu);
  const parallelUrls = await presignedPuts(PROBE_OBJECTS);
  const parallelCpu = cpu();
  const parallelStarted = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: PROBE_PARALLEL }, async () => {
      for (let i = next++; i < parallelUrls.length; i = next++) await put(parallelUrls[i]!, slice(i));
    }),
  );
  const putParallelMs = performance.now() - parallelStarted;
  const parallelUsed = cpuSince(parallelCpu);
  const gunzipStarted = performance.now();
  let expanded = 0;
  await pipeline(
    createReadStream(archive, { highWaterMark: MiB }),
    createGunzip({ chunkSize: 256 * 1024 }),
    new Writable({
      write(chunk: Buffer, _encoding, done) {
        expanded += chunk.length;
        done();
      },
    }),
  );
  const nodeGunzipMs = performance.now() - gunzipStarted;
  const gzipDc = await timeTool("gzip", ["-dc", archive], "/dev/null");

  // --- Restores -----------------------------------------------------------------------------
  const restores: RestoreRound[] = [];
  const tarX: { ms: number }[] = [];
  const tarSync: { ms: number }[] = [];
  const atRest = diskFolderAtRest(node.dataDir, disk.id).join();
  for (let round = 0; round < ROUNDS; round++) {
    settle();
    const roundLoad = load();
    const staging = watchStaging(join(node.dataDir, "disks", disk.id), () => running.builderPid());
    const cpuBefore = cpu();
    const postedAt = Date.now();
    const started = performance.now();
    const { jobId } = (await api<{ jobId: string }>("POST", `/v1/disks/${disk.id}/backups/restore`, { backupId: lastBackup.id })).data;
    const postMs = performance.now() - started;
    let view: RestoreView;
    for (;;) {
      view = (await api<RestoreView>("GET", `/v1/disks/${disk.id}/backups/restore/${jobId}`)).data;
      if (view.status === "succeeded") break;
      if (view.status === "failed") throw new Error(`restore ${jobId} failed: ${view.error}`);
      await sleep(POLL_MS);
    }
    const seenAt = Date.now();
    const ms = performance.now() - started;
    const used = cpuSince(cpuBefore);
    const seen = await staging.stop();
    const { status: job, log } = await builderJob(jobId);
    if (job.startedAt === null || job.finishedAt === null || view.finishedAt === null) throw new Error("the restore's job has no start or end time");
    const result = RestoreResult.parse(job.result);
    const startedAtMs = Date.parse(job.startedAt);
    const first = log.find((line) => line.text.startsWith("restore of disk"));
    const progress = log.filter((line) => line.text.startsWith("downloaded "));
    const restored = log.find((line) => line.text.startsWith("restored "));
    if (!first || !restored) throw new Error(`the restore's log lacks its first or last line:\n${log.map((line) => line.text).join("\n")}`);
    const lastProgress = progress.at(-1) ?? first;
    const progressBytes = /^downloaded ([\d.]+) MiB/.exec(lastProgress.text);
    restores.push({
      ...roundOf({ ms, load: roundLoad, postMs, postedAt, seenAt, cpu: used }, { createdAt: job.createdAt, startedAt: job.startedAt, finishedAt: job.finishedAt }, view.finishedAt),
      setupMs: first.at - startedAtMs,
      streamMs: lastProgress.at - first.at,
      streamBytes: progressBytes ? Number(progressBytes[1]) * MiB : 0,
      tailMs: restored.at - lastProgress.at,
      extractEndMs: extraction(seen, first.at).endedAt - first.at,
      extractedBytes: extraction(seen, first.at).bytes,
      unmountMs: (seen.unmountedAt ?? Number.NaN) - first.at,
      restoredMs: restored.at - first.at,
      dirtyAtSwapKiB: seen.dirtyAtUnmountKiB,
      streamCpu: cpuBetween(seen.builderCpu, first.at, lastProgress.at),
      tailCpu: cpuBetween(seen.builderCpu, lastProgress.at, restored.at),
      entries: result.entries,
    });
    process.stderr.write(`restore round ${round + 1}: ${s(ms)} (load ${roundLoad})\n`);
    // The old data is deleted in the background after the swap: let that end before tar runs.
    for (let waited = 0; (await readdir(join(node.dataDir, "disks", disk.id))).join() !== atRest; waited++) {
      if (waited > 1200) throw new Error("the disk's old data was not deleted within 60 s of the restore");
      await sleep(50);
    }
    const target = join(work, `untar-${round}`);
    await mkdir(target);
    settle();
    tarX.push(await timeTool("tar", ["xzf", archive, "-C", target]));
    // Not part of the baseline: how long writing tar's files back to disk then takes (the restore's swap unmounts, which writes back).
    tarSync.push(await timeTool("sync", ["-f", target]));
    await rm(target, { recursive: true, force: true });
    process.stderr.write(`  tar xzf ${s(tarX.at(-1)!.ms)} (then sync -f ${s(tarSync.at(-1)!.ms)})\n`);
  }

  // --- Report -------------------------------------------------------------------------------
  const bestBackup = backups.reduce((a, b) => (b.ms < a.ms ? b : a));
  const bestRestore = restores.reduce((a, b) => (b.ms < a.ms ? b : a));
  const partBytes = partSizeOf(sizeGb);
  const snap = bestBackup.result;
  say();
  say(
    `archive: ${mib(archiveBytes)} (${((archiveBytes / snap.expandedBytes) * 100).toFixed(0)} % of the ${mib(snap.expandedBytes)} tar stream), ` +
      `${snap.entries} entries, ${bestBackup.parts} parts of ${mib(partBytes)}; tar czf's archive: ${mib(tarBytes)}`,
  );
  say();
  say(`BACKUP (POST …/backups → ready), ${ROUNDS} rounds, alternating with tar czf:`);
  say(`  ours     ${all(backups)} s   best ${s(best(backups))}`);
  say(`  tar czf  ${all(tarC)} s   best ${s(best(tarC))}`);
  say(`  backup speed: ${(best(tarC) / best(backups)).toFixed(2)}x tar czf (best/best; target ≥ 1.3x)`);
  say(`  reference: tar | pigz -p${CORES} -6  ${all(pigzC)} s   (${(best(pigzC) / best(backups)).toFixed(2)}x ours)`);
  for (const [i, round] of backups.entries()) {
    say(`  round ${i + 1} (load average ${round.load}): ${s(round.ms)} = ${rate(SIZE_MIB * MiB, round.ms)} of data, ${rate(round.result.sizeBytes, round.ms)} of archive`);
    say(`    API + submission (POST → builder job created)  ${s(round.submitMs)}   (the POST itself answered in ${s(round.postMs)})`);
    say(`    queued on the builder                          ${s(round.queuedMs)}`);
    say(
      `    builder job: pack + gzip + upload               ${s(round.runMs)}   (${rate(round.result.sizeBytes, round.runMs)} archive, ` +
        `${rate(round.result.expandedBytes, round.runMs)} tar stream)`,
    );
    say(
      `      first part uploaded after ${s(round.firstPartMs)}; then one part every ${s(median(round.partGapMs))} (median; ` +
        `max ${s(Math.max(...round.partGapMs, 0))}) = ${rate(partBytes, median(round.partGapMs))}; last part → job end ${s(round.lastPartToEndMs)}`,
    );
    const fills = round.fillMs;
    const uploads = round.uploadMs;
    say(
      `      from outside (spool files sampled every ${SAMPLE_MS} ms, ${round.spoolSeenParts} of ${round.parts} parts seen): filling a part (pack + gzip + spool) ` +
        `median ${s(median(fills))}, uploading it (part URL + PUT through the gateway) median ${s(median(uploads))} = ${rate(partBytes, median(uploads))}, ` +
        `several at once`,
    );
    say(
      `      some part uploading ${s(round.uploadingMs)} (${((round.uploadingMs / round.runMs) * 100).toFixed(0)} % of the job); ` +
        `none uploading ${s(round.uploaderIdleMs)} (compression-bound, the first part's filling included)`,
    );
    say(`      per part, filling / uploading (s): ${fills.map((fill, n) => `${(fill / 1000).toFixed(2)}/${((uploads[n] ?? Number.NaN) / 1000).toFixed(2)}`).join(" ")}`);
    say(`    bookkeeping (builder end → backup completedAt)  ${s(round.bookkeepingMs)}   (callback, CompleteMultipartUpload in local R2, D1)`);
    say(`    poll (completedAt → seen ready)                ${s(round.pollMs)}   (polling every ${POLL_MS} ms)`);
    say(`    CPU: builder ${round.cpu.builder.toFixed(2)} s, ${workerCpuText(round.cpu, round.result.sizeBytes)}; ${CORES} cores × ${s(round.ms)} available`);
  }
  say();
  say(`RESTORE (POST …/backups/restore {backupId} → succeeded), ${ROUNDS} rounds, alternating with tar xzf:`);
  say(`  ours     ${all(restores)} s   best ${s(best(restores))}`);
  say(`  tar xzf  ${all(tarX)} s   best ${s(best(tarX))}   (then sync -f of its files, not counted: ${all(tarSync)} s)`);
  say(`  restore speed: ${(best(tarX) / best(restores)).toFixed(2)}x tar xzf (best/best; target ≥ 0.9x)`);
  for (const [i, round] of restores.entries()) {
    say(`  round ${i + 1} (load average ${round.load}): ${s(round.ms)} = ${rate(archiveBytes, round.ms)} of archive, ${round.entries} entries`);
    say(`    API + submission (POST → builder job created)  ${s(round.submitMs)}   (the POST itself answered in ${s(round.postMs)})`);
    say(`    queued on the builder                          ${s(round.queuedMs)}`);
    say(`    builder job                                    ${s(round.runMs)}   (${rate(archiveBytes, round.runMs)} archive)`);
    say(`      setup (quota, staging filesystem)            ${s(round.setupMs)}`);
    say(
      `      download + sha256 + gunzip + extract, streamed, to the last progress line (${mib(round.streamBytes)})  ` +
        `${s(round.streamMs)}   (${rate(round.streamBytes, round.streamMs)})`,
    );
    say(`      rest of the stream + size/hash check + swap  ${s(round.tailMs)}`);
    say(`      builder process CPU: ${round.streamCpu.toFixed(2)} s while streaming, ${round.tailCpu.toFixed(2)} s in the rest`);
    say(
      `      from outside (staging filesystem sampled every ${SAMPLE_MS} ms; times after the job's first line): data stopped growing at ` +
        `+${s(round.extractEndMs)} (${mib(round.extractedBytes)} allocated), staging unmounted (swap begins) at +${s(round.unmountMs)}, ` +
        `restored line at +${s(round.restoredMs)}: swap ${s(round.restoredMs - round.unmountMs)}; dirty + writeback memory (whole machine) just before: ${mib(round.dirtyAtSwapKiB * 1024)}`,
    );
    say(`    bookkeeping (builder end → restore finishedAt) ${s(round.bookkeepingMs)}   (callback, D1)`);
    say(`    poll (finishedAt → seen succeeded)             ${s(round.pollMs)}   (polling every ${POLL_MS} ms)`);
    say(`    CPU: builder ${round.cpu.builder.toFixed(2)} s, ${workerCpuText(round.cpu, archiveBytes)}; ${CORES} cores × ${s(round.ms)} available`);
  }
  say();
  say("REFERENCES (measured once, same stack, between the backups and the restores):");
  const probeBytes = PROBE_OBJECTS * PROBE_OBJECT_BYTES;
  say(
    `  gateway GET: the archive's presigned download (Worker /storage → local R2) ${s(downloadMs)} = ${rate(archiveBytes, downloadMs)}; ` +
      workerCpuText(downloadUsed, archiveBytes),
  );
  say(
    `  gateway PUT: ${PROBE_OBJECTS} × ${mib(PROBE_OBJECT_BYTES)} presigned single PUTs one at a time ${s(putSerialMs)} = ` +
      `${rate(probeBytes, putSerialMs)} (${workerCpuText(serialUsed, probeBytes)})`,
  );
  say(
    `               ${PROBE_PARALLEL} at a time ${s(putParallelMs)} = ${rate(probeBytes, putParallelMs)} (${workerCpuText(parallelUsed, probeBytes)}); ` +
      "the backup's parts go the same way, as UploadPart, up to three at once",
  );
  say(
    `  gunzip of the archive: Node zlib (what the restore uses, one thread) ${s(nodeGunzipMs)} = ${rate(archiveBytes, nodeGunzipMs)} archive ` +
      `(${rate(expanded, nodeGunzipMs)} out); gzip -dc ${s(gzipDc.ms)}`,
  );
  say(`  best backup:  ${s(bestBackup.runMs)} of ${s(bestBackup.ms)} in the builder job (${((bestBackup.runMs / bestBackup.ms) * 100).toFixed(0)} %)`);
  say(`  best restore: ${s(bestRestore.runMs)} of ${s(bestRestore.ms)} in the builder job (${((bestRestore.runMs / bestRestore.ms) * 100).toFixed(0)} %)`);
  say();
  say("NOT EXPOSED, measured from outside instead:");
  say("  - the API shows no builder times: the job's created/started/finished times and its log were read from the node (signed GET /v1/jobs?key=<backup or restore id>);");
  say("  - a backup's packing, gzip and upload overlap (one part uploads while the next is compressed and spooled) and the job logs only when a part's");
  say("    upload ended: when each part was filled and when its upload began come from the node's spool directory, sampled from outside;");
  say("  - a restore's download, hashing, gunzip and extraction are one stream (progress lines every tenth of the archive), and the end of the");
  say("    extraction and the swap are not logged: they come from the staging filesystem (used bytes, then its unmount), sampled from outside;");
  say("  - the Worker's own time per request (part URL, PUT, GET) is not exposed: its CPU is the process tree's, from /proc;");
  say("  - bookkeeping is the Worker's clock (completedAt/finishedAt) minus the builder's (finishedAt), on the same machine.");
  say(`load average at end: ${load()}`);
} finally {
  if (stack) {
    if (diskId) {
      // Deleting the disk unmounts and removes its filesystem (and deletes its backups) on the node.
      await fetch(`${stack.apiUrl}/v1/disks/${diskId}`, { method: "DELETE", headers: { Authorization: `Bearer ${stack.adminKey}` } })
        .then((response) => response.body?.cancel())
        .catch(() => undefined);
    }
    builderPids.add(stack.builderPid());
    await stack.stop().catch((error: unknown) => process.stderr.write(`stopping the stack: ${String(error)}\n`));
  }
  // Whatever the node left mounted in this run's directory (or in its alias of it) goes before the directory does.
  if (process.getuid?.() === 0) {
    const points = [...mountsUnder(work), ...[...builderPids].flatMap((pid) => mountsUnder(`/run/svc-builder/data-${pid}`))];
    for (const point of points) {
      try {
        execFileSync("umount", ["-l", point], { stdio: "ignore" });
      } catch {
        // already gone
      }
    }
  }
  await rm(work, { recursive: true, force: true }).catch((error: unknown) => process.stderr.write(`removing ${work}: ${String(error)}\n`));
}

console.log(lines.join("\n"));
