import { benchStack, fmt, load, type LoadResult } from "./load";

/**
 * What authentication costs: an authenticated `GET /v1/api-keys` (key check,
 * SHA-256, one indexed D1 read, the list query) against the unauthenticated
 * `/healthz` of the same `wrangler dev` process, driven from this second
 * process on loopback. Rounds alternate so drift hits both sides alike.
 */
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const DURATION_MS = Number(process.env.DURATION_MS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);

const stack = await benchStack();
try {
  const auth = { headers: { Authorization: `Bearer ${stack.adminKey}` } };
  const opts = { durationMs: DURATION_MS, concurrency: CONCURRENCY };
  // Warm-up: JIT, D1 page cache, connection pool.
  await load(`${stack.apiUrl}/healthz`, {}, { ...opts, durationMs: 1000 });
  await load(`${stack.apiUrl}/v1/api-keys`, auth, { ...opts, durationMs: 1000 });

  const health: LoadResult[] = [];
  const keys: LoadResult[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    health.push(await load(`${stack.apiUrl}/healthz`, {}, opts));
    keys.push(await load(`${stack.apiUrl}/v1/api-keys`, auth, opts));
  }
  const summary = (runs: LoadResult[]) => ({
    rps: runs.reduce((s, r) => s + r.rps, 0) / runs.length,
    p50: runs.reduce((s, r) => s + r.p50, 0) / runs.length,
    p99: runs.reduce((s, r) => s + r.p99, 0) / runs.length,
    errors: runs.reduce((s, r) => s + r.errors, 0),
  });
  const h = summary(health);
  const k = summary(keys);
  console.log(`bench/api-auth: ${ROUNDS} rounds x ${DURATION_MS / 1000} s, concurrency ${CONCURRENCY}, loopback, wrangler dev`);
  console.log(`  GET /healthz (no auth)        ${fmt(h.rps, 0).padStart(6)} req/s  p50 ${fmt(h.p50)} ms  p99 ${fmt(h.p99)} ms  errors ${h.errors}`);
  console.log(`  GET /v1/api-keys (Bearer key) ${fmt(k.rps, 0).padStart(6)} req/s  p50 ${fmt(k.p50)} ms  p99 ${fmt(k.p99)} ms  errors ${k.errors}`);
  console.log(`  ratio authenticated/health: throughput ${fmt(k.rps / h.rps, 2)}x, p99 ${fmt(k.p99 / h.p99, 2)}x`);
} finally {
  await stack.stop();
}
