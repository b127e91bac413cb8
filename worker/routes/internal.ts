import { Hono, type MiddlewareHandler } from "hono";
import { PartUrlRequest } from "../../builder/src/protocol/disks";
import { JobStatus } from "../../builder/src/protocol/job-status";
import { NODE_ID_PATTERN, NodeHeartbeat, NodeMetricsReport, NodeRejoin } from "../../builder/src/protocol/node";
import { AppLogShipment, ProcessStatus } from "../../builder/src/protocol/processes";
import { HEADER_NODE, NonceCache, verifyRequest } from "../../builder/src/protocol/signing";
import { BlobsRequest } from "../../builder/src/protocol/static";
import type { AppEnv } from "../context";
import { LONE_BUILDER_ID, signingKey } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { appRuntimeStub } from "../services/app-runtime";
import { backupStub, restoreStub } from "../services/backups";
import { cronStub } from "../services/crons";
import { deploymentStub } from "../services/deployments";
import { recordDiskUsage } from "../services/disk-usage";
import { fleetStub, forgetFleet, nodeRef } from "../services/fleet";

/** Nonces of accepted callbacks, per isolate; handlers are idempotent, so this only trims replays. */
const seen = new NonceCache(10_000);

/**
 * Endpoints the builder calls back; not part of the public API (no API key,
 * not in the OpenAPI document). Every request must carry a valid HMAC signature.
 */
type InternalEnv = AppEnv & { Variables: { signedBody: unknown; node: string } };

export const internalRoutes = new Hono<InternalEnv>();

/**
 * Verifies the node's HMAC signature (with the key of the node its
 * `X-Svc-Node` names, which must be a member of the fleet; without the header,
 * the lone builder's BUILDER_SECRET) and nonce; leaves the verified JSON body
 * in `signedBody` and the node's id in `node`.
 */
const requireBuilderSignature: MiddlewareHandler<InternalEnv> = async (c, next) => {
  const config = c.get("config");
  const nodeId = c.req.header(HEADER_NODE) ?? LONE_BUILDER_ID;
  // Only "no such node" makes it a stranger: the fleet's view failing to load is an error the node retries
  // (its log shipper drops a shipment refused with 4xx, so a transient failure must not read as one).
  const member = NODE_ID_PATTERN.test(nodeId)
    ? await nodeRef(c.env, nodeId).catch((error: unknown) => {
        if (error instanceof ApiError && error.code === "NODE_NOT_FOUND") return null;
        throw error;
      })
    : null;
  const body = await c.req.text();
  const url = new URL(c.req.url);
  const verdict = !config.BUILDER_SECRET
    ? { ok: false as const, reason: "BUILDER_SECRET unset" }
    : nodeId !== LONE_BUILDER_ID && !member
      ? { ok: false as const, reason: `${nodeId} is not a member of the fleet` }
      : await verifyRequest({
          secret: await signingKey(config, nodeId),
          method: c.req.method,
          path: url.pathname + url.search,
          body,
          headers: c.req.raw.headers,
        });
  if (!verdict.ok || !seen.use(verdict.nonce, verdict.timestamp)) {
    throw new ApiError("UNAUTHORIZED", `invalid builder signature${verdict.ok ? " (replayed)" : `: ${verdict.reason}`}`);
  }
  try {
    c.set("signedBody", JSON.parse(body));
  } catch {
    throw new ApiError("VALIDATION_ERROR", "body is not JSON");
  }
  c.set("node", nodeId);
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

/**
 * A node that joined before joins again as itself (after a restart, or from
 * a new address): its signature is the proof, never a token.
 */
internalRoutes.post("/nodes/rejoin", async (c) => {
  const parsed = NodeRejoin.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", `rejoin body is not a node's description: ${parsed.error.issues[0]?.message ?? ""}`);
  const node = c.get("node");
  if (node === LONE_BUILDER_ID) throw new ApiError("FORBIDDEN", "a lone builder does not join; nodes rejoin with their own id");
  const result = await fleetStub(c.env).rejoin(node, parsed.data);
  if (!result.ok) throw new ApiError(result.code, result.message);
  forgetFleet();
  const config = c.get("config");
  return c.json(
    { nodeId: node, heartbeatSeconds: config.NODE_HEARTBEAT_SECONDS, appsDomain: config.APPS_DOMAIN, leaseSeconds: config.NODE_LEASE_SECONDS },
    200,
  );
});

/** A node's heartbeat: capacity, load and the disks it holds; the answer names copies to set aside. */
internalRoutes.post("/nodes/heartbeat", async (c) => {
  const parsed = NodeHeartbeat.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "heartbeat body is not a node heartbeat");
  const reply = await fleetStub(c.env).heartbeat(c.get("node"), parsed.data);
  if (!reply) throw new ApiError("NODE_NOT_FOUND", "this node is not a member of the fleet; join again");
  return c.json(reply, 200);
});

/**
 * Lines the node's apps' runtime logs gained, kept off the node by each app's
 * object (durable-objects/shipped-log.ts), which takes only what a node it
 * started a process of the app on sends.
 */
internalRoutes.post("/app-logs", async (c) => {
  const parsed = AppLogShipment.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "body is not an app log shipment");
  const node = c.get("node");
  await Promise.all(parsed.data.logs.map(({ appId, text }) => appRuntimeStub(c.env, appId).keepLog(node, text)));
  return c.body(null, 204);
});

/**
 * What a node's apps used (builder/src/node/metrics.ts): each app's processes
 * go to its object, which keeps only what a node it ran on says; each disk's
 * use is kept when this node holds the disk, and may send `disk.almost_full`.
 */
internalRoutes.post("/nodes/metrics", async (c) => {
  const parsed = NodeMetricsReport.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "body is not a node's metrics report");
  const node = c.get("node");
  const at = Date.now();
  const byApp = new Map<string, typeof parsed.data.processes>();
  for (const sample of parsed.data.processes) {
    const samples = byApp.get(sample.appId);
    if (samples) samples.push(sample);
    else byApp.set(sample.appId, [sample]);
  }
  await Promise.all([
    ...[...byApp].map(([appId, samples]) => appRuntimeStub(c.env, appId).recordUsage(node, at, samples)),
    recordDiskUsage(c.env, c.get("db"), node, at, parsed.data.disks),
  ]);
  return c.body(null, 204);
});

/** A state change of an app's process, routed to the app's object by the labels it gave the process. */
internalRoutes.post("/processes/callback", async (c) => {
  const parsed = ProcessStatus.safeParse(c.get("signedBody"));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "callback body is not a process status");
  const { appId } = parsed.data.labels;
  // Only the node running a process may say what it does.
  if (appId) await appRuntimeStub(c.env, appId).processChanged(parsed.data, c.get("node"));
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
