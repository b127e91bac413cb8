import { ApiError, errorOf } from "./api";

/**
 * Uploads to presigned storage URLs (a deployment's source, a restore
 * archive). These go to object storage, not to the API, and are sent with
 * XMLHttpRequest because fetch cannot report upload progress.
 */

/** Bytes sent so far of the whole upload. */
export type OnProgress = (sentBytes: number) => void;

/** Storage answers S3 XML or our gateway's JSON envelope; either way, its code and message. */
function storageError(status: number, text: string): ApiError {
  const xmlCode = /<Code>([^<]+)<\/Code>/.exec(text)?.[1];
  if (xmlCode) return new ApiError(xmlCode, /<Message>([^<]+)<\/Message>/.exec(text)?.[1] ?? text.slice(0, 300), status);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return errorOf(status, body, text);
}

/** PUTs `body` to a presigned URL; resolves to the storage's ETag (multipart uploads need it). */
export function putObject(url: string, body: Blob, onProgress: OnProgress): Promise<string | null> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", url);
    xhr.upload.onprogress = (event) => onProgress(event.loaded);
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) {
        onProgress(body.size);
        resolve(xhr.getResponseHeader("ETag"));
      } else {
        reject(storageError(xhr.status, xhr.responseText));
      }
    };
    xhr.onerror = () => reject(new ApiError("NETWORK", "the upload to storage failed: the connection was refused or dropped", 0));
    xhr.send(body);
  });
}

/** A multipart plan from the presign answer: each part's URL and size, in order. */
export type UploadPart = { partNumber: number; url: string; sizeBytes: number };

/**
 * Uploads `file` in the parts the API planned (large restore archives) and
 * returns each part's ETag for the restore call.
 */
export async function putParts(parts: readonly UploadPart[], file: Blob, onProgress: OnProgress): Promise<{ partNumber: number; etag: string }[]> {
  const ordered = [...parts].sort((a, b) => a.partNumber - b.partNumber);
  const planned = ordered.reduce((sum, p) => sum + p.sizeBytes, 0);
  if (planned !== file.size) throw new ApiError("UPLOAD_PLAN_MISMATCH", `the API planned parts of ${planned} bytes for a file of ${file.size}`, 0);
  const etags: { partNumber: number; etag: string }[] = [];
  let offset = 0;
  for (const part of ordered) {
    const start = offset;
    const etag = await putObject(part.url, file.slice(start, start + part.sizeBytes), (sent) => onProgress(start + sent));
    if (!etag) throw new ApiError("NO_ETAG", `the storage returned no ETag for part ${part.partNumber}`, 0);
    etags.push({ partNumber: part.partNumber, etag });
    offset += part.sizeBytes;
  }
  return etags;
}
