/**
 * The node's half of an app's traffic (issue 18), measured in one run on one
 * machine against a real builder and a real sandboxed app (the test app of
 * the process suites, a Node HTTP server):
 *
 * - throughput: 16 concurrent keep-alive clients for 5 s, GET /hello, once
 *   straight to the app's address:port on the run network and once through
 *   `/v1/proxy/<id>/hello` with the Worker's proxy headers (signed once per
 *   second, as the edge's signatures repeat within a second); same client,
 *   alternating rounds (target: proxied ≥ 0.5 × direct);
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
import { Agent, request } from "node:http";
import { loadavg } from "node:os";
import { signProxy } from "../builder/src/protocol/processes.js";
import { startBuilder } from "../test/builder/builder-process.js";
import { APP_SERVER, makeRelease, pidsWith, startControlPlane, startProcess, stopProcess, waitFor, webSpec } from "../test/builder/process-support.js";

const seconds = Number(process.argv[2] ?? 5);
const rounds = Number(process.argv[3] ?? 2);
const CLIENTS = 16;

const builder = await startBuilder();
const plane = await startControlPlane(builder.secret);
const builderUrl = new URL(builder.url);

/** Proxy headers for a process, re-signed when the second changes. */
function signer(id: () => string) {
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

try {
  const release = await makeRelease({ "server.js": APP_SERVER });
  const marker = `bench-${process.pid}`;
  const started = await startProcess(builder, webSpec(plane.serve(release), { command: `node server.js ${marker}`, memoryMb: 512 }));
  await waitFor(builder, started.id, (status) => status.ready);
  const id = started.id;
  const headers = signer(() => id);
  const info = JSON.parse((await get(new Agent(), { host: builderUrl.hostname, port: Number(builderUrl.port), path: () => `/v1/proxy/${id}/info`, headers }, await headers())).body) as { address: string };
  const direct: Target = { host: info.address, port: 8080, path: () => "/hello", headers: async () => ({}) };
  const proxied: Target = { host: builderUrl.hostname, port: Number(builderUrl.port), path: () => `/v1/proxy/${id}/hello`, headers };

  console.log(`app at ${info.address}:8080, builder at ${builder.url}; ${CLIENTS} keep-alive clients, ${seconds} s per measurement; load ${loadavg().map((l) => l.toFixed(1)).join(" ")}`);
  await load(direct, 1_000);
  await load(proxied, 1_000);
  const results: { direct: number; proxied: number }[] = [];
  for (let round = 1; round <= rounds; round++) {
    const d = await load(direct, seconds * 1000);
    const p = await load(proxied, seconds * 1000);
    const row = { direct: d.ok / seconds, proxied: p.ok / seconds };
    results.push(row);
    console.log(
      `round ${round}: direct ${row.direct.toFixed(0)} req/s (${d.failed} failed), proxied ${row.proxied.toFixed(0)} req/s (${p.failed} failed): ${(row.proxied / row.direct).toFixed(2)}× (load ${loadavg()[0]!.toFixed(1)})`,
    );
  }

  // kill -9 → serving again.
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
  const deployTarget: Target = { host: builderUrl.hostname, port: Number(builderUrl.port), path: () => `/v1/proxy/${current}/hello`, headers: signer(() => current) };
  const next = await makeRelease({ "server.js": `${APP_SERVER}\n// release 2` });
  const deploy = (async () => {
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const fresh = await startProcess(builder, webSpec(plane.serve(next), { memoryMb: 512 }));
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
  const mean = (key: "direct" | "proxied") => results.reduce((sum, row) => sum + row[key], 0) / results.length;
  console.log(`mean: direct ${mean("direct").toFixed(0)} req/s, proxied ${mean("proxied").toFixed(0)} req/s, ratio ${(mean("proxied") / mean("direct")).toFixed(2)}`);
} finally {
  await builder.stop();
  await plane.close();
}
