import { and, desc, eq, inArray, isNull, or, sql } from "drizzle-orm";
import { GENERATED_WEB_SERVER_CONFIG_PATH } from "../../builder/src/protocol/static";
import type { Db } from "../db/client";
import { type AppRow, apps, type DeploymentRow, deployments } from "../db/schema";
import type { Config, Env } from "../env";
import { ApiError } from "../lib/errors";
import { newId } from "../lib/ids";
import { iso, isoOrNull } from "../lib/time";
import { manifestKey } from "../sites/serve";
import { presign } from "../storage/presign";
import { appRuntimeStub, runsProcess } from "./app-runtime";
import { appUrl, resolveApp } from "./apps";

/** Most progress lines a deployment keeps (its narration, oldest dropped first). */
const PROGRESS_LINES = 50;

/** Appends one step of a deployment's progress (`svc deploy` narrates them). */
export async function noteProgress(db: Db, deploymentId: string, text: string, at = Date.now()): Promise<void> {
  const row = await db.select({ progress: deployments.progress }).from(deployments).where(eq(deployments.id, deploymentId)).get();
  if (!row) return;
  const progress = [...(row.progress ?? []), { at, text }].slice(-PROGRESS_LINES);
  await db.update(deployments).set({ progress }).where(eq(deployments.id, deploymentId));
}

/** Deployments kept per app for instant rollback (issue: the last 10). */
export const KEPT_DEPLOYMENTS = 10;

export const sourceKey = (appId: string, deploymentId: string) => `sources/${appId}/${deploymentId}.tar.gz`;
export const buildLogKey = (deploymentId: string) => `deploy-logs/${deploymentId}.log`;
/** An app's release (the built tree with its dependencies, one `.tar.gz`), immutable, named by its deployment. */
export const releaseKey = (appId: string, deploymentId: string) => `releases/${appId}/${deploymentId}.tar.gz`;
/** Release parts: above R2's 5 MiB minimum, small enough that a small app's release is one part. */
export const RELEASE_PART_BYTES = 16 * 1024 * 1024;
/** Generated when the project has no container build file (spec rule 2). */
export const ARTIFACTS = ["Dockerfile", GENERATED_WEB_SERVER_CONFIG_PATH] as const;
export type ArtifactName = (typeof ARTIFACTS)[number];
export const artifactKey = (deploymentId: string, name: ArtifactName) => `artifacts/${deploymentId}/${name}`;

export type DeploymentView = {
  id: string;
  appId: string;
  status: DeploymentRow["status"];
  /** Why a `queued` deployment has not started building (the builder holds it for a slot), in words; null otherwise. */
  waiting: string | null;
  active: boolean;
  cause: string | null;
  /** One line: why it failed. */
  error: string | null;
  /** With a failed start, the process's last lines. */
  logExcerpt: string[] | null;
  progress: { at: string; text: string }[];
  processId: string | null;
  /** Static sites only (absent for an app that runs). */
  framework?: string | null;
  outputDir?: string | null;
  spa?: boolean | null;
  uploadedBlobs?: number | null;
  fileCount: number | null;
  totalBytes: number | null;
  peakMemoryBytes: number | null;
  release: { type: "web" | "worker"; startCommand: string; port: number | null; healthCheckPath: string | null; sizeBytes: number } | null;
  url: string | null;
  createdAt: string;
  startedAt: string | null;
  builtAt: string | null;
  finishedAt: string | null;
  buildMs: number | null;
};

export function deploymentView(config: Config, app: AppRow, row: DeploymentRow, waiting: string | null = null): DeploymentView {
  const site = !runsProcess(app.runtime);
  return {
    id: row.id,
    appId: row.appId,
    status: row.status,
    waiting: row.status === "queued" ? waiting : null,
    active: app.activeDeploymentId === row.id,
    cause: row.cause,
    error: row.error,
    logExcerpt: row.logExcerpt,
    progress: (row.progress ?? []).map((step) => ({ at: iso(step.at), text: step.text })),
    processId: row.processId,
    ...(site ? { framework: row.framework, outputDir: row.outputDir, spa: row.spa, uploadedBlobs: row.uploadedBlobs } : {}),
    fileCount: row.fileCount,
    totalBytes: row.totalBytes,
    peakMemoryBytes: row.peakMemoryBytes,
    release:
      row.releaseKey && row.startCommand && row.releaseBytes !== null
        ? {
            type: row.processType ?? "web",
            startCommand: app.startCommand ?? row.startCommand,
            port: row.port,
            healthCheckPath: row.processType === "worker" ? null : (app.healthCheckPath ?? row.healthCheckPath),
            sizeBytes: row.releaseBytes,
          }
        : null,
    url: row.processType === "worker" ? null : appUrl(config, app.name),
    createdAt: iso(row.createdAt),
    startedAt: isoOrNull(row.startedAt),
    builtAt: isoOrNull(row.builtAt),
    finishedAt: isoOrNull(row.finishedAt),
    buildMs: row.startedAt !== null && row.builtAt !== null ? row.builtAt - row.startedAt : null,
  };
}

export const deploymentStub = (env: Env, id: string) => env.DEPLOYMENT.get(env.DEPLOYMENT.idFromName(id));

/**
 * Deployments as the API shows them: one handed to the builder and still
 * `queued` asks its object why it waits (in parallel); the rest need nothing.
 */
export async function deploymentViews(env: Env, config: Config, app: AppRow, rows: DeploymentRow[]): Promise<DeploymentView[]> {
  return Promise.all(
    rows.map(async (row) => {
      const submitted = row.status === "queued" && row.builderJobId !== null;
      const waiting = submitted ? ((await deploymentStub(env, row.id).progress())?.waiting ?? null) : null;
      return deploymentView(config, app, row, waiting);
    }),
  );
}

/** A deployment waiting for its source, with a presigned PUT signed for exactly `sizeBytes`. */
export async function createDeployment(
  db: Db,
  config: Config,
  app: AppRow,
  sizeBytes: number,
): Promise<{ row: DeploymentRow; uploadUrl: string; expiresAt: number }> {
  if (sizeBytes > config.MAX_BUILD_UPLOAD_BYTES) {
    throw new ApiError(
      "PAYLOAD_TOO_LARGE",
      `the source archive is ${sizeBytes} bytes; build uploads are limited to ${config.MAX_BUILD_UPLOAD_BYTES} bytes (leave out node_modules, build output and large assets)`,
    );
  }
  const id = newId("deployment");
  const key = sourceKey(app.id, id);
  const upload = await presign(config, {
    method: "PUT",
    key,
    expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS,
    contentLength: sizeBytes,
  });
  const row: DeploymentRow = {
    id,
    accountId: app.accountId,
    appId: app.id,
    status: "queued",
    error: null,
    sourceKey: key,
    sourceSizeBytes: sizeBytes,
    uploadExpiresAt: upload.expiresAt,
    framework: null,
    outputDir: null,
    spa: null,
    manifestKey: null,
    fileCount: null,
    totalBytes: null,
    uploadedBlobs: null,
    peakMemoryBytes: null,
    builderJobId: null,
    releaseKey: null,
    releaseSha256: null,
    releaseBytes: null,
    processType: null,
    startCommand: null,
    port: null,
    healthCheckPath: null,
    startTimeoutSeconds: null,
    minReadySeconds: null,
    overlap: null,
    instances: null,
    cause: null,
    configVersion: null,
    processId: null,
    progress: null,
    logExcerpt: null,
    createdAt: Date.now(),
    startedAt: null,
    builtAt: null,
    finishedAt: null,
  };
  await db.insert(deployments).values(row);
  return { row, uploadUrl: upload.url, expiresAt: upload.expiresAt };
}

export async function resolveDeployment(db: Db, app: AppRow, id: string): Promise<DeploymentRow> {
  const row = await db
    .select()
    .from(deployments)
    .where(and(eq(deployments.id, id), eq(deployments.appId, app.id)))
    .get();
  if (!row) throw new ApiError("DEPLOYMENT_NOT_FOUND", `deployment ${id} not found`);
  return row;
}

/** The app (by id or name, in the account) and one of its deployments; 404 for either. */
export async function resolveAppDeployment(db: Db, accountId: string, appRef: string, id: string) {
  const app = await resolveApp(db, accountId, appRef);
  return { app, row: await resolveDeployment(db, app, id) };
}

export async function listDeployments(db: Db, appId: string): Promise<DeploymentRow[]> {
  return db.select().from(deployments).where(eq(deployments.appId, appId)).orderBy(desc(deployments.createdAt), desc(deployments.id));
}

/**
 * Checks the source arrived whole, then hands the deployment to its Durable
 * Object. It stays `queued` until the builder starts the build (a slot of the
 * account's plan, or of the builder, may not be free yet).
 */
export async function startDeployment(db: Db, env: Env, row: DeploymentRow): Promise<DeploymentRow> {
  if (row.status !== "queued" || row.startedAt !== null || row.builderJobId !== null) return row;
  const source = await env.BUCKET.head(row.sourceKey);
  if (!source) {
    if (Date.now() > row.uploadExpiresAt) {
      throw new ApiError("PRESIGNED_URL_EXPIRED", "the upload URL expired before the source was uploaded; create a new deployment");
    }
    throw new ApiError("UPLOAD_INCOMPLETE", "the source archive was not uploaded yet; PUT it to the uploadUrl first");
  }
  if (source.size !== row.sourceSizeBytes) {
    throw new ApiError("UPLOAD_INCOMPLETE", `the uploaded source has ${source.size} bytes, ${row.sourceSizeBytes} were announced`);
  }
  await deploymentStub(env, row.id).start(row.id);
  return (await db.select().from(deployments).where(eq(deployments.id, row.id)).get()) ?? row;
}

/**
 * Points the app at a ready deployment a new build just finished, but only
 * forward: when a newer deployment (created later) is already active, the app
 * keeps it and this one stays ready for an explicit activation. One
 * conditional UPDATE, so two builds finishing together cannot both win.
 * True when the app now serves this deployment.
 */
export async function activateIfNewer(db: Db, row: DeploymentRow): Promise<boolean> {
  const activeCreatedAt = db
    .select({ createdAt: deployments.createdAt })
    .from(deployments)
    .where(eq(deployments.id, apps.activeDeploymentId));
  const switched = await db
    .update(apps)
    .set({ activeDeploymentId: row.id, updatedAt: sql`max(${apps.updatedAt} + 1, ${Date.now()})` })
    .where(
      and(
        eq(apps.id, row.appId),
        or(
          isNull(apps.activeDeploymentId),
          sql`coalesce((${activeCreatedAt}), 0) < ${row.createdAt}`,
          and(sql`(${activeCreatedAt}) = ${row.createdAt}`, sql`${apps.activeDeploymentId} < ${row.id}`),
        ),
      ),
    )
    .returning({ id: apps.id });
  return switched.length > 0;
}

/** Points the app at a ready deployment the user chose (a rollback, or forward again): one UPDATE, so the switch is atomic. */
export async function activateDeployment(db: Db, env: Env, app: AppRow, row: DeploymentRow): Promise<AppRow> {
  if (row.status !== "ready" || !(row.manifestKey || row.releaseKey)) {
    throw new ApiError("DEPLOYMENT_NOT_READY", `deployment ${row.id} is ${row.status}; only ready deployments can be activated`);
  }
  if (row.releaseKey) {
    // A release is started again (no rebuild) and takes the traffic once ready, as a new deployment does.
    await db.update(deployments).set({ status: "deploying", error: null }).where(eq(deployments.id, row.id));
    await appRuntimeStub(env, app.id).release(app.id, row.id);
    return (await db.select().from(apps).where(eq(apps.id, app.id)).get()) ?? app;
  }
  const [updated] = await db
    .update(apps)
    .set({ activeDeploymentId: row.id, updatedAt: Date.now() })
    .where(eq(apps.id, app.id))
    .returning();
  return updated ?? app;
}

/**
 * Drops deployments beyond the newest {@link KEPT_DEPLOYMENTS} (never the
 * active one, nor `keepId`) with their objects; a source or release that a
 * kept deployment shares (a configuration change reuses its release, a static
 * site's its source) stays.
 */
export async function pruneDeployments(env: Env, db: Db, appId: string, keepId: string): Promise<void> {
  const serving = await db.select({ id: apps.activeDeploymentId }).from(apps).where(eq(apps.id, appId)).get();
  const all = await db
    .select({ id: deployments.id, sourceKey: deployments.sourceKey, releaseKey: deployments.releaseKey })
    .from(deployments)
    .where(eq(deployments.appId, appId))
    .orderBy(desc(deployments.createdAt), desc(deployments.id));
  const protectedIds = new Set([keepId, serving?.id ?? keepId]);
  const old = all.filter((d) => !protectedIds.has(d.id)).slice(KEPT_DEPLOYMENTS - 1);
  if (old.length === 0) return;
  const oldIds = new Set(old.map((d) => d.id));
  const kept = all.filter((d) => !oldIds.has(d.id));
  const stillUsed = new Set(kept.flatMap((d) => [d.sourceKey, d.releaseKey].filter((key): key is string => key !== null)));
  await env.BUCKET.delete(
    old.flatMap((d) => [
      ...[d.sourceKey, d.releaseKey].filter((key): key is string => key !== null && !stillUsed.has(key)),
      manifestKey(d.id),
      buildLogKey(d.id),
      ...ARTIFACTS.map((name) => artifactKey(d.id, name)),
    ]),
  );
  for (let i = 0; i < old.length; i += 90) await db.delete(deployments).where(inArray(deployments.id, old.slice(i, i + 90).map((d) => d.id)));
}
