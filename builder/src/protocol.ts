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

let cachedKey: { secret: string; key: Promise<HmacKey> } | undefined;

/** Importing an HMAC key costs more than the MAC itself; callers use one secret. */
function hmacKey(secret: string): Promise<HmacKey> {
  if (cachedKey?.secret !== secret) {
    const key = crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, [
      "sign",
      "verify",
    ]);
    cachedKey = { secret, key };
  }
  return cachedKey.key;
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
  return { [HEADER_TIMESTAMP]: timestamp, [HEADER_NONCE]: nonce, [HEADER_SIGNATURE]: signature };
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

/** A job to run: what the Worker posts to `POST /v1/jobs`. */
export const JobSpec = z.object({
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
      /** Where the app expects the disk; exported as SVC_DISK_MOUNT_PATH (the data is at SVC_DISK_PATH). */
      mountPath: z.string().startsWith("/").max(4096).refine(noNul, "must not contain NUL"),
      sizeBytes: z.int().positive(),
    })
    .optional(),
  timeoutSeconds: z.int().min(1).max(43_200),
  memoryMb: z.int().min(16).max(65_536),
  /** Receives the final {@link JobStatus}, signed, when the job ends. */
  callbackUrl: httpUrl.optional(),
  /** Opaque to the builder; echoed in every status so callbacks can be routed. */
  labels: z.record(z.string(), z.string()).optional(),
});
export type JobSpec = z.infer<typeof JobSpec>;

/** `queued` only while the builder is at its concurrency limit. */
export const JobState = z.enum(["queued", "running", "succeeded", "failed", "cancelled"]);
export type JobState = z.infer<typeof JobState>;

/** Why a job did not succeed (null while running and on success). */
export const JobFailureReason = z.enum(["exit_code", "timeout", "OOMKilled", "disk_quota", "cancelled", "error"]);
export type JobFailureReason = z.infer<typeof JobFailureReason>;

/** What `GET /v1/jobs/:id` answers and what the completion callback carries. */
export const JobStatus = z.object({
  id: z.string(),
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
  finishedAt: z.iso.datetime().nullable(),
  labels: z.record(z.string(), z.string()),
});
export type JobStatus = z.infer<typeof JobStatus>;

/** Body of `PUT /v1/disks/:id`: creates the disk or changes its quota. */
export const DiskSpec = z.object({ sizeBytes: z.int().positive() });
export type DiskSpec = z.infer<typeof DiskSpec>;

/** What the disk routes answer. */
export const DiskInfo = z.object({
  id: z.string(),
  sizeBytes: z.int().positive(),
  usedBytes: z.int().nonnegative(),
});
export type DiskInfo = z.infer<typeof DiskInfo>;

/** Every error code the builder answers with. */
export const BuilderErrorCode = z.enum([
  "UNAUTHORIZED",
  "VALIDATION_ERROR",
  "NOT_FOUND",
  "METHOD_NOT_ALLOWED",
  "JOB_NOT_FOUND",
  "DISK_NOT_FOUND",
  "DISK_BUSY",
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

/**
 * Splits one log line (without its newline) into its parts, so the Worker can
 * render run logs without re-deriving the format; null when it is not a record.
 */
export function parseLogLine(line: string): { time: string; stream: LogStream; text: string } | null {
  const match = LOG_LINE.exec(line);
  if (!match) return null;
  return { time: match[1]!, stream: match[2] as LogStream, text: match[3]! };
}
