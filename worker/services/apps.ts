import { and, asc, desc, eq, inArray, sql } from "drizzle-orm";
import { type Db, isUniqueViolation } from "../db/client";
import { type AppRow, apps, type DiskRow, disks, type Runtime } from "../db/schema";
import { type Config, configOf, type Env } from "../env";
import { ApiError } from "../lib/errors";
import { isId, newId } from "../lib/ids";
import { planLimitError, planOf } from "../lib/plans";
import { iso, isoOrNull } from "../lib/time";
import { type ProcessView, processView, runsProcess } from "./app-runtime";

export type AppView = {
  id: string;
  name: string;
  runtime: Runtime;
  status: AppRow["status"];
  url: string;
  memoryMb: number;
  activeDeploymentId: string | null;
  disks: { id: string; name: string; mountPath: string; sizeGb: number }[];
  createdAt: string;
  updatedAt: string;
  restartedAt: string | null;
  /** Apps that run, in the single-app view: the live process as its node reports it (null when none runs). */
  process?: ProcessView | null;
};

export function appUrl(config: Config, name: string): string {
  return `${config.APPS_URL_SCHEME}://${name}.${config.APPS_DOMAIN}`;
}

function viewOf(config: Config, row: AppRow, attached: DiskRow[]): AppView {
  return {
    id: row.id,
    name: row.name,
    runtime: row.runtime,
    status: row.status,
    url: appUrl(config, row.name),
    memoryMb: row.memoryMb,
    activeDeploymentId: row.activeDeploymentId,
    disks: attached.map((d) => ({ id: d.id, name: d.name, mountPath: d.mountPath, sizeGb: d.sizeGb })),
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
    restartedAt: row.restartedAt === row.createdAt ? null : isoOrNull(row.restartedAt),
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
  const attached = await db
    .select()
    .from(disks)
    .where(
      inArray(
        disks.appId,
        rows.map((r) => r.id),
      ),
    )
    .orderBy(asc(disks.createdAt));
  return rows.map((row) =>
    viewOf(
      config,
      row,
      attached.filter((d) => d.appId === row.id),
    ),
  );
}

/** One app, with (for apps that run) its live process as its node reports it. */
export async function appView(db: Db, env: Env, row: AppRow): Promise<AppView> {
  const [view, process] = await Promise.all([appViews(db, configOf(env), [row]), processView(env, row)]);
  return { ...view[0]!, ...(runsProcess(row.runtime) ? { process } : {}) };
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
    restartedAt: now,
    createdAt: now,
    updatedAt: now,
  };
  // The plan's limits are checked by the statement that inserts, so concurrent creations cannot both squeeze in.
  const owned = sql`(select count(*) from apps where account_id = ${accountId})`;
  const reserved = sql`(select coalesce(sum(memory_mb), 0) from apps where account_id = ${accountId} and runtime != 'static')`;
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
