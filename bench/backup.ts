/**
 * Disk snapshot throughput and memory: the real builder snapshots a generated
 * disk to a local sink (part-URL endpoint plus a PUT receiver that counts and
 * discards the bytes), against `tar czf` of the same directory in the same run,
 * for a 128 MiB and a 512 MiB disk. Each side runs twice, alternating, and the
 * faster run counts (the development VM is shared, so load comes and goes).
 * CPU seconds are reported too (the builder process's, from /proc; tar's and
 * its gzip child's, as this process's reaped-children time), which load does
 * not distort.
 * A fresh builder per size, so its peak RSS (sampled VmRSS every 25 ms, and
 * the kernel's VmHWM) belongs to that size.
 *
 * The data is deterministic (seeded): 40 % compressible JSON lines in 8 MiB
 * files, 40 % incompressible bytes in 16 MiB files, 20 % small files
 * (1-16 KiB, half JSON, half random) spread over nested directories.
 *
 *     npx tsx bench/backup.ts [sizes in MiB, default "128,512"]
 */
import { spawn } from "node:child_process";
import { createCipheriv, createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { SnapshotResult } from "../builder/src/protocol.js";
import { followLog, jobStatus, signedFetch, startBuilder } from "../test/builder/builder-process.js";

const MiB = 1024 * 1024;
const sizes = (process.argv[2] ?? "128,512").split(",").map(Number);
const PART_BYTES = 16 * MiB;
const ROUNDS = 2;

/** Deterministic bytes: AES-256-CTR keystream under a key derived from the seed (fast, and incompressible). */
function randomStream(seed: string): (bytes: number) => Buffer {
  const key = createHash("sha256").update(seed).digest();
  const cipher = createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
  return (bytes) => cipher.update(Buffer.alloc(bytes));
}

/** Small seeded PRNG (mulberry32) for choices. */
function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = "alpha beta gamma delta order user invoice paid pending shipped berlin paris tokyo retry cache ok error".split(" ");

function jsonLines(random: () => number, bytes: number): Buffer {
  const lines: string[] = [];
  let size = 0;
  for (let id = 0; size < bytes; id++) {
    const pick = () => WORDS[Math.floor(random() * WORDS.length)];
    const line = JSON.stringify({
      id,
      at: new Date(1_700_000_000_000 + id * 1000).toISOString(),
      kind: pick(),
      city: pick(),
      amount: Math.round(random() * 100_000) / 100,
      tags: [pick(), pick()],
      note: `${pick()} ${pick()} ${pick()}`,
    });
    lines.push(line);
    size += line.length + 1;
  }
  return Buffer.from(`${lines.join("\n")}\n`).subarray(0, bytes);
}

/** Fills `root` with `total` bytes of the mix above; answers the number of files. */
async function generate(root: string, total: number): Promise<number> {
  const random = prng(42);
  const bytes = randomStream("svc-bench-backup");
  let files = 0;
  const write = async (path: string, content: Buffer) => {
    await mkdir(join(path, ".."), { recursive: true });
    await writeFile(path, content);
    files++;
  };
  for (let written = 0, i = 0; written < total * 0.4; written += 8 * MiB, i++) await write(join(root, `logs/app-${i}.jsonl`), jsonLines(random, 8 * MiB));
  for (let written = 0, i = 0; written < total * 0.4; written += 16 * MiB, i++) await write(join(root, `blobs/blob-${i}.bin`), bytes(16 * MiB));
  for (let written = 0, i = 0; written < total * 0.2; i++) {
    const size = 1024 + Math.floor(random() * 15 * 1024);
    const path = join(root, `small/d${i % 16}/e${Math.floor(i / 16) % 32}/f${i}.${i % 2 ? "bin" : "json"}`);
    await write(path, i % 2 ? bytes(size) : jsonLines(random, size));
    written += size;
  }
  return files;
}

/** Receives parts like object storage would, counting and discarding the bytes. */
async function startSink(): Promise<{ endpoint: string; received: () => number; close: () => Promise<void> }> {
  let received = 0;
  let base = "";
  const server = createServer((request, response) => {
    if (request.method === "POST") {
      const chunks: Buffer[] = [];
      request.on("data", (chunk: Buffer) => chunks.push(chunk));
      request.on("end", () => {
        const { partNumber } = JSON.parse(Buffer.concat(chunks).toString()) as { partNumber: number };
        response.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ url: `${base}/put/${partNumber}` }));
      });
      return;
    }
    request.on("data", (chunk: Buffer) => {
      received += chunk.length;
    });
    request.on("end", () => response.writeHead(200, { ETag: `"${request.url}"` }).end());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    endpoint: `${base}/parts`,
    received: () => received,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function memoryOf(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(status)?.[1] ?? 0) * 1024;
  return { rss: kib("VmRSS"), hwm: kib("VmHWM") };
}

/** utime + stime in seconds: of `pid`, or with `children` this process's reaped children (tar and its gzip). */
function cpuSeconds(pid: number | "self", children = false): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  // Fields after the command name start at field 3; utime/stime are 14/15, cutime/cstime 16/17; in clock ticks (100 Hz).
  const [a, b] = children ? [fields[13], fields[14]] : [fields[11], fields[12]];
  return ((a ?? 0) + (b ?? 0)) / 100;
}

function timeTarCzf(dir: string, out: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const tar = spawn("tar", ["czf", out, "-C", dir, "."], { stdio: "inherit" });
    tar.once("error", reject);
    tar.once("exit", (code) => (code === 0 ? resolve(performance.now() - started) : reject(new Error(`tar exited ${code}`))));
  });
}

const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB`;
const rows: string[] = [];
console.log(`load average at start: ${loadavg().map((value) => value.toFixed(2)).join(" ")}`);

for (const size of sizes) {
  const dataDir = await mkdtemp(join(tmpdir(), "svc-bench-backup-"));
  const builder = await startBuilder({ dataDir });
  const sink = await startSink();
  try {
    await signedFetch(builder, "/v1/disks/bench", { method: "PUT", body: { sizeBytes: 4 * size * MiB } });
    const data = join(dataDir, "disks/bench/data");
    const generating = performance.now();
    const files = await generate(data, size * MiB);
    process.stderr.write(`${size} MiB: generated ${files} files in ${((performance.now() - generating) / 1000).toFixed(1)} s\n`);

    const idle = memoryOf(builder.pid);
    let peakRss = idle.rss;
    const sampler = setInterval(() => {
      peakRss = Math.max(peakRss, memoryOf(builder.pid).rss);
    }, 25);
    const snapshotRuns: number[] = [];
    const tarRuns: number[] = [];
    const snapshotCpu: number[] = [];
    const tarCpu: number[] = [];
    let result: SnapshotResult | undefined;
    for (let round = 0; round < ROUNDS; round++) {
      const before = sink.received();
      const cpuBefore = cpuSeconds(builder.pid);
      const started = performance.now();
      const submitted = await signedFetch(builder, "/v1/snapshots", {
        method: "POST",
        body: { diskId: "bench", partSizeBytes: PART_BYTES, partUrlEndpoint: sink.endpoint },
      });
      const { id } = (await submitted.json()) as { id: string };
      await followLog(builder, id);
      snapshotRuns.push(performance.now() - started);
      snapshotCpu.push(cpuSeconds(builder.pid) - cpuBefore);
      const status = await jobStatus(builder, id);
      if (status.status !== "succeeded") throw new Error(`snapshot failed: ${status.error}`);
      result = SnapshotResult.parse(status.result);
      const got = sink.received() - before;
      if (got !== result.sizeBytes) throw new Error(`sink got ${got} bytes, the result says ${result.sizeBytes}`);
      const tarCpuBefore = cpuSeconds("self", true);
      tarRuns.push(await timeTarCzf(data, join(dataDir, "tar-czf.tgz")));
      tarCpu.push(cpuSeconds("self", true) - tarCpuBefore);
    }
    clearInterval(sampler);
    const { hwm } = memoryOf(builder.pid);
    const snapshotMs = Math.min(...snapshotRuns);
    const tarMs = Math.min(...tarRuns);
    const seconds = (runs: number[]) => runs.map((ms) => (ms / 1000).toFixed(2)).join("/");
    const cpu = (runs: number[]) => runs.map((value) => value.toFixed(2)).join("/");
    if (!result) throw new Error("no snapshot ran");
    rows.push(
      `${`${size} MiB`.padEnd(8)} ${String(files).padStart(6)} files  builder ${seconds(snapshotRuns)} s  ` +
        `tar czf ${seconds(tarRuns)} s  ratio (best/best) ${(snapshotMs / tarMs).toFixed(2)}x  ` +
        `CPU builder ${cpu(snapshotCpu)} s, tar+gzip ${cpu(tarCpu)} s  ` +
        `archive ${mib(result.sizeBytes)} in ${result.parts.length} parts  ` +
        `builder RSS idle ${mib(idle.rss)}, peak during snapshot ${mib(peakRss)}, VmHWM ${mib(hwm)}`,
    );
    process.stderr.write(`${rows.at(-1)}\n`);
  } finally {
    await sink.close();
    await builder.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
}

console.log(`snapshot (gzip -6, parts of ${PART_BYTES / MiB} MiB, to a local sink) vs tar czf of the same directory:`);
for (const row of rows) console.log(row);
console.log(`load average at end: ${loadavg().map((value) => value.toFixed(2)).join(" ")}`);
