/**
 * What recording request metrics costs the serving path (issue 32): two local
 * stacks in one run, one with the Worker var METRICS=on (the default: the
 * request log's flush sums each second's requests into minute buckets and
 * hands each app's to its AppMetrics object) and one with METRICS=off (the
 * request log to D1 alone). On each, the same two apps: a static site with a
 * fingerprinted 50 KB asset (as bench/static-serve.ts deploys it) and the
 * Node fixture app of bench/apps.ts (`GET /` answers a one-line body through
 * the edge, the node and the sandboxed app), both addressed as
 * `Host: <app>.localhost:<port>` on the stack's edge.
 *
 * For each case ROUNDS rounds alternate on/off (which goes first swaps every
 * round, so drift and warm caches hit both alike), driven by `wrk` where it is
 * installed, else by `rawLoad` (keep-alive, every byte read, nothing decoded);
 * CONCURRENCY connections for DURATION_MS each. The table shows the median
 * requests/s of each side, the per-round ratio on/off (median, min–max) and
 * the median p99s; the target is on/off ≥ 0.95x. Afterwards both stacks'
 * `GET /v1/apps/{app}/metrics?since=1h` must show requests on the ON stack and
 * none on the OFF one (else exit 1), so the comparison is really with and
 * without the recording. It also prints each side's Worker CPU per request
 * (its process tree's, from /proc), the cost itself; SAME=1 runs both stacks
 * with metrics on, to measure how far two identical stacks differ here.
 *
 *     npx tsx bench/metrics-cost.ts        (ROUNDS=5 DURATION_MS=4000 CONCURRENCY=16 CLIENT=wrk|raw SAME=1)
 */
import { createHash } from "node:crypto";
import dns from "node:dns";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { ROOT } from "../scripts/local-stack";
import { svc } from "../test/cli/svc";
import { benchStack, fmt, type LoadResult, rawLoad, wrkLoad } from "./load";

const ROUNDS = Number(process.env.ROUNDS ?? 5);
const DURATION_MS = Number(process.env.DURATION_MS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const CLIENTS = {
  wrk: { load: wrkLoad, says: "wrk (one thread, nothing decoded)" },
  raw: { load: rawLoad, says: "a wrk-like client in this process (nothing decoded)" },
};
const CLIENT = CLIENTS[(process.env.CLIENT as keyof typeof CLIENTS | undefined) ?? (existsSync("/usr/bin/wrk") ? "wrk" : "raw")];
if (!CLIENT) throw new Error("CLIENT is wrk or raw");
const drive = CLIENT.load;
const ASSET_BYTES = 50 * 1024;
const TARGET = 0.95;
const SITE = "bench-site";
const NODE_APP = "bench-node";
const SIDES = ["on", "off"] as const;
type Side = (typeof SIDES)[number];

// `<name>.localhost` is loopback (RFC 6761), as in browsers: the in-process client addresses the apps by name.
const lookup = dns.lookup;
dns.lookup = function (this: unknown, hostname: string, ...rest: unknown[]) {
  return (lookup as (...args: unknown[]) => unknown).call(this, hostname.endsWith(".localhost") ? "127.0.0.1" : hostname, ...rest);
} as typeof dns.lookup;

/** The static site of bench/static-serve.ts: svc.json, `public/index.html` and a 50 KB fingerprinted script. */
async function writeSite(dir: string): Promise<{ source: string; assetPath: string }> {
  const source = join(dir, "site");
  const output = join(source, "public");
  await mkdir(join(output, "assets"), { recursive: true });
  let js = "// metrics-cost bench asset\n";
  for (let i = 0; js.length < ASSET_BYTES; i++) js += `export const value${i} = "${createHash("sha256").update(String(i)).digest("hex")}";\n`;
  js = `${js.slice(0, ASSET_BYTES - 1)}\n`;
  const assetPath = `/assets/app-${createHash("sha256").update(js).digest("hex").slice(0, 10)}.js`;
  await writeFile(join(output, assetPath), js);
  await writeFile(join(output, "index.html"), `<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8"><title>bench</title><script type="module" src="${assetPath}"></script></head>\n<body></body>\n</html>\n`);
  await writeFile(join(source, "svc.json"), `${JSON.stringify({ name: SITE, runtime: "static", outputDir: "public", spa: true }, null, 2)}\n`);
  return { source, assetPath };
}

type Stack = Awaited<ReturnType<typeof benchStack>>;

/** Creates and deploys both apps on `stack` with its admin key; answers each app's edge origin. */
async function deployApps(stack: Stack, home: string, siteSource: string): Promise<Record<"site" | "node", string>> {
  const env = { HOME: home, XDG_CONFIG_HOME: join(home, "config"), SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
  const run = async (args: string[]) => {
    const r = await svc(args, env);
    if (r.code !== 0) throw new Error(`svc ${args.join(" ")} on ${stack.apiUrl}: ${r.stderr}`);
  };
  await run(["apps", "create", "--name", SITE, "--runtime", "static"]);
  await run(["deploy", "--source", siteSource, "--app", SITE]);
  await run(["apps", "create", "--name", NODE_APP, "--runtime", "node", "--memory", "512"]);
  await run(["deploy", "--source", join(ROOT, "test", "fixtures", "apps", "node-features"), "--app", NODE_APP]);
  const port = new URL(stack.apiUrl).port;
  return { site: `http://${SITE}.localhost:${port}`, node: `http://${NODE_APP}.localhost:${port}` };
}

/** Until `url` answers 200 (an app just deployed may still be starting), for at most 30 s. */
async function probe(url: string, label: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const res = await fetch(url).catch(() => null);
    await res?.arrayBuffer();
    const status = res?.status ?? 0;
    if (status === 200) return;
    if (Date.now() > deadline) throw new Error(`${label}: ${url} answered ${status}, expected 200`);
    await sleep(200);
  }
}

/** The app's metrics totals over the last hour, as its owner reads them. */
async function recorded(stack: Stack, app: string): Promise<number> {
  const res = await fetch(`${stack.apiUrl}/v1/apps/${app}/metrics?since=1h`, { headers: { Authorization: `Bearer ${stack.adminKey}` } });
  if (!res.ok) throw new Error(`GET /v1/apps/${app}/metrics on ${stack.apiUrl}: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { data: { totals: { requests: number } } }).data.totals.requests;
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

/** CPU seconds used so far by a process and everything it started (its Worker: worker-dev and its workerd), from /proc. */
function treeCpuSeconds(root: number): number {
  const stats = new Map<number, { parent: number; ticks: number }>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "latin1");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      stats.set(Number(name), { parent: Number(fields[1]), ticks: Number(fields[11]) + Number(fields[12]) });
    } catch {
      // gone meanwhile
    }
  }
  let ticks = 0;
  const pending = [root];
  while (pending.length > 0) {
    const pid = pending.pop()!;
    ticks += stats.get(pid)?.ticks ?? 0;
    for (const [child, { parent }] of stats) if (parent === pid) pending.push(child);
  }
  return ticks / 100;
}

const dir = await mkdtemp(join(tmpdir(), "svc-bench-metrics-"));
const SAME = process.env.SAME === "1";
const started = await Promise.allSettled([benchStack(), benchStack(SAME ? {} : { workerVars: { METRICS: "off" } })]);
const stacks: Partial<Record<Side, Stack>> = {};
if (started[0].status === "fulfilled") stacks.on = started[0].value;
if (started[1].status === "fulfilled") stacks.off = started[1].value;
try {
  for (const result of started) if (result.status === "rejected") throw result.reason;
  const on = stacks.on!;
  const off = stacks.off!;
  const site = await writeSite(dir);
  const [originsOn, originsOff] = await Promise.all([deployApps(on, join(dir, "home-on"), site.source), deployApps(off, join(dir, "home-off"), site.source)]);
  const origins = { on: originsOn, off: originsOff };

  const cases = [
    { name: `50 KB asset (${site.assetPath})`, app: "site" as const, path: site.assetPath },
    { name: "node app GET /", app: "node" as const, path: "/" },
  ];
  const url = (c: (typeof cases)[number], side: Side) => `${origins[side][c.app]}${c.path}`;
  const opts = { durationMs: DURATION_MS, concurrency: CONCURRENCY };
  const sent = { on: 0, off: 0 };
  const count = (side: Side, result: LoadResult) => {
    sent[side] += result.requests;
    return result;
  };
  for (const c of cases) {
    for (const side of SIDES) {
      await probe(url(c, side), `${c.name}, metrics ${side}`);
      count(side, await drive(url(c, side), {}, { ...opts, durationMs: 1000 }));
    }
  }

  const results = cases.map(() => ({ on: [] as LoadResult[], off: [] as LoadResult[] }));
  /** The Worker's CPU per request in each run (ms), the cost itself rather than what two busy cores let through. */
  const cpuPerRequest = cases.map(() => ({ on: [] as number[], off: [] as number[] }));
  const loads: string[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    loads.push(loadavg().map((value) => value.toFixed(2)).join(" "));
    const order = round % 2 === 0 ? SIDES : ([...SIDES].reverse() as Side[]);
    for (const [i, c] of cases.entries()) {
      for (const side of order) {
        const before = treeCpuSeconds(stacks[side]!.workerPid());
        const result = count(side, await drive(url(c, side), {}, opts));
        // The flush a second after the run is the run's too.
        await sleep(1500);
        cpuPerRequest[i]![side].push(((treeCpuSeconds(stacks[side]!.workerPid()) - before) * 1000) / Math.max(1, result.requests));
        results[i]![side].push(result);
      }
    }
    process.stderr.write(`round ${round + 1}/${ROUNDS} done\n`);
  }

  console.log(`bench/metrics-cost: ${ROUNDS} rounds x ${DURATION_MS / 1000} s per case and side, concurrency ${CONCURRENCY}, loopback, ${CLIENT.says}`);
  console.log("  on:  local stack with METRICS=on (request log + minute buckets + one AppMetrics call per app per flush)");
  console.log("  off: local stack with METRICS=off (request log only); both stacks up for the whole run");
  const header = ["case", "on req/s", "off req/s", "ratio on/off (median, min–max)", "on p99", "off p99", "errors"];
  const ratios = results.map((r) => r.on.map((run, round) => run.rps / r.off[round]!.rps));
  const rows = cases.map((c, i) => {
    const r = results[i]!;
    const errors = [...r.on, ...r.off].reduce((sum, run) => sum + run.errors, 0);
    return [
      c.name,
      fmt(median(r.on.map((run) => run.rps)), 0),
      fmt(median(r.off.map((run) => run.rps)), 0),
      `${fmt(median(ratios[i]!), 2)}x (${fmt(Math.min(...ratios[i]!), 2)}–${fmt(Math.max(...ratios[i]!), 2)}x)`,
      `${fmt(median(r.on.map((run) => run.p99)))} ms`,
      `${fmt(median(r.off.map((run) => run.p99)))} ms`,
      String(errors),
    ];
  });
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  for (const row of [header, ...rows]) console.log(`  ${row.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join("  ")}`);
  console.log("  req/s and p99: medians of the rounds; ratio: on/off within each round");
  for (const [i, c] of cases.entries()) {
    const r = results[i]!;
    console.log(`  ${c.name} per round: ${r.on.map((run, round) => `${fmt(run.rps, 0)}/${fmt(r.off[round]!.rps, 0)} = ${fmt(ratios[i]![round]!, 2)}x`).join(", ")}`);
  }
  console.log(`  load average per round: ${loads.join(" | ")}`);
  for (const [i, c] of cases.entries()) {
    const cpu = cpuPerRequest[i]!;
    const on = median(cpu.on);
    const offCpu = median(cpu.off);
    console.log(`  ${c.name}: the Worker's CPU per request ${fmt(on, 3)} ms on, ${fmt(offCpu, 3)} ms off (medians): recording costs ${fmt(((on - offCpu) / offCpu) * 100)} %`);
  }
  for (const [i, c] of cases.entries()) {
    const ratio = median(ratios[i]!);
    console.log(`${c.name}: metrics on/off: ${fmt(ratio, 2)}x (target >= ${TARGET}x): ${ratio >= TARGET ? "met" : "unmet"}`);
  }

  // The flush runs about a second after a burst, and AppMetrics answers right after it: wait a few.
  await sleep(3000);
  let verified = true;
  for (const app of [SITE, NODE_APP]) {
    const counts = { on: await recorded(on, app), off: await recorded(off, app) };
    const ok = counts.on > 0 && (SAME ? counts.off > 0 : counts.off === 0);
    verified &&= ok;
    console.log(`recorded requests for ${app} (metrics?since=1h totals.requests): on ${counts.on}, off ${counts.off}: ${ok ? "as expected" : "WRONG (on must be > 0, off 0)"}`);
  }
  console.log(`  requests sent in all (both apps, warm-up included): on ${sent.on}, off ${sent.off}`);
  if (!verified) process.exitCode = 1;
} finally {
  await Promise.all([stacks.on?.stop(), stacks.off?.stop()]);
  await rm(dir, { recursive: true, force: true });
}
