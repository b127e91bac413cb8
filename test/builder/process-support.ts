/**
 * Plays the control plane for the app-process suites: releases made in the
 * test (a tar.gz of a tiny Node server) served from a local HTTP server acting
 * as presigned storage, a callback receiver that verifies signatures, and the
 * Worker's side of proxied traffic (signProxy headers, X-Forwarded-*).
 */
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { type IncomingMessage, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ProcessSpec, ProcessStatus, signProxy } from "../../builder/src/protocol/processes.js";
import { NonceCache, verifyRequest } from "../../builder/src/protocol/signing.js";
import { type BuilderTarget, TEST_TENANT, signedFetch } from "./builder-process.js";

/** A release: the archive, and what ProcessSpec's `release` says of it (its URL once served). */
export interface Release {
  archive: Buffer;
  sha256: string;
  sizeBytes: number;
}

/** Packs `files` (path → content) as a release `.tar.gz` with `./…` paths, as release builds write it. */
export async function makeRelease(files: Record<string, string>): Promise<Release> {
  const dir = await mkdtemp(join(tmpdir(), "svc-release-"));
  try {
    for (const [path, content] of Object.entries(files)) await writeFile(join(dir, path), content);
    const archive = execFileSync("tar", ["-czf", "-", "-C", dir, "."]);
    return { archive, sha256: createHash("sha256").update(archive).digest("hex"), sizeBytes: archive.length };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * The test app: a Node HTTP server on PORT. `/healthz` (500 when HEALTH=fail),
 * `/hello`, `/big?bytes=N`, `/slow?ms=N`, `/sse` (three events 300 ms apart), `/info` (its
 * address, uid and some env), `/ws` (a WebSocket echo, frames under 126
 * bytes), anything else echoes method, URL, headers and the body's size and
 * SHA-256. Its response carries an X-Svc-Leak header the node must drop.
 */
export const APP_SERVER = String.raw`
const http = require("http");
const crypto = require("crypto");
const os = require("os");
const port = Number(process.env.PORT);
const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://app");
  if (url.pathname === "/healthz") {
    res.writeHead(process.env.HEALTH === "fail" ? 500 : 200);
    return res.end("ok");
  }
  if (url.pathname === "/hello") return res.end("hello from the app");
  if (url.pathname === "/big") {
    const size = Number(url.searchParams.get("bytes") || 0);
    res.writeHead(200, { "Content-Length": size, "Content-Type": "application/octet-stream" });
    return res.end(Buffer.alloc(size, 7));
  }
  if (url.pathname === "/cookies") {
    res.setHeader("Set-Cookie", url.searchParams.getAll("c"));
    return res.end("cookies");
  }
  if (url.pathname === "/slow") return void setTimeout(() => res.end("slow done"), Number(url.searchParams.get("ms") || 1000));
  if (url.pathname === "/sse") {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
    let n = 0;
    const timer = setInterval(() => {
      res.write("data: event " + n + "\n\n");
      if (++n === 3) { clearInterval(timer); res.end(); }
    }, 300);
    return;
  }
  if (url.pathname === "/info") {
    const eth0 = (os.networkInterfaces().eth0 || []).find((a) => a.family === "IPv4");
    res.writeHead(200, { "Content-Type": "application/json" });
    return res.end(JSON.stringify({ address: eth0 && eth0.address, uid: process.getuid(), cwd: process.cwd(),
      env: { PORT: process.env.PORT, PATH: process.env.PATH, SECRET: process.env.SECRET, SVC_APP_ID: process.env.SVC_APP_ID, HOME: process.env.HOME } }));
  }
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    res.writeHead(200, { "Content-Type": "application/json", "X-Svc-Leak": "must not pass", "X-App": "echo" });
    res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, bodyLength: body.length,
      bodySha256: crypto.createHash("sha256").update(body).digest("hex") }));
  });
});
server.on("upgrade", (req, socket) => {
  const accept = crypto.createHash("sha1").update(req.headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
  socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n");
  socket.on("data", (frame) => {
    const length = frame[1] & 0x7f;
    const mask = frame.subarray(2, 6);
    const payload = Buffer.from(frame.subarray(6, 6 + length).map((byte, i) => byte ^ mask[i % 4]));
    const text = "echo: " + payload.toString();
    socket.write(Buffer.concat([Buffer.from([0x81, Buffer.byteLength(text)]), Buffer.from(text)]));
  });
});
server.listen(port, "0.0.0.0", () => console.log("listening on " + port));
`;

/** Serves releases as presigned storage does (GET with Content-Length), and receives signed callbacks. */
export interface ControlPlane {
  /** Serves the release; the returned object is ProcessSpec's `release`. */
  serve(release: Release): ProcessSpec["release"];
  /** Where callbacks go. */
  callbackUrl: string;
  /** Every callback received with a valid signature, in order of arrival. */
  callbacks: ProcessStatus[];
  /** Callbacks whose signature did not verify. */
  badCallbacks: number;
  close(): Promise<void>;
}

const read = (request: IncomingMessage): Promise<Buffer> =>
  new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks)));
    request.on("error", reject);
  });

export async function startControlPlane(secret: string): Promise<ControlPlane> {
  const served = new Map<string, Buffer>();
  const nonces = new NonceCache();
  const plane: ControlPlane = {
    serve(release) {
      const name = randomBytes(8).toString("hex");
      served.set(name, release.archive);
      return { url: `${base}/releases/${name}.tar.gz?X-Amz-Signature=fake`, sha256: release.sha256, sizeBytes: release.sizeBytes };
    },
    callbackUrl: "",
    callbacks: [],
    badCallbacks: 0,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
  const server = createServer(async (request, response) => {
    const url = new URL(request.url ?? "/", base);
    const body = await read(request);
    if (request.method === "GET" && url.pathname.startsWith("/releases/")) {
      const archive = served.get(url.pathname.slice("/releases/".length, -".tar.gz".length));
      if (!archive) return response.writeHead(404).end();
      response.writeHead(200, { "Content-Length": archive.length, "Content-Type": "application/gzip" });
      return response.end(archive);
    }
    if (request.method === "POST" && url.pathname === "/internal/processes/callback") {
      const verdict = await verifyRequest({
        secret,
        method: "POST",
        path: request.url ?? "",
        body,
        headers: { get: (name) => (request.headers[name.toLowerCase()] as string | undefined) ?? null },
      });
      if (!verdict.ok || !nonces.use(verdict.nonce, verdict.timestamp)) {
        plane.badCallbacks++;
        return response.writeHead(401).end();
      }
      plane.callbacks.push(ProcessStatus.parse(JSON.parse(body.toString("utf8"))));
      return response.writeHead(204).end();
    }
    response.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  plane.callbackUrl = `${base}/internal/processes/callback`;
  return plane;
}

/** A web process of the test app, with what a test overrides. */
export function webSpec(release: ProcessSpec["release"], overrides: Partial<ProcessSpec> = {}): ProcessSpec {
  return {
    key: `app_test/dep_${randomBytes(6).toString("hex")}/1`,
    tenant: TEST_TENANT,
    appId: "app_test",
    release,
    type: "web",
    command: "node server.js",
    port: 8080,
    healthCheck: { path: "/healthz", timeoutSeconds: 20 },
    env: {},
    memoryMb: 256,
    ...overrides,
  };
}

/** Starts a process; throws unless the node accepted it. */
export async function startProcess(target: BuilderTarget, spec: ProcessSpec): Promise<ProcessStatus> {
  const response = await signedFetch(target, "/v1/processes", { method: "POST", body: spec });
  if (response.status !== 201) throw new Error(`start failed: ${response.status} ${await response.text()}`);
  return ProcessStatus.parse(await response.json());
}

/** Starts a web process of `release` and waits until it takes traffic. */
export async function readyProcess(target: BuilderTarget, plane: ControlPlane, release: Release, overrides: Partial<ProcessSpec> = {}): Promise<ProcessStatus> {
  const started = await startProcess(target, webSpec(plane.serve(release), overrides));
  return waitFor(target, started.id, (status) => status.ready);
}

export async function processStatus(target: BuilderTarget, id: string): Promise<ProcessStatus> {
  const response = await signedFetch(target, `/v1/processes/${id}`);
  if (response.status !== 200) throw new Error(`status failed: ${response.status} ${await response.text()}`);
  return ProcessStatus.parse(await response.json());
}

/** Polls the process every 25 ms until `done` holds; throws with the last status after `timeoutMs`. */
export async function waitFor(
  target: BuilderTarget,
  id: string,
  done: (status: ProcessStatus) => boolean,
  timeoutMs = 20_000,
): Promise<ProcessStatus> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const status = await processStatus(target, id);
    if (done(status)) return status;
    if (Date.now() > deadline) throw new Error(`process ${id} did not get there within ${timeoutMs} ms: ${JSON.stringify(status)}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

export async function stopProcess(target: BuilderTarget, id: string, drainSeconds = 0, successor?: string): Promise<ProcessStatus> {
  const response = await signedFetch(target, `/v1/processes/${id}/stop`, { method: "POST", body: { drainSeconds, successor } });
  if (response.status !== 202) throw new Error(`stop failed: ${response.status} ${await response.text()}`);
  return ProcessStatus.parse(await response.json());
}

/** The headers the Worker adds to a proxied request. */
export async function proxyHeaders(secret: string, id: string, host = "myapp.apps.example"): Promise<Record<string, string>> {
  return { ...(await signProxy(secret, id)), "X-Forwarded-Host": host, "X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https" };
}

/** A request through the node's proxy, as the Worker sends it. */
export async function proxyFetch(target: BuilderTarget, id: string, path: string, init: RequestInit = {}): Promise<Response> {
  const headers = { ...(await proxyHeaders(target.secret, id)), ...(init.headers as Record<string, string> | undefined) };
  return fetch(`${target.url}/v1/proxy/${id}${path}`, { ...init, headers });
}

/**
 * Host pids of the Node processes whose command line contains `marker`: the
 * app's own, found through /proc (the shell running the start command, and
 * bubblewrap, carry the marker too, but do not start with `node`).
 */
export function pidsWith(marker: string): number[] {
  const pids: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmdline = readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0").join(" ");
      if (cmdline.startsWith("node ") && cmdline.includes(marker)) pids.push(Number(name));
    } catch {
      // gone
    }
  }
  return pids;
}
