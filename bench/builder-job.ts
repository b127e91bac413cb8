/**
 * End-to-end latency of a trivial job (`true`) through the real builder, versus
 * spawning `/bin/sh -c true` directly, in the same run on the same machine.
 *
 * A builder job is: signed POST /v1/jobs, then a signed GET of the log with
 * follow=1, whose stream ends when the job has ended (the cheapest way to learn
 * of completion; no polling). The ratio of the medians is the builder's overhead
 * factor: HTTP + HMAC, job records, working directory, log file, /proc scans.
 *
 *     npx tsx bench/builder-job.ts [iterations]      (default 200, after 20 warm-up runs)
 */
import { spawn } from "node:child_process";
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

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN;
}

const mean = (values: number[]) => values.reduce((sum, value) => sum + value, 0) / values.length;

const builder = await startBuilder();
try {
  const viaBuilder = await measure("builder", iterations, async () => {
    const job = await submitJob(builder, { command: "true", timeoutSeconds: 60, memoryMb: 256 });
    const log = await followLog(builder, job.id);
    if (!log.includes("job succeeded")) throw new Error(`job ${job.id} did not succeed:\n${log}`);
  });
  const direct = await measure("direct", iterations, spawnTrue);

  const row = (name: string, sorted: number[]) =>
    `${name.padEnd(22)} p50 ${percentile(sorted, 50).toFixed(2).padStart(8)} ms   p99 ${percentile(sorted, 99)
      .toFixed(2)
      .padStart(8)} ms   mean ${mean(sorted).toFixed(2).padStart(8)} ms`;
  console.log(`trivial job latency, ${iterations} runs each (after ${warmup} warm-up runs)`);
  console.log(row("builder (submit+follow)", viaBuilder));
  console.log(row("direct /bin/sh -c true", direct));
  console.log(`ratio builder/direct: p50 ${(percentile(viaBuilder, 50) / percentile(direct, 50)).toFixed(2)}x, mean ${(mean(viaBuilder) / mean(direct)).toFixed(2)}x`);
} finally {
  await builder.stop();
}
