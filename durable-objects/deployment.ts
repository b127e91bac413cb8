import { and, eq, inArray } from "drizzle-orm";
import { type ReleaseTarget, ServerRuntime } from "../builder/src/protocol/processes";
import { type BlobsRequest, type BlobsResponse, GENERATED_WEB_SERVER_CONFIG_PATH } from "../builder/src/protocol/static";
import { accounts, apps, type DeploymentRow, deployments } from "../worker/db/schema";
import type { Env } from "../worker/env";
import { cancelJob, jobLog, type NodeRef, submitBuild } from "../worker/lib/builder-client";
import { builderShare } from "../worker/lib/plans";
import { isImmutable } from "../worker/sites/fingerprint";
import { parseHeadersFile } from "../worker/sites/headers";
import { blobKey, blobPrefix, type Manifest, manifestKey } from "../worker/sites/serve";
import { completeUpload } from "../worker/storage/objects";
import { placeStateless } from "../worker/services/placement";
import { presign, presignPart } from "../worker/storage/presign";
import { appRuntimeStub, runsProcess } from "../worker/services/app-runtime";
import { appChanged } from "../worker/services/cron-targets";
import { activateIfNewer, artifactKey, buildLogKey, pruneDeployments, RELEASE_PART_BYTES, releaseKey } from "../worker/services/deployments";
import { envOf } from "../worker/services/env-vars";
import { deploymentEvent } from "../worker/services/webhooks";
import { type Ending, failureOf, SingleBuilderJob } from "./single-job";

const HEADERS_FILE = "/_headers";

/** Heads run this many at a time when checking which blobs storage lacks. */
const HEAD_CONCURRENCY = 50;
/**
 * Blobs checked per invocation when a build finishes: with the few other
 * subrequests of a finish, well under Workers' 1,000 per invocation (free
 * plan); a bigger site is checked over several alarms.
 */
const VERIFY_PER_INVOCATION = 800;

/**
 * One object per deployment: drives the builder's static-site build (fetch
 * source, install, build, upload the blobs R2 lacks), checks that every blob
 * it handed out an upload URL for arrived, then publishes the manifest and
 * switches the app's active deployment in one UPDATE, forward only (an older
 * build finishing late never replaces a newer one). Keeps the last
 * {@link KEPT_DEPLOYMENTS} deployments for rollback.
 *
 * A deployment stays `queued` until the builder really starts its build (its
 * account may be at its plan's concurrency, or the builder full); then it is
 * `building`, with the builder's start as `startedAt`.
 */
export class Deployment extends SingleBuilderJob {
  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    // Blobs this deployment handed out upload URLs for: what must be in storage before it goes live.
    ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS issued (sha256 TEXT PRIMARY KEY, verified INTEGER NOT NULL DEFAULT 0)");
  }

  async start(deploymentId: string): Promise<void> {
    const kv = this.ctx.storage.kv;
    // Submitted once: a repeated start (the client retrying) changes nothing.
    if (kv.get("jobKey") !== undefined || kv.get("starting")) return;
    kv.put("starting", true);
    try {
      await this.submit(deploymentId);
    } finally {
      kv.delete("starting");
    }
  }

  private async submit(deploymentId: string): Promise<void> {
    const row = await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get();
    if (row?.status !== "queued" || row.startedAt !== null) return;
    const found = await this.db
      .select({ app: apps, plan: accounts.plan })
      .from(apps)
      .innerJoin(accounts, eq(accounts.id, apps.accountId))
      .where(eq(apps.id, row.appId))
      .get();
    if (!found) return;
    const { app, plan } = found;
    const kv = this.ctx.storage.kv;
    kv.put("deploymentId", deploymentId);
    kv.put("accountId", app.accountId);
    const config = this.config;
    let release: ReleaseTarget | undefined;
    if (runsProcess(app.runtime)) {
      const runtime = ServerRuntime.safeParse(app.runtime);
      if (!runtime.success) {
        await this.fail(`the ${app.runtime} runtime cannot be built: apps run as node, python or custom (any start command); create the app again with one of them`);
        return;
      }
      // The release goes into one multipart upload the builder fills through part URLs (as a snapshot does).
      if (!kv.get("releaseUploadId")) {
        const key = releaseKey(app.id, deploymentId);
        const upload = await this.env.BUCKET.createMultipartUpload(key, { httpMetadata: { contentType: "application/gzip" } });
        kv.put("releaseKey", key);
        kv.put("releaseUploadId", upload.uploadId);
      }
      release = {
        runtime: runtime.data,
        partUrlEndpoint: new URL(`/internal/deployments/${deploymentId}/release-part`, config.PUBLIC_URL).href,
        partSizeBytes: RELEASE_PART_BYTES,
      };
    }
    const source = await presign(config, { method: "GET", key: row.sourceKey, expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS });
    // Builds touch no disk: the least loaded ready node.
    let node: NodeRef;
    try {
      node = await placeStateless(this.env);
    } catch (err) {
      await this.fail(`the build could not start: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    const submitted = await submitBuild(config, node, {
      ...(release ? { release } : {}),
      key: deploymentId,
      tenant: app.accountId,
      app: app.id,
      sourceUrl: source.url,
      env: await envOf(this.db, config, app.id),
      // The app's memory limit (spec: OOMKilled when a build exceeds it), capped by the operator's maximum.
      memoryMb: Math.min(app.memoryMb, config.BUILD_MEMORY_MB),
      timeoutSeconds: config.BUILD_TIMEOUT_SECONDS,
      blobsEndpoint: new URL(`/internal/deployments/${deploymentId}/blobs`, config.PUBLIC_URL).href,
      callbackUrl: new URL("/internal/builder/callback", config.PUBLIC_URL).href,
      labels: { kind: "deployment", deploymentId },
      ...builderShare(plan),
    }).catch((err: unknown) => ({ ok: false as const, message: err instanceof Error ? err.message : String(err) }));
    if (submitted.ok) await this.db.update(deployments).set({ builderJobId: submitted.value.id }).where(eq(deployments.id, deploymentId));
    await this.submitted(deploymentId, node, submitted, "the build");
  }

  /**
   * Presigned PUTs for the blobs the account's storage lacks (asked for by the
   * builder, signed). Each URL signs the blob's length and SHA-256, so storage
   * accepts nothing but the bytes the hash names; blobs are shared only within
   * the account, so nothing tells one account what another has stored.
   */
  async missingBlobs(request: BlobsRequest): Promise<BlobsResponse> {
    const kv = this.ctx.storage.kv;
    const accountId = kv.get<string>("accountId");
    if (kv.get("finished") || kv.get("finishing") || !accountId) return { missing: [] };
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
        this.ctx.storage.sql.exec("INSERT INTO issued (sha256) VALUES (?) ON CONFLICT DO NOTHING", blob.sha256);
        missing.push({ sha256: blob.sha256, url });
      }
    }
    return { missing };
  }

  /** The builder started the build: `building` from now on, with its start (only from `queued`: a late report changes nothing). */
  protected override async started(startedAt: number): Promise<void> {
    const deploymentId = this.ctx.storage.kv.get<string>("deploymentId");
    if (!deploymentId) return;
    await this.db
      .update(deployments)
      .set({ status: "building", startedAt })
      .where(and(eq(deployments.id, deploymentId), eq(deployments.status, "queued")));
  }

  /** A presigned URL for one part of the release (asked for by the builder, signed). */
  async releasePartUrl(partNumber: number): Promise<string | null> {
    const kv = this.ctx.storage.kv;
    const key = kv.get<string>("releaseKey");
    const uploadId = kv.get<string>("releaseUploadId");
    if (!key || !uploadId || kv.get("finished") || kv.get("finishing")) return null;
    return presignPart(this.config, key, uploadId, partNumber);
  }

  /** A build is safe to repeat: one whose node was lost starts again, from the source, on another node. */
  protected override async retryElsewhere(): Promise<boolean> {
    const deploymentId = this.ctx.storage.kv.get<string>("deploymentId");
    if (!deploymentId) return false;
    const reset = await this.db
      .update(deployments)
      .set({ status: "queued", startedAt: null, builderJobId: null })
      .where(and(eq(deployments.id, deploymentId), inArray(deployments.status, ["queued", "building"])))
      .returning({ id: deployments.id });
    if (reset.length === 0) return false;
    this.forgetJob();
    console.log(JSON.stringify({ event: "deployment.rebuilt", deploymentId, why: "its node was lost" }));
    await this.submit(deploymentId);
    return true;
  }

  async cancel(): Promise<void> {
    const jobId = this.ctx.storage.kv.get<string>("jobId");
    const node = await this.jobNode();
    if (jobId && node) await cancelJob(this.config, node, jobId).catch(() => undefined);
  }

  protected maxRuntimeMs(): number {
    return this.config.BUILD_TIMEOUT_SECONDS * 1000 + 10 * 60_000;
  }

  protected async finish(ending: Ending): Promise<void> {
    const deploymentId = this.ctx.storage.kv.get<string>("deploymentId");
    const row = deploymentId ? await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get() : null;
    if (!row) return;
    const node = await this.jobNode();
    if ("id" in ending && node) {
      const log = await jobLog(this.config, node, ending.id).catch(() => null);
      if (log?.ok) await this.env.BUCKET.put(buildLogKey(row.id), log.value, { httpMetadata: { contentType: "text/plain; charset=utf-8" } });
    }
    const now = Date.now();
    // A build that ended before a poll saw it running still gets its start.
    const startedAt = row.startedAt ?? ("id" in ending && ending.startedAt !== null ? Date.parse(ending.startedAt) : null);
    const result = "id" in ending ? ending.result : null;
    if (result?.kind === "release" || this.ctx.storage.kv.get("releaseKey")) {
      await this.finishRelease(row, ending, startedAt, now);
      return;
    }
    let error = failureOf(ending);
    if (!error && result?.kind !== "build") error = "the builder reported no build result";
    if (error || result?.kind !== "build") {
      await this.ended(row.id, ending, error, startedAt, now);
      return;
    }
    await this.db
      .update(deployments)
      .set({
        status: "deploying",
        startedAt,
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
    // `_headers` configures the edge (DESIGN §6); like on Pages it is applied, not served.
    const prefix = blobPrefix(row.accountId);
    const headersFile = result.manifest.find((f) => f.path === HEADERS_FILE);
    const headersText = headersFile ? await (await this.env.BUCKET.get(blobKey(prefix, headersFile.sha256)))?.text() : undefined;
    const headers = headersText ? parseHeadersFile(headersText) : null;
    if (headers && !headers.ok) {
      // A file the edge would have to ignore in part is refused whole, before anything is published.
      const where = headers.line === null ? "_headers" : `_headers line ${headers.line}`;
      await this.db
        .update(deployments)
        .set({ status: "failed", error: `${where}: ${headers.message}`, finishedAt: Date.now() })
        .where(eq(deployments.id, row.id));
      await deploymentEvent(this.env, row.id, "failed");
      return;
    }
    const manifest: Manifest = {
      spa: result.spa,
      blobs: prefix,
      immutableMarked: true,
      files: Object.fromEntries(
        result.manifest
          .filter((f) => f.path !== HEADERS_FILE)
          .map((f) => [
            f.path,
            { sha256: f.sha256, size: f.size, contentType: f.contentType, ...(isImmutable(f.path, result.framework) ? { immutable: true } : {}) },
          ]),
      ),
      ...(headers ? { headers: headers.rules } : {}),
    };
    // Written now, read by the edge only once the app points at this deployment.
    await this.env.BUCKET.put(manifestKey(row.id), JSON.stringify(manifest), { httpMetadata: { contentType: "application/json" } });
    if (result.artifacts) {
      const text = { httpMetadata: { contentType: "text/plain; charset=utf-8" } };
      await this.env.BUCKET.put(artifactKey(row.id, "Dockerfile"), result.artifacts.dockerfile, text);
      await this.env.BUCKET.put(artifactKey(row.id, GENERATED_WEB_SERVER_CONFIG_PATH), result.artifacts.webServerConfig, text);
    }
    this.ctx.storage.kv.put("publishing", true);
    await this.publish();
  }

  /** A build that made nothing to publish: the deployment is `cancelled` (when it was) or `failed`, with why. */
  private async ended(id: string, ending: Ending, error: string | null, startedAt: number | null, now: number): Promise<void> {
    const cancelled = "id" in ending && ending.status === "cancelled";
    await this.db
      .update(deployments)
      .set({ status: cancelled ? "cancelled" : "failed", error, startedAt, finishedAt: now })
      .where(eq(deployments.id, id));
    if (!cancelled) await deploymentEvent(this.env, id, "failed");
  }

  /**
   * An app that runs: completes the release's upload, records the release and
   * how to run it, and hands it to the app's AppRuntime object, which starts it
   * and moves the traffic once it is ready (or fails the deployment). Repeatable.
   */
  private async finishRelease(row: DeploymentRow, ending: Ending, startedAt: number | null, now: number): Promise<void> {
    const kv = this.ctx.storage.kv;
    const key = kv.get<string>("releaseKey")!;
    const uploadId = kv.get<string>("releaseUploadId")!;
    const result = "id" in ending ? ending.result : null;
    let error = failureOf(ending);
    if (!error && result?.kind !== "release") error = "the builder reported no release";
    if (!error && result?.kind === "release") {
      error = await completeUpload(this.env.BUCKET, key, uploadId, result, kv.get("releaseCompleted") === true);
      if (!error) kv.put("releaseCompleted", true);
    }
    if (error || result?.kind !== "release") {
      if (!kv.get("releaseCompleted")) await this.env.BUCKET.resumeMultipartUpload(key, uploadId).abort().catch(() => undefined);
      await this.env.BUCKET.delete(key);
      await this.ended(row.id, ending, error, startedAt, now);
      return;
    }
    await this.db
      .update(deployments)
      .set({
        status: "deploying",
        startedAt,
        builtAt: now,
        fileCount: result.files,
        totalBytes: result.expandedBytes,
        peakMemoryBytes: result.peakMemoryBytes,
        releaseKey: key,
        releaseSha256: result.sha256,
        releaseBytes: result.sizeBytes,
        processType: result.type,
        startCommand: result.startCommand,
        port: result.port,
        healthCheckPath: result.healthCheckPath,
        startTimeoutSeconds: result.startTimeoutSeconds,
        minReadySeconds: result.minReadySeconds,
        overlap: result.overlap,
        instances: result.instances,
      })
      .where(and(eq(deployments.id, row.id), eq(deployments.status, "building")));
    await appRuntimeStub(this.env, row.appId).release(row.appId, row.id);
    await pruneDeployments(this.env, this.db, row.appId, row.id);
  }

  override async alarm(): Promise<void> {
    if (this.ctx.storage.kv.get("publishing")) await this.publish();
    else await super.alarm();
  }

  /**
   * Checks the uploaded blobs arrived (each was stored only under its own
   * SHA-256), {@link VERIFY_PER_INVOCATION} per invocation, continuing in the
   * next alarm; then marks the deployment ready and moves the app to it.
   */
  private async publish(): Promise<void> {
    const deploymentId = this.ctx.storage.kv.get<string>("deploymentId");
    const row = deploymentId ? await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get() : null;
    if (row?.status !== "deploying") {
      this.ctx.storage.kv.delete("publishing");
      return;
    }
    const prefix = blobPrefix(row.accountId);
    const batch = this.ctx.storage.sql
      .exec<{ sha256: string }>("SELECT sha256 FROM issued WHERE verified = 0 LIMIT ?", VERIFY_PER_INVOCATION)
      .toArray();
    const absent: string[] = [];
    for (let i = 0; i < batch.length; i += HEAD_CONCURRENCY) {
      const slice = batch.slice(i, i + HEAD_CONCURRENCY);
      const heads = await Promise.all(slice.map((b) => this.env.BUCKET.head(blobKey(prefix, b.sha256))));
      for (const [j, blob] of slice.entries()) {
        if (heads[j]) this.ctx.storage.sql.exec("UPDATE issued SET verified = 1 WHERE sha256 = ?", blob.sha256);
        else absent.push(blob.sha256);
      }
    }
    if (absent.length > 0) {
      const error = `${absent.length} file(s) never reached storage (blobs ${absent.slice(0, 3).join(", ")})`;
      await this.db.update(deployments).set({ status: "failed", error, finishedAt: Date.now() }).where(eq(deployments.id, row.id));
      await deploymentEvent(this.env, row.id, "failed");
      this.ctx.storage.kv.delete("publishing");
      return;
    }
    if (batch.length === VERIFY_PER_INVOCATION) {
      await this.ctx.storage.setAlarm(Date.now());
      return;
    }
    await this.db
      .update(deployments)
      .set({ status: "ready", manifestKey: manifestKey(row.id), finishedAt: Date.now() })
      .where(eq(deployments.id, row.id));
    await deploymentEvent(this.env, row.id, "succeeded");
    if (await activateIfNewer(this.db, row)) {
      // The app's cron runs work in the active deployment's source.
      await appChanged(this.env, this.db, row.appId);
      await pruneDeployments(this.env, this.db, row.appId, row.id);
    }
    this.ctx.storage.kv.delete("publishing");
  }

}
