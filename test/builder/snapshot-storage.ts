/**
 * Plays the Worker and object storage for the snapshot and restore suites: a
 * signed part-URL endpoint, a presigned-style PUT receiver that keeps parts in
 * memory and answers ETags, and a GET that serves archives. Plus helpers to
 * run those jobs to their end and to describe a directory tree for comparison.
 */
import { createHash } from "node:crypto";
import { lstat, readFile, readdir, readlink } from "node:fs/promises";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { PartUrlRequest, type RestoreSpec, type SnapshotSpec } from "../../builder/src/protocol/disks.js";
import { NonceCache, verifyRequest } from "../../builder/src/protocol/signing.js";
import { type BuilderTarget, followLog, jobStatus, signedFetch } from "./builder-process.js";

/** The fake storage and what it saw. */
export interface FakeStorage {
  url: string;
  /** Signed endpoint the builder asks for part URLs. */
  partUrlEndpoint: string;
  /** Uploaded parts by number. */
  parts: Map<number, Buffer>;
  /** Part-URL requests whose signature did not verify. */
  badSignatures: number;
  /** Answers HTTP 500 to the next `count` PUTs of this part. */
  failPuts(partNumber: number, count: number): void;
  /** Answers every PUT this much later, as a distant store would. */
  putDelayMs: number;
  /** The most PUTs that were in progress at once. */
  maxPutsAtOnce: number;
  /** The uploaded parts concatenated in order. */
  archive(): Buffer;
  /** Serves `body` at the returned URL (GET, with Content-Length), after `delayMs`. */
  serve(name: string, body: Buffer, delayMs?: number): string;
  close(): Promise<void>;
}

const read = (request: IncomingMessage): Promise<Buffer> =>
  new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks)));
    request.on("error", reject);
  });

/** Starts the fake on a free port; `secret` verifies the builder's part-URL requests. */
export async function startFakeStorage(secret: string): Promise<FakeStorage> {
  const parts = new Map<number, Buffer>();
  const served = new Map<string, { body: Buffer; delayMs: number }>();
  const failures = new Map<number, number>();
  const nonces = new NonceCache();
  let base = "";
  let putsNow = 0;
  const storage: FakeStorage = {
    url: "",
    partUrlEndpoint: "",
    parts,
    badSignatures: 0,
    failPuts: (partNumber, count) => failures.set(partNumber, count),
    putDelayMs: 0,
    maxPutsAtOnce: 0,
    archive: () => Buffer.concat([...parts.keys()].sort((a, b) => a - b).map((n) => parts.get(n)!)),
    serve(name, body, delayMs = 0) {
      served.set(name, { body, delayMs });
      return `${base}/archives/${name}?X-Amz-Signature=fake`;
    },
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };

  const handle = async (request: IncomingMessage, response: ServerResponse) => {
    const url = new URL(request.url ?? "/", base);
    const put = request.method === "PUT";
    if (put) storage.maxPutsAtOnce = Math.max(storage.maxPutsAtOnce, ++putsNow);
    try {
      const body = await read(request);
      if (put) await new Promise((resolve) => setTimeout(resolve, storage.putDelayMs));
      return await answer(request, response, url, body);
    } finally {
      if (put) putsNow--;
    }
  };
  const answer = async (request: IncomingMessage, response: ServerResponse, url: URL, body: Buffer) => {
    if (request.method === "POST" && url.pathname === "/internal/backups/bk_1/parts") {
      const verdict = await verifyRequest({
        secret,
        method: "POST",
        path: request.url ?? "",
        body,
        headers: { get: (name) => (request.headers[name.toLowerCase()] as string | undefined) ?? null },
      });
      if (!verdict.ok || !nonces.use(verdict.nonce, verdict.timestamp)) {
        storage.badSignatures++;
        return response.writeHead(401).end();
      }
      const { partNumber } = PartUrlRequest.parse(JSON.parse(body.toString("utf8")));
      response.writeHead(200, { "Content-Type": "application/json" });
      return response.end(JSON.stringify({ url: `${base}/upload/${partNumber}?X-Amz-Signature=fake` }));
    }
    const upload = /^\/upload\/(\d+)$/.exec(url.pathname);
    if (request.method === "PUT" && upload) {
      const partNumber = Number(upload[1]);
      if (request.headers["content-length"] !== String(body.length) || request.headers.authorization) {
        return response.writeHead(400).end("bad Content-Length or unexpected Authorization");
      }
      const failing = failures.get(partNumber) ?? 0;
      if (failing > 0) {
        failures.set(partNumber, failing - 1);
        return response.writeHead(500).end("<Error><Code>InternalError</Code></Error>");
      }
      parts.set(partNumber, body);
      response.writeHead(200, { ETag: `"${createHash("md5").update(body).digest("hex")}"` });
      return response.end();
    }
    const archive = /^\/archives\/([^/]+)$/.exec(url.pathname);
    if (request.method === "GET" && archive && served.has(archive[1]!)) {
      const { body: content, delayMs } = served.get(archive[1]!)!;
      await new Promise((resolve) => setTimeout(resolve, delayMs));
      response.writeHead(200, { "Content-Length": content.length, "Content-Type": "application/gzip" });
      return response.end(content);
    }
    response.writeHead(404).end();
  };
  const server = createServer((request, response) => {
    handle(request, response).catch(() => response.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  storage.url = base;
  storage.partUrlEndpoint = `${base}/internal/backups/bk_1/parts`;
  return storage;
}

/** Waits for the job's end: its final status and whole log. */
async function toEnd(builder: BuilderTarget, response: Response) {
  if (response.status !== 201) throw new Error(`submit failed: ${response.status} ${await response.text()}`);
  const { id } = (await response.json()) as { id: string };
  const log = await followLog(builder, id);
  return { status: await jobStatus(builder, id), log };
}

/** Snapshots a disk to the fake storage and waits for the end. */
export async function snapshotToEnd(builder: BuilderTarget, storage: FakeStorage, spec: Partial<SnapshotSpec> & { diskId: string }) {
  const body = { partSizeBytes: 5 * 1024 * 1024, partUrlEndpoint: storage.partUrlEndpoint, ...spec };
  return toEnd(builder, await signedFetch(builder, "/v1/snapshots", { method: "POST", body }));
}

/** Restores a disk and waits for the end. */
export async function restoreToEnd(builder: BuilderTarget, spec: Partial<RestoreSpec> & { diskId: string; archiveUrl: string }) {
  const body = { expectedSizeBytes: 1, maxEntries: 10_000, maxExpandedBytes: 1024 ** 3, ...spec };
  return toEnd(builder, await signedFetch(builder, "/v1/restores", { method: "POST", body }));
}

/** One line per member of a tree: path, type, mode, mtime (s) and content digest or link target. */
export async function describeTree(root: string): Promise<string[]> {
  const lines: string[] = [];
  const walk = async (dir: string, prefix: string) => {
    for (const name of (await readdir(dir)).sort()) {
      const path = join(dir, name);
      const stats = await lstat(path);
      const mode = (stats.mode & 0o777).toString(8);
      const mtime = Math.floor(stats.mtimeMs / 1000);
      if (stats.isDirectory()) {
        lines.push(`${prefix}${name}/ dir ${mode} ${mtime}`);
        await walk(path, `${prefix}${name}/`);
      } else if (stats.isSymbolicLink()) {
        lines.push(`${prefix}${name} -> ${await readlink(path)}`);
      } else {
        const digest = createHash("sha256").update(await readFile(path)).digest("hex");
        lines.push(`${prefix}${name} file ${mode} ${mtime} ${stats.size} ${digest}`);
      }
    }
  };
  await walk(root, "");
  return lines;
}
