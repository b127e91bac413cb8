/**
 * Releases kept on this node: each one a verified copy of the release's
 * `.tar.gz` at `releases/<sha256>-<n>.tar.gz`, fetched once from its presigned URL
 * and shared by every process of that release, so that restarts never need the
 * URL again (it expires after an hour). A copy is deleted when its last process
 * lets go of it; at startup none is in use (processes do not survive a builder
 * restart), so the folder starts empty.
 *
 * Only the builder reads these files (it unpacks them itself, with the hardened
 * extractor, into each process's own working tree); tenants never see them.
 */
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { Readable, Transform, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeWebReadableStream } from "node:stream/web";
import { setTimeout as sleep } from "node:timers/promises";
import { gunzipFile } from "../tar/extract.js";
import { formatBytes } from "../units.js";

/** A fetch is tried this many times in all when the failure may pass (network errors, 429, 5xx). */
const DOWNLOAD_ATTEMPTS = 5;
const FIRST_RETRY_MS = 500;

/** What identifies a release (ProcessSpec's `release`). */
export interface ReleaseRef {
  url: string;
  sha256: string;
  sizeBytes: number;
}

/** A verified release on this node, held until `release()`. */
export interface ReleaseHandle {
  /** The `.tar.gz`, size and SHA-256 verified. */
  path: string;
  /** Bytes of the uncompressed tar stream: the bound its extraction is held to. */
  expandedBytes: number;
  /** Lets go of the copy (deleted once nobody holds it); idempotent. */
  release(): void;
}

/** A release that cannot be had: `permanent` when trying again with the same URL cannot help. */
export class ReleaseUnavailable extends Error {
  readonly permanent: boolean;

  constructor(message: string, permanent: boolean) {
    super(message);
    this.permanent = permanent;
  }
}

interface Entry {
  holders: number;
  ready: Promise<{ path: string; expandedBytes: number }>;
  /** Stops the download once nobody waits for it any more. */
  abort: AbortController;
}

export class ReleaseStore {
  readonly #dir: string;
  readonly #entries = new Map<string, Entry>();
  /** Names each download's files apart, so a copy being deleted never collides with a new one of the same release. */
  #downloads = 0;

  private constructor(dir: string) {
    this.#dir = dir;
  }

  /** Opens the store, deleting what an earlier builder left (no process survives a restart). */
  static async open(dir: string): Promise<ReleaseStore> {
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    return new ReleaseStore(dir);
  }

  /**
   * The verified release, downloaded unless this node holds it already;
   * `note` reports progress to the process's log. Throws ReleaseUnavailable.
   */
  async acquire(ref: ReleaseRef, signal: AbortSignal, note: (text: string) => void): Promise<ReleaseHandle> {
    let entry = this.#entries.get(ref.sha256);
    if (!entry) {
      const abort = new AbortController();
      const created: Entry = { holders: 0, abort, ready: this.#fetch(ref, abort.signal, note) };
      entry = created;
      this.#entries.set(ref.sha256, created);
      // A failed download is forgotten, so the next process of the release tries again.
      created.ready.catch(() => {
        if (this.#entries.get(ref.sha256) === created) this.#entries.delete(ref.sha256);
      });
    } else {
      note(`release ${ref.sha256.slice(0, 12)} is already on this node`);
    }
    const held = entry;
    held.holders++;
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      if (--held.holders > 0) return;
      held.abort.abort();
      if (this.#entries.get(ref.sha256) === held) this.#entries.delete(ref.sha256);
      void held.ready.then(
        ({ path }) => rm(path, { force: true }),
        () => undefined,
      );
    };
    try {
      const ready = await abortable(held.ready, signal);
      return { ...ready, release };
    } catch (error) {
      release();
      throw error;
    }
  }

  async #fetch(ref: ReleaseRef, signal: AbortSignal, note: (text: string) => void): Promise<{ path: string; expandedBytes: number }> {
    const path = join(this.#dir, `${ref.sha256}-${++this.#downloads}.tar.gz`);
    const partial = `${path}.part`;
    note(`downloading release ${ref.sha256.slice(0, 12)} (${formatBytes(ref.sizeBytes)})`);
    let delay = FIRST_RETRY_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        await download(ref, partial, signal);
        break;
      } catch (error) {
        await rm(partial, { force: true });
        const unavailable =
          error instanceof ReleaseUnavailable ? error : new ReleaseUnavailable(`release download failed: ${messageOf(error)}`, false);
        if (signal.aborted || unavailable.permanent || attempt >= DOWNLOAD_ATTEMPTS) throw unavailable;
        note(`${unavailable.message}; trying again in ${delay / 1000} s`);
        await sleep(delay, undefined, { signal }).catch(() => undefined);
        delay *= 2;
      }
    }
    await rename(partial, path);
    try {
      const expandedBytes = await measureExpanded(path);
      return { path, expandedBytes };
    } catch (error) {
      await rm(path, { force: true });
      throw new ReleaseUnavailable(`release ${ref.sha256.slice(0, 12)} is not a valid .tar.gz: ${messageOf(error)}`, true);
    }
  }
}

/** Fetches the archive to `path`, counting and hashing; throws ReleaseUnavailable (permanent when retrying cannot help). */
async function download(ref: ReleaseRef, path: string, signal: AbortSignal): Promise<void> {
  const response = await fetch(ref.url, { signal });
  if (!response.ok || !response.body) {
    await response.body?.cancel();
    const transient = response.status === 429 || response.status >= 500;
    const hint = response.status === 403 ? " (an expired or invalid presigned URL)" : "";
    throw new ReleaseUnavailable(`release download failed: HTTP ${response.status}${hint}`, !transient);
  }
  const hash = createHash("sha256");
  let received = 0;
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      received += chunk.length;
      if (received > ref.sizeBytes) {
        done(new ReleaseUnavailable(`release is larger than its announced ${formatBytes(ref.sizeBytes)}`, true));
        return;
      }
      hash.update(chunk);
      done(null, chunk);
    },
  });
  await pipeline(Readable.fromWeb(response.body as NodeWebReadableStream<Uint8Array>), counted, createWriteStream(path, { mode: 0o600 }), {
    signal,
  });
  if (received !== ref.sizeBytes) {
    throw new ReleaseUnavailable(`release is ${formatBytes(received)}, not the announced ${formatBytes(ref.sizeBytes)}`, true);
  }
  const sha256 = hash.digest("hex");
  if (sha256 !== ref.sha256) throw new ReleaseUnavailable(`release SHA-256 is ${sha256}, not the announced ${ref.sha256}`, true);
}

/** Bytes of the archive's uncompressed tar stream (one gunzip pass; it bounds the extraction). */
async function measureExpanded(path: string): Promise<number> {
  let bytes = 0;
  await pipeline(
    gunzipFile(path),
    new Writable({
      write(chunk: Buffer, _encoding, done) {
        bytes += chunk.length;
        done();
      },
    }),
  );
  return bytes;
}

function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(new ReleaseUnavailable("interrupted", false));
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(new ReleaseUnavailable("interrupted", false));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

function messageOf(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    return cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
  }
  return String(error);
}
