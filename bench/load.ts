import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type LocalStack, type LocalStackOptions, startLocalStack } from "../scripts/local-stack";

export type LoadResult = { requests: number; errors: number; rps: number; p50: number; p99: number };

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/**
 * Closed-loop load from this process: `concurrency` workers each send the next
 * request as soon as the previous answer is read, for `durationMs`. Latencies
 * in milliseconds; non-2xx/3xx answers count as errors. `url` and `init` may
 * vary with the request's number (e.g. spreading requests over several keys).
 */
export async function load(
  url: string | ((n: number) => string),
  init: RequestInit | ((n: number) => RequestInit),
  opts: { durationMs: number; concurrency: number; expectStatus?: number },
): Promise<LoadResult> {
  const latencies: number[] = [];
  let errors = 0;
  let sent = 0;
  const deadline = performance.now() + opts.durationMs;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: opts.concurrency }, async () => {
      while (performance.now() < deadline) {
        const t0 = performance.now();
        try {
          const n = sent++;
          const res = await fetch(typeof url === "function" ? url(n) : url, typeof init === "function" ? init(n) : init);
          await res.arrayBuffer();
          if (res.status !== (opts.expectStatus ?? 200)) errors++;
        } catch {
          errors++;
        }
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    requests: latencies.length,
    errors,
    rps: latencies.length / elapsed,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
  };
}

/** A throwaway local system (own state, free ports) for one benchmark run; `persistDir` holds its D1/R2/DO state, `stateDir` its logs. */
export async function benchStack(
  extra: Pick<LocalStackOptions, "builderEnv" | "workerLogs" | "workerVars"> = {},
): Promise<LocalStack & { persistDir: string; stateDir: string }> {
  const dir = await mkdtemp(join(tmpdir(), "svc-bench-"));
  const persistDir = join(dir, "state");
  const stack = await startLocalStack({
    port: 0,
    persistDir,
    stateDir: join(dir, "svc"),
    secretsFile: join(dir, "dev.vars"),
    output: "files",
    ...extra,
  });
  return { ...stack, persistDir, stateDir: join(dir, "svc") };
}

export const fmt = (n: number, digits = 1) => n.toFixed(digits);
