/**
 * Fetches a job's source (a `.tar.gz` behind a presigned URL) into the job's
 * folder, readable only by the job's user. It is unpacked inside the job's
 * sandbox (see sandbox/sandbox.ts), never by the builder: whatever the archive holds
 * (absolute names, `..`, links pointing anywhere) can then reach nothing but the
 * sandbox's own working directory.
 */
import { createWriteStream } from "node:fs";
import { chown, rm } from "node:fs/promises";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeWebReadableStream } from "node:stream/web";
import type { JobLog } from "../sandbox/sandbox.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";

/** Largest source archive the builder downloads. */
const MAX_SOURCE_BYTES = 1024 * 1024 * 1024;

/** Inputs of {@link downloadSource}. */
export interface SourceArchiveOptions {
  url: string;
  jobDir: string;
  /** Who may read the archive (the job's user, which unpacks it in the sandbox). */
  user: JobUser;
  log: JobLog;
  /** Aborts the download (cancel or timeout). */
  signal: AbortSignal;
}

/** Downloads the archive to `<jobDir>/source.tar.gz`; expected failures come back as a message. */
export async function downloadSource(options: SourceArchiveOptions): Promise<{ ok: true; path: string } | { ok: false; error: string }> {
  const archive = join(options.jobDir, "source.tar.gz");
  try {
    const response = await fetch(options.url, { signal: options.signal });
    if (!response.ok || !response.body) return { ok: false, error: `source download failed: HTTP ${response.status}` };
    let received = 0;
    const limit = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        received += chunk.length;
        if (received > MAX_SOURCE_BYTES) done(new Error(`archive larger than ${formatBytes(MAX_SOURCE_BYTES)}`));
        else done(null, chunk);
      },
    });
    await pipeline(
      Readable.fromWeb(response.body as NodeWebReadableStream<Uint8Array>),
      limit,
      createWriteStream(archive, { mode: 0o400 }),
      { signal: options.signal },
    );
    await chown(archive, options.user.uid, options.user.gid);
    options.log.note(`downloaded source archive (${formatBytes(received)})`);
    return { ok: true, path: archive };
  } catch (error) {
    await rm(archive, { force: true });
    if (options.signal.aborted) return { ok: false, error: "source download interrupted" };
    return { ok: false, error: `source download failed: ${error instanceof Error ? error.message : String(error)}` };
  }
}
