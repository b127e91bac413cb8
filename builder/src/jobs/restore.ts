/**
 * The "restore" job: replaces a disk's data with a `.tar.gz` behind a
 * presigned URL, all or nothing.
 *
 * One pass, no spool file: the download is counted and hashed as it streams
 * through gunzip into the extractor, which writes only into a fresh staging
 * directory beside the disk (tar/extract.ts). Size and SHA-256 are compared
 * once the download ends, before anything is swapped in, so a bad archive
 * costs only the staging directory, which is removed. Spooling first would
 * need the archive's size again in free space and a second read, and would
 * protect nothing more: until the swap, the disk's data is never touched.
 * The swap itself is three renames under the disk's lock (disks/store.ts), which a
 * crash leaves recoverable at the next start.
 *
 * The download reads into 1 MiB pieces straight from the socket (download.ts):
 * gunzip takes them as they come, and a slow extraction stops the socket's
 * reads rather than filling memory (a server that closes its idle connection
 * meanwhile loses nothing: the unread bytes wait in the socket).
 */
import { createHash } from "node:crypto";
import { statfs } from "node:fs/promises";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGunzip } from "node:zlib";
import type { DiskStore } from "../disks/store.js";
import { measureDisk } from "../sandbox/usage.js";
import type { JobContext, JobOutcome } from "./manager.js";
import type { RestoreSpec } from "../protocol/disks.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";
import { ArchiveRejected, type ExtractSummary, GUNZIP_CHUNK_BYTES, GUNZIP_INPUT_BYTES, TarFormatError, extractTar } from "../tar/extract.js";
import { DownloadError, download } from "./download.js";
import { failed, messageOf, succeeded } from "./outcome.js";

/** Progress lines: one per tenth of the download, but no closer than this. */
const PROGRESS_MIN_BYTES = 16 * 1024 * 1024;

/** The log line between extracting and swapping (benches time the two from it). */
export const RESTORE_EXTRACTED_NOTE = "archive downloaded, checked and extracted";

/** The archive could not be fetched (as opposed to being refused). */
class DownloadFailed extends Error {}

/** Inputs of {@link restoreJob}. */
export interface RestoreJobInput extends JobContext {
  spec: RestoreSpec;
  disks: DiskStore;
  /** Owner of the restored files (the job user), as the disk's own files are. */
  user: JobUser | null;
}

/** Downloads, checks and extracts the archive, then swaps it in for the disk's data. */
export async function restoreJob(input: RestoreJobInput): Promise<JobOutcome> {
  const { spec, log, signal, disks } = input;
  const quotaBytes = await disks.quotaBytes(spec.diskId);
  const staging = quotaBytes === null ? null : await disks.createStaging(spec.diskId, input.id);
  if (quotaBytes === null || staging === null) return failed(log, signal, `disk ${spec.diskId} does not exist`);
  try {
    log.note(`restore of disk ${spec.diskId}: downloading ${formatBytes(spec.expectedSizeBytes)}, extracting into a staging directory`);
    const summary = await downloadAndExtract(input, staging, quotaBytes);
    log.note(`${RESTORE_EXTRACTED_NOTE}; swapping it in for the disk's data`);
    const discardOld = await disks.replaceData(spec.diskId, staging, input.id);
    // The swap has committed; deleting the old data need not delay the answer (a restart finishes it).
    void discardOld().catch((error: unknown) => console.error(`builder: could not delete disk ${spec.diskId}'s old data: ${messageOf(error)}`));
    log.note(
      `restored ${summary.entries} entries, ${formatBytes(summary.restoredBytes)} allocated ` +
        `(${formatBytes(summary.expandedBytes)} uncompressed archive)`,
    );
    return succeeded(log, { kind: "restore", entries: summary.entries, expandedBytes: summary.expandedBytes });
  } catch (error) {
    return failed(log, signal, describe(error));
  } finally {
    await disks.discardStaging(spec.diskId, input.id);
  }
}

async function downloadAndExtract(input: RestoreJobInput, staging: string, quotaBytes: number): Promise<ExtractSummary> {
  const { spec, signal } = input;
  // The staging filesystem is made like the disk's: its blocks and inodes are what the archive may take.
  const room = { blockSize: (await statfs(staging)).bsize, inodeLimit: (await measureDisk(staging, quotaBytes)).inodeLimit };
  const expected = spec.expectedSizeBytes;
  // A failure to connect or a bad answer is a DownloadError (describe() says so); an abort is the job's cancel.
  const { status, contentLength, body } = await download(new URL(spec.archiveUrl), { signal, pieceBytes: GUNZIP_INPUT_BYTES });
  if (status < 200 || status > 299) {
    body.destroy();
    throw new DownloadFailed(`archive download failed: HTTP ${status}`);
  }
  if (contentLength !== null && contentLength !== expected) {
    body.destroy();
    throw new ArchiveRejected(`the download is ${contentLength} bytes, expected ${expected} (expectedSizeBytes)`);
  }

  const hash = createHash("sha256");
  let received = 0;
  let complete = false;
  const progressStep = Math.max(PROGRESS_MIN_BYTES, Math.ceil(expected / 10));
  let nextProgress = progressStep;
  const meter = new Transform({
    transform(piece: Buffer, _encoding, done) {
      received += piece.length;
      if (received > expected) return done(new ArchiveRejected(`the download is larger than the expected ${expected} bytes (expectedSizeBytes)`));
      hash.update(piece);
      if (received >= nextProgress && received < expected) {
        input.log.note(`downloaded ${formatBytes(received)} of ${formatBytes(expected)}`);
        nextProgress += progressStep;
      }
      done(null, piece);
    },
    flush(done) {
      complete = true;
      done();
    },
  });
  const sizeMismatch = () => new ArchiveRejected(`the download is ${received} bytes, expected ${expected} (expectedSizeBytes)`);
  let summary: ExtractSummary | undefined;
  // Leaving the gunzip iterator early destroys it with an AbortError, which the pipeline may report instead of the cause.
  let extractError: unknown;
  try {
    await pipeline(
      body,
      meter,
      createGunzip({ chunkSize: GUNZIP_CHUNK_BYTES }),
      async (source: AsyncIterable<Buffer>) => {
        try {
          summary = await extractTar({
            source,
            root: staging,
            maxEntries: spec.maxEntries,
            maxExpandedBytes: spec.maxExpandedBytes,
            quotaBytes,
            blockSize: room.blockSize,
            inodeLimit: room.inodeLimit,
            owner: input.user,
          });
        } catch (error) {
          extractError = error;
          throw error;
        }
      },
      { signal },
    );
  } catch (error) {
    // A short download makes gunzip fail too; the size says more.
    if (complete && received !== expected) throw sizeMismatch();
    throw extractError ?? error;
  }
  if (received !== expected) throw sizeMismatch();
  const sha256 = hash.digest("hex");
  if (spec.expectedSha256 !== undefined && sha256 !== spec.expectedSha256) {
    throw new ArchiveRejected(`the download's SHA-256 is ${sha256}, expected ${spec.expectedSha256} (expectedSha256)`);
  }
  return summary!;
}

/** The job's error message for anything that ended the restore. */
function describe(error: unknown): string {
  if (error instanceof DownloadFailed) return error.message;
  if (error instanceof DownloadError) return `archive download failed: ${error.message}`;
  if (error instanceof ArchiveRejected) return `archive rejected: ${error.message}`;
  if (error instanceof TarFormatError) return `archive rejected: not a valid tar stream: ${error.message}`;
  const code = (error as NodeJS.ErrnoException).code ?? "";
  if (code.startsWith("Z_")) return `archive rejected: not a valid gzip stream (${messageOf(error)})`;
  return `restore failed: ${messageOf(error)}`;
}
