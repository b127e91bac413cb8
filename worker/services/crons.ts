import { and, desc, eq, sql } from "drizzle-orm";
import { metricsStub } from "./metrics";
import { type Db, isUniqueViolation } from "../db/client";
import { accounts, type ConcurrencyPolicy, type CronRow, type CronRunStatus, crons, type Plan } from "../db/schema";
import type { Env } from "../env";
import { nextRuns } from "../lib/cron";
import { ApiError } from "../lib/errors";
import { isId, newId } from "../lib/ids";
import { planLimitError, planOf } from "../lib/plans";
import { iso, isoOrNull } from "../lib/time";
import { deletePrefix } from "../storage/objects";
import { loadTarget } from "./cron-targets";

/** Runs kept per job (DESIGN §6); older runs and their logs are removed. */
export const RUN_HISTORY = 100;

export type CronView = {
  id: string;
  appId: string;
  name: string;
  schedule: string;
  command: string;
  enabled: boolean;
  timezone: string;
  concurrencyPolicy: ConcurrencyPolicy;
  timeoutSeconds: number;
  /** Disables itself after this many failed runs in a row (null: never). */
  disableAfterFailures: number | null;
  /** `cron.failed` goes out from this many failed runs in a row on (1: every failure). */
  notifyAfterFailures: number;
  /** Why it disabled itself; null when it did not (or was enabled again since). */
  disabledReason: string | null;
  createdAt: string;
  updatedAt: string;
};

export type CronDetail = CronView & { lastRun: string | null; nextRun: string | null; nextRuns: string[]; late: boolean };

/** What a job's object needs of its D1 row: the definition, without the bookkeeping columns. */
export type CronDefinition = Omit<CronRow, "lastRunAt" | "nextRunAt" | "targetVersion">;

/** A run as the job's object keeps it (epoch milliseconds). */
export type CronRunRecord = {
  jobName: string;
  trigger: "schedule" | "manual";
  status: CronRunStatus;
  /** While `running`: whether the builder runs the command or holds it queued for a slot; null once ended. */
  phase: "queued" | "running" | null;
  /** Why a queued run waits, in words; null otherwise. */
  waiting: string | null;
  scheduledAt: number;
  /** When the run was handed to the builder. */
  queuedAt: number;
  /** When the builder started the command; until then (and for a run that never started), when it was queued. */
  startedAt: number;
  finishedAt: number | null;
  exitCode: number | null;
  error: string | null;
};

export type CronRunView = {
  jobName: string;
  status: CronRunStatus;
  phase: CronRunRecord["phase"];
  waiting: string | null;
  trigger: CronRunRecord["trigger"];
  queuedAt: string;
  startedAt: string;
  finishedAt: string | null;
  exitCode: number | null;
  error: string | null;
};

export function cronView(row: CronRow): CronView {
  return {
    id: row.id,
    appId: row.appId,
    name: row.name,
    schedule: row.schedule,
    command: row.command,
    enabled: row.enabled,
    timezone: row.timezone,
    concurrencyPolicy: row.concurrencyPolicy,
    timeoutSeconds: row.timeoutSeconds,
    disableAfterFailures: row.disableAfterFailures,
    notifyAfterFailures: row.notifyAfterFailures,
    disabledReason: row.disabledReason,
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
  };
}

/** The detail view: the definition from D1, last and next run from the job's object (where runs live). */
export async function cronDetail(env: Env, row: CronRow, now = Date.now()): Promise<CronDetail> {
  const state = await cronStub(env, row.id).detail();
  return {
    ...cronView(row),
    lastRun: isoOrNull(state.lastRunAt),
    nextRun: isoOrNull(state.nextRunAt),
    nextRuns: row.enabled ? nextRuns(row.schedule, row.timezone, now, 5).map(iso) : [],
    late: state.late,
  };
}

export function runView(row: CronRunRecord): CronRunView {
  return {
    jobName: row.jobName,
    status: row.status,
    phase: row.phase,
    waiting: row.waiting,
    trigger: row.trigger,
    queuedAt: iso(row.queuedAt),
    startedAt: iso(row.startedAt),
    finishedAt: isoOrNull(row.finishedAt),
    exitCode: row.exitCode,
    error: row.error,
  };
}

/** The account's plan, which bounds its manual runs (one indexed read, off the scheduled path). */
export async function accountPlan(db: Db, accountId: string): Promise<Plan> {
  const row = await db.select({ plan: accounts.plan }).from(accounts).where(eq(accounts.id, accountId)).get();
  return row?.plan ?? "free";
}

export function definitionOf(row: CronRow): CronDefinition {
  const { lastRunAt: _last, nextRunAt: _next, targetVersion: _version, ...definition } = row;
  return definition;
}

export function cronStub(env: Env, cronId: string) {
  return env.CRON_JOB.get(env.CRON_JOB.idFromName(cronId));
}

export function logKey(cronId: string, jobName: string): string {
  return `cron-logs/${cronId}/${jobName}.log`;
}

/** Finds a cron job of the account by id or name (names are unique in the account); 404 otherwise. */
export async function resolveCron(db: Db, accountId: string, ref: string): Promise<CronRow> {
  const row = await db
    .select()
    .from(crons)
    .where(and(isId("cron", ref) ? eq(crons.id, ref) : eq(crons.name, ref), eq(crons.accountId, accountId)))
    .get();
  if (!row) throw new ApiError("CRON_NOT_FOUND", `cron job ${ref} not found`);
  return row;
}

export async function listCrons(db: Db, accountId: string): Promise<CronRow[]> {
  return db.select().from(crons).where(eq(crons.accountId, accountId)).orderBy(desc(crons.createdAt), desc(crons.id));
}

export type CronInput = {
  appId: string;
  name: string;
  schedule: string;
  command: string;
  timezone: string;
  concurrencyPolicy: ConcurrencyPolicy;
  timeoutSeconds: number;
  enabled: boolean;
  disableAfterFailures?: number | null;
  notifyAfterFailures?: number;
};

/** Inserts the job and hands it (with its app's target) to its object, which arms the alarm; if that fails the row goes again. */
export async function createCron(db: Db, env: Env, accountId: string, input: CronInput): Promise<CronRow> {
  const now = Date.now();
  const row: CronRow = {
    id: newId("cron"),
    accountId,
    ...input,
    disableAfterFailures: input.disableAfterFailures ?? null,
    notifyAfterFailures: input.notifyAfterFailures ?? 1,
    disabledReason: null,
    lastRunAt: null,
    nextRunAt: null,
    targetVersion: null,
    createdAt: now,
    updatedAt: now,
  };
  const { plan, limits } = await planOf(db, accountId);
  // Counted by the statement that inserts, so concurrent creations cannot pass the limit together.
  const owned = sql`(select count(*) from crons where account_id = ${accountId})`;
  let inserted: D1Result;
  try {
    inserted = await db.run(sql`
      insert into crons (id, account_id, app_id, name, schedule, command, timezone, concurrency_policy, timeout_seconds, enabled,
        disable_after_failures, notify_after_failures, last_run_at, next_run_at, target_version, created_at, updated_at)
      select ${row.id}, ${accountId}, ${row.appId}, ${row.name}, ${row.schedule}, ${row.command}, ${row.timezone},
        ${row.concurrencyPolicy}, ${row.timeoutSeconds}, ${row.enabled ? 1 : 0}, ${row.disableAfterFailures}, ${row.notifyAfterFailures}, null, null, null, ${now}, ${now}
      where ${owned} < ${limits.cronJobs}`);
  } catch (err) {
    if (isUniqueViolation(err)) throw new ApiError("NAME_TAKEN", `a cron job named "${input.name}" already exists`);
    throw err;
  }
  if (inserted.meta.changes !== 1) {
    throw planLimitError(plan, `an account may have ${limits.cronJobs} cron jobs`, "delete one (or disable it: disabled jobs count too)");
  }
  try {
    const target = await loadTarget(db, row.appId);
    row.nextRunAt = await cronStub(env, row.id).configure(definitionOf(row), target);
    row.targetVersion = target?.version ?? null;
    await db.update(crons).set({ nextRunAt: row.nextRunAt, targetVersion: row.targetVersion }).where(eq(crons.id, row.id));
  } catch (err) {
    await cronStub(env, row.id)
      .destroy()
      .catch(() => undefined);
    await db.delete(crons).where(eq(crons.id, row.id));
    throw err;
  }
  return row;
}

export type CronPatch = Partial<Omit<CronInput, "appId" | "name">>;

/** Changes only the supplied fields, then hands the new definition to the object, which re-arms the alarm. */
export async function updateCron(db: Db, env: Env, cron: CronRow, patch: CronPatch): Promise<CronRow> {
  const [row] = await db
    .update(crons)
    // Enabled again: the reason it disabled itself no longer holds.
    .set({ ...patch, ...(patch.enabled === true ? { disabledReason: null } : {}), updatedAt: Date.now() })
    .where(eq(crons.id, cron.id))
    .returning();
  if (!row) throw new ApiError("CRON_NOT_FOUND", `cron job ${cron.id} not found`);
  row.nextRunAt = await cronStub(env, row.id).configure(definitionOf(row), null);
  await db.update(crons).set({ nextRunAt: row.nextRunAt }).where(eq(crons.id, row.id));
  return row;
}

/** Disarms the alarm first, then removes logs, runs (in the object) and the job. */
export async function deleteCron(db: Db, env: Env, cron: CronRow): Promise<void> {
  await cronStub(env, cron.id).destroy();
  await deletePrefix(env.BUCKET, `cron-logs/${cron.id}/`);
  await metricsStub(env, cron.id).drop();
  await db.delete(crons).where(eq(crons.id, cron.id));
}

/** Every cron job of the app goes with it: objects disarmed, logs deleted (the rows cascade with the app). */
export async function deleteAppCrons(db: Db, env: Env, appId: string): Promise<void> {
  const jobs = await db.select({ id: crons.id }).from(crons).where(eq(crons.appId, appId));
  for (const job of jobs) {
    await cronStub(env, job.id).destroy();
    await deletePrefix(env.BUCKET, `cron-logs/${job.id}/`);
    await metricsStub(env, job.id).drop();
  }
}
