/**
 * A directory as one `.tar.gz` in object storage, uploaded in parts through
 * presigned URLs the Worker hands out one at a time (protocol/disks.ts, "Disk
 * snapshots and restores"): what a disk snapshot and a release build both
 * produce.
 *
 * Compression uses every core: the tar stream is cut into 1 MiB blocks that
 * compress at once on the threadpool into concatenated gzip members
 * (parallel-gzip.ts), one standard `.tar.gz` for any gzip reader.
 *
 * Memory stays bounded whatever the directory holds: files stream through in
 * 512 KiB chunks, and the compressed stream is cut into parts spooled to files
 * in a directory of the job's rather than held in memory, since a part may
 * be up to 5 GiB and a failed PUT must be retried with the same bytes. Up to
 * {@link UPLOADS_AT_ONCE} parts upload at once while the next is written, so
 * at most one more than that exists at a time. Size and SHA-256 of the whole
 * archive are computed as it is produced.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { type FileHandle, mkdir, open, rm } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { PartUrlResponse, SNAPSHOT_MAX_PARTS, type SnapshotPart } from "../protocol/disks.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { signRequest } from "../protocol/signing.js";
import type { JobLog } from "../sandbox/sandbox.js";
import { formatBytes } from "../units.js";
import { DirectoryPacker, type PackLimits } from "./pack.js";
import { parallelGzip } from "./parallel-gzip.js";

/**
 * Tries per part (URL request plus PUT), waiting 0.5 s, then doubling up to
 * 8 s, between them: about half a minute, so a snapshot outlasts a control
 * plane that restarts under it (a Worker deploy, an outage of seconds).
 */
const PART_ATTEMPTS = 8;
const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 8_000;
/** A PUT or URL request that makes no progress for this long is abandoned (and retried). */
const REQUEST_IDLE_MS = 60_000;
/** Same level as `gzip` and `tar czf`. */
const GZIP_LEVEL = 6;
/** Uncompressed bytes per gzip member: the ratio lost at member edges is about 0.1 % at this size. */
const GZIP_BLOCK_BYTES = 1024 * 1024;
/**
 * Blocks compressing at once: one more than the cores, so they stay busy while
 * the event loop fills the next block, but never the whole threadpool (4
 * threads unless UV_THREADPOOL_SIZE says otherwise), which file reads need too.
 */
const GZIP_CONCURRENCY = Math.max(1, Math.min(availableParallelism() + 1, (Number(process.env.UV_THREADPOOL_SIZE) || 4) - 1));
/**
 * Parts uploading at once. Object storage takes parts in any order; over a
 * network each PUT waits on its round trips, and several at once keep the
 * link busy. It also lets an archive whose start compresses fast and whose
 * end compresses slowly (a disk's big binary files, then its text) upload the
 * former while the latter is still being compressed, instead of one part
 * behind the other.
 */
const UPLOADS_AT_ONCE = 3;
/** Every spool write and read costs a threadpool round trip: gathered writes and large reads keep them few. */
const SPOOL_WRITE_BYTES = 1024 * 1024;
const PUT_READ_BYTES = 1024 * 1024;

/** Where and how {@link uploadDirectoryArchive} sends the archive. */
export interface ArchiveUploadInput {
  /** The directory packed: members `./`, `./a/`, `./a/b`, never following a link (pack.ts). */
  root: string;
  /** A directory of the job's for the parts on their way (created, and removed at the end). */
  spoolDir: string;
  partUrlEndpoint: string;
  partSizeBytes: number;
  /** Signs the part-URL requests to the Worker. */
  credentials: NodeCredentials;
  /** Hears about members left out (sockets, fifos…) and each uploaded part. */
  log: JobLog;
  signal: AbortSignal;
  /** What the archive may hold (pack.ts); past a limit packing stops with {@link SnapshotLimitExceeded}. */
  limits?: Partial<PackLimits>;
}

/** What was uploaded: what CompleteMultipartUpload needs, and what a restore of it may be limited to. */
export interface UploadedArchive {
  /** Bytes of the whole `.tar.gz` (the sum of the parts). */
  sizeBytes: number;
  /** SHA-256 of the whole `.tar.gz`, hex. */
  sha256: string;
  /** In part-number order, 1 to N. */
  parts: SnapshotPart[];
  /** Members, as `tar tzf` lists them. */
  entries: number;
  /** Bytes of the uncompressed tar stream. */
  expandedBytes: number;
}

/** A part could not be uploaded; the message says which and why. */
export class PartUploadFailed extends Error {}

/**
 * Packs, compresses and uploads `root`. Throws {@link PartUploadFailed} when
 * a part could not be uploaded after its retries, and whatever stopped the
 * packing otherwise (a cancel, an unreadable directory, a limit: then the
 * error or its cause is a SnapshotLimitExceeded).
 */
export async function uploadDirectoryArchive(input: ArchiveUploadInput): Promise<UploadedArchive> {
  const { log, signal } = input;
  const uploader = new PartUploader(input.partUrlEndpoint, input.credentials, log, signal);
  const spooler = new PartSpooler(input.spoolDir, input.partSizeBytes, uploader);
  try {
    await mkdir(input.spoolDir, { mode: 0o700 });
    const packer = new DirectoryPacker(input.root, (message) => log.note(message), input.limits);
    const hash = createHash("sha256");
    let sizeBytes = 0;
    await pipeline(
      packer.stream(),
      (tar: AsyncIterable<Buffer>) => parallelGzip(tar, { level: GZIP_LEVEL, blockBytes: GZIP_BLOCK_BYTES, concurrency: GZIP_CONCURRENCY }),
      async (compressed: AsyncIterable<Buffer>) => {
        for await (const chunk of compressed) {
          hash.update(chunk);
          sizeBytes += chunk.length;
          await spooler.write(chunk);
        }
        await spooler.end();
      },
      { signal: AbortSignal.any([signal, uploader.failed]) },
    );
    const parts = await uploader.finish();
    return { sizeBytes, sha256: hash.digest("hex"), parts, entries: packer.entries, expandedBytes: packer.bytes };
  } catch (error) {
    const uploadError = uploader.error;
    uploader.stop();
    if (uploadError !== null) throw new PartUploadFailed(uploadError);
    throw error;
  } finally {
    await spooler.discard();
    await uploader.settled();
    await rm(input.spoolDir, { recursive: true, force: true });
  }
}

/** A part written to its spool file, ready to upload. */
interface SpooledPart {
  partNumber: number;
  path: string;
  size: number;
}

/** The part being written, and the chunks not yet written to its file. */
interface OpenPart {
  part: SpooledPart;
  file: FileHandle;
  pending: Buffer[];
  pendingBytes: number;
}

/** Cuts the compressed stream into files of exactly `partSize` bytes (the last one smaller, never empty). */
class PartSpooler {
  readonly #dir: string;
  readonly #partSize: number;
  readonly #uploader: PartUploader;
  #current: OpenPart | null = null;
  #count = 0;

  constructor(dir: string, partSize: number, uploader: PartUploader) {
    this.#dir = dir;
    this.#partSize = partSize;
    this.#uploader = uploader;
  }

  async write(chunk: Buffer): Promise<void> {
    let offset = 0;
    while (offset < chunk.length) {
      this.#current ??= await this.#open();
      const current = this.#current;
      const take = Math.min(chunk.length - offset, this.#partSize - current.part.size);
      current.pending.push(chunk.subarray(offset, offset + take));
      current.pendingBytes += take;
      current.part.size += take;
      offset += take;
      if (current.part.size === this.#partSize) await this.#seal();
      else if (current.pendingBytes >= SPOOL_WRITE_BYTES) await this.#flush(current);
    }
  }

  /** Seals the last part (gzip output is never empty, so there always is one). */
  async end(): Promise<void> {
    if (this.#current !== null) await this.#seal();
  }

  /** Closes the part a failure left open, if any (its file goes with the spool directory). */
  async discard(): Promise<void> {
    const current = this.#current;
    this.#current = null;
    await current?.file.close();
  }

  async #open(): Promise<OpenPart> {
    const partNumber = ++this.#count;
    if (partNumber > SNAPSHOT_MAX_PARTS) {
      throw new Error(`the archive needs more than ${SNAPSHOT_MAX_PARTS} parts of ${formatBytes(this.#partSize)}; ask for larger parts`);
    }
    const path = join(this.#dir, `part-${partNumber}`);
    return { part: { partNumber, path, size: 0 }, file: await open(path, "wx", 0o600), pending: [], pendingBytes: 0 };
  }

  async #flush(current: OpenPart): Promise<void> {
    let pending = current.pending;
    current.pending = [];
    current.pendingBytes = 0;
    while (pending.length > 0) {
      let { bytesWritten } = await current.file.writev(pending);
      // A short write: drop what was written and write the rest again.
      while (pending.length > 0 && bytesWritten >= pending[0]!.length) bytesWritten -= pending.shift()!.length;
      if (bytesWritten > 0) pending = [pending[0]!.subarray(bytesWritten), ...pending.slice(1)];
    }
  }

  async #seal(): Promise<void> {
    const current = this.#current!;
    this.#current = null;
    await this.#flush(current);
    await current.file.close();
    await this.#uploader.enqueue(current.part);
  }
}

/**
 * Uploads up to {@link UPLOADS_AT_ONCE} parts at once while the next one is
 * being spooled: `enqueue` waits for a free upload, so at most one spool file
 * more than that exists. A part that still fails after its retries aborts
 * `failed`, which stops the pipeline feeding it.
 */
class PartUploader {
  readonly #endpoint: URL;
  readonly #credentials: NodeCredentials;
  readonly #log: JobLog;
  readonly #signal: AbortSignal;
  readonly #failure = new AbortController();
  /** Aborts an upload in flight when the snapshot failed for another reason. */
  readonly #stop = new AbortController();
  readonly #parts: SnapshotPart[] = [];
  #uploaded = 0;
  readonly #inFlight = new Set<Promise<void>>();
  /** Why the upload failed, once it did. */
  error: string | null = null;

  constructor(endpoint: string, credentials: NodeCredentials, log: JobLog, signal: AbortSignal) {
    this.#endpoint = new URL(endpoint);
    this.#credentials = credentials;
    this.#log = log;
    this.#signal = AbortSignal.any([signal, this.#stop.signal]);
  }

  /** Aborted when a part could not be uploaded. */
  get failed(): AbortSignal {
    return this.#failure.signal;
  }

  async enqueue(part: SpooledPart): Promise<void> {
    while (this.#inFlight.size >= UPLOADS_AT_ONCE) await Promise.race(this.#inFlight);
    if (this.error !== null) throw new Error(this.error);
    // Never rejects: a failure is recorded and aborts `failed`, so no rejection goes unhandled meanwhile.
    const upload: Promise<void> = this.#upload(part)
      .catch((error: unknown) => {
        this.error ??= messageOf(error);
        this.#failure.abort();
      })
      .finally(() => this.#inFlight.delete(upload));
    this.#inFlight.add(upload);
  }

  /** Abandons the upload in flight, if any. */
  stop(): void {
    this.#stop.abort();
  }

  /** Resolves once no upload is in flight. */
  async settled(): Promise<void> {
    await Promise.all(this.#inFlight);
  }

  /** Waits for the last uploads; the parts in order, or throws if one failed. */
  async finish(): Promise<SnapshotPart[]> {
    await this.settled();
    if (this.error !== null) throw new Error(this.error);
    return this.#parts.sort((a, b) => a.partNumber - b.partNumber);
  }

  async #upload(part: SpooledPart): Promise<void> {
    let delay = FIRST_RETRY_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        const url = await this.#partUrl(part.partNumber);
        const etag = await putFile(url, part.path, part.size, this.#signal);
        this.#parts.push({ partNumber: part.partNumber, etag });
        this.#uploaded += part.size;
        this.#log.note(`uploaded part ${part.partNumber} (${formatBytes(part.size)}; ${formatBytes(this.#uploaded)} so far)`);
        await rm(part.path, { force: true });
        return;
      } catch (error) {
        if (this.#signal.aborted) throw error;
        if (attempt >= PART_ATTEMPTS) {
          throw new Error(`part ${part.partNumber} upload failed after ${PART_ATTEMPTS} attempts: ${messageOf(error)}`);
        }
        this.#log.note(`part ${part.partNumber} upload attempt ${attempt} failed (${messageOf(error)}); retrying in ${delay / 1000} s`);
        await sleep(delay, undefined, { signal: this.#signal });
        delay = Math.min(delay * 2, MAX_RETRY_MS);
      }
    }
  }

  /** Asks the Worker for the part's presigned URL (a fresh one per attempt: the last may have expired). */
  async #partUrl(partNumber: number): Promise<URL> {
    const body = JSON.stringify({ partNumber });
    const path = this.#endpoint.pathname + this.#endpoint.search;
    const headers = await signRequest({ secret: this.#credentials.key, node: this.#credentials.node, method: "POST", path, body });
    const response = await fetch(this.#endpoint, {
      method: "POST",
      headers: { ...headers, "Content-Type": "application/json" },
      body,
      signal: AbortSignal.any([this.#signal, AbortSignal.timeout(REQUEST_IDLE_MS)]),
    });
    if (!response.ok) {
      await response.body?.cancel();
      throw new Error(`part URL request answered HTTP ${response.status}`);
    }
    const parsed = PartUrlResponse.safeParse(await response.json().catch(() => null));
    if (!parsed.success) throw new Error('part URL response is not {"url": "<http(s) URL>"}');
    return new URL(parsed.data.url);
  }
}

/** PUTs a file with its exact Content-Length (no chunked encoding, no auth: the URL is presigned); answers the ETag. */
function putFile(url: URL, path: string, size: number, signal: AbortSignal): Promise<string> {
  return new Promise((resolve, reject) => {
    const send = url.protocol === "https:" ? httpsRequest : httpRequest;
    const request = send(url, { method: "PUT", headers: { "Content-Length": String(size) }, signal }, (response) => {
      let detail = "";
      response.setEncoding("utf8");
      response.on("data", (text: string) => {
        if (detail.length < 300) detail += text;
      });
      response.on("error", reject);
      response.on("end", () => {
        const status = response.statusCode ?? 0;
        const etag = response.headers.etag;
        if (status < 200 || status > 299) reject(new Error(`PUT answered HTTP ${status} ${detail.trim().slice(0, 300)}`.trim()));
        else if (!etag) reject(new Error(`PUT answered HTTP ${status} without an ETag header`));
        else resolve(etag);
      });
    });
    request.setTimeout(REQUEST_IDLE_MS, () => request.destroy(new Error(`no progress for ${REQUEST_IDLE_MS / 1000} s`)));
    request.on("error", reject);
    const file = createReadStream(path, { highWaterMark: PUT_READ_BYTES });
    file.on("error", (error) => request.destroy(error));
    file.pipe(request);
  });
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
