import { eq } from "drizzle-orm";
import type { Db } from "../db/client";
import { type AppRow, apps, type DeploymentRow, deployments } from "../db/schema";
import type { Env } from "../env";
import { newId } from "../lib/ids";
import { appRuntimeStub, runsProcess } from "./app-runtime";
import { appChanged } from "./cron-targets";
import { noteProgress, pruneDeployments, startDeployment } from "./deployments";

/**
 * A change of an app's configuration reaches the app (DESIGN §11, issue 29):
 * env vars, its disk, memory and start settings roll out like a deploy of the
 * same release with the new configuration (a static site, whose variables are
 * read at build time, is built again from the same source), recorded in the
 * deployment history with its cause. Made without `apply`, a change waits
 * (`pendingChanges`) until `POST /v1/apps/{app}/apply`, a restart or the next
 * deploy, so several changes roll out together.
 */

/** What became of a change. */
export type Rollout = {
  /** Whether it is on its way to the app now (false: it waits to be applied). */
  applied: boolean;
  /** The deployment rolling it out; null when nothing needs to (a stopped or never deployed app) or it waits. */
  deploymentId: string | null;
  /** In words, for the CLI and the dashboard. */
  message: string;
};

/**
 * Records a change of the app's configuration (`cause`, e.g. `GREETING set`)
 * and, with `apply`, rolls it (with every change still pending) out.
 */
export async function configChanged(env: Env, db: Db, app: AppRow, cause: string, apply: boolean): Promise<Rollout> {
  const version = app.configVersion + 1;
  if (!apply) {
    const pendingChanges = [...(app.pendingChanges ?? []), { version, cause }];
    await db.update(apps).set({ configVersion: version, pendingChanges, updatedAt: Date.now() }).where(eq(apps.id, app.id));
    await appChanged(env, db, app.id);
    const also = pendingChanges.length > 1 ? ` with ${pendingChanges.length - 1} other pending change${pendingChanges.length > 2 ? "s" : ""}` : "";
    return { applied: false, deploymentId: null, message: `${cause}; not applied yet: \`svc apps apply ${app.name}\` rolls it out${also}` };
  }
  await db.update(apps).set({ configVersion: version, updatedAt: Date.now() }).where(eq(apps.id, app.id));
  return rollOut(env, db, { ...app, configVersion: version }, cause);
}

/** Rolls out what is pending (`svc apps apply`), or says there is nothing to. */
export async function applyPending(env: Env, db: Db, app: AppRow): Promise<Rollout> {
  const pending = app.pendingChanges ?? [];
  if (pending.length === 0) return { applied: true, deploymentId: null, message: `${app.name} has no pending change: it runs its current configuration` };
  return rollOut(env, db, app, null);
}

/**
 * Starts the rollout of the app's current configuration: a new deployment of
 * the active release (a rebuild of the active source for a static site),
 * caused by `cause` and every pending change.
 */
async function rollOut(env: Env, db: Db, app: AppRow, cause: string | null): Promise<Rollout> {
  const causes = [...(app.pendingChanges ?? []).map((change) => change.cause), ...(cause === null ? [] : [cause])].join(", ");
  await appChanged(env, db, app.id);
  const active = app.activeDeploymentId ? await db.select().from(deployments).where(eq(deployments.id, app.activeDeploymentId)).get() : undefined;
  const clear = () => db.update(apps).set({ pendingChanges: null }).where(eq(apps.id, app.id));
  if (!active) {
    await clear();
    return { applied: true, deploymentId: null, message: `${causes}; ${app.name} has nothing deployed yet: its first deploy runs with it` };
  }
  if (app.status === "stopped") {
    await clear();
    return { applied: true, deploymentId: null, message: `${causes}; ${app.name} is stopped: it runs with it when it starts` };
  }
  const now = Date.now();
  const row: DeploymentRow = {
    ...active,
    id: newId("deployment"),
    error: null,
    cause: `config: ${causes}`,
    configVersion: app.configVersion,
    // svc.json's count was the app's when its deploy rolled out; a configuration change keeps the app's count now.
    instances: null,
    processId: null,
    progress: null,
    logExcerpt: null,
    createdAt: now,
    finishedAt: null,
  };
  if (runsProcess(app.runtime)) {
    // The same release, started with the app's configuration as it is now.
    await db.insert(deployments).values({ ...row, status: "deploying", builderJobId: null, startedAt: null, builtAt: null });
    await noteProgress(db, row.id, `rolling out ${causes}: the release of ${active.id} with the app's new configuration`, now);
    await appRuntimeStub(env, app.id).release(app.id, row.id);
  } else {
    // A static site's variables are read by its build: built again, from the same source.
    await db.insert(deployments).values({
      ...row,
      status: "queued",
      manifestKey: null,
      builderJobId: null,
      startedAt: null,
      builtAt: null,
      fileCount: null,
      totalBytes: null,
      uploadedBlobs: null,
      peakMemoryBytes: null,
    });
    await startDeployment(db, env, { ...row, status: "queued", builderJobId: null, startedAt: null });
    await clear();
  }
  await pruneDeployments(env, db, app.id, row.id);
  return { applied: true, deploymentId: row.id, message: `${causes}; rolling out to ${app.name}` };
}
