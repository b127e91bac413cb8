/**
 * Content-addressed publishing: the builder tells the Worker which blobs the
 * site consists of, the Worker answers with presigned PUT URLs for the ones its
 * storage lacks, and only those are sent. The builder holds no storage
 * credentials; every request to the Worker is signed with the node's key.
 */
import { createHash } from "node:crypto";
import { Readable, Transform } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { setTimeout as sleep } from "node:timers/promises";
import type { NodeCredentials } from "../protocol/shared.js";
import { signRequest } from "../protocol/signing.js";
import { BLOB_BATCH_LIMIT, type BlobsRequest, BlobsResponse, type ManifestEntry } from "../protocol/static.js";
import { openInside } from "./files.js";
import { forEachLimited } from "./pool.js";

const ATTEMPTS = 4;
const FIRST_RETRY_MS = 500;
const ATTEMPT_TIMEOUT_MS = 60_000;
/** PUTs in flight at once: enough to hide storage latency, few enough not to flood it. */
const PARALLEL_PUTS = 16;

/** Inputs of {@link uploadMissingBlobs}. */
export interface UploadOptions {
  /** The Worker's blobs endpoint (BuildSpec.blobsEndpoint). */
  endpoint: string;
  credentials: NodeCredentials;
  /** Real path of the output folder the manifest was made from. */
  root: string;
  manifest: ManifestEntry[];
  /** Cancel, timeout or shutdown. */
  signal: AbortSignal;
}

/** Which blobs the Worker lacked, and how many bytes went up. */
export interface UploadReport {
  distinct: number;
  uploaded: number;
  uploadedBytes: number;
}

class UploadError extends Error {}

/**
 * Asks the Worker, in batches of at most {@link BLOB_BATCH_LIMIT}, which blobs it
 * lacks and PUTs each of those, streamed from its file. Requests are retried
 * with backoff on network errors and 5xx/429 answers.
 */
export async function uploadMissingBlobs(
  options: UploadOptions,
): Promise<{ ok: true; report: UploadReport } | { ok: false; error: string }> {
  // One blob per distinct content: identical files under several paths are stored once.
  const byHash = new Map<string, ManifestEntry>();
  for (const entry of options.manifest) if (!byHash.has(entry.sha256)) byHash.set(entry.sha256, entry);
  const blobs = [...byHash.values()];
  const report: UploadReport = { distinct: blobs.length, uploaded: 0, uploadedBytes: 0 };
  try {
    for (let start = 0; start < blobs.length; start += BLOB_BATCH_LIMIT) {
      const batch = blobs.slice(start, start + BLOB_BATCH_LIMIT);
      const missing = await askMissing(options, batch);
      await forEachLimited(missing, PARALLEL_PUTS, async (blob) => {
        const entry = byHash.get(blob.sha256)!;
        await putBlob(options, entry, blob.url);
        report.uploaded++;
        report.uploadedBytes += entry.size;
      });
    }
    return { ok: true, report };
  } catch (error) {
    if (options.signal.aborted) return { ok: false, error: "upload interrupted" };
    return { ok: false, error: error instanceof Error ? error.message : String(error) };
  }
}

async function askMissing(options: UploadOptions, batch: ManifestEntry[]): Promise<BlobsResponse["missing"]> {
  const url = new URL(options.endpoint);
  const request: BlobsRequest = { blobs: batch.map(({ sha256, size, contentType }) => ({ sha256, size, contentType })) };
  const body = JSON.stringify(request);
  const response = await withRetries(`blob check at ${url.origin}${url.pathname}`, options.signal, async (signal) => {
    const headers = await signRequest({ secret: options.credentials.key, node: options.credentials.node, method: "POST", path: url.pathname + url.search, body });
    return fetch(url, { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body, signal });
  });
  const parsed = BlobsResponse.safeParse(await response.json().catch(() => null));
  if (!parsed.success) throw new UploadError(`blob check at ${url.origin}${url.pathname} answered an unexpected body`);
  const asked = new Set(batch.map((entry) => entry.sha256));
  const stranger = parsed.data.missing.find((blob) => !asked.has(blob.sha256));
  if (stranger) throw new UploadError(`blob check answered a blob that was not asked for (${stranger.sha256})`);
  return parsed.data.missing;
}

/**
 * PUTs one blob. The URL signs its length and SHA-256 (x-amz-checksum-sha256),
 * so storage refuses bytes that do not hash to the manifest's digest; the
 * stream is hashed on the way too, and cut short (failing the upload) if the
 * file no longer holds what was hashed.
 */
async function putBlob(options: UploadOptions, entry: ManifestEntry, url: string): Promise<void> {
  const checksum = Buffer.from(entry.sha256, "hex").toString("base64");
  const response = await withRetries(`upload of ${entry.path}`, options.signal, async (signal) => {
    const handle = await openInside(options.root, entry.path.slice(1));
    if (!handle) throw new UploadError(`${entry.path} disappeared from the output before its upload`);
    const hash = createHash("sha256");
    const verify = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        hash.update(chunk);
        done(null, chunk);
      },
      flush(done) {
        done(hash.digest("hex") === entry.sha256 ? null : new UploadError(`${entry.path} changed after it was hashed`));
      },
    });
    // The stream closes the handle once it is read, failed or cancelled.
    const body = Readable.toWeb(handle.createReadStream().pipe(verify)) as WebReadableStream<Uint8Array> as ReadableStream<Uint8Array>;
    try {
      return await fetch(url, {
        method: "PUT",
        headers: { "Content-Length": String(entry.size), "Content-Type": entry.contentType, "x-amz-checksum-sha256": checksum },
        body,
        duplex: "half",
        signal,
      });
    } catch (error) {
      await body.cancel().catch(() => undefined); // releases the file when fetch never read it
      throw error;
    }
  });
  await response.body?.cancel();
}

/**
 * Runs `attempt` until it answers 2xx. 4xx other than 429 is final (the URL or
 * the request is wrong; repeating cannot help); network errors, 429 and 5xx are
 * retried with doubling pauses.
 */
async function withRetries(
  what: string,
  signal: AbortSignal,
  attempt: (signal: AbortSignal) => Promise<Response>,
): Promise<Response> {
  let delay = FIRST_RETRY_MS;
  let problem = "";
  for (let round = 1; round <= ATTEMPTS; round++) {
    signal.throwIfAborted();
    try {
      const response = await attempt(AbortSignal.any([signal, AbortSignal.timeout(ATTEMPT_TIMEOUT_MS)]));
      if (response.ok) return response;
      await response.body?.cancel();
      problem = `HTTP ${response.status}`;
      if (response.status < 500 && response.status !== 429) break;
    } catch (error) {
      if (error instanceof UploadError || signal.aborted) throw error;
      problem = describe(error);
    }
    if (round < ATTEMPTS) {
      await sleep(delay, undefined, { signal });
      delay *= 2;
    }
  }
  throw new UploadError(`${what} failed (${problem})`);
}

/** fetch reports "fetch failed" and keeps the reason (ECONNREFUSED, …) in `cause`. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  return error.cause instanceof Error ? `${error.message}: ${error.cause.message}` : error.message;
}
