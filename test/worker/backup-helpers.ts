import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import type { JobStatus } from "../../builder/src/protocol/job-status";
import { newId, randomBase62 } from "../../worker/lib/ids";
import { backupStub } from "../../worker/services/backups";

/**
 * A backup whose snapshot the builder has finished, as its object sees it:
 * row `creating`, a multipart upload holding the archive's part (written
 * through the R2 binding, as the builder's presigned PUT would), and the
 * builder's final status to hand it. Made by hand because the Worker suites'
 * storage URLs lead nowhere (no HTTP listener); the end-to-end suite does it
 * for real.
 */
export async function finishedSnapshot(
  accountId: string,
  diskId: string,
  options: { automatic?: boolean; description?: string } = {},
): Promise<{ backupId: string; status: JobStatus; objectKey: string }> {
  const backupId = newId("backup");
  const objectKey = `backups/${diskId}/${backupId}.tar.gz`;
  await env.DB.prepare(
    "INSERT INTO backups (id, account_id, disk_id, status, description, automatic, reserved_bytes, object_key, created_at) VALUES (?, ?, ?, 'creating', ?, ?, 65536, ?, ?)",
  )
    .bind(backupId, accountId, diskId, options.description ?? "made by a test", options.automatic ? 1 : 0, objectKey, Date.now())
    .run();
  const upload = await env.BUCKET.createMultipartUpload(objectKey);
  const bytes = new TextEncoder().encode("a tar.gz, as far as this test is concerned");
  const part = await upload.uploadPart(1, bytes);
  const jobId = `job_${randomBase62(24)}`;
  await runInDurableObject(backupStub(env, backupId), (_i, state) => {
    state.storage.kv.put("backupId", backupId);
    state.storage.kv.put("objectKey", objectKey);
    state.storage.kv.put("multipartUploadId", upload.uploadId);
    state.storage.kv.put("jobId", jobId);
  });
  const now = new Date().toISOString();
  const status: JobStatus = {
    id: jobId,
    key: backupId,
    status: "succeeded",
    reason: null,
    exitCode: null,
    signal: null,
    error: null,
    peakMemoryBytes: 0,
    logBytes: 0,
    logTruncated: false,
    createdAt: now,
    startedAt: now,
    finishedAt: now,
    labels: { kind: "backup", backupId },
    result: { kind: "snapshot", sizeBytes: bytes.byteLength, sha256: "b".repeat(64), parts: [{ partNumber: 1, etag: `"${part.etag}"` }], entries: 1, expandedBytes: 512 },
  };
  return { backupId, status, objectKey };
}
