/**
 * Apps that run (issue 18), end to end against the stack `npm start` runs:
 * the edge (the local stack's Worker), the builder and a sandboxed Node app, all on this
 * machine, each number a ratio against a peer measured in the same run.
 *
 * - proxy: 16 keep-alive clients for DURATION_MS, `GET /` of the fixture app
 *   through `<app>.localhost` (edge → node → app) against the same client
 *   straight to the app's own address and port on the run network; ROUNDS
 *   alternating rounds; target proxied ≥ 0.5× direct; the added p50 latency;
 *   proxied against the edge's own `/healthz` (target ≥ 0.9×), beside
 *   workerd's floor for that ratio (a bare Worker's one fetch against its own
 *   `/healthz`, {@link subrequestFloor});
 * - deploy: `svc deploy` of the Express fixture (pack, upload, install from the
 *   registry, build the release, start it, health check) to its first answer
 *   through the edge, against `npm ci && node server.js` to its first answer
 *   in a copy of the same folder; target ≤ 1.3×; then the same source again, its
 *   lockfile unchanged (dependencies from the node's cache), against that first deploy; target ≤ 0.5×;
 * - redeploy under 16 clients of constant load: failed requests (target 0);
 * - kill -9 of the app's process: time until the edge serves it again (target < 5 s).
 *
 *     npx tsx bench/apps.ts        (ROUNDS=3 DURATION_MS=5000)
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import dns from "node:dns";
import { cp, mkdtemp, rm } from "node:fs/promises";
import { Agent, request } from "node:http";
import { createRequire } from "node:module";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { freePort, ROOT } from "../scripts/local-stack";
import { svc } from "../test/cli/svc";
import { benchStack, fmt, percentile } from "./load";

const ROUNDS = Number(process.env.ROUNDS ?? 3);
const DURATION_MS = Number(process.env.DURATION_MS ?? 5000);
const CLIENTS = 16;
const APPS = join(ROOT, "test", "fixtures", "apps");

type Result = { requests: number; failed: number; rps: number; p50: number; p99: number };

/** `CLIENTS` keep-alive clients for `ms`: requests per second, latencies, answers other than 200. */
function hammer(host: string, port: number, headers: Record<string, string>, ms: number): Promise<Result> {
  return hammerAt(host, port, "/", headers, ms);
}

async function hammerAt(host: string, port: number, path: string, headers: Record<string, string>, ms: number): Promise<Result> {
  const agent = new Agent({ keepAlive: true, maxSockets: CLIENTS });
  const latencies: number[] = [];
  let failed = 0;
  const started = performance.now();
  const deadline = started + ms;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (performance.now() < deadline) {
        const t0 = performance.now();
        const status = await get(agent, host, port, path, headers).catch(() => 0);
        if (status !== 200) failed++;
        latencies.push(performance.now() - t0);
      }
    }),
  );
  agent.destroy();
  latencies.sort((a, b) => a - b);
  const seconds = (performance.now() - started) / 1000;
  return { requests: latencies.length, failed, rps: latencies.length / seconds, p50: percentile(latencies, 50), p99: percentile(latencies, 99) };
}

/** {@link hammer} of one path of the API origin. */
function hammerPath(path: string, port: number, ms: number): Promise<Result> {
  return hammerAt("127.0.0.1", port, path, {}, ms);
}

function get(agent: Agent, host: string, port: number, path: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, agent, headers }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

async function text(host: string, port: number, path: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const res = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = request({ host, port, path, headers }, (r) => {
      let body = "";
      r.on("data", (c: Buffer) => {
        body += c.toString();
      });
      r.on("end", () => resolve({ status: r.statusCode ?? 0, body }));
      r.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
  return res;
}

/** Until `path` answers 200 through the edge: the time it took. */
async function until200(port: number, host: string, path: string, timeoutMs: number): Promise<number> {
  const started = performance.now();
  while (performance.now() - started < timeoutMs) {
    const r = await text("127.0.0.1", port, path, { Host: host }).catch(() => ({ status: 0, body: "" }));
    if (r.status === 200) return performance.now() - started;
    await sleep(20);
  }
  throw new Error(`${host}${path} did not answer 200 within ${timeoutMs} ms`);
}

/**
 * workerd's own floor for a proxied request: a Worker that answers `/healthz`
 * with JSON and anything else with one fetch to a local Node server (no
 * lookup, no signature, no log), in the Miniflare wrangler brings, under the
 * same client; requests per second of each, ROUNDS alternating rounds. No
 * edge that makes one subrequest per request can do better than this ratio.
 */
async function subrequestFloor(): Promise<{ healthz: number; fetched: number }[]> {
  const appPort = await freePort();
  const app = spawn(process.execPath, ["-e", `require("node:http").createServer((q, s) => s.end("hello from the app\\n")).listen(${appPort}, "127.0.0.1")`], { stdio: "ignore" });
  const requireFromWrangler = createRequire(createRequire(import.meta.url).resolve("wrangler"));
  const { Miniflare, Log, LogLevel } = requireFromWrangler("miniflare") as {
    Miniflare: new (options: Record<string, unknown>) => { ready: Promise<URL>; dispose(): Promise<void> };
    Log: new (level: number) => object;
    LogLevel: { WARN: number };
  };
  const script = `export default { fetch(request) {
    const url = new URL(request.url);
    return url.pathname === "/healthz" ? Response.json({ ok: true }) : fetch("http://127.0.0.1:${appPort}" + url.pathname);
  } };`;
  const mf = new Miniflare({ host: "127.0.0.1", port: 0, cf: {}, log: new Log(LogLevel.WARN), workers: [{ name: "floor", modules: true, script, compatibilityDate: "2025-01-01" }] });
  try {
    const port = Number((await mf.ready).port);
    await until200(port, `127.0.0.1:${port}`, "/", 10_000);
    const rounds: { healthz: number; fetched: number }[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const fetched = await hammerPath("/", port, DURATION_MS);
      const healthz = await hammerPath("/healthz", port, DURATION_MS);
      rounds.push({ healthz: healthz.rps, fetched: fetched.rps });
    }
    return rounds;
  } finally {
    await mf.dispose();
    app.kill();
  }
}

/**
 * A deploy's steps from what `svc deploy` printed: the build's log lines, the
 * new process's and the rollout's, each stamped with the time it happened
 * (the builder's and the Worker's clocks: this machine's, as the bench's).
 */
function deployTimeline(output: string, startedAt: number, exitedAt: number, answeredAt: number): string {
  const at = (pattern: string): number | null => {
    const match = new RegExp(`(\\S+Z) svc\\s+${pattern}`).exec(output);
    return match ? Date.parse(match[1]!) : null;
  };
  const marks: [string, number | null][] = [
    ["svc packs and uploads the source, the build starts", at("downloaded source archive")],
    ["the build's plan", at("\\$ npm ci")],
    ["npm ci", at("install finished")],
    ["the dependency cache kept", at("packing the release")],
    ["the release packed and uploaded", at("job succeeded")],
    ["placement", at("starting: release")],
    ["the release downloaded and unpacked", at("unpacked the release")],
    ["the sandbox, npm start and the app to ready", at("running: ready after")],
    ["the edges' copies of the app (ready to serving)", at("serving: every request goes to the new release")],
    ["svc seeing it and exiting", exitedAt],
    ["the first answer through the edge", answeredAt],
  ];
  let previous = startedAt;
  return marks
    .map(([step, time]) => {
      if (time === null) return `${step} ?`;
      const spent = `${step} ${fmt((time - previous) / 1000, 2)} s`;
      previous = time;
      return spent;
    })
    .join(", ");
}

// `<name>.localhost` is loopback (RFC 6761), as in browsers.
const lookup = dns.lookup;
dns.lookup = function (this: unknown, hostname: string, ...rest: unknown[]) {
  return (lookup as (...args: unknown[]) => unknown).call(this, hostname.endsWith(".localhost") ? "127.0.0.1" : hostname, ...rest);
} as typeof dns.lookup;

const stack = await benchStack();
const work = await mkdtemp(join(tmpdir(), "svc-bench-apps-"));
try {
  const apiPort = Number(new URL(stack.apiUrl).port);
  const env = { HOME: work, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
  const run = async (args: string[]) => {
    const r = await svc(args, env);
    if (r.code !== 0) throw new Error(`svc ${args.join(" ")}: ${r.stderr}`);
    return r;
  };
  const suffix = randomBytes(3).toString("hex");

  // Proxy throughput: the same client through the edge and straight to the app.
  const app = `bench-${suffix}`;
  const host = `${app}.localhost:${apiPort}`;
  await run(["apps", "create", "--name", app, "--runtime", "node", "--memory", "512"]);
  await run(["deploy", "--source", join(APPS, "node-features"), "--app", app]);
  const address = (await text("127.0.0.1", apiPort, "/address", { Host: host })).body.trim();
  console.log(`app ${app}: edge http://${host}/, direct http://${address}:8080/ (load ${loadavg()[0]!.toFixed(1)})`);
  // The edge's own floor: the same client on the Worker's /healthz, which does nothing (no D1, no subrequest).
  const rows: { round: number; direct: Result; edge: Result; healthz: Result }[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    const direct = await hammer(address, 8080, {}, DURATION_MS);
    const edge = await hammer("127.0.0.1", apiPort, { Host: host }, DURATION_MS);
    const healthz = await hammerPath("/healthz", apiPort, DURATION_MS);
    rows.push({ round, direct, edge, healthz });
  }
  console.log("\nproxy: 16 keep-alive clients, GET /");
  console.log("| round | direct req/s | p50 | through the edge req/s | p50 | p99 | failed | ratio | the edge's /healthz req/s | edge ÷ /healthz |");
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const { round, direct, edge, healthz } of rows) {
    console.log(
      `| ${round} | ${fmt(direct.rps, 0)} | ${fmt(direct.p50)} ms | ${fmt(edge.rps, 0)} | ${fmt(edge.p50)} ms | ${fmt(edge.p99)} ms | ${edge.failed} | **${fmt(edge.rps / direct.rps, 2)}x** | ${fmt(healthz.rps, 0)} | ${fmt(edge.rps / healthz.rps, 2)}x |`,
    );
  }
  const mean = (f: (r: (typeof rows)[number]) => number) => rows.reduce((s, r) => s + f(r), 0) / rows.length;
  console.log(
    `mean ratio ${fmt(mean((r) => r.edge.rps / r.direct.rps), 2)}x (target ≥ 0.5x); added p50 latency ${fmt(mean((r) => r.edge.p50 - r.direct.p50))} ms; ` +
      `proxied requests run at ${fmt(mean((r) => r.edge.rps / r.healthz.rps), 2)}x of the edge's own /healthz (target ≥ 0.9x)`,
  );
  const floor = await subrequestFloor();
  console.log(
    `workerd's floor, a bare Worker's one fetch to a local server against its own JSON /healthz: ` +
      `${floor.map((r) => `${fmt(r.fetched, 0)}/${fmt(r.healthz, 0)} req/s = ${fmt(r.fetched / r.healthz, 2)}x`).join(", ")}; ` +
      `the edge's proxied ÷ /healthz is ${fmt(mean((r) => r.edge.rps / r.healthz.rps) / (floor.reduce((sum, r) => sum + r.fetched / r.healthz, 0) / floor.length), 2)} of it`,
  );

  // kill -9 of the app's process: until the edge serves it again.
  const kills: number[] = [];
  for (let i = 0; i < 3; i++) {
    await text("127.0.0.1", apiPort, "/kill9", { Host: host });
    await sleep(100);
    kills.push(100 + (await until200(apiPort, host, "/", 30_000)));
    await sleep(2000);
  }
  console.log(`\nkill -9 → serving again: ${kills.map((ms) => `${fmt(ms / 1000, 2)} s`).join(", ")} (target < 5 s; restarts back off 0.5, 1, 2 s)`);

  // Redeploy under constant load.
  let running = true;
  const counts = { ok: 0, failed: 0 };
  const agent = new Agent({ keepAlive: true, maxSockets: CLIENTS });
  const loops = Array.from({ length: CLIENTS }, async () => {
    while (running) {
      const status = await get(agent, "127.0.0.1", apiPort, "/", { Host: host }).catch(() => 0);
      if (status === 200) counts.ok++;
      else counts.failed++;
    }
  });
  await run(["env", "set", "RELEASE_MARK=v2", "--app", app]);
  await run(["deploy", "--source", join(APPS, "node-features"), "--app", app]);
  await sleep(3000);
  running = false;
  await Promise.all(loops);
  agent.destroy();
  console.log(`\nredeploy under ${CLIENTS} clients: ${counts.ok} requests answered 200, **${counts.failed} failed** (target 0)`);

  // Deploy: svc deploy of the Express app to its first answer, against npm ci && node server.js.
  const express = `express-${suffix}`;
  await run(["apps", "create", "--name", express, "--runtime", "node"]);
  const deployStartedAt = Date.now();
  const deployed = await run(["deploy", "--source", join(APPS, "node-express"), "--app", express]);
  const deployExitedAt = Date.now();
  await until200(apiPort, `${express}.localhost:${apiPort}`, "/", 60_000);
  const deployMs = Date.now() - deployStartedAt;
  const copy = join(work, "node-express");
  await cp(join(APPS, "node-express"), copy, { recursive: true });
  const port = await freePort();
  const localStarted = performance.now();
  await new Promise<void>((resolve, reject) => {
    spawn("npm", ["ci", "--no-audit", "--no-fund"], { cwd: copy, stdio: "ignore" }).once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`npm ci exited ${code}`))));
  });
  const installedMs = performance.now() - localStarted;
  const node = spawn(process.execPath, ["server.js"], { cwd: copy, env: { ...process.env, PORT: String(port) }, stdio: "ignore" });
  try {
    for (;;) {
      const r = await text("127.0.0.1", port, "/", {}).catch(() => null);
      if (r?.status === 200) break;
      await sleep(20);
    }
  } finally {
    node.kill();
  }
  const localMs = performance.now() - localStarted;
  console.log(
    `\ndeploy of the Express app to its first answer: svc deploy ${fmt(deployMs / 1000, 2)} s, npm ci && node server.js ${fmt(localMs / 1000, 2)} s: **${fmt(deployMs / localMs, 2)}x** (target ≤ 1.3x)`,
  );
  console.log(`  where svc deploy's time goes: ${deployTimeline(deployed.stdout + deployed.stderr, deployStartedAt, deployExitedAt, deployStartedAt + deployMs)}`);
  console.log(`  npm ci && node server.js: npm ci ${fmt(installedMs / 1000, 2)} s, node server.js to its first answer ${fmt((localMs - installedMs) / 1000, 2)} s`);
  // The same source again (a code change that leaves the lockfile alone): its dependencies come from the node's cache.
  const redeployStarted = performance.now();
  const redeploy = await run(["deploy", "--source", join(APPS, "node-express"), "--app", express]);
  const redeployMs = performance.now() - redeployStarted;
  const cached = /dependencies: from cache/.test(redeploy.stdout + redeploy.stderr);
  console.log(
    `redeploy with the lockfile unchanged: ${fmt(redeployMs / 1000, 2)} s against the first deploy's ${fmt(deployMs / 1000, 2)} s: ` +
      `**${fmt(redeployMs / deployMs, 2)}x** (target ≤ 0.5x; dependencies ${cached ? "from the cache" : "installed again"})`,
  );
} finally {
  await stack.stop();
  await rm(work, { recursive: true, force: true });
}
