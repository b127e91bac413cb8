import { AwsV4Signer } from "aws4fetch";
import type { Config } from "../env";
import { ApiError } from "../lib/errors";

/**
 * SigV4 query-signed URLs for objects in the bucket (aws4fetch). In production
 * `S3_ENDPOINT` is R2's S3 endpoint and uploads never touch the Worker; locally
 * it is this Worker's own /storage gateway, which verifies the same signatures
 * with the same code (see gateway.ts).
 */
export const REGION = "auto";
/** The header carrying an upload's SHA-256 (base64), which S3 and R2 verify against the bytes. */
export const CHECKSUM_HEADER = "x-amz-checksum-sha256";
export const SERVICE = "s3";

export type PresignInput = {
  method: "GET" | "PUT" | "HEAD";
  key: string;
  expiresInSeconds: number;
  /** Signed, so the uploader must send exactly this many bytes. */
  contentLength?: number;
  /**
   * Hex SHA-256 of the bytes to upload, signed as `x-amz-checksum-sha256`
   * (base64): storage (R2, or the local gateway) refuses any other bytes.
   */
  sha256?: string;
  /** Extra query parameters that become part of the signature (e.g. partNumber, uploadId). */
  query?: Record<string, string>;
  /** Signing time; defaults to now (tests inject old clocks to get expired URLs). */
  now?: number;
};

function credentials(config: Config) {
  if (!config.R2_ACCESS_KEY_ID || !config.R2_SECRET_ACCESS_KEY) {
    throw new ApiError("INTERNAL", "object storage credentials are not configured (R2_ACCESS_KEY_ID / R2_SECRET_ACCESS_KEY)");
  }
  return { accessKeyId: config.R2_ACCESS_KEY_ID, secretAccessKey: config.R2_SECRET_ACCESS_KEY };
}

export function hexToBase64(hex: string): string {
  let binary = "";
  for (let i = 0; i < hex.length; i += 2) binary += String.fromCharCode(Number.parseInt(hex.slice(i, i + 2), 16));
  return btoa(binary);
}

/** The hex digest of a base64 `x-amz-checksum-sha256` value, or null when it is not 32 bytes of base64. */
export function base64ToHex(value: string): string | null {
  let binary: string;
  try {
    binary = atob(value);
  } catch {
    return null;
  }
  if (binary.length !== 32) return null;
  return [...binary].map((c) => c.charCodeAt(0).toString(16).padStart(2, "0")).join("");
}

/** `20261121T102800Z`, the SigV4 timestamp format. */
export function amzDate(ms: number): string {
  return new Date(ms).toISOString().replace(/[:-]|\.\d{3}/g, "");
}

export function objectUrl(config: Config, key: string): URL {
  const base = config.S3_ENDPOINT.replace(/\/+$/, "");
  const path = key.split("/").map(encodeURIComponent).join("/");
  return new URL(`${base}/${config.S3_BUCKET}/${path}`);
}

export async function presign(config: Config, input: PresignInput): Promise<{ url: string; expiresAt: number }> {
  const now = input.now ?? Date.now();
  const url = objectUrl(config, input.key);
  for (const [k, v] of Object.entries(input.query ?? {})) url.searchParams.set(k, v);
  url.searchParams.set("X-Amz-Expires", String(input.expiresInSeconds));
  const headers: Record<string, string> = {};
  if (input.contentLength !== undefined) headers["content-length"] = String(input.contentLength);
  if (input.sha256 !== undefined) headers[CHECKSUM_HEADER] = hexToBase64(input.sha256);
  const signer = new AwsV4Signer({
    ...credentials(config),
    url: url.href,
    method: input.method,
    headers,
    service: SERVICE,
    region: REGION,
    datetime: amzDate(now),
    signQuery: true,
    allHeaders: true,
  });
  const signed = await signer.sign();
  return { url: signed.url.href, expiresAt: now + input.expiresInSeconds * 1000 };
}

export type SignatureCheck =
  | { ok: true }
  | { ok: false; code: "PRESIGNED_URL_EXPIRED" | "FORBIDDEN"; message: string };

const DATE_FORMAT = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/;

/**
 * Verifies a presigned request the way S3 does: credential scope, expiry, then
 * the signature recomputed over method, path, query and every signed header.
 */
export async function verifyPresigned(config: Config, request: Request, now = Date.now()): Promise<SignatureCheck> {
  const url = new URL(request.url);
  const q = url.searchParams;
  const deny = (message: string): SignatureCheck => ({ ok: false, code: "FORBIDDEN", message });
  const signature = q.get("X-Amz-Signature");
  const date = q.get("X-Amz-Date");
  const expires = Number(q.get("X-Amz-Expires"));
  const credential = q.get("X-Amz-Credential") ?? "";
  const signedHeaders = (q.get("X-Amz-SignedHeaders") ?? "").split(";").filter(Boolean);
  if (!signature || !date || q.get("X-Amz-Algorithm") !== "AWS4-HMAC-SHA256") return deny("missing or unsupported signature");
  const dateParts = DATE_FORMAT.exec(date);
  if (!dateParts || !Number.isInteger(expires) || expires < 1 || expires > 604_800) return deny("malformed X-Amz-Date or X-Amz-Expires");
  const { accessKeyId } = credentials(config);
  const [keyId, scopeDate, region, service, terminal] = credential.split("/");
  if (keyId !== accessKeyId || scopeDate !== date.slice(0, 8) || region !== REGION || service !== SERVICE || terminal !== "aws4_request") {
    return deny("unknown credential");
  }
  const signedAt = Date.UTC(
    Number(dateParts[1]),
    Number(dateParts[2]) - 1,
    Number(dateParts[3]),
    Number(dateParts[4]),
    Number(dateParts[5]),
    Number(dateParts[6]),
  );
  if (now > signedAt + expires * 1000) {
    return { ok: false, code: "PRESIGNED_URL_EXPIRED", message: "the presigned URL has expired; request a new one" };
  }
  if (signedAt > now + 5 * 60_000) return deny("the signature is dated in the future");
  const unsigned = new URL(url.href);
  unsigned.searchParams.delete("X-Amz-Signature");
  const headers: Record<string, string> = {};
  for (const name of signedHeaders) {
    if (name === "host") continue;
    headers[name] = request.headers.get(name) ?? "";
  }
  const expected = await new AwsV4Signer({
    ...credentials(config),
    url: unsigned.href,
    method: request.method,
    headers,
    service: SERVICE,
    region: REGION,
    datetime: date,
    signQuery: true,
    allHeaders: true,
  }).sign();
  const recomputed = expected.url.searchParams.get("X-Amz-Signature") ?? "";
  const enc = new TextEncoder();
  const a = enc.encode(recomputed);
  const b = enc.encode(signature);
  if (a.byteLength !== b.byteLength || !crypto.subtle.timingSafeEqual(a, b)) return deny("signature does not match");
  return { ok: true };
}

/** A presigned PUT for one part of a multipart upload (what the builder streams snapshots and releases into). */
export async function presignPart(config: Config, key: string, uploadId: string, partNumber: number): Promise<string> {
  const { url } = await presign(config, {
    method: "PUT",
    key,
    expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS,
    query: { partNumber: String(partNumber), uploadId },
  });
  return url;
}
