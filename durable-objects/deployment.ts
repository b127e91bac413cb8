import { and, desc, eq, inArray, ne } from "drizzle-orm";
import { type BlobsRequest, type BlobsResponse, GENERATED_WEB_SERVER_CONFIG_PATH, type JobStatus } from "../builder/src/protocol";
import { apps, deployments } from "../worker/db/schema";
import { cancelJob, jobLog, submitBuild } from "../worker/lib/builder-client";
import { parseHeadersFile } from "../worker/sites/headers";
import { blobKey, blobPrefix, type Manifest, manifestKey } from "../worker/sites/serve";
import { presign } from "../worker/storage/presign";
import { ARTIFACTS, artifactKey, buildLogKey, KEPT_DEPLOYMENTS } from "../worker/services/deployments";
import { envOf } from "../worker/services/env-vars";
import { failureOf, SingleBuilderJob } from "./single-job";

const HEADERS_FILE = "/_headers";

/** Heads run this many at a time when checking which blobs storage lacks. */
const HEAD_CONCURRENCY = 50;

/**
 * One object per deployment: drives the builder's static-site build (fetch
 * source, install, build, upload the blobs R2 lacks), then publishes the
 * manifest and switches the app's active deployment in one UPDATE. Keeps the
 * last {@link KEPT_DEPLOYMENTS} deployments for rollback.
 */
export class Deployment extends SingleBuilderJob {
  async start(deploymentId: string): Promise<void> {
    const row = await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get();
    if (row?.status !== "queued" || row.startedAt !== null) return;
    const app = await this.db.select().from(apps).where(eq(apps.id, row.appId)).get();
    if (!app) return;
    await this.ctx.storage.put({ deploymentId, accountId: app.accountId });
    const now = Date.now();
    await this.db.update(deployments).set({ status: "building", startedAt: now }).where(eq(deployments.id, deploymentId));
    const config = this.config;
    const source = await presign(config, { method: "GET", key: row.sourceKey, expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS });
    const submitted = await submitBuild(config, {
      tenant: app.accountId,
      sourceUrl: source.url,
      env: await envOf(this.db, config, app.id),
      // The app's memory limit (spec: OOMKilled when a build exceeds it), capped by the operator's maximum.
      memoryMb: Math.min(app.memoryMb, config.BUILD_MEMORY_MB),
      timeoutSeconds: config.BUILD_TIMEOUT_SECONDS,
      blobsEndpoint: new URL(`/internal/deployments/${deploymentId}/blobs`, config.PUBLIC_URL).href,
      callbackUrl: new URL("/internal/builder/callback", config.PUBLIC_URL).href,
      labels: { kind: "deployment", deploymentId },
    }).catch((err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }));
    if (!submitted.ok) {
      await this.fail(`the builder could not start the build: ${submitted.message}`);
      return;
    }
    await this.db.update(deployments).set({ builderJobId: submitted.value.id }).where(eq(deployments.id, deploymentId));
    await this.watch(submitted.value.id);
  }

  /**
   * Presigned PUTs for the blobs the account's storage lacks (asked for by the
   * builder, signed). Each URL signs the blob's length and SHA-256, so storage
   * accepts nothing but the bytes the hash names; blobs are shared only within
   * the account, so nothing tells one account what another has stored.
   */
  async missingBlobs(request: BlobsRequest): Promise<BlobsResponse> {
    const [finished, accountId] = await Promise.all([
      this.ctx.storage.get<boolean>("finished"),
      this.ctx.storage.get<string>("accountId"),
    ]);
    if (finished || !accountId) return { missing: [] };
    const prefix = blobPrefix(accountId);
    const unique = [...new Map(request.blobs.map((b) => [b.sha256, b])).values()];
    const missing: BlobsResponse["missing"] = [];
    for (let i = 0; i < unique.length; i += HEAD_CONCURRENCY) {
      const batch = unique.slice(i, i + HEAD_CONCURRENCY);
      const heads = await Promise.all(batch.map((b) => this.env.BUCKET.head(blobKey(prefix, b.sha256))));
      for (const [j, blob] of batch.entries()) {
        if (heads[j]?.size === blob.size) continue;
        const { url } = await presign(this.config, {
          method: "PUT",
          key: blobKey(prefix, blob.sha256),
          expiresInSeconds: this.config.PRESIGNED_URL_TTL_SECONDS,
          contentLength: blob.size,
          sha256: blob.sha256,
        });
        missing.push({ sha256: blob.sha256, url });
      }
    }
    return { missing };
  }

  async cancel(): Promise<void> {
    const jobId = await this.ctx.storage.get<string>("jobId");
    if (jobId) await cancelJob(this.config, jobId).catch(() => undefined);
  }

  protected maxRuntimeMs(): number {
    return this.config.BUILD_TIMEOUT_SECONDS * 1000 + 10 * 60_000;
  }

  protected async finish(status: JobStatus | { error: string }): Promise<void> {
    const deploymentId = await this.ctx.storage.get<string>("deploymentId");
    const row = deploymentId ? await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get() : null;
    if (!row) return;
    if ("id" in status) {
      const log = await jobLog(this.config, status.id).catch(() => null);
      if (log?.ok) await this.env.BUCKET.put(buildLogKey(row.id), log.value, { httpMetadata: { contentType: "text/plain; charset=utf-8" } });
    }
    const now = Date.now();
    const result = "id" in status ? status.result : null;
    let error = failureOf(status);
    if (!error && result?.kind !== "build") error = "the builder reported no build result";
    if (error || result?.kind !== "build") {
      const cancelled = "id" in status && status.status === "cancelled";
      await this.db
        .update(deployments)
        .set({ status: cancelled ? "cancelled" : "failed", error, finishedAt: now })
        .where(eq(deployments.id, row.id));
      return;
    }
    await this.db
      .update(deployments)
      .set({
        status: "deploying",
        builtAt: now,
        framework: result.framework,
        outputDir: result.outputDir,
        spa: result.spa,
        fileCount: result.manifest.length,
        totalBytes: result.manifest.reduce((sum, f) => sum + f.size, 0),
        uploadedBlobs: result.uploadedBlobs,
        peakMemoryBytes: result.peakMemoryBytes,
      })
      .where(eq(deployments.id, row.id));
    const absent = [];
    for (let i = 0; i < result.manifest.length; i += HEAD_CONCURRENCY) {
      const batch = result.manifest.slice(i, i + HEAD_CONCURRENCY);
      const heads = await Promise.all(batch.map((f) => this.env.BUCKET.head(blobKey(blobPrefix(row.accountId), f.sha256))));
      absent.push(...batch.filter((_, j) => !heads[j]).map((f) => f.path));
    }
    if (absent.length > 0) {
      const error = `${absent.length} file(s) never reached storage, e.g. ${absent.slice(0, 3).join(", ")}`;
      await this.db.update(deployments).set({ status: "failed", error, finishedAt: Date.now() }).where(eq(deployments.id, row.id));
      return;
    }
    // `_headers` configures the edge (DESIGN §6); like on Pages it is applied, not served.
    const headersFile = result.manifest.find((f) => f.path === HEADERS_FILE);
    const headersText = headersFile
      ? await (await this.env.BUCKET.get(blobKey(blobPrefix(row.accountId), headersFile.sha256)))?.text()
      : undefined;
    const manifest: Manifest = {
      spa: result.spa,
      blobs: blobPrefix(row.accountId),
      files: Object.fromEntries(
        result.manifest
          .filter((f) => f.path !== HEADERS_FILE)
          .map((f) => [f.path, { sha256: f.sha256, size: f.size, contentType: f.contentType }]),
      ),
      ...(headersText ? { headers: parseHeadersFile(headersText) } : {}),
    };
    const key = manifestKey(row.id);
    await this.env.BUCKET.put(key, JSON.stringify(manifest), { httpMetadata: { contentType: "application/json" } });
    if (result.artifacts) {
      const text = { httpMetadata: { contentType: "text/plain; charset=utf-8" } };
      await this.env.BUCKET.put(artifactKey(row.id, "Dockerfile"), result.artifacts.dockerfile, text);
      await this.env.BUCKET.put(artifactKey(row.id, GENERATED_WEB_SERVER_CONFIG_PATH), result.artifacts.webServerConfig, text);
    }
    await this.db.batch([
      this.db.update(deployments).set({ status: "ready", manifestKey: key, finishedAt: Date.now() }).where(eq(deployments.id, row.id)),
      this.db.update(apps).set({ activeDeploymentId: row.id, updatedAt: Date.now() }).where(eq(apps.id, row.appId)),
    ]);
    await this.prune(row.appId, row.id);
  }

  /** Drops deployments beyond the newest {@link KEPT_DEPLOYMENTS} (never the active one) with their objects. */
  private async prune(appId: string, activeId: string): Promise<void> {
    const old = await this.db
      .select({ id: deployments.id, sourceKey: deployments.sourceKey })
      .from(deployments)
      .where(and(eq(deployments.appId, appId), ne(deployments.id, activeId)))
      .orderBy(desc(deployments.createdAt))
      .offset(KEPT_DEPLOYMENTS - 1)
      .limit(100);
    if (old.length === 0) return;
    await this.env.BUCKET.delete(
      old.flatMap((d) => [
        d.sourceKey,
        manifestKey(d.id),
        buildLogKey(d.id),
        ...ARTIFACTS.map((name) => artifactKey(d.id, name)),
      ]),
    );
    await this.db.delete(deployments).where(inArray(deployments.id, old.map((d) => d.id)));
  }
}
