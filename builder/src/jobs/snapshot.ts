/**
 * The "snapshot" job: a gzip-compressed tar of a disk's data directory,
 * uploaded to object storage in parts through presigned URLs the Worker hands
 * out one at a time (protocol/disks.ts, "Disk snapshots and restores"). Packing,
 * parallel gzip, spooling and the part uploads are tar/multipart-upload.ts,
 * which release builds share.
 */
import { join } from "node:path";
import type { DiskStore } from "../disks/store.js";
import type { JobContext, JobOutcome } from "./manager.js";
import type { SnapshotSpec } from "../protocol/disks.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { formatBytes } from "../units.js";
import { PartUploadFailed, uploadDirectoryArchive } from "../tar/multipart-upload.js";
import { SnapshotLimitExceeded } from "../tar/pack.js";
import { failed, messageOf, succeeded } from "./outcome.js";

/** Inputs of {@link snapshotJob}. */
export interface SnapshotJobInput extends JobContext {
  spec: SnapshotSpec;
  disks: DiskStore;
  /** Signs the part-URL requests to the Worker. */
  credentials: NodeCredentials;
}

/** Packs, compresses and uploads the disk; the result lists the parts for CompleteMultipartUpload. */
export async function snapshotJob(input: SnapshotJobInput): Promise<JobOutcome> {
  const { spec, log, signal } = input;
  const quotaBytes = await input.disks.quotaBytes(spec.diskId);
  if (quotaBytes === null) return failed(log, signal, `disk ${spec.diskId} does not exist`);
  try {
    log.note(`snapshot of disk ${spec.diskId}: packing, gzip, parts of ${formatBytes(spec.partSizeBytes)}`);
    const archive = await uploadDirectoryArchive({
      root: input.disks.dataPath(spec.diskId),
      spoolDir: join(input.jobDir, "work"),
      partUrlEndpoint: spec.partUrlEndpoint,
      partSizeBytes: spec.partSizeBytes,
      credentials: input.credentials,
      log,
      signal,
      // The backup limits a restore of this disk enforces (protocol/disks.ts): past one, the snapshot fails with the reason.
      limits: { quotaBytes },
    });
    log.note(
      `archived ${archive.entries} entries, ${formatBytes(archive.expandedBytes)} uncompressed, ` +
        `${formatBytes(archive.sizeBytes)} compressed in ${archive.parts.length} part(s), sha256 ${archive.sha256}`,
    );
    return succeeded(log, { kind: "snapshot", ...archive });
  } catch (error) {
    if (error instanceof PartUploadFailed) return failed(log, signal, error.message);
    const limit = error instanceof SnapshotLimitExceeded ? error : (error as { cause?: unknown }).cause;
    if (limit instanceof SnapshotLimitExceeded) return failed(log, signal, `snapshot refused: ${messageOf(limit)}`);
    return failed(log, signal, `snapshot failed: ${messageOf(error)}`);
  }
}
