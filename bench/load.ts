import { execFile } from "node:child_process";
import { mkdtemp } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { type LocalStack, type LocalStackOptions, startLocalStack } from "../scripts/local-stack";

export type LoadResult = { requests: number; errors: number; rps: number; p50: number; p99: number };

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

type LoadOptions = { durationMs: number; concurrency: number; expectStatus?: number };

/** What the raw clients ask for, as a browser does. */
const BROWSER_ACCEPT_ENCODING = "gzip, deflate, br";

/**
 * Closed-loop load from this process: `concurrency` workers each send the next
 * request as soon as the previous answer is read, for `durationMs`. `send`
 * makes request number n and resolves to its status once its body is read.
 * Latencies in milliseconds; any other status than `expectStatus` (200 by
 * default) counts as an error, as does a request that fails.
 */
async function closedLoop(send: (n: number) => Promise<number>, opts: LoadOptions): Promise<LoadResult> {
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
          if ((await send(sent++)) !== (opts.expectStatus ?? 200)) errors++;
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

/** Closed-loop load through Node's fetch, which decodes what it reads. `url` and `init` may vary with the request's number (e.g. spreading requests over several keys). */
export function load(url: string | ((n: number) => string), init: RequestInit | ((n: number) => RequestInit), opts: LoadOptions): Promise<LoadResult> {
  return closedLoop(async (n) => {
    const res = await fetch(typeof url === "function" ? url(n) : url, typeof init === "function" ? init(n) : init);
    await res.arrayBuffer();
    return res.status;
  }, opts);
}

/**
 * Closed-loop load the way `wrk` makes it: keep-alive sockets, every byte of
 * each answer read and counted, nothing decoded. It asks for gzip as a browser
 * does; an answer shorter or longer than its Content-Length is an error.
 * A decoding client (Node's fetch) spends more of this machine's two cores on
 * a 50 KB gzip answer than on a tiny one, and those are the server's cores.
 */
export async function rawLoad(url: string, headers: Record<string, string>, opts: LoadOptions): Promise<LoadResult> {
  const target = new URL(url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: opts.concurrency });
  const request = { hostname: target.hostname, port: target.port, path: `${target.pathname}${target.search}`, agent, headers: { "Accept-Encoding": BROWSER_ACCEPT_ENCODING, ...headers } };
  const send = () =>
    new Promise<number>((resolve, reject) => {
      const req = http.request(request, (res) => {
        let bytes = 0;
        res.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
        });
        res.on("error", reject);
        res.on("end", () => {
          const length = res.headers["content-length"];
          resolve(length !== undefined && Number(length) !== bytes ? -1 : (res.statusCode ?? -1));
        });
      });
      req.on("error", reject);
      req.end();
    });
  try {
    return await closedLoop(send, opts);
  } finally {
    agent.destroy();
  }
}

/** wrk's durations ("635.91us", "1.50ms", "2.01s") in milliseconds. */
function wrkMs(value: string): number {
  const match = /^([\d.]+)(us|ms|s|m)$/.exec(value);
  if (!match) throw new Error(`wrk printed a duration it should not: ${value}`);
  const scale = { us: 0.001, ms: 1, s: 1000, m: 60_000 }[match[2] as "us" | "ms" | "s" | "m"];
  return Number(match[1]) * scale;
}

/**
 * The same load from `wrk` (C, one thread, `concurrency` keep-alive
 * connections), where it is installed (`apt-get install wrk`): the lightest
 * client there is, so the most of the two cores is left to the server.
 * Answers outside 2xx/3xx and socket errors count as errors; wrk cannot tell
 * one status from another, so `expectStatus` is not checked here (the benches
 * probe each case's status before they load it).
 */
export async function wrkLoad(url: string, headers: Record<string, string>, opts: LoadOptions): Promise<LoadResult> {
  const target = new URL(url);
  const args = ["-t1", `-c${opts.concurrency}`, `-d${Math.max(1, Math.round(opts.durationMs / 1000))}s`, "--latency"];
  // Named hosts go to loopback by their Host header: wrk resolves names with the system's resolver.
  for (const [name, value] of Object.entries({ Host: target.host, "Accept-Encoding": BROWSER_ACCEPT_ENCODING, ...headers })) args.push("-H", `${name}: ${value}`);
  args.push(`http://127.0.0.1:${target.port}${target.pathname}${target.search}`);
  const { stdout } = await promisify(execFile)("wrk", args);
  const number = (pattern: RegExp) => Number(pattern.exec(stdout)?.[1] ?? 0);
  const requests = number(/(\d+) requests in/);
  const socketErrors = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(stdout);
  const errors = number(/Non-2xx or 3xx responses: (\d+)/) + (socketErrors ? socketErrors.slice(1).reduce((sum, n) => sum + Number(n), 0) : 0);
  const p50 = /\n\s+50%\s+(\S+)/.exec(stdout)?.[1];
  const p99 = /\n\s+99%\s+(\S+)/.exec(stdout)?.[1];
  if (requests === 0 || !p50 || !p99) throw new Error(`wrk printed no result:\n${stdout}`);
  return { requests, errors, rps: number(/Requests\/sec:\s+([\d.]+)/), p50: wrkMs(p50), p99: wrkMs(p99) };
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
