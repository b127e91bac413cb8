import { createHash } from "node:crypto";
import { join } from "node:path";
import { loadavg } from "node:os";
import { getPlatformProxy } from "wrangler";
import { ROOT } from "../scripts/local-stack";
import { countingD1 } from "../test/support/d1-count";
import { benchStack, fmt, load, type LoadResult } from "./load";

/**
 * What authentication costs: the authenticated no-op `GET /v1/whoami` (key
 * check, SHA-256, one indexed D1 read, nothing else) and `GET /v1/api-keys`
 * (the same plus the list query) against the unauthenticated `/healthz` of the
 * same Worker process (the local stack's, scripts/worker-dev.ts), driven from this second process on loopback.
 * Rounds alternate so drift hits all sides alike.
 *
 * D1 statements per request are counted, not estimated: the same app factory
 * runs here against the stack's own local D1 (wrangler's platform proxy on its
 * persisted state) through a binding that counts what it runs.
 *
 *     npx tsx bench/api-auth.ts        (ROUNDS=3 DURATION_MS=4000 CONCURRENCY=16)
 */
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const DURATION_MS = Number(process.env.DURATION_MS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const COUNTED_REQUESTS = 50;
const KEYS = Number(process.env.KEYS ?? 64);

/** The Worker's app factory, loaded untyped: its types are the Workers runtime's, not this Node program's. */
type AppModule = { createApp(): { fetch(request: Request, env: object, ctx: object): Response | Promise<Response> } };

/** D1 reads and writes per request of `path`, over COUNTED_REQUESTS requests through the real app. */
async function d1PerRequest(persistDir: string, path: string, key: string): Promise<{ reads: number; writes: number }> {
  const proxy = await getPlatformProxy<Record<string, unknown>>({ configPath: join(ROOT, "wrangler.toml"), persist: { path: join(persistDir, "v3") }, envFiles: [] });
  try {
    const appPath = join(ROOT, "worker", "app.ts");
    const { createApp } = (await import(appPath)) as AppModule;
    const app = createApp();
    const { db, counts } = countingD1(proxy.env.DB as object);
    const pending: Promise<unknown>[] = [];
    const ctx = { waitUntil: (promise: Promise<unknown>) => pending.push(promise), passThroughOnException: () => undefined, props: {} };
    for (let i = 0; i < COUNTED_REQUESTS; i++) {
      const res = await app.fetch(new Request(`http://127.0.0.1${path}`, { headers: { Authorization: `Bearer ${key}` } }), { ...proxy.env, DB: db }, ctx);
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`${path} answered ${res.status} in the counting run`);
    }
    await Promise.all(pending);
    return { reads: counts.reads / COUNTED_REQUESTS, writes: counts.writes / COUNTED_REQUESTS };
  } finally {
    await proxy.dispose();
  }
}

const stack = await benchStack({ workerVars: { BENCH_FLOOR_ROUTES: "on" } });
try {
  const d1 = {
    whoami: await d1PerRequest(stack.persistDir, "/v1/whoami", stack.adminKey),
    keys: await d1PerRequest(stack.persistDir, "/v1/api-keys", stack.adminKey),
  };
  // Requests are spread over KEYS keys, so the per-key rate limit (100 per 10 s) answers none of them with 429.
  const secrets: string[] = [];
  for (let i = 0; i < KEYS; i++) {
    const res = await fetch(`${stack.apiUrl}/v1/api-keys`, {
      method: "POST",
      headers: { Authorization: `Bearer ${stack.adminKey}`, "Content-Type": "application/json" },
      body: JSON.stringify({ name: `bench-${i}`, scopes: ["admin"] }),
    });
    if (res.status !== 201) throw new Error(`creating bench key ${i}: ${res.status} ${await res.text()}`);
    secrets.push(((await res.json()) as { key: string }).key);
  }
  const hashes = secrets.map((key) => createHash("sha256").update(key).digest("hex"));
  const auth = (n: number) => ({ headers: { Authorization: `Bearer ${secrets[n % KEYS]}` } });
  const opts = { durationMs: DURATION_MS, concurrency: CONCURRENCY };
  const cases: { name: string; path: string | ((n: number) => string); init: RequestInit | ((n: number) => RequestInit) }[] = [
    { name: "GET /healthz (no auth)", path: "/healthz", init: {} },
    { name: "GET /v1/whoami (Bearer key)", path: "/v1/whoami", init: auth },
    { name: "GET /v1/api-keys (Bearer key)", path: "/v1/api-keys", init: auth },
    // The floor of synchronous revocation: the same keys' indexed reads alone (app.ts, BENCH_FLOOR_ROUTES).
    { name: "GET /__bench/key-read (floor)", path: (n) => `/__bench/key-read?hash=${hashes[n % KEYS]}`, init: {} },
  ];
  const urlOf = (path: string | ((n: number) => string)) => (typeof path === "function" ? (n: number) => `${stack.apiUrl}${path(n)}` : `${stack.apiUrl}${path}`);
  // Warm-up: JIT, D1 page cache, connection pool.
  for (const c of cases) await load(urlOf(c.path), c.init, { ...opts, durationMs: 1000 });
  const results = cases.map(() => [] as LoadResult[]);
  const loads: string[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    loads.push(loadavg().map((value) => value.toFixed(2)).join(" "));
    const order = round % 2 === 0 ? [0, 1, 2, 3] : [3, 2, 1, 0];
    for (const i of order) results[i]!.push(await load(urlOf(cases[i]!.path), cases[i]!.init, opts));
  }
  const summary = (runs: LoadResult[]) => ({
    rps: runs.reduce((s, r) => s + r.rps, 0) / runs.length,
    p50: runs.reduce((s, r) => s + r.p50, 0) / runs.length,
    p99: runs.reduce((s, r) => s + r.p99, 0) / runs.length,
    errors: runs.reduce((s, r) => s + r.errors, 0),
  });
  type Summary = ReturnType<typeof summary>;
  const [health, whoami, keys, floor] = results.map(summary) as [Summary, Summary, Summary, Summary];
  console.log(`bench/api-auth: ${ROUNDS} rounds x ${DURATION_MS / 1000} s, concurrency ${CONCURRENCY}, loopback, the local stack's Worker`);
  console.log(`  load average per round: ${loads.join(" | ")}`);
  for (const [i, s] of [health, whoami, keys, floor].entries()) {
    console.log(`  ${cases[i]!.name.padEnd(30)} ${fmt(s.rps, 0).padStart(6)} req/s  p50 ${fmt(s.p50)} ms  p99 ${fmt(s.p99)} ms  errors ${s.errors}`);
  }
  console.log(`  ratio whoami/health: throughput ${fmt(whoami.rps / health.rps, 2)}x, p99 ${fmt(whoami.p99 / health.p99, 2)}x`);
  console.log(
    `  ratio whoami/key-read floor: throughput ${fmt(whoami.rps / floor.rps, 2)}x (target >= 0.90), p99 ${fmt(whoami.p99 / floor.p99, 2)}x`,
  );
  console.log(`  ratio api-keys/health: throughput ${fmt(keys.rps / health.rps, 2)}x, p99 ${fmt(keys.p99 / health.p99, 2)}x`);
  console.log(
    `  D1 statements per request (counted over ${COUNTED_REQUESTS} requests): whoami ${fmt(d1.whoami.reads, 2)} reads + ${fmt(d1.whoami.writes, 2)} writes, ` +
      `api-keys ${fmt(d1.keys.reads, 2)} reads + ${fmt(d1.keys.writes, 2)} writes (a write is lastUsedAt, at most once a minute per key)`,
  );
} finally {
  await stack.stop();
}
