import { Hono, type MiddlewareHandler } from "hono";
import { BlobsRequest, JobStatus, NonceCache, PartUrlRequest, ProcessStatus, verifyRequest } from "../../builder/src/protocol";
import type { AppEnv } from "../context";
import { ApiError } from "../lib/errors";
import { appRuntimeStub } from "../services/app-runtime";
import { backupStub, restoreStub } from "../services/backups";
import { cronStub } from "../services/crons";
import { deploymentStub } from "../services/deployments";

/** Nonces of accepted callbacks, per isolate; handlers are idempotent, so this only trims replays. */
const seen = new NonceCache(10_000);

/**
 * Endpoints the builder calls back; not part of the public API (no API key,
 * not in the OpenAPI document). Every request must carry a valid HMAC signature.
 */
export const internalRoutes = new Hono<AppEnv & { Variables: { signedBody: unknown } }>();

/** Verifies the builder's HMAC signature and nonce; leaves the verified JSON body in `signedBody`. */
const requireBuilderSignature: MiddlewareHandler<AppEnv & { Variables: { signedBody: unknown } }> = async (c, next) => {
  const secret = c.get("config").BUILDER_SECRET;
  const body = await c.req.text();
  const url = new URL(c.req.url);
  const verdict = secret
    ? await verifyRequest({ secret, method: c.req.method, path: url.pathname + url.search, body, headers: c.req.raw.headers })
    : { ok: false as const, reason: "BUILDER_SECRET unset" };
  if (!verdict.ok || !seen.use(verdict.nonce, verdict.timestamp)) {
    throw new ApiError("UNAUTHORIZED", `invalid builder signature${verdict.ok ? " (replayed)" : `: ${verdict.reason}`}`);
  }
  try {
    c.set("signedBody", JSON.parse(body));
  } catch {
    throw new ApiError("VALIDATION_ERROR", "body is not JSON");
  }
  await next();
};

internalRoutes.use("*", requireBuilderSignature);

/** Completion of any builder job, routed by the labels its owner gave it. */
internalRoutes.post("/builder/callback", async (c) => {
  const parsed = JobStatus.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "callback body is not a job status");
  const status = parsed.data;
  const { kind, cronId, backupId, restoreId, deploymentId } = status.labels;
  if (kind === "cron" && cronId) await cronStub(c.env, cronId).jobFinished(status);
  else if (kind === "backup" && backupId) await backupStub(c.env, backupId).jobFinished(status);
  else if (kind === "restore" && restoreId) await restoreStub(c.env, restoreId).jobFinished(status);
  else if (kind === "deployment" && deploymentId) await deploymentStub(c.env, deploymentId).jobFinished(status);
  return c.body(null, 204);
});

/** A state change of an app's process, routed to the app's object by the labels it gave the process. */
internalRoutes.post("/processes/callback", async (c) => {
  const parsed = ProcessStatus.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "callback body is not a process status");
  const { appId } = parsed.data.labels;
  if (appId) await appRuntimeStub(c.env, appId).processChanged(parsed.data);
  return c.body(null, 204);
});

/** The builder asks for one presigned part URL at a time while it streams a snapshot. */
internalRoutes.post("/backups/:backupId/part-url", async (c) => {
  const parsed = PartUrlRequest.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "partNumber must be an integer from 1 to 10000");
  const url = await backupStub(c.env, c.req.param("backupId")).partUrl(parsed.data.partNumber);
  if (!url) throw new ApiError("BACKUP_NOT_FOUND", "no snapshot upload in progress for this backup");
  return c.json({ url });
});

/** The builder names a build's blobs; the answer lists presigned PUTs for those storage lacks. */
internalRoutes.post("/deployments/:deploymentId/blobs", async (c) => {
  const parsed = BlobsRequest.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "body must be {blobs: [{sha256, size, contentType}]} (at most 500)");
  return c.json(await deploymentStub(c.env, c.req.param("deploymentId")).missingBlobs(parsed.data));
});

/** The builder asks for one presigned part URL at a time while it uploads a release. */
internalRoutes.post("/deployments/:deploymentId/release-part", async (c) => {
  const parsed = PartUrlRequest.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "partNumber must be an integer from 1 to 10000");
  const url = await deploymentStub(c.env, c.req.param("deploymentId")).releasePartUrl(parsed.data.partNumber);
  if (!url) throw new ApiError("DEPLOYMENT_NOT_FOUND", "no release upload in progress for this deployment");
  return c.json({ url });
});
