/** Deletes every object under `prefix`, a page (≤ 1000 keys) at a time. */
export async function deletePrefix(bucket: R2Bucket, prefix: string): Promise<void> {
  let cursor: string | undefined;
  do {
    const page = await bucket.list({ prefix, cursor });
    if (page.objects.length > 0) await bucket.delete(page.objects.map((o) => o.key));
    cursor = page.truncated ? page.cursor : undefined;
  } while (cursor);
}

/**
 * Completes a multipart upload the builder filled through part URLs and checks
 * the object has the size the builder wrote. Repeatable: an attempt that
 * completed the upload and died before recording it (`completed` false) finds
 * the object by its size instead of failing. Null when the object is there,
 * else why not.
 */
export async function completeUpload(
  bucket: R2Bucket,
  key: string,
  uploadId: string,
  result: { parts: { partNumber: number; etag: string }[]; sizeBytes: number },
  completed: boolean,
): Promise<string | null> {
  if (!completed) {
    try {
      const upload = bucket.resumeMultipartUpload(key, uploadId);
      await upload.complete(result.parts.map((p) => ({ partNumber: p.partNumber, etag: p.etag.replace(/^"|"$/g, "") })));
    } catch (err) {
      const stored = await bucket.head(key);
      if (stored?.size !== result.sizeBytes) return `completing the upload failed: ${err instanceof Error ? err.message : String(err)}`;
    }
  }
  const stored = await bucket.head(key);
  return stored?.size === result.sizeBytes ? null : `stored archive has ${stored?.size ?? 0} bytes, the builder wrote ${result.sizeBytes}`;
}
