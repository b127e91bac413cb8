/**
 * Disk snapshot and restore throughput and memory, against the standard tools
 * in the same run, for a 128 MiB and a 512 MiB disk:
 *
 * - snapshot: the real builder packs, compresses, hashes and uploads the disk
 *   in parts to a local sink (part-URL endpoint plus a PUT receiver that keeps
 *   the bytes in memory), against `tar czf` (one gzip) and `tar -I "pigz -p2"`
 *   (pigz on two threads) of the same directory;
 * - restore: the builder downloads that archive from the sink, checks it and
 *   extracts it into a staging directory and swaps it in, against `tar xzf` of
 *   the same archive into an empty directory on a disk made like the restored one.
 *
 * Each side runs ROUNDS times (default 2), alternating, and the fastest run
 * counts (the development VM is shared, so load comes and goes; the load
 * average is printed with every round). CPU seconds are reported too: the
 * builder process's, from /proc, and the tools' as this process's
 * reaped-children time. A fresh builder per size, so its peak RSS (VmRSS
 * sampled every 25 ms, and the kernel's VmHWM) belongs to that size.
 *
 * The data is deterministic (seeded, bench/disk-data.ts): 40 % compressible
 * JSON lines in 8 MiB files, 40 % incompressible bytes in 16 MiB files, 20 %
 * small files (1-16 KiB, half JSON, half random) spread over nested directories.
 * pigz is installed with apt-get when missing (as root, or through sudo).
 *
 *     npx tsx bench/backup.ts [sizes in MiB, default "128,512"]
 */
import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { RESTORE_EXTRACTED_NOTE } from "../builder/src/jobs/restore.js";
import { RestoreResult, SnapshotResult } from "../builder/src/protocol/disks.js";
import { diskDataPath, diskFolderAtRest, followLog, jobStatus, putDisk, signedFetch, startBuilder } from "../test/builder/builder-process.js";
import { generate, MiB } from "./disk-data.js";

const sizes = (process.argv[2] ?? "128,512").split(",").map(Number);
const PART_BYTES = 16 * MiB;
const ROUNDS = Number(process.env.ROUNDS ?? 2);

/** Receives parts like object storage would, keeping the last snapshot's parts to serve it back for restores. */
async function startSink(): Promise<{ endpoint: string; received: () => number; archive: () => Buffer; archiveUrl: string; close: () => Promise<void> }> {
  let received = 0;
  let base = "";
  let parts = new Map<number, Buffer>();
  let served = Buffer.alloc(0);
  const server = createServer((request, response) => {
    if (request.method === "GET") {
      response.writeHead(200, { "Content-Length": served.length, "Content-Type": "application/gzip" }).end(served);
      return;
    }
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      received += chunk.length;
    });
    request.on("end", () => {
      if (request.method === "POST") {
        const { partNumber } = JSON.parse(Buffer.concat(chunks).toString()) as { partNumber: number };
        if (partNumber === 1) parts = new Map();
        response.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ url: `${base}/put/${partNumber}` }));
        return;
      }
      parts.set(Number(request.url?.split("/").pop()), Buffer.concat(chunks));
      response.writeHead(200, { ETag: `"${request.url}"` }).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    endpoint: `${base}/parts`,
    received: () => received,
    /** The last snapshot, whole; also what GET `archiveUrl` serves from now on. */
    archive: () => {
      served = Buffer.concat([...parts.keys()].sort((a, b) => a - b).map((n) => parts.get(n)!));
      return served;
    },
    archiveUrl: `${base}/archive.tar.gz`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function memoryOf(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(status)?.[1] ?? 0) * 1024;
  return { rss: kib("VmRSS"), hwm: kib("VmHWM") };
}

/** utime + stime in seconds: of `pid`, or with `children` this process's reaped children (the tools). */
function cpuSeconds(pid: number | "self", children = false): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  // Fields after the command name start at field 3; utime/stime are 14/15, cutime/cstime 16/17; in clock ticks (100 Hz).
  const [a, b] = children ? [fields[13], fields[14]] : [fields[11], fields[12]];
  return ((a ?? 0) + (b ?? 0)) / 100;
}

/** Runs a tool to its end: wall milliseconds and the CPU seconds it (and its children) used. */
function timeTool(command: string, args: string[]): Promise<{ ms: number; cpu: number }> {
  return new Promise((resolve, reject) => {
    const cpuBefore = cpuSeconds("self", true);
    const started = performance.now();
    const child = spawn(command, args, { stdio: "inherit" });
    child.once("error", reject);
    child.once("exit", (code) => {
      if (code !== 0) return reject(new Error(`${command} ${args.join(" ")} exited ${code}`));
      resolve({ ms: performance.now() - started, cpu: cpuSeconds("self", true) - cpuBefore });
    });
  });
}

/** pigz on the PATH, installed with apt-get (as root, else through sudo) when missing. */
function ensurePigz(): void {
  const has = () => {
    try {
      execFileSync("pigz", ["--version"], { stdio: "ignore" });
      return true;
    } catch {
      return false;
    }
  };
  if (has()) return;
  const sudo = process.getuid?.() === 0 ? [] : ["sudo"];
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  const run = (args: string[]) => execFileSync(sudo[0] ?? args[0]!, sudo.length ? args : args.slice(1), { stdio: "inherit", env });
  run(["apt-get", "update", "-qq"]);
  run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "pigz"]);
  if (!has()) throw new Error("pigz is still missing after apt-get install");
}

/** Runs a builder job to its end: wall milliseconds, builder CPU seconds, final status. */
async function timeJob(builder: Awaited<ReturnType<typeof startBuilder>>, path: string, body: object) {
  const cpuBefore = cpuSeconds(builder.pid);
  const started = performance.now();
  const submitted = await signedFetch(builder, path, { method: "POST", body });
  const { id } = (await submitted.json()) as { id: string };
  const log = await followLog(builder, id);
  const ms = performance.now() - started;
  const cpu = cpuSeconds(builder.pid) - cpuBefore;
  const status = await jobStatus(builder, id);
  if (status.status !== "succeeded") throw new Error(`${path} failed: ${status.error}`);
  return { ms, cpu, result: status.result, phases: restorePhases(log) };
}

/**
 * A restore's phases from its log's timestamps: from its first line to the
 * end of extraction (download, checks, gunzip, writing into the staging
 * filesystem), then the swap (unmounting the staging image, which writes its
 * dirty pages into the image file, and mounting it as the disk), in ms.
 */
function restorePhases(log: string): { extractMs: number; swapMs: number } | null {
  const at = (pattern: string) => {
    const line = log.split("\n").find((text) => text.includes(pattern));
    return line ? Date.parse(line.slice(0, line.indexOf(" "))) : Number.NaN;
  };
  const start = at("restore of disk");
  const extracted = at(RESTORE_EXTRACTED_NOTE);
  const restored = at("restored ");
  if ([start, extracted, restored].some(Number.isNaN)) return null;
  return { extractMs: extracted - start, swapMs: restored - extracted };
}

const load = () => loadavg().map((value) => value.toFixed(2)).join(" ");
const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB`;
const seconds = (runs: { ms: number }[]) => runs.map((run) => (run.ms / 1000).toFixed(2)).join("/");
const cpus = (runs: { cpu: number }[]) => runs.map((run) => run.cpu.toFixed(2)).join("/");
const best = (runs: { ms: number }[]) => Math.min(...runs.map((run) => run.ms));
/** Speed of `ours` relative to `theirs` (higher is better for ours): their time over ours. */
const speed = (ours: { ms: number }[], theirs: { ms: number }[]) => `${(best(theirs) / best(ours)).toFixed(2)}x`;

ensurePigz();
const rows: string[] = [];
console.log(`load average at start: ${load()}`);

for (const size of sizes) {
  const dataDir = await mkdtemp(join(tmpdir(), "svc-bench-backup-"));
  const builder = await startBuilder({ dataDir });
  const sink = await startSink();
  try {
    // `tar xzf` extracts into a disk made like the one the builder restores into (an image where the node makes them).
    for (const disk of ["bench", "restored", "untar"]) await putDisk(builder, disk, 4 * size * MiB);
    const data = diskDataPath(dataDir, "bench");
    const generating = performance.now();
    const files = await generate(data, size * MiB);
    process.stderr.write(`${size} MiB: generated ${files} files in ${((performance.now() - generating) / 1000).toFixed(1)} s\n`);

    const idle = memoryOf(builder.pid);
    let peakRss = idle.rss;
    const sampler = setInterval(() => {
      peakRss = Math.max(peakRss, memoryOf(builder.pid).rss);
    }, 25);
    const runs = { snapshot: [] as { ms: number; cpu: number }[], tar: [] as { ms: number; cpu: number }[], pigz: [] as { ms: number; cpu: number }[] };
    const restoreRuns = { restore: [] as { ms: number; cpu: number }[], untar: [] as { ms: number; cpu: number }[] };
    const phases: { extractMs: number; swapMs: number }[] = [];
    const loads: string[] = [];
    let snapshot: SnapshotResult | undefined;
    let tarBytes = 0;
    const tarOut = join(dataDir, "tool.tgz");
    for (let round = 0; round < ROUNDS; round++) {
      loads.push(load());
      const before = sink.received();
      const job = await timeJob(builder, "/v1/snapshots", { diskId: "bench", partSizeBytes: PART_BYTES, partUrlEndpoint: sink.endpoint });
      runs.snapshot.push(job);
      snapshot = SnapshotResult.parse(job.result);
      if (sink.received() - before < snapshot.sizeBytes) throw new Error("the sink got less than the snapshot says");
      runs.tar.push(await timeTool("tar", ["czf", tarOut, "-C", data, "."]));
      tarBytes = statSync(tarOut).size;
      runs.pigz.push(await timeTool("tar", ["-I", "pigz -p2 -6", "-cf", tarOut, "-C", data, "."]));
    }
    if (!snapshot) throw new Error("no snapshot ran");
    const archive = sink.archive();
    if (createHash("sha256").update(archive).digest("hex") !== snapshot.sha256) throw new Error("the sink's archive does not match the snapshot's SHA-256");
    const snapshotPeakRss = peakRss;
    peakRss = memoryOf(builder.pid).rss;
    const archiveFile = join(dataDir, "snapshot.tar.gz");
    await writeFile(archiveFile, archive);
    const restoreSpec = {
      diskId: "restored",
      archiveUrl: sink.archiveUrl,
      expectedSizeBytes: snapshot.sizeBytes,
      expectedSha256: snapshot.sha256,
      maxEntries: snapshot.entries,
      maxExpandedBytes: snapshot.expandedBytes,
    };
    for (let round = 0; round < ROUNDS; round++) {
      loads.push(load());
      const job = await timeJob(builder, "/v1/restores", restoreSpec);
      restoreRuns.restore.push(job);
      if (job.phases) phases.push(job.phases);
      const restored = RestoreResult.parse(job.result);
      if (restored.entries !== snapshot.entries) throw new Error(`restored ${restored.entries} entries of ${snapshot.entries}`);
      // The old data is deleted in the background after the swap: let it finish before tar runs.
      const atRest = diskFolderAtRest(dataDir, "restored").join();
      while ((await readdir(join(dataDir, "disks/restored"))).join() !== atRest) await new Promise((resolve) => setTimeout(resolve, 50));
      const target = join(diskDataPath(dataDir, "untar"), `round-${round}`);
      await mkdir(target);
      restoreRuns.untar.push(await timeTool("tar", ["xzf", archiveFile, "-C", target]));
      await rm(target, { recursive: true, force: true });
    }
    clearInterval(sampler);
    const { hwm } = memoryOf(builder.pid);
    rows.push(
      `${`${size} MiB`.padEnd(8)} ${String(files).padStart(6)} files, archive ${mib(snapshot.sizeBytes)} (tar czf: ${mib(tarBytes)}) in ${snapshot.parts.length} parts\n` +
        `  snapshot ${seconds(runs.snapshot)} s (CPU ${cpus(runs.snapshot)})  tar czf ${seconds(runs.tar)} s (CPU ${cpus(runs.tar)})  ` +
        `tar -I "pigz -p2" ${seconds(runs.pigz)} s (CPU ${cpus(runs.pigz)})\n` +
        `  snapshot speed: ${speed(runs.snapshot, runs.tar)} tar czf, ${speed(runs.snapshot, runs.pigz)} pigz -p2 (best/best)\n` +
        `  restore ${seconds(restoreRuns.restore)} s (CPU ${cpus(restoreRuns.restore)})  tar xzf ${seconds(restoreRuns.untar)} s (CPU ${cpus(restoreRuns.untar)})  ` +
        `restore speed: ${speed(restoreRuns.restore, restoreRuns.untar)} tar xzf\n` +
        `  restore phases: extract ${phases.map((phase) => (phase.extractMs / 1000).toFixed(2)).join("/")} s (its best ${speed(phases.map((phase) => ({ ms: phase.extractMs })), restoreRuns.untar)} tar xzf), ` +
        `swap ${phases.map((phase) => (phase.swapMs / 1000).toFixed(2)).join("/")} s, the rest (job submit, staging made, log) the difference\n` +
        `  builder RSS idle ${mib(idle.rss)}, peak ${mib(Math.max(snapshotPeakRss, peakRss))} (sampled: ${mib(snapshotPeakRss)} in the snapshots, ` +
        `${mib(peakRss)} in the restores), VmHWM ${mib(hwm)}; load average per round: ${loads.join(" | ")}`,
    );
    process.stderr.write(`${rows.at(-1)}\n`);
  } finally {
    await sink.close();
    await builder.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
}

console.log("snapshot (gzip -6 on every core, parts of 16 MiB, to a local sink) and restore (download, check, extract, swap), vs the tools on the same data:");
for (const row of rows) console.log(row);
console.log(`load average at end: ${load()}`);
