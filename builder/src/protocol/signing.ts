/**
 * The wire contract between the Worker (control plane) and the nodes (data
 * plane): request signing. The Worker imports builder/src/protocol/ itself, so
 * these modules use only what both runtimes share: Web Crypto (`crypto.subtle`),
 * `TextEncoder` and zod; no `node:` imports.
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
 */

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

export const encoder = new TextEncoder();

export function toHex(bytes: ArrayBuffer): string {
  let out = "";
  for (const byte of new Uint8Array(bytes)) out += byte.toString(16).padStart(2, "0");
  return out;
}

export function fromHex(hex: string): Uint8Array<ArrayBuffer> {
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

export function hmacKey(secret: string): Promise<HmacKey> {
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

export const TIMESTAMP_FORMAT = /^\d{1,12}$/;
const NONCE_FORMAT = /^[0-9a-f]{32}$/;
export const SIGNATURE_FORMAT = /^[0-9a-f]{64}$/;

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
