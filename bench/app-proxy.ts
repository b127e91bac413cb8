/**
 * The node's half of an app's traffic (issues 18 and 33), measured in one run
 * on one machine against real builders and real sandboxed apps (the test app
 * of the process suites, a Node HTTP server):
 *
 * - throughput: 16 concurrent keep-alive clients for 5 s, GET /hello, once
 *   straight to the app's address:port on the run network and once through
 *   `/v1/proxy/<id>/hello` with the Worker's proxy headers (signed once per
 *   second, as the edge's signatures repeat within a second); same client,
 *   alternating rounds. Two builders side by side: the node as it runs (HAProxy
 *   in front, processes/native-proxy.ts) and its peer, the Node proxy alone
 *   (BUILDER_NATIVE_PROXY=off), each with its own app (targets: proxied ≥ 0.5 ×
 *   direct, issue 18; ≥ 0.8 ×, issue 33);
 * - the floor for any second hop, in the same rounds: a bare HAProxy (the
 *   same binary, no rules, no authentication) in front of the native side's
 *   app, against straight to it;
 * - the latency it adds under light load: one client, requests one after the
 *   other, p50 through each proxy minus p50 straight to its app (target: ≤ 1 ms);
 * - the node's CPU per proxied request: HAProxy's and the builder's, from /proc;
 * - kill -9 of the app's process → the first proxied request answered 200
 *   (the proxy holds requests while the supervisor restarts the app), and the
 *   status ready again (target: < 5 s);
 * - a redeploy under the same 16 clients: the new process starts and becomes
 *   ready, the clients move to it (as the edge does once its cache expires,
 *   here at once), the old one drains 2 s and stops; a client that hits the
 *   old one after its drain gets 404 PROCESS_NOT_FOUND and, like the edge,
 *   looks the app up again and retries there. Failed requests are counted
 *   (target: 0).
 *
 *     npx tsx bench/app-proxy.ts [seconds] [rounds]      (default 5 s, 2 rounds)
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { Agent, request } from "node:http";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../scripts/local-stack.js";
import { signProxy } from "../builder/src/protocol/processes.js";
import { type BuilderProcess, startBuilder } from "../test/builder/builder-process.js";
import { APP_SERVER, type ControlPlane, makeRelease, pidsWith, startControlPlane, startProcess, stopProcess, waitFor, webSpec } from "../test/builder/process-support.js";

const seconds = Number(process.argv[2] ?? 5);
const rounds = Number(process.argv[3] ?? 2);
const CLIENTS = 16;

/** Proxy headers for a process, re-signed when the second changes. */
function signer(builder: BuilderProcess, id: () => string) {
  let cached: { second: number; id: string; headers: Record<string, string> } | null = null;
  return async () => {
    const second = Math.floor(Date.now() / 1000);
    if (cached?.second !== second || cached.id !== id()) {
      const headers = { ...(await signProxy(builder.secret, id(), second)), "X-Forwarded-Host": "bench.apps.example", "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https" };
      cached = { second, id: id(), headers };
    }
    return cached.headers;
  };
}

interface Target {
  host: string;
  port: number;
  path: () => string;
  headers: () => Promise<Record<string, string>>;
}

function get(agent: Agent, target: Target, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: target.host, port: target.port, path: target.path(), agent, headers }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        body += chunk;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

/** 16 clients in a loop for `ms`; `retry` decides whether an answer is retried (the edge's 404 rule). */
async function load(target: Target, ms: number, retry: (status: number) => boolean = () => false): Promise<{ ok: number; failed: number; retried: number; failures: string[] }> {
  const agent = new Agent({ keepAlive: true, maxSockets: CLIENTS });
  const deadline = Date.now() + ms;
  let ok = 0;
  let failed = 0;
  let retried = 0;
  const failures: string[] = [];
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (Date.now() < deadline) {
        for (let attempt = 1; ; attempt++) {
          try {
            const answer = await get(agent, target, await target.headers());
            if (answer.status === 200) ok++;
            else if (attempt < 3 && retry(answer.status)) {
              retried++;
              continue;
            } else {
              failed++;
              if (failures.length < 5) failures.push(`${answer.status} ${answer.body.slice(0, 200)}`);
            }
          } catch (error) {
            failed++;
            if (failures.length < 5) failures.push(String(error));
          }
          break;
        }
      }
    }),
  );
  agent.destroy();
  return { ok, failed, retried, failures };
}

/** CPU seconds a process has used (utime + stime). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** The builder's HAProxy, when it runs one: a child of the builder (its other children are the apps' sandboxes). */
function haproxyOf(builderPid: number): number[] {
  const children = readFileSync(`/proc/${builderPid}/task/${builderPid}/children`, "utf8").trim().split(/\s+/).filter(Boolean);
  return children.filter((pid) => readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "haproxy").map(Number);
}

/** p50 of one client's requests, one after the other, for `count` requests (ms). */
async function p50(target: Target, count: number): Promise<number> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const headers = await target.headers();
    const started = performance.now();
    await get(agent, target, headers);
    times.push(performance.now() - started);
  }
  agent.destroy();
  return times.sort((a, b) => a - b)[Math.floor(times.length / 2)]!;
}

/** A builder with the test app running, and its two targets. */
interface Side {
  name: string;
  builder: BuilderProcess;
  plane: ControlPlane;
  id: string;
  marker: string;
  direct: Target;
  proxied: Target;
  /** The node's processes whose CPU a proxied request costs: the builder, and HAProxy when it runs. */
  nodePids: number[];
}

async function side(name: string, env: Record<string, string>): Promise<Side> {
  const builder = await startBuilder({ env });
  const plane = await startControlPlane(builder.secret);
  const url = new URL(builder.url);
  const release = await makeRelease({ "server.js": APP_SERVER });
  const marker = `bench-${name}-${process.pid}`;
  const started = await startProcess(builder, webSpec(plane.serve(release), { command: `node server.js ${marker}`, memoryMb: 512 }));
  await waitFor(builder, started.id, (status) => status.ready);
  const id = started.id;
  const headers = signer(builder, () => id);
  const proxied: Target = { host: url.hostname, port: Number(url.port), path: () => `/v1/proxy/${id}/hello`, headers };
  const info = JSON.parse((await get(new Agent(), { ...proxied, path: () => `/v1/proxy/${id}/info` }, await headers())).body) as { address: string };
  const direct: Target = { host: info.address, port: 8080, path: () => "/hello", headers: async () => ({}) };
  return { name, builder, plane, id, marker, direct, proxied, nodePids: [builder.pid, ...haproxyOf(builder.pid)] };
}

/**
 * The floor for any second hop here: the same HAProxy binary with nothing
 * but a frontend and the app as its one server (no signature, no rules, one
 * thread, keep-alive both ways), in front of the native side's app.
 */
async function bareHaproxy(app: Target): Promise<{ target: Target; stop(): Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "svc-bench-haproxy-"));
  const port = await freePort();
  const config = [
    "global",
    "  nbthread 1",
    "defaults",
    "  mode http",
    "  timeout connect 5s",
    "  timeout client 60s",
    "  timeout server 60s",
    "frontend bare",
    `  bind 127.0.0.1:${port}`,
    "  default_backend app",
    "backend app",
    `  server app ${app.host}:${app.port}`,
    "",
  ].join("\n");
  await writeFile(join(dir, "haproxy.cfg"), config);
  const child = spawn(process.env.BUILDER_HAPROXY ?? "/usr/sbin/haproxy", ["-db", "-f", join(dir, "haproxy.cfg")], { stdio: "ignore" });
  const target: Target = { host: "127.0.0.1", port, path: app.path, headers: app.headers };
  for (let tries = 0; (await get(new Agent(), target, {}).catch(() => null))?.status !== 200; tries++) {
    if (tries > 100) throw new Error("the bare HAProxy did not answer");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return {
    target,
    async stop() {
      child.kill();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

const native = await side("native", { BUILDER_NATIVE_PROXY: "on" });
const peer = await side("node", { BUILDER_NATIVE_PROXY: "off" });
const bare = await bareHaproxy(native.direct);
try {
  const { builder } = native;
  const builderUrl = new URL(builder.url);
  console.log(
    `two builders: ${native.builder.url} (HAProxy in front, the node as it runs) and ${peer.builder.url} (the Node proxy alone); ${CLIENTS} keep-alive clients, ${seconds} s per measurement; load ${loadavg().map((l) => l.toFixed(1)).join(" ")}`,
  );
  for (const one of [native, peer]) {
    await load(one.direct, 1_000);
    await load(one.proxied, 1_000);
  }
  const results = new Map<string, { direct: number; proxied: number; cpuMicros: number }[]>([
    [native.name, []],
    [peer.name, []],
  ]);
  const floors: number[] = [];
  for (let round = 1; round <= rounds; round++) {
    const d = await load(native.direct, seconds * 1000);
    const b = await load(bare.target, seconds * 1000);
    floors.push(b.ok / d.ok);
    console.log(`round ${round}, bare HAProxy (no rules) in front of the native side's app: ${(b.ok / seconds).toFixed(0)} req/s against ${(d.ok / seconds).toFixed(0)} direct: ${(b.ok / d.ok).toFixed(2)}×`);
    for (const one of [native, peer]) {
      const d = await load(one.direct, seconds * 1000);
      const cpuBefore = one.nodePids.reduce((sum, pid) => sum + cpuSeconds(pid), 0);
      const p = await load(one.proxied, seconds * 1000);
      const cpuMicros = ((one.nodePids.reduce((sum, pid) => sum + cpuSeconds(pid), 0) - cpuBefore) / p.ok) * 1e6;
      const row = { direct: d.ok / seconds, proxied: p.ok / seconds, cpuMicros };
      results.get(one.name)!.push(row);
      console.log(
        `round ${round}, ${one.name}: direct ${row.direct.toFixed(0)} req/s (${d.failed} failed), proxied ${row.proxied.toFixed(0)} req/s (${p.failed} failed): ${(row.proxied / row.direct).toFixed(2)}×; the node's CPU ${cpuMicros.toFixed(0)} µs per request (load ${loadavg()[0]!.toFixed(1)})`,
      );
    }
  }
  for (const one of [native, peer]) {
    const direct = await p50(one.direct, 2_000);
    const proxied = await p50(one.proxied, 2_000);
    console.log(`light load, ${one.name}: p50 ${direct.toFixed(3)} ms direct, ${proxied.toFixed(3)} ms proxied: adds ${(proxied - direct).toFixed(3)} ms`);
  }

  // kill -9 → serving again.
  const { id, marker, proxied } = native;
  const headers = proxied.headers;
  const kills: string[] = [];
  for (let i = 1; i <= 3; i++) {
    const [pid] = pidsWith(marker);
    if (pid === undefined) throw new Error("the app's process was not found");
    const killedAt = performance.now();
    process.kill(pid, "SIGKILL");
    const answer = await get(new Agent(), proxied, await headers());
    const served = performance.now() - killedAt;
    await waitFor(builder, id, (status) => status.ready && status.restarts === i, 10_000);
    kills.push(`served ${answer.status} after ${served.toFixed(0)} ms, status ready seen after ${(performance.now() - killedAt).toFixed(0)} ms`);
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  console.log(`kill -9: ${kills.join("; ")}`);

  // Redeploy under load.
  let current = id;
  const deployTarget: Target = { host: builderUrl.hostname, port: Number(builderUrl.port), path: () => `/v1/proxy/${current}/hello`, headers: signer(builder, () => current) };
  const next = await makeRelease({ "server.js": `${APP_SERVER}\n// release 2` });
  const deploy = (async () => {
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const fresh = await startProcess(builder, webSpec(native.plane.serve(next), { memoryMb: 512 }));
    await waitFor(builder, fresh.id, (status) => status.ready);
    const old = current;
    current = fresh.id;
    await stopProcess(builder, old, 2);
    await waitFor(builder, old, (status) => status.state === "stopped");
    return fresh.id;
  })();
  const during = await load(deployTarget, 8_000, (status) => status === 404);
  const freshId = await deploy;
  console.log(`redeploy under ${CLIENTS} clients: ${during.ok} ok, ${during.failed} failed, ${during.retried} retried after 404 PROCESS_NOT_FOUND${during.failures.length ? `: ${during.failures.join(" | ")}` : ""}`);
  await stopProcess(builder, freshId);
  const floor = floors.reduce((sum, ratio) => sum + ratio, 0) / floors.length;
  for (const [name, rows] of results) {
    const mean = (key: "direct" | "proxied" | "cpuMicros") => rows.reduce((sum, row) => sum + row[key], 0) / rows.length;
    const ratio = mean("proxied") / mean("direct");
    console.log(
      `mean, ${name}: direct ${mean("direct").toFixed(0)} req/s, proxied ${mean("proxied").toFixed(0)} req/s, ratio ${ratio.toFixed(2)} (${(ratio / floor).toFixed(2)} of the bare HAProxy's ${floor.toFixed(2)}); the node's CPU ${mean("cpuMicros").toFixed(0)} µs per request`,
    );
  }
} finally {
  await bare.stop();
  for (const one of [native, peer]) {
    await one.builder.stop();
    await one.plane.close();
  }
}
