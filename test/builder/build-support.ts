/**
 * What the build suites share: a tiny HTTP server playing the Worker (serves
 * source archives, answers the blobs endpoint from a set of stored hashes,
 * accepts blob PUTs and checks them), fixture packing, and a helper that runs a
 * build to its end through the real builder.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cp, mkdtemp } from "node:fs/promises";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { NonceCache, verifyRequest } from "../../builder/src/protocol/signing.js";
import { BlobsRequest, type BlobsResponse, type BuildResult, type BuildSpec } from "../../builder/src/protocol/static.js";
import { type BuilderTarget, followLog, jobStatus, signedFetch } from "./builder-process.js";

/** `test/fixtures/sites`. */
export const sitesDir = fileURLToPath(new URL("../fixtures/sites", import.meta.url));

/** A `.tar.gz` of a project folder, without what `svc deploy` leaves out (node_modules, build output). */
export function packProject(dir: string): Buffer {
  return execFileSync("tar", ["-czf", "-", "--exclude=./node_modules", "--exclude=./dist", "-C", dir, "."], {
    maxBuffer: 64 * 1024 * 1024,
  });
}

/** A throwaway copy of a fixture, to change before packing. */
export async function copyFixture(name: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), `svc-site-${name}-`));
  await cp(join(sitesDir, name), dir, { recursive: true, filter: (source) => !source.includes("node_modules") });
  return dir;
}

/** What the fake Worker saw for one build (one blobs endpoint). */
export interface BlobTraffic {
  /** Every blob named in blobs-endpoint requests. */
  asked: BlobsRequest["blobs"];
  /** How many blobs each blobs-endpoint request named. */
  batches: number[];
  /** Hashes answered as missing. */
  missing: string[];
  /** Hashes PUT successfully. */
  put: string[];
  /** PUT answers that were failures on purpose (see failNextPuts). */
  failedPuts: number;
}

/** The Worker's side of a build, in one local process. */
export interface FakeWorker {
  url: string;
  /** Serves `archive` and returns its URL. */
  serveSource(name: string, archive: Buffer): string;
  /** A fresh blobs endpoint, its traffic recorded under `tag`; `hasAll` answers that storage lacks nothing. */
  blobsEndpoint(tag: string, options?: { hasAll?: boolean }): string;
  traffic(tag: string): BlobTraffic;
  /** Stored blobs by hash (content type and bytes as PUT). */
  stored: Map<string, { contentType: string; bytes: Buffer }>;
  /** The next `count` PUTs answer 503, to exercise retries. */
  failNextPuts(count: number): void;
  close(): Promise<void>;
}

function readAll(request: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks)));
    request.on("error", reject);
  });
}

/** Starts the fake Worker; blobs requests must be signed with `secret`. */
export async function startFakeWorker(secret: string): Promise<FakeWorker> {
  const sources = new Map<string, Buffer>();
  const traffic = new Map<string, BlobTraffic>();
  const hasAll = new Set<string>();
  const stored = new Map<string, { contentType: string; bytes: Buffer }>();
  const announced = new Map<string, { size: number; contentType: string }>();
  const nonces = new NonceCache();
  let failPuts = 0;
  let base = "";

  const handle = async (request: IncomingMessage, response: ServerResponse): Promise<void> => {
    const url = new URL(request.url ?? "/", base);
    const body = await readAll(request);
    const [, kind, tag, hash] = url.pathname.split("/");
    if (request.method === "GET" && kind === "source" && tag && sources.has(tag)) {
      response.writeHead(200, { "Content-Type": "application/gzip" }).end(sources.get(tag));
      return;
    }
    if (request.method === "POST" && kind === "blobs" && tag) {
      const verdict = await verifyRequest({
        secret,
        method: "POST",
        path: url.pathname + url.search,
        body,
        headers: { get: (name) => (request.headers[name.toLowerCase()] as string | undefined) ?? null },
      });
      if (!verdict.ok || !nonces.use(verdict.nonce, verdict.timestamp)) {
        response.writeHead(401).end();
        return;
      }
      const parsed = BlobsRequest.safeParse(JSON.parse(body.toString("utf8")));
      if (!parsed.success) {
        response.writeHead(400).end(parsed.error.message);
        return;
      }
      const record = traffic.get(tag)!;
      record.asked.push(...parsed.data.blobs);
      record.batches.push(parsed.data.blobs.length);
      const missing = hasAll.has(tag) ? [] : parsed.data.blobs.filter((blob) => !stored.has(blob.sha256));
      for (const blob of missing) announced.set(blob.sha256, { size: blob.size, contentType: blob.contentType });
      record.missing.push(...missing.map((blob) => blob.sha256));
      const answer: BlobsResponse = {
        missing: missing.map((blob) => ({ sha256: blob.sha256, url: `${base}/put/${tag}/${blob.sha256}` })),
      };
      response.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(answer));
      return;
    }
    if (request.method === "PUT" && kind === "put" && tag && hash) {
      const record = traffic.get(tag)!;
      if (failPuts > 0) {
        failPuts--;
        record.failedPuts++;
        response.writeHead(503).end();
        return;
      }
      const expected = announced.get(hash);
      const actual = createHash("sha256").update(body).digest("hex");
      const contentType = request.headers["content-type"] ?? "";
      // As R2 does with a signed x-amz-checksum-sha256: the bytes must hash to it.
      const checksum = Buffer.from(String(request.headers["x-amz-checksum-sha256"] ?? ""), "base64").toString("hex");
      if (!expected || actual !== hash || checksum !== hash || body.length !== expected.size || contentType !== expected.contentType) {
        response.writeHead(400).end("blob does not match what was announced");
        return;
      }
      stored.set(hash, { contentType, bytes: body });
      record.put.push(hash);
      response.writeHead(200).end();
      return;
    }
    response.writeHead(404).end();
  };

  const server = createServer((request, response) => {
    handle(request, response).catch((error: unknown) => response.writeHead(500).end(String(error)));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: base,
    serveSource(name, archive) {
      sources.set(name, archive);
      return `${base}/source/${name}`;
    },
    blobsEndpoint(tag, options = {}) {
      traffic.set(tag, { asked: [], batches: [], missing: [], put: [], failedPuts: 0 });
      if (options.hasAll) hasAll.add(tag);
      return `${base}/blobs/${tag}?deployment=${tag}`;
    },
    traffic: (tag) => traffic.get(tag)!,
    stored,
    failNextPuts(count) {
      failPuts = count;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Submits a build; throws unless the builder accepted it. */
export async function submitBuild(target: BuilderTarget, spec: BuildSpec): Promise<JobStatus> {
  const response = await signedFetch(target, "/v1/builds", { method: "POST", body: spec });
  if (response.status !== 201) throw new Error(`build submit failed: ${response.status} ${await response.text()}`);
  return JobStatus.parse(await response.json());
}

/** Runs a build to its end: final status, the build result (when it succeeded) and the whole log. */
export async function buildToEnd(
  target: BuilderTarget,
  spec: BuildSpec,
): Promise<{ status: JobStatus; result: BuildResult | null; log: string }> {
  const submitted = await submitBuild(target, spec);
  const log = await followLog(target, submitted.id);
  const status = await jobStatus(target, submitted.id);
  const result = status.result?.kind === "build" ? status.result : null;
  return { status, result, log };
}

/** The `svc` lines of a log, text only. */
export function svcLines(log: string): string[] {
  return log
    .split("\n")
    .map((line) => /^\S+ svc (.*)$/.exec(line)?.[1])
    .filter((text): text is string => text !== undefined);
}
