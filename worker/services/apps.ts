import { and, asc, desc, eq, inArray, sql } from "drizzle-orm";
import { type Db, isUniqueViolation } from "../db/client";
import { type AppRow, apps, type Autoscaling, type DeploymentRow, type DiskRow, disks, type Runtime } from "../db/schema";
import { type Config, configOf, type Env } from "../env";
import { ApiError } from "../lib/errors";
import { isId, newId } from "../lib/ids";
import { planLimitError, planOf } from "../lib/plans";
import { iso, isoOrNull } from "../lib/time";
import { type InstanceView, instanceViews, type ProcessView, runsProcess } from "./app-runtime";

/** What an app's status says (derived from its processes and deployments, never stored as a wish). */
export const APP_STATES = ["not_deployed", "deploying", "running", "crash_loop", "failed", "stopped"] as const;
export type AppState = (typeof APP_STATES)[number];

export type AppView = {
  id: string;
  name: string;
  runtime: Runtime;
  /** An app that runs: `web` or `worker`, as its active (else newest) release says; null for a static site or before any release. */
  type: "web" | "worker" | null;
  status: AppState;
  /** Where it answers; null for a worker, which takes no HTTP traffic. */
  url: string | null;
  memoryMb: number;
  /** Settings that win over svc.json for the app's releases (null: svc.json's). */
  startCommand: string | null;
  healthCheckPath: string | null;
  activeDeploymentId: string | null;
  /** Configuration changes made without a rollout, not running yet, oldest first. */
  pendingChanges: string[];
  disks: { id: string; name: string; mountPath: string; sizeGb: number }[];
  createdAt: string;
  updatedAt: string;
  restartedAt: string | null;
  /** Apps that run: how many processes serve it (`PATCH /v1/apps/{app}` `instances`); an app with a disk runs one. */
  instanceCount: number;
  /** Apps that run: scaling on load, when on (null: the count changes only when asked). */
  autoscaling: Autoscaling | null;
  /** What scaling on load decided, newest first. */
  scaleEvents: { at: string; from: number; to: number; reason: string }[];
  /** Apps that run, in the single-app view: the first process serving it as its node reports it (null when none runs). */
  process?: ProcessView | null;
  /** Apps that run, in the single-app view: every process serving it, as each node reports it. */
  instances?: InstanceView[];
};

export function appUrl(config: Config, name: string): string {
  return `${config.APPS_URL_SCHEME}://${name}.${config.APPS_DOMAIN}`;
}

/** What an app's status is derived from besides its own row: its newest deployment and its release's type. */
export type AppFacts = { latest: Pick<DeploymentRow, "status"> | null; type: "web" | "worker" | null };

/**
 * An app's status from what runs: `stopped` when stopped; a static site
 * `running` once it has a deployment, else `not_deployed`; an app that runs
 * `deploying` while a deployment is under way, `not_deployed` or `failed`
 * (its only deploys failed) before any release served, then what its live
 * process is: `crash_loop`, `failed`, else `running`.
 */
export function appState(app: Pick<AppRow, "status" | "runtime" | "activeDeploymentId" | "processState" | "liveProcessId">, facts: AppFacts): AppState {
  if (app.status === "stopped") return "stopped";
  if (!runsProcess(app.runtime)) return app.activeDeploymentId ? "running" : "not_deployed";
  const latest = facts.latest?.status;
  if (latest === "queued" || latest === "building" || latest === "deploying") return "deploying";
  if (!app.activeDeploymentId) return latest === "failed" ? "failed" : "not_deployed";
  if (app.processState === "crash_loop") return "crash_loop";
  if (app.processState === "failed" || app.liveProcessId === null) return "failed";
  return "running";
}

function viewOf(config: Config, row: AppRow, attached: DiskRow[], facts: AppFacts): AppView {
  return {
    id: row.id,
    name: row.name,
    runtime: row.runtime,
    type: facts.type,
    status: appState(row, facts),
    url: facts.type === "worker" ? null : appUrl(config, row.name),
    memoryMb: row.memoryMb,
    startCommand: row.startCommand,
    healthCheckPath: row.healthCheckPath,
    activeDeploymentId: row.activeDeploymentId,
    pendingChanges: (row.pendingChanges ?? []).map((change) => change.cause),
    disks: attached.map((d) => ({ id: d.id, name: d.name, mountPath: d.mountPath, sizeGb: d.sizeGb })),
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
    restartedAt: row.restartedAt === row.createdAt ? null : isoOrNull(row.restartedAt),
    instanceCount: row.instances,
    autoscaling: row.autoscaling,
    scaleEvents: (row.scaleEvents ?? []).map((event) => ({ ...event, at: iso(event.at) })).reverse(),
  };
}

/** Finds an app of the account by id or name; 404 `app not found` otherwise (never another account's). */
export async function resolveApp(db: Db, accountId: string, ref: string): Promise<AppRow> {
  const row = await db
    .select()
    .from(apps)
    .where(and(eq(apps.accountId, accountId), isId("app", ref) ? eq(apps.id, ref) : eq(apps.name, ref)))
    .get();
  if (!row) throw new ApiError("APP_NOT_FOUND", "app not found");
  return row;
}

export async function appViews(db: Db, config: Config, rows: AppRow[]): Promise<AppView[]> {
  if (rows.length === 0) return [];
  const ids = rows.map((r) => r.id);
  const [attached, facts] = await Promise.all([
    db.select().from(disks).where(inArray(disks.appId, ids)).orderBy(asc(disks.createdAt)),
    appFacts(db, rows),
  ]);
  return rows.map((row) =>
    viewOf(
      config,
      row,
      attached.filter((d) => d.appId === row.id),
      facts.get(row.id) ?? { latest: null, type: null },
    ),
  );
}

/**
 * Each app's newest deployment (its status) and its release's type (the
 * active deployment's, else the newest's): one statement for all of them.
 */
async function appFacts(db: Db, rows: AppRow[]): Promise<Map<string, AppFacts>> {
  const ids = rows.map((r) => r.id);
  const active = new Map(rows.map((r) => [r.id, r.activeDeploymentId]));
  const found = await db.all<{ app_id: string; id: string; status: DeploymentRow["status"]; process_type: "web" | "worker" | null; newest: number }>(sql`
    select app_id, id, status, process_type, newest from (
      select app_id, id, status, process_type,
             row_number() over (partition by app_id order by created_at desc, id desc) as newest
      from deployments where app_id in (${sql.join(ids.map((id) => sql`${id}`), sql`, `)})
    ) where newest = 1 or id in (${sql.join(rows.map((r) => sql`${r.activeDeploymentId ?? ""}`), sql`, `)})`);
  const facts = new Map<string, AppFacts>();
  for (const app of rows) {
    const mine = found.filter((d) => d.app_id === app.id);
    const latest = mine.find((d) => d.newest === 1) ?? null;
    const serving = mine.find((d) => d.id === active.get(app.id)) ?? null;
    facts.set(app.id, { latest: latest && { status: latest.status }, type: runsProcess(app.runtime) ? ((serving ?? latest)?.process_type ?? null) : null });
  }
  return facts;
}

/** One app, with (for apps that run) its processes as their nodes report them. */
export async function appView(db: Db, env: Env, row: AppRow): Promise<AppView> {
  const [view, instances] = await Promise.all([appViews(db, configOf(env), [row]), instanceViews(env, row)]);
  if (!runsProcess(row.runtime)) return view[0]!;
  const first = instances[0];
  const process = first ? { state: first.state, ready: first.ready, restarts: first.restarts, lastExit: first.lastExit, lastLines: first.lastLines, startedAt: first.startedAt, readyAt: first.readyAt } : null;
  return { ...view[0]!, process, instances };
}

export async function createApp(
  db: Db,
  accountId: string,
  input: { name: string; runtime: Runtime; memoryMb: number },
): Promise<AppRow> {
  const { plan, limits } = await planOf(db, accountId);
  if (input.memoryMb > limits.appMemoryMb) {
    throw planLimitError(plan, `an app may have at most ${limits.appMemoryMb} MB of memory (asked for ${input.memoryMb} MB)`, "ask for less");
  }
  const now = Date.now();
  const row: AppRow = {
    id: newId("app"),
    accountId,
    name: input.name,
    runtime: input.runtime,
    status: "running",
    memoryMb: input.memoryMb,
    activeDeploymentId: null,
    liveProcessId: null,
    liveNode: null,
    liveInstances: null,
    instances: 1,
    autoscaling: null,
    scaleEvents: null,
    processState: null,
    startCommand: null,
    healthCheckPath: null,
    configVersion: 0,
    pendingChanges: null,
    restartedAt: now,
    createdAt: now,
    updatedAt: now,
  };
  // The plan's limits are checked by the statement that inserts, so concurrent creations cannot both squeeze in.
  const owned = sql`(select count(*) from apps where account_id = ${accountId})`;
  const reserved = sql`(select coalesce(sum(memory_mb * instances), 0) from apps where account_id = ${accountId} and runtime != 'static')`;
  const reserves = runsProcess(row.runtime) ? row.memoryMb : 0;
  let inserted: D1Result;
  try {
    inserted = await db.run(sql`
      insert into apps (id, account_id, name, runtime, status, memory_mb, active_deployment_id, live_process_id, live_node,
                        restarted_at, created_at, updated_at)
      select ${row.id}, ${accountId}, ${row.name}, ${row.runtime}, ${row.status}, ${row.memoryMb}, null, null, null, ${now}, ${now}, ${now}
      where ${owned} < ${limits.apps} and ${reserved} + ${reserves} <= ${limits.totalAppMemoryMb}`);
  } catch (err) {
    if (isUniqueViolation(err)) throw new ApiError("NAME_TAKEN", `the app name "${input.name}" is already taken`);
    throw err;
  }
  if (inserted.meta.changes !== 1) {
    const usage = await db.get<{ count: number; mb: number }>(sql`select ${owned} as count, ${reserved} as mb`);
    if (usage.count >= limits.apps) throw planLimitError(plan, `an account may have ${limits.apps} apps and has ${usage.count}`, "delete one");
    throw planLimitError(
      plan,
      `an account's apps may reserve ${limits.totalAppMemoryMb} MB of memory in all; ${usage.mb} MB are reserved and this app asks for ${row.memoryMb} MB`,
      "give it less memory or delete an app",
    );
  }
  return row;
}

/** What `PATCH /v1/apps/{app}` may change: memory, and start settings that win over svc.json (null: svc.json's again). */
export type AppSettings = { memoryMb?: number; startCommand?: string | null; healthCheckPath?: string | null };

/**
 * Changes the app's settings; a larger memory limit is checked against the
 * plan by the statement that writes it (as creation is). Returns the app and
 * the change in words (`memory 512 MB`), or null when nothing changed.
 */
export async function updateAppSettings(db: Db, app: AppRow, settings: AppSettings): Promise<{ app: AppRow; cause: string | null }> {
  if (!runsProcess(app.runtime) && (settings.startCommand != null || settings.healthCheckPath != null)) {
    throw new ApiError("APP_IS_STATIC", `${app.name} is a static site: it has no process to start or check`);
  }
  const parts: string[] = [];
  const memoryMb = settings.memoryMb !== undefined && settings.memoryMb !== app.memoryMb ? settings.memoryMb : undefined;
  if (memoryMb !== undefined) parts.push(`memory ${memoryMb} MB`);
  if (settings.startCommand !== undefined && settings.startCommand !== app.startCommand) {
    parts.push(settings.startCommand === null ? "start command from svc.json" : `start command ${JSON.stringify(settings.startCommand)}`);
  }
  if (settings.healthCheckPath !== undefined && settings.healthCheckPath !== app.healthCheckPath) {
    parts.push(settings.healthCheckPath === null ? "health check from svc.json" : `health check GET ${settings.healthCheckPath}`);
  }
  if (parts.length === 0) return { app, cause: null };
  // An app that runs has its memory written by the statement that checks the account's total; a static site's with the rest.
  const guarded = memoryMb !== undefined && runsProcess(app.runtime);
  if (memoryMb !== undefined) {
    const { plan, limits } = await planOf(db, app.accountId);
    if (memoryMb > limits.appMemoryMb) {
      throw planLimitError(plan, `an app may have at most ${limits.appMemoryMb} MB of memory (asked for ${memoryMb} MB)`, "ask for less");
    }
    if (guarded) {
      const others = reservedByOthers(app);
      const written = await db.run(sql`update apps set memory_mb = ${memoryMb} where id = ${app.id} and ${others} + ${memoryMb} * instances <= ${limits.totalAppMemoryMb}`);
      if (written.meta.changes !== 1) {
        const used = await db.get<{ mb: number }>(sql`select ${others} as mb`);
        throw planLimitError(
          plan,
          `an account's apps may reserve ${limits.totalAppMemoryMb} MB of memory in all; its other apps reserve ${used.mb} MB and this one asks for ${memoryMb} MB${app.instances > 1 ? ` × ${app.instances} instances` : ""}`,
          "give it less memory or delete an app",
        );
      }
    }
  }
  const [row] = await db
    .update(apps)
    .set({
      ...(memoryMb !== undefined && !guarded ? { memoryMb } : {}),
      ...(settings.startCommand !== undefined ? { startCommand: settings.startCommand } : {}),
      ...(settings.healthCheckPath !== undefined ? { healthCheckPath: settings.healthCheckPath } : {}),
      updatedAt: Date.now(),
    })
    .where(eq(apps.id, app.id))
    .returning();
  return { app: row ?? app, cause: parts.join(", ") };
}

/** Memory the account's other apps that run reserve: each app's limit times its instances. */
function reservedByOthers(app: Pick<AppRow, "id" | "accountId">) {
  return sql`(select coalesce(sum(memory_mb * instances), 0) from apps where account_id = ${app.accountId} and runtime != 'static' and id != ${app.id})`;
}

/**
 * Sets how many processes serve an app that runs, within the plan (its
 * instances per app, and its memory in all: each instance reserves the app's
 * limit). An app with a disk runs one: the statement checks it, so a disk
 * attached meanwhile cannot end up with two writers.
 */
export async function scaleApp(db: Db, app: AppRow, instances: number): Promise<AppRow> {
  if (!runsProcess(app.runtime)) throw new ApiError("APP_IS_STATIC", `${app.name} is a static site: the edge serves it, it has no processes to scale`);
  const { plan, limits } = await planOf(db, app.accountId);
  if (instances > limits.instances) throw planLimitError(plan, `an app may run at most ${limits.instances} instances (asked for ${instances})`, "ask for fewer");
  const others = reservedByOthers(app);
  const written = await db.run(sql`
    update apps set instances = ${instances}, updated_at = ${Date.now()}
    where id = ${app.id} and (${instances} = 1 or not exists (select 1 from disks where app_id = ${app.id}))
      and ${others} + memory_mb * ${instances} <= ${limits.totalAppMemoryMb}`);
  if (written.meta.changes !== 1) {
    const disk = await db.select({ name: disks.name }).from(disks).where(eq(disks.appId, app.id)).get();
    if (disk) throw new ApiError("APP_HAS_DISK", `${app.name} has disk ${disk.name}: an app with a disk runs one instance (one writer per disk); detach it to run more`);
    const used = await db.get<{ mb: number }>(sql`select ${others} as mb`);
    throw planLimitError(
      plan,
      `an account's apps may reserve ${limits.totalAppMemoryMb} MB of memory in all; its other apps reserve ${used.mb} MB and ${instances} instances of ${app.memoryMb} MB ask for ${instances * app.memoryMb} MB`,
      "run fewer instances, give the app less memory or delete an app",
    );
  }
  return (await db.select().from(apps).where(eq(apps.id, app.id)).get()) ?? app;
}

/**
 * Turns scaling on load on (between `minInstances` and `maxInstances`, the
 * plan's limit at most, aiming at `targetConcurrency` requests in flight per
 * instance) or off (null: the count stays where it is). Turned on, the count
 * moves into the bounds at once.
 */
export async function setAutoscaling(db: Db, app: AppRow, settings: Autoscaling | null): Promise<AppRow> {
  if (!runsProcess(app.runtime)) throw new ApiError("APP_IS_STATIC", `${app.name} is a static site: the edge serves it, it has no processes to scale`);
  if (settings === null) {
    const [row] = await db.update(apps).set({ autoscaling: null, updatedAt: Date.now() }).where(eq(apps.id, app.id)).returning();
    return row ?? app;
  }
  const { minInstances, maxInstances } = settings;
  if (minInstances > maxInstances) throw new ApiError("VALIDATION_ERROR", `minInstances (${minInstances}) is above maxInstances (${maxInstances})`);
  const { plan, limits } = await planOf(db, app.accountId);
  if (maxInstances > limits.instances) throw planLimitError(plan, `an app may run at most ${limits.instances} instances (maxInstances ${maxInstances})`, "ask for fewer");
  const disk = maxInstances > 1 ? await db.select({ name: disks.name }).from(disks).where(eq(disks.appId, app.id)).get() : undefined;
  if (disk) throw new ApiError("APP_HAS_DISK", `${app.name} has disk ${disk.name}: an app with a disk runs one instance (one writer per disk); detach it to scale on load`);
  const count = Math.min(maxInstances, Math.max(minInstances, app.instances));
  const scaled = count === app.instances ? app : await scaleApp(db, app, count);
  const [row] = await db.update(apps).set({ autoscaling: settings, updatedAt: Date.now() }).where(eq(apps.id, app.id)).returning();
  return row ?? scaled;
}

export async function listApps(db: Db, accountId: string): Promise<AppRow[]> {
  return db.select().from(apps).where(eq(apps.accountId, accountId)).orderBy(desc(apps.createdAt), desc(apps.id));
}

/** Stopped apps serve 503 and skip cron runs; restart starts a new incarnation. */
export async function setAppStatus(db: Db, app: AppRow, status: AppRow["status"]): Promise<AppRow> {
  const now = Date.now();
  const changes = status === "running" ? { status, restartedAt: now, updatedAt: now } : { status, updatedAt: now };
  const [row] = await db.update(apps).set(changes).where(eq(apps.id, app.id)).returning();
  if (!row) throw new ApiError("APP_NOT_FOUND", "app not found");
  return row;
}

/** Deletes the app with its env vars; its disks are detached (data kept), not deleted. */
export async function deleteApp(db: Db, app: AppRow): Promise<void> {
  await db.delete(apps).where(eq(apps.id, app.id));
}
