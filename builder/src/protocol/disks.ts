/**
 * Disks: a tenant's disk on a node (quota, inodes, generation), and the
 * snapshots and restores that move its files to and from storage.
 */
import { z } from "zod";
import { fairShare, key } from "./jobs.js";
import { DISK_ID_PATTERN, diskGeneration, httpUrl, sha256Hex, tenant } from "./shared.js";

/** Body of `PUT /v1/disks/:id`: creates the disk for a tenant or changes its quota. */
export const DiskSpec = z.object({ sizeBytes: z.int().positive(), tenant, generation: diskGeneration });
export type DiskSpec = z.infer<typeof DiskSpec>;

/**
 * What the disk routes answer. `usedBytes` counts allocated blocks, as `df`
 * does (a 10-byte file uses 4096, a sparse file only its data), and
 * `inodeLimit`/`usedInodes` the files, directories and links the disk may
 * hold (absent in answers of builders that predate them).
 */
export const DiskInfo = z.object({
  id: z.string(),
  sizeBytes: z.int().positive(),
  usedBytes: z.int().nonnegative(),
  inodeLimit: z.int().positive().optional(),
  usedInodes: z.int().nonnegative().optional(),
});
export type DiskInfo = z.infer<typeof DiskInfo>;

/** Quota bytes per inode a disk gets: one file per 4 KiB, like mkfs.ext4's "small" usage type. */
export const DISK_BYTES_PER_INODE = 4096;

/**
 * The files, directories and symlinks a disk of `sizeBytes` may hold: one per
 * {@link DISK_BYTES_PER_INODE} of quota, never more than a backup may hold
 * ({@link BACKUP_MAX_ENTRIES}, less the archive's root member), so whatever
 * fits on a disk fits in its backup. (Hard links are names, not inodes: a
 * snapshot still counts them against the entry limit.) A builder with
 * filesystem images may round the number up to fill its inode tables; the
 * exact number is the disk's `inodeLimit`.
 */
export function diskInodeLimit(sizeBytes: number): number {
  return Math.max(1, Math.min(Math.ceil(sizeBytes / DISK_BYTES_PER_INODE), BACKUP_MAX_ENTRIES - 1));
}

// ---------------------------------------------------------------------------
// Disk snapshots and restores
// ---------------------------------------------------------------------------
//
// Both are jobs like runs (same ids, status, logs, cancel and callback). A
// snapshot streams a gzip-compressed tar of the disk's data directory (paths
// relative to it, `./a/b`; ustar headers, pax extended headers for names or
// link targets over 100 bytes or non-ASCII) to object storage through
// presigned part URLs the Worker hands out one at a time:
//
//     builder → Worker   POST <partUrlEndpoint>  {"partNumber": N}   (signed)
//     Worker  → builder  200 {"url": "<presigned PUT URL>"}
//     builder → storage  PUT <url>  (Content-Length, no other auth)  → ETag
//
// A restore downloads such an archive from a presigned GET URL, checks it and
// swaps it in for the disk's data. `expandedBytes` is the size of the
// uncompressed tar stream (what `gzip -dc | wc -c` prints) and `entries` the
// number of archive members (`tar tzf | wc -l`), for both, so the numbers of a
// snapshot can serve as the limits of its restore.

// One set of limits for both directions: a snapshot that would exceed one
// fails (the backup is never `ready`), and a restore refuses an archive past
// one, so every ready backup restores onto its disk.

/** Most members (`tar tzf` lines: the root `./`, files, directories, links, hard links) of a backup. */
export const BACKUP_MAX_ENTRIES = 1_000_000;
/**
 * Most bytes of a backup's tar stream that are not file data: headers, pax
 * records, sparse maps, padding and the end marker (4 KiB per entry at the
 * entry limit; an ordinary member takes 0.5 to 2 KiB).
 */
export const BACKUP_MAX_OVERHEAD_BYTES = 4 * 1024 * BACKUP_MAX_ENTRIES;
/** Most data regions one sparse file may have in a backup (its map is held in memory on both sides). */
export const BACKUP_MAX_SPARSE_REGIONS = 1_048_576;
/** Longest member path (bytes, without the leading `./`) of a backup: restore opens it below the staging directory, within PATH_MAX (4096). */
export const BACKUP_MAX_PATH_BYTES = 3_072;

/**
 * The `maxExpandedBytes` under which every backup of a disk of `quotaBytes`
 * restores: its file data fits the quota (a snapshot checks it, counting
 * sparse files by their data) and the rest fits {@link BACKUP_MAX_OVERHEAD_BYTES}.
 */
export function backupMaxExpandedBytes(quotaBytes: number): number {
  return quotaBytes + BACKUP_MAX_OVERHEAD_BYTES;
}

/** Smallest part an S3 multipart upload accepts (except the last one). */
export const SNAPSHOT_MIN_PART_BYTES = 5 * 1024 * 1024;
/** Largest part an S3 multipart upload accepts. */
export const SNAPSHOT_MAX_PART_BYTES = 5 * 1024 * 1024 * 1024;
/** Most parts an S3 multipart upload may have. */
export const SNAPSHOT_MAX_PARTS = 10_000;

/** A snapshot to take: what the Worker posts to `POST /v1/snapshots`. */
export const SnapshotSpec = z.object({
  key: key.optional(),
  diskId: z.string().regex(DISK_ID_PATTERN),
  generation: diskGeneration,
  /** Every part but the last has exactly this size. */
  partSizeBytes: z.int().min(SNAPSHOT_MIN_PART_BYTES).max(SNAPSHOT_MAX_PART_BYTES),
  /** Signed `POST` here with a {@link PartUrlRequest} returns a {@link PartUrlResponse}. */
  partUrlEndpoint: httpUrl,
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  /** The account the snapshot counts against; the disk's owner when absent. */
  tenant: tenant.optional(),
  ...fairShare,
});
export type SnapshotSpec = z.infer<typeof SnapshotSpec>;

/** Body of the builder's signed request for one part's upload URL. */
export const PartUrlRequest = z.object({ partNumber: z.int().min(1).max(SNAPSHOT_MAX_PARTS) });
export type PartUrlRequest = z.infer<typeof PartUrlRequest>;

/** The Worker's answer: a presigned URL the builder PUTs the part to. */
export const PartUrlResponse = z.object({ url: httpUrl });
export type PartUrlResponse = z.infer<typeof PartUrlResponse>;

/** One uploaded part, as CompleteMultipartUpload needs it. */
export const SnapshotPart = z.object({
  partNumber: z.int().min(1).max(SNAPSHOT_MAX_PARTS),
  /** The storage's `ETag` response header, verbatim (quotes included). */
  etag: z.string(),
});
export type SnapshotPart = z.infer<typeof SnapshotPart>;

/** What a succeeded snapshot reports in {@link JobStatus}'s `result`. */
export const SnapshotResult = z.object({
  kind: z.literal("snapshot"),
  /** Bytes of the whole `.tar.gz` (the sum of the parts). */
  sizeBytes: z.int().positive(),
  /** SHA-256 of the whole `.tar.gz`, hex. */
  sha256: sha256Hex,
  /** In part-number order, 1 to N. */
  parts: z.array(SnapshotPart).min(1),
  entries: z.int().nonnegative(),
  expandedBytes: z.int().nonnegative(),
});
export type SnapshotResult = z.infer<typeof SnapshotResult>;

/** A restore to run: what the Worker posts to `POST /v1/restores`. */
export const RestoreSpec = z.object({
  key: key.optional(),
  diskId: z.string().regex(DISK_ID_PATTERN),
  generation: diskGeneration,
  /** Presigned GET URL of the `.tar.gz`. */
  archiveUrl: httpUrl,
  /** The download must be exactly this long. */
  expectedSizeBytes: z.int().min(1),
  /** When given, the download's SHA-256 must match. */
  expectedSha256: sha256Hex.optional(),
  /** Most archive members accepted. */
  maxEntries: z.int().min(1),
  /** Most bytes the uncompressed tar stream may have; reading stops as soon as it is exceeded. */
  maxExpandedBytes: z.int().min(1),
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  /** The account the restore counts against; the disk's owner when absent. */
  tenant: tenant.optional(),
  ...fairShare,
});
export type RestoreSpec = z.infer<typeof RestoreSpec>;

/** What a succeeded restore reports in {@link JobStatus}'s `result`. */
export const RestoreResult = z.object({
  kind: z.literal("restore"),
  entries: z.int().nonnegative(),
  expandedBytes: z.int().nonnegative(),
});
export type RestoreResult = z.infer<typeof RestoreResult>;
