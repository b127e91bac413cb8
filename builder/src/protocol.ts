/**
 * The contract between the Worker (control plane) and the builder (data plane).
 *
 * The Cloudflare Worker imports this very file to sign its requests to the
 * builder and to verify the builder's completion callbacks, so it may use only
 * what both runtimes share: Web Crypto (`crypto.subtle`), `TextEncoder` and zod.
 * No `node:` imports here.
 *
 * Request signing
 * ---------------
 * Every request (both directions) carries three headers:
 *
 * - `X-Svc-Timestamp`: unix time in whole seconds;
 * - `X-Svc-Nonce`: 16 random bytes as 32 lowercase hex characters;
 * - `X-Svc-Signature`: lowercase hex HMAC-SHA256, keyed with the shared secret, of
 *   `${METHOD}\n${pathWithQuery}\n${timestamp}\n${nonce}\n${hex(sha256(body))}`
 *   where METHOD is upper case, pathWithQuery is the URL's pathname plus search
 *   exactly as sent (`/v1/jobs/job_x/logs?offset=0`), and body is the raw request
 *   body (empty string when there is none).
 *
 * Nodes (DESIGN §10) sign with a key of their own, `nodeKey(BUILDER_SECRET, id)`,
 * which the Worker derives and the node receives when it joins; a node's
 * requests to the Worker name it in `X-Svc-Node`. A request signed for one
 * node is refused by every other. A builder started with `BUILDER_SECRET`
 * itself (no join) signs and verifies with that secret.
 *
 * A receiver rejects a request whose timestamp is more than
 * {@link SIGNATURE_WINDOW_SECONDS} away from its clock, and a nonce it has
 * already accepted inside that window ({@link NonceCache}).
 *
 * Job log format
 * --------------
 * `GET /v1/jobs/:id/logs` returns UTF-8 text, one record per line:
 *
 *     2026-11-21T10:00:00.000Z out hello world
 *     2026-11-21T10:00:00.004Z err sh: 1: nosuchcmd: not found
 *     2026-11-21T10:00:00.005Z svc job failed: exit code 127 (command not found)
 *
 * i.e. `<ISO-8601 UTC time with ms> <stream> <text>` where stream is `out`
 * (the command's stdout), `err` (its stderr) or `svc` (a message from the
 * builder itself: source download, limits, the final outcome). stdout and stderr
 * are interleaved in the order lines complete; a last line without a newline is
 * flushed when the job ends; a line longer than {@link LOG_MAX_LINE_BYTES} is
 * split. The log keeps at most {@link LOG_LIMIT_BYTES}; beyond that the command's
 * output is dropped and one `svc` line {@link LOG_TRUNCATION_MARKER} marks the cut
 * (the builder's own final lines still follow it).
 */
import { z } from "zod";

/** Header carrying the request's unix time in seconds. */
export const HEADER_TIMESTAMP = "X-Svc-Timestamp";
/** Header carrying the request's single-use random nonce. */
export const HEADER_NONCE = "X-Svc-Nonce";
/** Header carrying the hex HMAC-SHA256 signature. */
export const HEADER_SIGNATURE = "X-Svc-Signature";
/** Header naming the node that signed a request to the Worker (its key is derived from the node's id, {@link nodeKey}). */
export const HEADER_NODE = "X-Svc-Node";
/** How far a request's timestamp may be from the receiver's clock, either way. */
export const SIGNATURE_WINDOW_SECONDS = 300;

/** Most bytes a job log keeps (DESIGN §7: 10 MiB per run or build). */
export const LOG_LIMIT_BYTES = 10 * 1024 * 1024;
/** Text of the `svc` line written where a log was cut at {@link LOG_LIMIT_BYTES}. */
export const LOG_TRUNCATION_MARKER = "[log truncated at 10 MiB]";
/** Longest command output line kept as one record; longer ones are split. */
export const LOG_MAX_LINE_BYTES = 64 * 1024;

/** Disk ids become directory names, so they are restricted to a safe alphabet. */
export const DISK_ID_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
/** Tenant (account) ids: each tenant's jobs run as its own user and own its disks. */
export const TENANT_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
/** Names a POSIX shell accepts as environment variables. */
export const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;

const encoder = new TextEncoder();

function toHex(bytes: ArrayBuffer): string {
  let out = "";
  for (const byte of new Uint8Array(bytes)) out += byte.toString(16).padStart(2, "0");
  return out;
}

function fromHex(hex: string): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = Number.parseInt(hex.slice(i * 2, i * 2 + 2), 16);
  return out;
}

function toBytes(body: string | Uint8Array | undefined): Uint8Array {
  if (body === undefined) return new Uint8Array(0);
  if (typeof body === "string") return encoder.encode(body);
  // Copy so that views over shared or pooled buffers (Node's Buffer) digest correctly.
  const copy = new Uint8Array(body.byteLength);
  copy.set(body);
  return copy;
}

type HmacKey = Awaited<ReturnType<typeof crypto.subtle.importKey>>;

/** Imported keys by secret: importing costs more than the MAC itself. A Worker talks to a handful of nodes, each with its own key. */
const importedKeys = new Map<string, Promise<HmacKey>>();
const MAX_IMPORTED_KEYS = 256;

function hmacKey(secret: string): Promise<HmacKey> {
  let key = importedKeys.get(secret);
  if (!key) {
    key = crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);
    if (importedKeys.size >= MAX_IMPORTED_KEYS) importedKeys.delete(importedKeys.keys().next().value as string);
    importedKeys.set(secret, key);
  }
  return key;
}

async function canonicalString(
  method: string,
  path: string,
  timestamp: string,
  nonce: string,
  body: string | Uint8Array | undefined,
): Promise<Uint8Array> {
  const bodyDigest = toHex(await crypto.subtle.digest("SHA-256", toBytes(body)));
  return encoder.encode(`${method.toUpperCase()}\n${path}\n${timestamp}\n${nonce}\n${bodyDigest}`);
}

/** What {@link signRequest} needs; `timestamp` and `nonce` exist for tests. */
export interface SignRequestInput {
  secret: string;
  /** The signing node's id, sent as {@link HEADER_NODE} so the receiver knows whose key to check (absent: the shared BUILDER_SECRET). */
  node?: string | null;
  method: string;
  /** Pathname plus search, exactly as it will be sent. */
  path: string;
  body?: string | Uint8Array;
  /** Unix seconds; defaults to now. */
  timestamp?: number;
  /** Defaults to 16 fresh random bytes in hex. */
  nonce?: string;
}

/**
 * Signs one request so the other side can prove it came from a holder of the
 * shared secret, unaltered, recently, and only once. Returns the headers to add.
 */
export async function signRequest(input: SignRequestInput): Promise<Record<string, string>> {
  const timestamp = String(input.timestamp ?? Math.floor(Date.now() / 1000));
  const nonce = input.nonce ?? toHex(crypto.getRandomValues(new Uint8Array(16)).buffer);
  const data = await canonicalString(input.method, input.path, timestamp, nonce, input.body);
  const signature = toHex(await crypto.subtle.sign("HMAC", await hmacKey(input.secret), data));
  const headers: Record<string, string> = { [HEADER_TIMESTAMP]: timestamp, [HEADER_NONCE]: nonce, [HEADER_SIGNATURE]: signature };
  if (input.node) headers[HEADER_NODE] = input.node;
  return headers;
}

/** What {@link verifyRequest} needs; `headers` matches both `Headers` and small adapters. */
export interface VerifyRequestInput {
  secret: string;
  method: string;
  path: string;
  body?: string | Uint8Array;
  headers: { get(name: string): string | null };
  /** Unix seconds; defaults to now. */
  now?: number;
}

/** Outcome of {@link verifyRequest}: expected failures are values, not exceptions. */
export type VerifyResult = { ok: true; nonce: string; timestamp: number } | { ok: false; reason: string };

const TIMESTAMP_FORMAT = /^\d{1,12}$/;
const NONCE_FORMAT = /^[0-9a-f]{32}$/;
const SIGNATURE_FORMAT = /^[0-9a-f]{64}$/;

/**
 * Checks a request's signature (in constant time, through `crypto.subtle.verify`)
 * and its freshness. It cannot detect replays by itself: pass the returned nonce
 * to a {@link NonceCache} that lives as long as the receiver.
 */
export async function verifyRequest(input: VerifyRequestInput): Promise<VerifyResult> {
  const timestamp = input.headers.get(HEADER_TIMESTAMP);
  const nonce = input.headers.get(HEADER_NONCE);
  const signature = input.headers.get(HEADER_SIGNATURE);
  if (timestamp === null || nonce === null || signature === null) {
    return { ok: false, reason: `missing ${HEADER_TIMESTAMP}, ${HEADER_NONCE} or ${HEADER_SIGNATURE} header` };
  }
  if (!TIMESTAMP_FORMAT.test(timestamp)) return { ok: false, reason: "malformed timestamp" };
  if (!NONCE_FORMAT.test(nonce)) return { ok: false, reason: "malformed nonce" };
  const hexSignature = signature.toLowerCase();
  if (!SIGNATURE_FORMAT.test(hexSignature)) return { ok: false, reason: "malformed signature" };
  const seconds = Number(timestamp);
  const now = input.now ?? Date.now() / 1000;
  if (Math.abs(now - seconds) > SIGNATURE_WINDOW_SECONDS) {
    return { ok: false, reason: `timestamp outside the ${SIGNATURE_WINDOW_SECONDS} s window` };
  }
  const data = await canonicalString(input.method, input.path, timestamp, nonce, input.body);
  const valid = await crypto.subtle.verify("HMAC", await hmacKey(input.secret), fromHex(hexSignature), data);
  if (!valid) return { ok: false, reason: "signature does not match" };
  return { ok: true, nonce, timestamp: seconds };
}

/**
 * Remembers accepted nonces for as long as their timestamp keeps them inside the
 * signature window, so a captured request cannot be replayed. Memory is bounded:
 * expired nonces are evicted on every use, and past `capacity` the oldest entry
 * goes first (only reachable above `capacity` requests per window).
 */
export class NonceCache {
  readonly #expiries = new Map<string, number>();
  readonly #capacity: number;

  constructor(capacity = 100_000) {
    this.#capacity = capacity;
  }

  /** Records a nonce; false when it was already used (a replay). */
  use(nonce: string, timestamp: number, now: number = Date.now() / 1000): boolean {
    for (const [seen, expiry] of this.#expiries) {
      if (expiry >= now && this.#expiries.size < this.#capacity) break;
      this.#expiries.delete(seen);
    }
    const expiry = this.#expiries.get(nonce);
    if (expiry !== undefined && expiry >= now) return false;
    this.#expiries.set(nonce, timestamp + SIGNATURE_WINDOW_SECONDS);
    return true;
  }

  /** Number of nonces currently remembered. */
  get size(): number {
    return this.#expiries.size;
  }
}

const httpUrl = z.url({ protocol: /^https?$/ });
const noNul = (value: string) => !value.includes("\0");

const tenant = z.string().regex(TENANT_PATTERN, "must be a tenant (account) id");

/**
 * The submission's idempotency key, chosen by the control plane (the run,
 * backup, restore or deployment it belongs to): submitting again with a key the
 * builder knows returns that job instead of starting another, so a retry after a
 * lost reply never runs anything twice. `GET /v1/jobs?key=…` finds it too.
 */
export const JOB_KEY_PATTERN = /^[A-Za-z0-9_.:/-]{1,200}$/;
const key = z.string().regex(JOB_KEY_PATTERN, "must be 1-200 characters of letters, digits and _.:/-");

/**
 * Fair share between tenants (issue 17): every submission counts against its
 * tenant, which runs at most `tenantConcurrency` jobs at once (its plan's
 * limit; the builder's default when absent, and never every slot of the
 * builder). Free slots go to the tenant with the fewest running jobs, so one
 * tenant's backlog never holds up another's next job.
 */
const fairShare = {
  tenantConcurrency: z.int().min(1).max(1024).optional(),
  /** Refuse the submission (429 TENANT_QUEUE_FULL) when the tenant already has this many jobs queued; no bound when absent. */
  tenantMaxQueued: z.int().min(0).max(100_000).optional(),
  /** Also POST the status to `callbackUrl` when a job that was answered `queued` starts (its `running` status). */
  startCallback: z.boolean().optional(),
};

/**
 * Directories of a job's sandbox (the host's system directories it sees
 * read-only, and its own /proc, /dev, /tmp, /work, /home, /run): a disk may not
 * be mounted on or under them.
 */
export const SANDBOX_RESERVED_PATHS = [
  "/usr",
  "/bin",
  "/sbin",
  "/lib",
  "/lib32",
  "/lib64",
  "/libx32",
  "/etc",
  "/proc",
  "/dev",
  "/sys",
  "/tmp",
  "/work",
  "/home",
  "/run",
] as const;

/** Why a disk cannot be mounted at `mountPath` (the sandbox directory it would cover), or null when it can. */
export function mountPathProblem(mountPath: string): string | null {
  const segments = mountPath.split("/").filter(Boolean);
  if (!mountPath.startsWith("/") || segments.length === 0) return "must be an absolute path below /";
  if (segments.includes("..") || segments.includes(".")) return "must not contain . or .. segments";
  const normal = `/${segments.join("/")}`;
  const taken = SANDBOX_RESERVED_PATHS.find((path) => normal === path || normal.startsWith(`${path}/`));
  return taken ? `${taken} belongs to the job's sandbox; choose another path, e.g. /data` : null;
}

/**
 * Fencing: the disk's generation in the control plane's record, bumped each time
 * its copy of record moves to another node. A node holding an older one refuses
 * the request (`DISK_FENCED`) and never uses that copy again; absent from a
 * control plane that predates nodes.
 */
const diskGeneration = z.int().positive().optional();

/** A job to run: what the Worker posts to `POST /v1/jobs`. */
export const JobSpec = z.object({
  key: key.optional(),
  /** The account the job belongs to: it runs as that account's user and may use only its disks. */
  tenant,
  command: z.string().min(1).max(100_000).refine(noNul, "must not contain NUL"),
  /**
   * Exactly the environment the command sees, plus PATH and HOME defaults (which
   * these values override) and the builder's SVC_* variables (which they do not).
   */
  env: z
    .record(z.string().regex(ENV_NAME_PATTERN, "invalid environment variable name"), z.string().refine(noNul, "must not contain NUL"))
    .default({}),
  /** A `.tar.gz` downloaded and extracted into the working directory before the command runs. */
  sourceUrl: httpUrl.optional(),
  disk: z
    .object({
      id: z.string().regex(DISK_ID_PATTERN),
      /** Where the job sees the disk (SVC_DISK_PATH and SVC_DISK_MOUNT_PATH name it); not a directory of the sandbox itself. */
      mountPath: z
        .string()
        .max(4096)
        .refine(noNul, "must not contain NUL")
        .superRefine((path, context) => {
          const problem = mountPathProblem(path);
          if (problem) context.addIssue({ code: "custom", message: problem });
        }),
      sizeBytes: z.int().positive(),
      generation: diskGeneration,
    })
    .optional(),
  timeoutSeconds: z.int().min(1).max(43_200),
  memoryMb: z.int().min(16).max(65_536),
  /** Receives the final {@link JobStatus}, signed, when the job ends. */
  callbackUrl: httpUrl.optional(),
  /** Opaque to the builder; echoed in every status so callbacks can be routed. */
  labels: z.record(z.string(), z.string()).optional(),
  ...fairShare,
});
export type JobSpec = z.infer<typeof JobSpec>;

/** `queued` while the builder, or the job's tenant, is at its concurrency limit. */
export const JobState = z.enum(["queued", "running", "succeeded", "failed", "cancelled"]);
export type JobState = z.infer<typeof JobState>;

/** Why a job did not succeed (null while running and on success). */
export const JobFailureReason = z.enum(["exit_code", "timeout", "OOMKilled", "disk_quota", "cancelled", "error"]);
export type JobFailureReason = z.infer<typeof JobFailureReason>;

/** What `GET /v1/jobs/:id` answers and what the completion callback carries. */
export const JobStatus = z.object({
  id: z.string(),
  /** The submission's idempotency key (null when it had none, and in records written before keys existed). */
  key: z.string().nullable().default(null),
  status: JobState,
  reason: JobFailureReason.nullable(),
  exitCode: z.int().nullable(),
  signal: z.string().nullable(),
  /** Human message, e.g. "memory limit 64 MiB exceeded (peak 71 MiB)". */
  error: z.string().nullable(),
  /** Highest memory use seen (cgroup peak, or the sampled RSS sum of the process tree). */
  peakMemoryBytes: z.int().nonnegative(),
  logBytes: z.int().nonnegative(),
  logTruncated: z.boolean(),
  createdAt: z.iso.datetime(),
  /** Null while queued. */
  startedAt: z.iso.datetime().nullable(),
  /**
   * While queued, why: the tenant runs as many jobs as it may (`tenant_limit`),
   * or every slot of the builder is busy (`builder_full`); `ahead` counts the
   * tenant's own jobs queued before this one. Null otherwise (absent in records
   * written before tenants had limits).
   */
  waiting: z
    .object({
      reason: z.enum(["tenant_limit", "builder_full"]),
      tenantRunning: z.int().nonnegative(),
      tenantLimit: z.int().positive(),
      ahead: z.int().nonnegative(),
    })
    .nullable()
    .optional(),
  finishedAt: z.iso.datetime().nullable(),
  labels: z.record(z.string(), z.string()),
  /**
   * What a snapshot, restore or build job produced, once it succeeded (null
   * before and for other jobs; absent in records written before results
   * existed). Lazy because {@link JobResult} is defined at the end of the file.
   */
  result: z
    .lazy(() => JobResult)
    .nullable()
    .optional(),
});
export type JobStatus = z.infer<typeof JobStatus>;

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

/** What a node signs its requests to the Worker with: its key, and its id once it joined (null: a builder holding BUILDER_SECRET itself). */
export type NodeCredentials = { key: string; node: string | null };

/** Every error code the builder answers with. */
export const BuilderErrorCode = z.enum([
  "UNAUTHORIZED",
  "VALIDATION_ERROR",
  "NOT_FOUND",
  "METHOD_NOT_ALLOWED",
  "JOB_NOT_FOUND",
  "PROCESS_NOT_FOUND",
  "DISK_NOT_FOUND",
  "DISK_BUSY",
  /** 409: the request names a newer generation of the disk than this node holds (its copy is stale, fenced off), or an older one. */
  "DISK_FENCED",
  "TENANT_QUEUE_FULL",
  /** 507: the builder's host cannot hold the disk (or the larger quota, or a process's working tree) asked for. */
  "INSUFFICIENT_STORAGE",
  /** 507: the builder's host cannot hold a process's memory limit beside what it promised already. */
  "INSUFFICIENT_MEMORY",
  "PAYLOAD_TOO_LARGE",
  "INTERNAL",
  "UNAVAILABLE",
]);
export type BuilderErrorCode = z.infer<typeof BuilderErrorCode>;

/** Error envelope shared with the Worker's API (DESIGN §3). */
export const BuilderError = z.object({
  error: z.object({ code: BuilderErrorCode, message: z.string(), details: z.unknown().optional() }),
});
export type BuilderError = z.infer<typeof BuilderError>;

/** Origin of a log line. */
export type LogStream = "out" | "err" | "svc";

const LOG_LINE = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z) (out|err|svc) (.*)$/s;

const APP_LOG_LINE = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z) (out|err|svc) ([A-Za-z0-9_-]+)\/([A-Za-z0-9_]+) (.*)$/s;

/**
 * One line of an app's runtime log (`<time> <stream> <deployment>/<process>
 * <text>`: which release and which process wrote it; `-` for a process started
 * without a deployment), split into its parts; null when it is not one.
 */
export function parseAppLogLine(line: string): { time: string; stream: LogStream; release: string; process: string; text: string } | null {
  const match = APP_LOG_LINE.exec(line);
  if (!match) return null;
  return { time: match[1]!, stream: match[2] as LogStream, release: match[3]!, process: match[4]!, text: match[5]! };
}

/**
 * Splits one log line (without its newline) into its parts, so the Worker can
 * render run logs without re-deriving the format; null when it is not a record.
 */
export function parseLogLine(line: string): { time: string; stream: LogStream; text: string } | null {
  const match = LOG_LINE.exec(line);
  if (!match) return null;
  return { time: match[1]!, stream: match[2] as LogStream, text: match[3]! };
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

const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, "must be 64 lowercase hex characters");

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

// ---------------------------------------------------------------------------
// Static-site builds
// ---------------------------------------------------------------------------
//
// A build is a job like a run (same ids, status, logs, cancel and callback),
// submitted with `POST /v1/builds` (a BuildSpec). It downloads the source,
// decides how to build it (overrides, then svc.json, then framework detection),
// installs with the lockfile's package manager, builds under the memory limit,
// hashes every file of the output folder into a manifest, and uploads the blobs
// the Worker's storage lacks:
//
//     builder → Worker   POST <blobsEndpoint>  {"blobs": [{sha256, size, contentType}, …]}  (signed, ≤ 500 per request)
//     Worker  → builder  200 {"missing": [{"sha256": "…", "url": "<presigned PUT URL>"}, …]}
//     builder → storage  PUT <url>  (the bytes, with the announced Content-Length and Content-Type, and
//                                    x-amz-checksum-sha256: the base64 SHA-256, which the URL signs)
//
// Storage refuses bytes that do not hash to the blob's name. Identical files are announced once. Network errors, 429 and 5xx are retried
// with backoff. A succeeded build reports a BuildResult (with the manifest) in
// JobStatus's `result`; a failed one reports none.

/** Most blobs one blobs-endpoint request names. */
export const BLOB_BATCH_LIMIT = 500;
/** Most files one deployment may hold (Cloudflare Pages' limit); more fails the build. */
export const MAX_MANIFEST_FILES = 20_000;
/**
 * Most bytes the manifest may take as JSON (long paths add up); more fails the
 * build. It bounds a build's completion callback, whose body the Worker accepts
 * up to this plus {@link CALLBACK_OVERHEAD_BYTES}.
 */
export const MAX_MANIFEST_BYTES = 16 * 1024 * 1024;
/** What a completion callback carries besides a manifest: status fields, labels, artifacts. */
export const CALLBACK_OVERHEAD_BYTES = 1024 * 1024;
/**
 * Where the generated Dockerfile expects the generated web-server config: a
 * file of this name beside the Dockerfile, at the root of the project.
 */
export const GENERATED_WEB_SERVER_CONFIG_PATH = "svc-nginx.conf";

/**
 * A folder inside the project in its normal form (`./dist/` → `dist`), or null
 * when the path is absolute, climbs out with `..`, or names the project root
 * (serving that would publish the whole source).
 */
export function projectDir(path: string): string | null {
  if (path.startsWith("/") || path.includes("\\") || path.includes("\0")) return null;
  const segments = path.split("/").filter((segment) => segment !== "" && segment !== ".");
  if (segments.length === 0 || segments.includes("..")) return null;
  return segments.join("/");
}

/** How an output folder names the project root itself (a plain folder's site). */
export const PROJECT_ROOT = ".";

/**
 * An output folder in its normal form: {@link projectDir}, or
 * {@link PROJECT_ROOT} for `.` and `./`. Whether the root may be served depends
 * on the project (detect.ts, `rootOutputProblem`: only a plain folder without
 * package.json or build command), which a schema cannot see, so the build
 * checks it once it has the files.
 */
export function siteDir(path: string): string | null {
  return path === "." || path === "./" ? PROJECT_ROOT : projectDir(path);
}

const isSiteDir = (path: string) => siteDir(path) !== null;
const PROJECT_DIR_MESSAGE =
  'must be a folder inside the project: relative, without .. (e.g. dist), or "." for a plain folder served as it is';

/** A URL path of the manifest: leading slash, no empty, `.` or `..` segment. */
function isManifestPath(path: string): boolean {
  const segments = path.split("/");
  return segments[0] === "" && !path.includes("\0") && segments.slice(1).every((s) => s !== "" && s !== "." && s !== "..");
}

/** A build to run: what the Worker posts to `POST /v1/builds`. */
export const BuildSpec = z.object({
  key: key.optional(),
  /** The account the build belongs to (its user runs install and build). */
  tenant,
  /** Presigned GET of the project's `.tar.gz`, extracted as the build's working directory. */
  sourceUrl: httpUrl,
  /** The app's variables: the install and build steps see them (install without NODE_ENV). */
  env: JobSpec.shape.env,
  /** Limits install and build alike. */
  memoryMb: JobSpec.shape.memoryMb,
  /** For the whole job: download, install, build, upload. */
  timeoutSeconds: JobSpec.shape.timeoutSeconds,
  /** Signed `POST` here with a {@link BlobsRequest} returns a {@link BlobsResponse}. */
  blobsEndpoint: httpUrl,
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  /** The app's settings, which win over svc.json and detection. */
  overrides: z
    .strictObject({
      buildCommand: z.string().min(1).max(100_000).refine(noNul, "must not contain NUL").optional(),
      outputDir: z.string().max(1024).refine(isSiteDir, PROJECT_DIR_MESSAGE).optional(),
      spa: z.boolean().optional(),
    })
    .optional(),
  ...fairShare,
  /**
   * Present for apps that run (runtimes other than `static`): the build makes
   * a release (see "Releases" below) instead of a site, and `blobsEndpoint` is
   * not used.
   */
  release: z.lazy(() => ReleaseTarget).optional(),
});
export type BuildSpec = z.infer<typeof BuildSpec>;

/** One file of a built site. */
export const ManifestEntry = z.object({
  /** URL path, decoded (`/about/index.html`, `/café.html`): what the edge matches requests against. */
  path: z.string().max(4096).refine(isManifestPath, "must start with / and have no empty, . or .. segment"),
  /** Hex SHA-256 of the bytes: the blob's name in storage. */
  sha256: sha256Hex,
  size: z.int().nonnegative(),
  /** From the extension; text types carry `; charset=utf-8`; unknown ones `application/octet-stream`. */
  contentType: z.string().min(1).max(255),
});
export type ManifestEntry = z.infer<typeof ManifestEntry>;

/** Body of the builder's signed request to the blobs endpoint. */
export const BlobsRequest = z.object({
  blobs: z.array(ManifestEntry.pick({ sha256: true, size: true, contentType: true })).min(1).max(BLOB_BATCH_LIMIT),
});
export type BlobsRequest = z.infer<typeof BlobsRequest>;

/** The Worker's answer: a presigned PUT URL for each blob of the request its storage lacks. */
export const BlobsResponse = z.object({ missing: z.array(z.object({ sha256: sha256Hex, url: httpUrl })) });
export type BlobsResponse = z.infer<typeof BlobsResponse>;

/** What a succeeded build reports in {@link JobStatus}'s `result`. */
export const BuildResult = z.object({
  kind: z.literal("build"),
  /** Detected framework id (`vite`, `nextjs`, `astro`, `sveltekit`, `gatsby`, `nuxt`, `create-react-app`, `eleventy`), or null. */
  framework: z.string().nullable(),
  /** The command that ran, or null when nothing needed building (plain `static/` folder). */
  buildCommand: z.string().nullable(),
  /** Normalised, relative to the project root. */
  outputDir: z.string(),
  spa: z.boolean(),
  /** Null when nothing was installed. */
  packageManager: z.enum(["npm", "yarn", "pnpm"]).nullable(),
  /** Sorted by path. */
  manifest: z.array(ManifestEntry).max(MAX_MANIFEST_FILES),
  /**
   * Generated when the project has no Dockerfile or Containerfile (null when it
   * has one): nginx serving the output with the edge's rules. Store
   * `webServerConfig` as {@link GENERATED_WEB_SERVER_CONFIG_PATH} beside the Dockerfile.
   */
  artifacts: z.object({ dockerfile: z.string(), webServerConfig: z.string() }).nullable(),
  /** Blobs the Worker lacked and that were PUT (0 when it had them all). */
  uploadedBlobs: z.int().nonnegative(),
  /** Highest memory use of the install and build steps. */
  peakMemoryBytes: z.int().nonnegative(),
});
export type BuildResult = z.infer<typeof BuildResult>;

// ---------------------------------------------------------------------------
// Releases (apps that run)
// ---------------------------------------------------------------------------
//
// An app of runtime `node`, `python` or `custom` is built into a release: the
// project tree after install and build, dependencies included, as one
// `.tar.gz` (paths relative to the tree, `./…`, as snapshots write them) in
// object storage, uploaded in parts exactly as a snapshot is (part URLs from
// `partUrlEndpoint`). A release is immutable and named by its deployment; any
// node can fetch it (presigned GET), verify its SHA-256 and run it, and a
// rollback only starts an older one. Inside the sandbox the tree is the
// working directory, /work, for the app's processes and its cron runs alike.
//
// What to run is decided at build time and travels with the release: svc.json
// (`type`, `startCommand`, `buildCommand`, `port`, `healthCheckPath`) wins,
// then a Procfile's `web:`/`worker:` line, then the runtime's convention
// (node: `npm start` when package.json has a start script, else `node <main>`;
// python: `python3 main.py` or `app.py`). A project with nothing to start
// fails the build with what to add.

/** Runtimes that run a process (everything but `static`). */
export const ServerRuntime = z.enum(["node", "python", "custom"]);
export type ServerRuntime = z.infer<typeof ServerRuntime>;

/** `web` listens on `port` and takes HTTP traffic; `worker` runs without a port or health check. */
export const ProcessType = z.enum(["web", "worker"]);
export type ProcessType = z.infer<typeof ProcessType>;

/** Port a web app is given in PORT when svc.json names none. */
/** Seconds a web process has to pass its health check when svc.json does not say (`startTimeoutSeconds`). */
export const DEFAULT_START_TIMEOUT_SECONDS = 60;

export const DEFAULT_APP_PORT = 8080;

/**
 * PATH of everything that runs in a release (its processes and its cron
 * runs), unless the app's env sets one: the python venv and the node
 * packages' commands first, as `npm run` and an activated venv would.
 */
export const RELEASE_PATH = "/work/.venv/bin:/work/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";

/** What a release build needs besides the BuildSpec. */
export const ReleaseTarget = z.object({
  runtime: ServerRuntime,
  /** Signed `POST` here with a {@link PartUrlRequest} returns a {@link PartUrlResponse} (as for snapshots). */
  partUrlEndpoint: httpUrl,
  /** Every part but the last has exactly this size. */
  partSizeBytes: z.int().min(SNAPSHOT_MIN_PART_BYTES).max(SNAPSHOT_MAX_PART_BYTES),
});
export type ReleaseTarget = z.infer<typeof ReleaseTarget>;

/** A path of the app answered with 2xx when it is ready for traffic (`/healthz`). */
const healthCheckPath = z
  .string()
  .max(1024)
  .regex(/^\/[\x21-\x7e]*$/, "must be a path starting with / (no spaces or control characters)");

/** What a succeeded release build reports in {@link JobStatus}'s `result`. */
export const ReleaseResult = z.object({
  kind: z.literal("release"),
  runtime: ServerRuntime,
  type: ProcessType,
  /** Runs with `/bin/sh -c` in /work. */
  startCommand: z.string().min(1).max(100_000),
  /** The command that ran, or null when nothing needed building. */
  buildCommand: z.string().nullable(),
  /** How dependencies were installed, or null when there were none. */
  packageManager: z.enum(["npm", "yarn", "pnpm", "pip"]).nullable(),
  /** Where a `web` process must listen (it gets it in PORT); null for a worker. */
  port: z.int().min(1).max(65_535).nullable(),
  /** Null: the process is ready once its port accepts connections. */
  healthCheckPath: healthCheckPath.nullable(),
  /** A web process: seconds it has to pass its health check (null: the platform's default). */
  startTimeoutSeconds: z.int().min(1).max(600).nullable().default(null),
  /** Seconds a new process must stay up once ready before it counts as deployed. */
  minReadySeconds: z.int().min(0).max(600).default(0),
  /** A worker: its new release may run beside the old one during a deploy. */
  overlap: z.boolean().default(false),
  /** Regular files in the release (what its build log and the deployment say). */
  files: z.int().nonnegative().default(0),
  /** Bytes of the whole `.tar.gz` (the sum of the parts). */
  sizeBytes: z.int().positive(),
  /** SHA-256 of the whole `.tar.gz`, hex. */
  sha256: sha256Hex,
  /** In part-number order, 1 to N: what completes the multipart upload. */
  parts: z.array(SnapshotPart).min(1),
  entries: z.int().nonnegative(),
  expandedBytes: z.int().nonnegative(),
  /** Highest memory use of the install and build steps. */
  peakMemoryBytes: z.int().nonnegative(),
});
export type ReleaseResult = z.infer<typeof ReleaseResult>;

// ---------------------------------------------------------------------------
// App processes
// ---------------------------------------------------------------------------
//
// A process is a release running as a long-lived sandbox on a node, made like
// a job's (own user, namespaces, cgroups, run network, only its app's disk at
// its mountPath, the app's env plus PORT and SVC_*), supervised by the node:
//
//     starting ──ready──▶ running ──exit──▶ backoff ──▶ starting …
//        │                                    │ (5 exits without 10 minutes of running between)
//        └──────exit / start timeout──────────┴──▶ crash_loop (still restarted, every 60 s)
//     any ──stop──▶ stopping ──▶ stopped          (release unusable, sandbox impossible) ──▶ failed
//
// `ready` means the health check passed: HTTP 2xx from `healthCheck.path`, or
// (no path) the port accepting a TCP connection; a `worker` is ready once
// started. Restarts wait 0.5 s, doubling up to 30 s, reset after 10 minutes
// of running. Every transition is written to the app's runtime log (`svc`
// lines) with its reason, and reported to `callbackUrl` (signed, like job
// callbacks) with the new {@link ProcessStatus}.
//
//     POST /v1/processes              ProcessSpec → 201 ProcessStatus (200: its key named one already)
//     GET  /v1/processes/:id          → ProcessStatus
//     GET  /v1/processes?key=…        → ProcessStatus
//     POST /v1/processes/:id/stop     {drainSeconds} → 202 ProcessStatus (stopping); idempotent
//     GET  /v1/app-logs/:appId?tail=N&follow=1   the app's runtime log (job log line format), across
//                                     restarts and releases, bounded (LOG_LIMIT_BYTES kept per app)
//     ANY  /v1/proxy/:id/<path>       the app's own HTTP, WebSocket and SSE traffic (below)
//
// A stop keeps serving proxied requests for `drainSeconds` (the edge caches
// which process serves an app for a few seconds), then answers new ones with
// 404 PROCESS_NOT_FOUND, lets requests in flight finish (at most 30 s), then
// sends SIGTERM, then SIGKILL after 10 s. In-flight requests finish before
// SIGTERM, so an app without a SIGTERM handler (Node's default is to exit at
// once) loses none of them. A stopped process answers proxied requests with
// 404 PROCESS_NOT_FOUND, which tells the edge to look up the app's process
// again; one that is (re)starting holds them up to 5 s for its readiness,
// then 503 UNAVAILABLE; a failed one, and a worker, answer 503 UNAVAILABLE.
//
// App processes do not survive a restart of the node's builder: afterwards
// the process reads `failed` (lastExit.reason `error`, "the builder
// restarted…"), reported through its callback, and the control plane starts a
// new one (with a new key: a key names one process for good).

export const ProcessState = z.enum(["starting", "running", "backoff", "crash_loop", "stopping", "stopped", "failed"]);
export type ProcessState = z.infer<typeof ProcessState>;

/** Why the last instance of a process ended (or never became ready). */
export const ProcessExitReason = z.enum(["exit_code", "OOMKilled", "health_check", "start_timeout", "port", "error"]);
export type ProcessExitReason = z.infer<typeof ProcessExitReason>;

/** Most lines of the runtime log a status carries when something went wrong. */
export const PROCESS_LAST_LINES = 20;

/** A process to start: what the Worker posts to `POST /v1/processes`. */
export const ProcessSpec = z.object({
  /** Idempotency key chosen by the control plane (`<appId>/<deploymentId>/<n>`). */
  key,
  tenant,
  /** The app the process belongs to: its runtime log is kept under this id. */
  appId: z.string().regex(TENANT_PATTERN, "must be an app id"),
  release: z.object({
    /** Presigned GET of the release's `.tar.gz`; the node keeps a verified copy for restarts. */
    url: httpUrl,
    sha256: sha256Hex,
    sizeBytes: z.int().positive(),
  }),
  type: ProcessType,
  command: JobSpec.shape.command,
  /** The port a `web` process listens on (PORT); null for a worker. */
  port: z.int().min(1).max(65_535).nullable(),
  healthCheck: z
    .object({
      path: healthCheckPath.nullable(),
      /** From each start until ready; past it the instance is ended (`start_timeout`). */
      timeoutSeconds: z.int().min(1).max(600),
    })
    .nullable(),
  env: JobSpec.shape.env,
  memoryMb: JobSpec.shape.memoryMb,
  disk: JobSpec.shape.disk,
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
});
export type ProcessSpec = z.infer<typeof ProcessSpec>;

/**
 * What the schema cannot say about a {@link ProcessSpec}: a `web` process needs
 * a port; a `worker` has neither port nor health check. The node answers 400
 * VALIDATION_ERROR with these; empty when the spec is coherent. (A web process
 * with `healthCheck: null` is ready once its port accepts connections, within
 * 60 s.)
 */
export function processSpecProblems(spec: ProcessSpec): { path: string; message: string }[] {
  if (spec.type === "web") return spec.port === null ? [{ path: "port", message: "a web process needs the port it listens on" }] : [];
  const problems: { path: string; message: string }[] = [];
  if (spec.port !== null) problems.push({ path: "port", message: "a worker has no port (null)" });
  if (spec.healthCheck !== null) problems.push({ path: "healthCheck", message: "a worker has no health check (null)" });
  return problems;
}

/** What the process routes answer and its callbacks carry. */
export const ProcessStatus = z.object({
  id: z.string(),
  key: z.string(),
  appId: z.string(),
  state: ProcessState,
  /** True while an instance is running and ready (takes traffic). */
  ready: z.boolean(),
  /** Instances started after the first. */
  restarts: z.int().nonnegative(),
  lastExit: z
    .object({
      at: z.iso.datetime(),
      reason: ProcessExitReason,
      exitCode: z.int().nullable(),
      signal: z.string().nullable(),
      /** e.g. "memory limit 256 MiB exceeded (OOMKilled)", "exited with code 1", "health check GET /healthz: 500". */
      message: z.string(),
    })
    .nullable(),
  /** The last lines of the runtime log (at most {@link PROCESS_LAST_LINES}) when the last instance ended badly; else empty. */
  lastLines: z.array(z.string()),
  memoryLimitBytes: z.int().positive(),
  /** A web process: the port its traffic goes to (its spec's, or the one it was found listening on instead); null for a worker. */
  port: z.int().min(1).max(65_535).nullable().default(null),
  createdAt: z.iso.datetime(),
  /** Start of the current (or last) instance. */
  startedAt: z.iso.datetime().nullable(),
  readyAt: z.iso.datetime().nullable(),
  stoppedAt: z.iso.datetime().nullable(),
  labels: z.record(z.string(), z.string()),
});
export type ProcessStatus = z.infer<typeof ProcessStatus>;

/** Body of `POST /v1/processes/:id/stop`. */
export const ProcessStop = z.object({ drainSeconds: z.int().min(0).max(300).default(0) });
export type ProcessStop = z.infer<typeof ProcessStop>;

// Proxied traffic
// ---------------
// The Worker forwards an app's requests to `ANY /v1/proxy/<processId>/<path>?<query>`
// on the node running it. The body is the client's, streamed, so it cannot be
// part of a signature: the request carries `X-Svc-Proxy-Timestamp` (unix
// seconds) and `X-Svc-Proxy-Signature` = hex HMAC-SHA256(secret,
// `proxy\n<processId>\n<timestamp>`), accepted within the signature window.
// It only proves the Worker sent it: the same process is public at its URL.
// The Worker sets `X-Forwarded-Host` (the app's host, which the node passes
// on as `Host`), `X-Forwarded-For` (only from what the edge itself knows of the
// client) and `X-Forwarded-Proto`, and `X-Svc-Apps-Domain` (the domain apps are
// served under: the node drops an app's cookie set for it or a parent of it);
// the node drops every `X-Svc-*` header and hop-by-hop header before the app
// sees the request, and passes WebSocket upgrades (`Connection: Upgrade`)
// through as a byte stream both ways.

/** Header of a proxied request: unix seconds. */
export const HEADER_PROXY_TIMESTAMP = "X-Svc-Proxy-Timestamp";
/** Header of a proxied request: hex HMAC of `proxy\n<processId>\n<timestamp>`. */
export const HEADER_PROXY_SIGNATURE = "X-Svc-Proxy-Signature";
/**
 * Set on the answers the node itself gives to proxied requests (never on the
 * app's: the node drops every `X-Svc-*` header the app sends), with the error
 * code, so the edge can tell "this process is gone" from an app's own 404.
 */
export const HEADER_PROXY_ERROR = "X-Svc-Proxy-Error";
/** Header of a proxied request: the domain apps are served under (`APPS_DOMAIN`, without a port). */
export const HEADER_APPS_DOMAIN = "X-Svc-Apps-Domain";
/** Largest request body passed to an app (Cloudflare's own limit on request bodies is 100 MB). */
export const MAX_PROXY_BODY_BYTES = 100 * 1024 * 1024;

const proxySigned = (processId: string, timestamp: string) => encoder.encode(`proxy\n${processId}\n${timestamp}`);

/** The two headers that let a node accept a proxied request for `processId`. */
export async function signProxy(secret: string, processId: string, timestamp = Math.floor(Date.now() / 1000)): Promise<Record<string, string>> {
  const data = proxySigned(processId, String(timestamp));
  const signature = toHex(await crypto.subtle.sign("HMAC", await hmacKey(secret), data));
  return { [HEADER_PROXY_TIMESTAMP]: String(timestamp), [HEADER_PROXY_SIGNATURE]: signature };
}

/** Checks a proxied request's headers for `processId` (constant time, within the signature window). */
export async function verifyProxy(
  secret: string,
  processId: string,
  headers: { get(name: string): string | null },
  now = Date.now() / 1000,
): Promise<boolean> {
  const timestamp = headers.get(HEADER_PROXY_TIMESTAMP);
  const signature = headers.get(HEADER_PROXY_SIGNATURE)?.toLowerCase() ?? null;
  if (timestamp === null || signature === null || !TIMESTAMP_FORMAT.test(timestamp) || !SIGNATURE_FORMAT.test(signature)) return false;
  if (Math.abs(now - Number(timestamp)) > SIGNATURE_WINDOW_SECONDS) return false;
  const data = proxySigned(processId, timestamp);
  return crypto.subtle.verify("HMAC", await hmacKey(secret), fromHex(signature), data);
}

// ---------------------------------------------------------------------------
// Job results
// ---------------------------------------------------------------------------

/** Every kind of job result, told apart by `kind`. */
export const JobResult = z.discriminatedUnion("kind", [SnapshotResult, RestoreResult, BuildResult, ReleaseResult]);
export type JobResult = z.infer<typeof JobResult>;

// The fleet
// ---------
// A new node joins with `POST /v1/nodes/join` on the Worker (`Authorization:
// Bearer <join token>`, a {@link NodeJoin}): the token (minted by the operator,
// good for a number of joins until it expires) only ever admits a new node,
// which gets a new id and its key ({@link NodeJoined}) and keeps both in its
// data directory. After a restart it joins again as itself with
// `POST /internal/nodes/rejoin` (a {@link NodeRejoin}, signed with its key,
// {@link HEADER_NODE} = its id): only that signature, never a token, lets a
// node be a node that joined before or move its address. It then heartbeats
// `POST /internal/nodes/heartbeat` (signed the same way, a {@link NodeHeartbeat})
// every `heartbeatSeconds`; the answer ({@link NodeHeartbeatReply}) names the
// disks it holds whose copy of record is elsewhere: it quarantines them.

/** Node ids are chosen by the control plane; a node signs with `nodeKey(secret, id)`. */
export const NODE_ID_PATTERN = /^node_[A-Za-z0-9]{8,40}$/;

/** A node's signing key: HMAC-SHA256(BUILDER_SECRET, `node\n<id>`) as hex. Only the Worker can derive it. */
export async function nodeKey(secret: string, nodeId: string): Promise<string> {
  return toHex(await crypto.subtle.sign("HMAC", await hmacKey(secret), encoder.encode(`node\n${nodeId}`)));
}

/** What a node measures of itself, at join and in every heartbeat. */
export const NodeCapacity = z.object({
  cores: z.int().min(1).max(4096),
  memoryMb: z.int().min(1),
  /** The data directory's filesystem. */
  diskTotalBytes: z.int().nonnegative(),
  diskFreeBytes: z.int().nonnegative(),
  /** Jobs running or queued, and app processes, on the node now. */
  runningJobs: z.int().nonnegative(),
  processes: z.int().nonnegative(),
  /** Memory the node may still promise to app processes (its host's, less a reserve and every promise on the host). */
  memoryFreeMb: z.int().nonnegative(),
})
  .refine((capacity) => capacity.diskFreeBytes <= capacity.diskTotalBytes, { path: ["diskFreeBytes"], message: "cannot exceed diskTotalBytes" })
  .refine((capacity) => capacity.memoryFreeMb <= capacity.memoryMb, { path: ["memoryFreeMb"], message: "cannot exceed memoryMb" });
export type NodeCapacity = z.infer<typeof NodeCapacity>;

/** A disk copy a node holds, with the generation it was made at. */
export const HeldDisk = z.object({ id: z.string().regex(DISK_ID_PATTERN), generation: z.int().positive() });
export type HeldDisk = z.infer<typeof HeldDisk>;

/** A stale copy a node set aside (never served, written or snapshotted again). */
export const QuarantinedDisk = z.object({
  /** Its folder under the node's `quarantine/`. */
  name: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/),
  diskId: z.string().regex(DISK_ID_PATTERN),
  generation: z.int().positive(),
  quarantinedAt: z.iso.datetime(),
});
export type QuarantinedDisk = z.infer<typeof QuarantinedDisk>;

/** How a node describes itself when it joins or joins again. */
export const NodeRejoin = z.object({
  /** Unique among nodes; the host name by default. */
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, "letters, digits, '.', '_' and '-', at most 63"),
  /** Where the Worker reaches the node. */
  address: httpUrl,
  /** The node's process id on its host (shown to the operator). */
  pid: z.int().positive().optional(),
  capacity: NodeCapacity,
  disks: z.array(HeldDisk).max(100_000),
});
export type NodeRejoin = z.infer<typeof NodeRejoin>;

/**
 * A new node's join. `nodeId` is refused (403): a node that joined before
 * joins again by signing with its own key ({@link NodeRejoin}), never by
 * presenting a token, so a token cannot take over a node.
 */
export const NodeJoin = NodeRejoin.extend({ nodeId: z.string().optional() });
export type NodeJoin = z.infer<typeof NodeJoin>;

/** What the control plane tells a node that joined or joined again. */
export const NodeRejoined = z.object({
  nodeId: z.string().regex(NODE_ID_PATTERN),
  heartbeatSeconds: z.int().positive(),
  /** Apps are served at `<app>.<appsDomain>`: a cookie an app sets for this domain (or a parent of it) is dropped. */
  appsDomain: z.string().min(1),
  /** The node's first lease on its disks (as a heartbeat's answer grants it), counted from the request's sending; absent: no leases. */
  leaseSeconds: z.int().nonnegative().optional(),
});
export type NodeRejoined = z.infer<typeof NodeRejoined>;

/** A new node's id, key and settings. */
export const NodeJoined = NodeRejoined.extend({ key: z.string().regex(/^[0-9a-f]{64}$/) });
export type NodeJoined = z.infer<typeof NodeJoined>;

/** An app process's id as heartbeats report it and their answers name it (ids.ts: `prc_…`). */
const ReportedProcessId = z.string().regex(/^prc_[A-Za-z0-9]{1,64}$/);

export const NodeHeartbeat = z.object({
  capacity: NodeCapacity,
  disks: z.array(HeldDisk).max(100_000),
  quarantined: z.array(QuarantinedDisk).max(100_000),
  /** The app processes it runs (not stopped or failed); absent from nodes that predate it. */
  processes: z
    .array(z.object({ id: ReportedProcessId, appId: z.string().regex(TENANT_PATTERN) }))
    .max(100_000)
    .optional(),
});
export type NodeHeartbeat = z.infer<typeof NodeHeartbeat>;

export const NodeHeartbeatReply = z.object({
  /** Disks whose copy on this node is no longer the copy of record: set them aside now. */
  fence: z.array(z.string().regex(DISK_ID_PATTERN)),
  /**
   * How long the node may hold its disks, counted from when it sent this
   * heartbeat; 0: not at all (it was declared lost). Absent from a control
   * plane without leases: the node holds them without one.
   */
  leaseSeconds: z.number().int().nonnegative().optional(),
  /**
   * Processes to stop now: a node that returns after it was declared lost runs
   * processes whose apps were started elsewhere meanwhile.
   */
  stop: z.array(ReportedProcessId).max(100_000).optional(),
});
export type NodeHeartbeatReply = z.infer<typeof NodeHeartbeatReply>;
