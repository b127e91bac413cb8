/**
 * Static-site serving, ours vs. Cloudflare's own: the same folder (an
 * index.html and a fingerprinted 50 KB asset, spa on) deployed through the
 * platform (`svc deploy`, the builder, manifest + blobs in local R2, served by
 * the Worker's edge code on `Host: <app>.localhost:<port>`), and served by a
 * second `wrangler dev` running Workers Static Assets with no script at all
 * (`not_found_handling = "single-page-application"`). Both run in this one
 * process's machine, on loopback, driven by `wrk` where it is installed
 * (the lightest client, so the most of the two cores is left to the servers),
 * else from this process by `rawLoad` (keep-alive, every byte read, nothing
 * decoded, as wrk does). CLIENT=fetch drives them with Node's fetch instead,
 * which decodes gzip and so spends more of the cores on a 50 KB answer than
 * on a tiny one: it moved the asset's ratio to /healthz from 0.96x to 0.83x.
 *
 * For each case (the 50 KB asset, an SPA fallback path, a 304 for the ETag that
 * server returned) the runs alternate ours/theirs for ROUNDS rounds; the table
 * shows the mean requests/s and p99 of the rounds, and the ratios ours/theirs.
 * Each round also measures the bare `/healthz` of our own process, the ceiling
 * for anything it serves, and our cases are shown as a fraction of it.
 *
 *     npx tsx bench/static-serve.ts        (ROUNDS=3 DURATION_MS=4000 CONCURRENCY=16 CLIENT=wrk|raw|fetch)
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import dns from "node:dns";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, ROOT } from "../scripts/local-stack";
import { svc } from "../test/cli/svc";
import { benchStack, fmt, load, type LoadResult, rawLoad, wrkLoad } from "./load";

const ROUNDS = Number(process.env.ROUNDS ?? 3);
const DURATION_MS = Number(process.env.DURATION_MS ?? 4000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const CLIENTS = {
  wrk: { load: wrkLoad, says: "wrk (one thread, nothing decoded)" },
  raw: { load: rawLoad, says: "a wrk-like client in this process (nothing decoded)" },
  fetch: { load: (url: string, headers: Record<string, string>, opts: Parameters<typeof load>[2]) => load(url, { headers }, opts), says: "Node's fetch (decodes gzip)" },
};
const CLIENT = CLIENTS[(process.env.CLIENT as keyof typeof CLIENTS | undefined) ?? (existsSync("/usr/bin/wrk") ? "wrk" : "raw")];
if (!CLIENT) throw new Error("CLIENT is wrk, raw or fetch");
const drive = CLIENT.load;
const ASSET_BYTES = 50 * 1024;

/**
 * Resolves `<name>.localhost` to loopback in this process, as browsers do
 * (RFC 6761): fetch cannot set a Host header, so the sites are addressed by
 * their real names.
 */
function resolveLocalhostSubdomains(): void {
  const original = dns.lookup;
  const patched = function (this: unknown, hostname: string, ...rest: unknown[]) {
    const name = typeof hostname === "string" && hostname.endsWith(".localhost") ? "127.0.0.1" : hostname;
    return (original as (...args: unknown[]) => unknown).call(this, name, ...rest);
  };
  dns.lookup = patched as typeof dns.lookup;
}

/** The site: svc.json at the root, the output folder `public/` with index.html and a 50 KB fingerprinted script. */
async function writeSite(dir: string, app: string): Promise<{ source: string; output: string; assetPath: string }> {
  const source = join(dir, "site");
  const output = join(source, "public");
  await mkdir(join(output, "assets"), { recursive: true });
  let js = "// static-serve bench asset\n";
  for (let i = 0; js.length < ASSET_BYTES; i++) {
    js += `export const value${i} = "${createHash("sha256").update(String(i)).digest("hex")}";\n`;
  }
  js = `${js.slice(0, ASSET_BYTES - 1)}\n`;
  const assetPath = `/assets/app-${createHash("sha256").update(js).digest("hex").slice(0, 10)}.js`;
  await writeFile(join(output, assetPath), js);
  await writeFile(
    join(output, "index.html"),
    `<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8"><title>bench</title><script type="module" src="${assetPath}"></script></head>\n<body><div id="root"></div></body>\n</html>\n`,
  );
  await writeFile(join(source, "svc.json"), `${JSON.stringify({ name: app, runtime: "static", outputDir: "public", spa: true }, null, 2)}\n`);
  return { source, output, assetPath };
}

/** `wrangler dev` serving `directory` with Workers Static Assets only (no Worker script). */
async function startAssetsOnly(dir: string, directory: string): Promise<{ url: string; stop(): Promise<void> }> {
  const port = await freePort();
  const config = join(dir, "wrangler.toml");
  await writeFile(
    config,
    `name = "static-serve-bench"\ncompatibility_date = "2026-04-20"\nassets = { directory = ${JSON.stringify(directory)}, not_found_handling = "single-page-application" }\n`,
  );
  const child: ChildProcess = spawn(
    join(ROOT, "node_modules", ".bin", "wrangler"),
    ["dev", "--config", config, "--ip", "127.0.0.1", "--port", String(port), "--persist-to", join(dir, "state"), "--show-interactive-dev-session=false", "--log-level", "warn"],
    {
      cwd: dir,
      env: { ...process.env, CLOUDFLARE_CF_FETCH_ENABLED: "false", WRANGLER_SEND_METRICS: "false" },
      stdio: ["ignore", "ignore", "inherit"],
      detached: true,
    },
  );
  const stop = async () => {
    if (child.exitCode !== null || child.pid === undefined) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {
      // already gone
    }
    await exited;
  };
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`wrangler dev (assets only) exited with code ${child.exitCode}`);
    const ok = await fetch(`${url}/`).then(
      (res) => res.ok,
      () => false,
    );
    if (ok) return { url, stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`wrangler dev (assets only) did not answer ${url} within 90 s`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** Fetches once and checks what both servers must agree on before they are compared. */
async function probe(url: string, init: RequestInit, status: number, label: string): Promise<Response> {
  const res = await fetch(url, init);
  await res.arrayBuffer();
  if (res.status !== status) throw new Error(`${label}: ${url} answered ${res.status}, expected ${status}`);
  return res;
}

const mean = (runs: LoadResult[], key: "rps" | "p99") => runs.reduce((sum, run) => sum + run[key], 0) / runs.length;

resolveLocalhostSubdomains();
const dir = await mkdtemp(join(tmpdir(), "svc-bench-static-"));
const stack = await benchStack();
let theirs: { url: string; stop(): Promise<void> } | undefined;
try {
  const app = "bench-site";
  const site = await writeSite(dir, app);
  const keyRes = await fetch(`${stack.apiUrl}/v1/api-keys`, {
    method: "POST",
    headers: { Authorization: `Bearer ${stack.adminKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "bench-static", scopes: ["deploy"] }),
  });
  const { key } = (await keyRes.json()) as { key: string };
  const env = { HOME: join(dir, "home"), XDG_CONFIG_HOME: join(dir, "home", "config"), SVC_API_URL: stack.apiUrl, SVC_API_KEY: key };
  const created = await svc(["apps", "create", "--name", app, "--runtime", "static"], env);
  if (created.code !== 0) throw new Error(`apps create: ${created.stderr}`);
  const [deployed, started] = await Promise.all([svc(["deploy", "--source", site.source, "--json"], env), startAssetsOnly(dir, site.output)]);
  theirs = started;
  if (deployed.code !== 0) throw new Error(`deploy: ${deployed.stderr}`);
  const ours = (JSON.parse(deployed.stdout) as { url: string }).url;

  const servers = { ours, theirs: theirs.url };
  type Case = { name: string; path: string; status: number; headers: Record<keyof typeof servers, Record<string, string>> };
  const assets = { ours: await probe(`${ours}${site.assetPath}`, {}, 200, "ours"), theirs: await probe(`${theirs.url}${site.assetPath}`, {}, 200, "theirs") };
  const etags = { ours: assets.ours.headers.get("ETag"), theirs: assets.theirs.headers.get("ETag") };
  /** How the asset went on the wire to Node's fetch (Accept-Encoding: gzip, deflate, br): ours sends its gzip copy, theirs the edge's encoding. */
  const encodings = {
    ours: `${assets.ours.headers.get("Content-Encoding") ?? "identity"} ${assets.ours.headers.get("Content-Length") ?? "chunked"} bytes`,
    theirs: `${assets.theirs.headers.get("Content-Encoding") ?? "identity"} ${assets.theirs.headers.get("Content-Length") ?? "chunked"}${assets.theirs.headers.has("Content-Length") ? " bytes" : ""}`,
  };
  if (!etags.ours || !etags.theirs) throw new Error(`an ETag is missing: ${JSON.stringify(etags)}`);
  const cases: Case[] = [
    { name: `50 KB asset (${site.assetPath})`, path: site.assetPath, status: 200, headers: { ours: {}, theirs: {} } },
    { name: "SPA fallback (/some/client/route)", path: "/some/client/route", status: 200, headers: { ours: {}, theirs: {} } },
    {
      name: "304 (If-None-Match: its ETag)",
      path: site.assetPath,
      status: 304,
      headers: { ours: { "If-None-Match": etags.ours }, theirs: { "If-None-Match": etags.theirs } },
    },
  ];
  for (const c of cases) for (const side of ["ours", "theirs"] as const) await probe(`${servers[side]}${c.path}`, { headers: c.headers[side] }, c.status, side);
  const ourAsset = await (await fetch(`${ours}${site.assetPath}`)).text();
  const theirAsset = await (await fetch(`${theirs.url}${site.assetPath}`)).text();
  if (ourAsset !== theirAsset || ourAsset.length !== ASSET_BYTES) throw new Error("the two servers do not serve the same 50 KB asset");

  const opts = { durationMs: DURATION_MS, concurrency: CONCURRENCY };
  for (const c of cases) {
    for (const side of ["ours", "theirs"] as const) await drive(`${servers[side]}${c.path}`, c.headers[side], { ...opts, durationMs: 1000, expectStatus: c.status });
  }
  await drive(`${stack.apiUrl}/healthz`, {}, { ...opts, durationMs: 1000 });
  const results = cases.map(() => ({ ours: [] as LoadResult[], theirs: [] as LoadResult[] }));
  const health: LoadResult[] = [];
  const loads: string[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    loads.push(loadavg().map((value) => value.toFixed(2)).join(" "));
    health.push(await drive(`${stack.apiUrl}/healthz`, {}, opts));
    // Alternate which side goes first, so drift and warm caches hit both alike.
    const order = round % 2 === 0 ? (["ours", "theirs"] as const) : (["theirs", "ours"] as const);
    for (const [i, c] of cases.entries()) {
      for (const side of order) results[i]![side].push(await drive(`${servers[side]}${c.path}`, c.headers[side], { ...opts, expectStatus: c.status }));
    }
    process.stderr.write(`round ${round + 1}/${ROUNDS} done\n`);
  }

  console.log(`bench/static-serve: ${ROUNDS} rounds x ${DURATION_MS / 1000} s per case and side, concurrency ${CONCURRENCY}, loopback, ${CLIENT.says}`);
  console.log("  ours:   svc deploy → Worker edge (manifest + R2 blob, request log) on the local stack's Worker");
  console.log("  theirs: wrangler dev with Workers Static Assets only, same folder, not_found_handling = single-page-application");
  const header = ["case", "ours req/s", "theirs req/s", "ratio", "ours p99", "theirs p99", "ratio", "errors"];
  const rows = cases.map((c, i) => {
    const r = results[i]!;
    const errors = [...r.ours, ...r.theirs].reduce((sum, run) => sum + run.errors, 0);
    return [
      c.name,
      fmt(mean(r.ours, "rps"), 0),
      fmt(mean(r.theirs, "rps"), 0),
      `${fmt(mean(r.ours, "rps") / mean(r.theirs, "rps"), 2)}x`,
      `${fmt(mean(r.ours, "p99"))} ms`,
      `${fmt(mean(r.theirs, "p99"))} ms`,
      `${fmt(mean(r.ours, "p99") / mean(r.theirs, "p99"), 2)}x`,
      String(errors),
    ];
  });
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  for (const row of [header, ...rows]) console.log(`  ${row.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join("  ")}`);
  console.log("  ratio = ours / theirs (throughput: higher is better for ours; p99: lower is better for ours)");
  console.log(`  the 50 KB asset on the wire: ours ${encodings.ours}, theirs ${encodings.theirs}`);
  const healthRps = mean(health, "rps");
  console.log(`  our process's bare /healthz: ${fmt(healthRps, 0)} req/s, p99 ${fmt(mean(health, "p99"))} ms; each case of ours as a fraction of it:`);
  for (const [i, c] of cases.entries()) console.log(`    ${c.name}: ${fmt(mean(results[i]!.ours, "rps") / healthRps, 2)}x`);
  console.log(`  load average per round: ${loads.join(" | ")}`);
} finally {
  await theirs?.stop();
  await stack.stop();
  await rm(dir, { recursive: true, force: true });
}
