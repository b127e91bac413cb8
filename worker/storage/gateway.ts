import { Hono } from "hono";
import type { AppEnv } from "../context";
import { ApiError } from "../lib/errors";
import { base64ToHex, CHECKSUM_HEADER, verifyPresigned } from "./presign";

/**
 * The local stand-in for R2's S3 endpoint: serves presigned GET/HEAD/PUT (and
 * multipart part PUTs) over the R2 binding after checking the same SigV4 query
 * signature R2 would. Bodies stream in both directions; nothing is buffered.
 */
export const storageRoutes = new Hono<AppEnv>();

/** Quoted, as S3 returns it; multipart completion strips the quotes again. */
const quoted = (etag: string) => `"${etag}"`;

function rangeHeaders(object: R2ObjectBody): { status: 200 | 206; headers: Record<string, string> } {
  const size = object.size;
  const range = object.range;
  if (!range) return { status: 200, headers: { "Content-Length": String(size) } };
  let offset: number;
  let length: number;
  if ("suffix" in range && range.suffix !== undefined) {
    length = Math.min(range.suffix, size);
    offset = size - length;
  } else {
    offset = "offset" in range && range.offset !== undefined ? range.offset : 0;
    length = "length" in range && range.length !== undefined ? range.length : size - offset;
  }
  if (offset === 0 && length === size) return { status: 200, headers: { "Content-Length": String(size) } };
  return {
    status: 206,
    headers: { "Content-Length": String(length), "Content-Range": `bytes ${offset}-${offset + length - 1}/${size}` },
  };
}

storageRoutes.on(["GET", "HEAD", "PUT"], "/:bucket/:key{.+}", async (c) => {
  const config = c.get("config");
  const check = await verifyPresigned(config, c.req.raw);
  if (!check.ok) throw new ApiError(check.code, check.message, undefined, 403);
  if (c.req.param("bucket") !== config.S3_BUCKET) throw new ApiError("NOT_FOUND", "no such bucket");
  const key = decodeURIComponent(c.req.param("key"));
  const bucket = c.env.BUCKET;

  if (c.req.method === "PUT") {
    const length = c.req.header("Content-Length");
    if (length === undefined || !/^\d+$/.test(length)) {
      throw new ApiError("LENGTH_REQUIRED", "uploads need a Content-Length header");
    }
    const body = c.req.raw.body ?? new Uint8Array(0);
    const partNumber = c.req.query("partNumber");
    const uploadId = c.req.query("uploadId");
    if (partNumber !== undefined || uploadId !== undefined) {
      const n = Number(partNumber);
      if (!uploadId || !Number.isInteger(n) || n < 1 || n > 10_000) throw new ApiError("VALIDATION_ERROR", "bad partNumber or uploadId");
      try {
        const part = await bucket.resumeMultipartUpload(key, uploadId).uploadPart(n, body);
        return c.body(null, 200, { ETag: quoted(part.etag) });
      } catch (err) {
        throw new ApiError("UPLOAD_NOT_FOUND", `multipart upload not found: ${err instanceof Error ? err.message : err}`);
      }
    }
    const contentType = c.req.header("Content-Type");
    // Like S3 and R2: a checksum header (signed into content-addressed upload URLs) must match the bytes.
    const checksum = c.req.header(CHECKSUM_HEADER);
    const sha256 = checksum === undefined ? undefined : base64ToHex(checksum);
    if (sha256 === null) throw new ApiError("VALIDATION_ERROR", `${CHECKSUM_HEADER} must be a base64 SHA-256 digest`);
    let stored: R2Object | null;
    try {
      stored = await bucket.put(key, body, {
        ...(contentType ? { httpMetadata: { contentType } } : {}),
        ...(sha256 ? { sha256 } : {}),
      });
    } catch (err) {
      if (sha256 && err instanceof Error && /checksum|digest/i.test(err.message)) {
        throw new ApiError("CHECKSUM_MISMATCH", `the uploaded bytes do not hash to the ${CHECKSUM_HEADER} the URL was signed for`);
      }
      throw err;
    }
    return c.body(null, 200, { ETag: quoted(stored?.etag ?? "") });
  }

  const object = await bucket.get(key, { range: c.req.raw.headers, onlyIf: c.req.raw.headers });
  if (!object) throw new ApiError("NOT_FOUND", "no such object");
  const headers: Record<string, string> = {
    ETag: object.httpEtag,
    "Accept-Ranges": "bytes",
    "Last-Modified": object.uploaded.toUTCString(),
    "Content-Type": object.httpMetadata?.contentType ?? "application/octet-stream",
  };
  if (!("body" in object)) return c.body(null, 304, headers);
  const { status, headers: sizeHeaders } = rangeHeaders(object);
  return new Response(c.req.method === "HEAD" ? null : object.body, { status, headers: { ...headers, ...sizeHeaders } });
});
