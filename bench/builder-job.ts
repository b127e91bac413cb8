/**
 * What the sandbox adds to a job, and what a whole builder job costs, against
 * spawning `/bin/sh -c true` directly, in the same run on the same machine:
 *
 * - direct: `spawn("/bin/sh", ["-c", "true"])` and wait for its exit;
 * - sandboxed: `runInSandbox` (the builder's own code) running `true` the way a
 *   cron run does: job cgroup, a network namespace from the pool, bubblewrap
 *   with its namespaces and mounts, the prelude, log capture, teardown;
 * - builder job: signed POST /v1/jobs, then a signed GET of the log with
 *   follow=1, whose stream ends when the job has ended.
 *
 * The sandbox's cost is sandboxed − direct (issue 9's target: ≤ 10 ms at p50).
 *
 *     npx tsx bench/builder-job.ts [iterations]      (default 200, after 20 warm-up runs)
 */
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { SandboxHost } from "../builder/src/sandbox/host.js";
import { JobLog, runInSandbox } from "../builder/src/sandbox/sandbox.js";
import { percentile } from "../scripts/percentile.js";
import { followLog, startBuilder, submitJob } from "../test/builder/builder-process.js";

const iterations = Number(process.argv[2] ?? 200);
const warmup = 20;

function spawnTrue(): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn("/bin/sh", ["-c", "true"], { stdio: "ignore" });
    child.once("error", reject);
    child.once("exit", () => resolve());
  });
}

async function measure(label: string, runs: number, once: () => Promise<void>): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await once();
  const samples: number[] = [];
  for (let i = 0; i < runs; i++) {
    const started = performance.now();
    await once();
    samples.push(performance.now() - started);
  }
  process.stderr.write(`${label}: ${runs} runs done\n`);
  return samples.sort((a, b) => a - b);
}

const mean = (values: number[]) => values.reduce((sum, value) => sum + value, 0) / values.length;

const dataDir = await mkdtemp(join(tmpdir(), "svc-bench-sandbox-"));
const user = process.getuid?.() === 0 ? { uid: 2_000_000, gid: 2_000_000 } : { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
const host = await SandboxHost.open({ dataDir, npmRegistry: null, probeUser: process.getuid?.() === 0 ? user : null });
const builder = await startBuilder();
try {
  if (host.failure) throw new Error(host.failure);
  for (const line of host.summary) process.stderr.write(`${line}\n`);
  let n = 0;
  const sandboxed = await measure("sandboxed", iterations, async () => {
    const id = `job_bench${String(++n).padStart(15, "0")}`;
    const log = await JobLog.open(join(dataDir, `${id}.log`), () => undefined);
    const outcome = await runInSandbox({
      host,
      jobId: id,
      command: "true",
      env: {},
      user,
      work: { tmpfsBytes: 64 * 1024 * 1024 },
      source: null,
      network: "egress",
      tools: null,
      timeoutMs: 60_000,
      memoryLimitBytes: 256 * 1024 * 1024,
      disk: null,
      log,
      signal: new AbortController().signal,
    });
    await log.close();
    await rm(join(dataDir, `${id}.log`));
    if (outcome.reason !== null) throw new Error(`sandboxed true failed: ${outcome.error}`);
  });
  const viaBuilder = await measure("builder", iterations, async () => {
    const job = await submitJob(builder, { command: "true", timeoutSeconds: 60, memoryMb: 256 });
    const log = await followLog(builder, job.id);
    if (!log.includes("job succeeded")) throw new Error(`job ${job.id} did not succeed:\n${log}`);
  });
  const direct = await measure("direct", iterations, spawnTrue);

  const row = (name: string, sorted: number[]) =>
    `${name.padEnd(26)} p50 ${percentile(sorted, 50).toFixed(2).padStart(8)} ms   p99 ${percentile(sorted, 99)
      .toFixed(2)
      .padStart(8)} ms   mean ${mean(sorted).toFixed(2).padStart(8)} ms`;
  console.log(`trivial job latency, ${iterations} runs each (after ${warmup} warm-up runs), load ${loadavg()[0]!.toFixed(2)}`);
  console.log(row("direct /bin/sh -c true", direct));
  console.log(row("sandboxed (runInSandbox)", sandboxed));
  console.log(row("builder job (submit+follow)", viaBuilder));
  console.log(
    `sandbox adds p50 ${(percentile(sandboxed, 50) - percentile(direct, 50)).toFixed(2)} ms, p99 ${(percentile(sandboxed, 99) - percentile(direct, 99)).toFixed(2)} ms; ` +
      `ratio sandboxed/direct p50 ${(percentile(sandboxed, 50) / percentile(direct, 50)).toFixed(2)}x; builder job/direct p50 ${(percentile(viaBuilder, 50) / percentile(direct, 50)).toFixed(2)}x`,
  );
} finally {
  await builder.stop();
  await host.close();
  await rm(dataDir, { recursive: true, force: true });
}
