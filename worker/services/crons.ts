import { and, desc, eq } from "drizzle-orm";
import { type Db, isUniqueViolation } from "../db/client";
import { type ConcurrencyPolicy, type CronRow, type CronRunRow, cronRuns, crons } from "../db/schema";
import type { Env } from "../env";
import { nextRuns } from "../lib/cron";
import { ApiError } from "../lib/errors";
import { newId } from "../lib/ids";
import { iso, isoOrNull } from "../lib/time";
import { deletePrefix } from "../storage/objects";

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
  createdAt: string;
  updatedAt: string;
};

export type CronDetail = CronView & { lastRun: string | null; nextRun: string | null; nextRuns: string[] };

export type CronRunView = {
  jobName: string;
  status: CronRunRow["status"];
  trigger: CronRunRow["trigger"];
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
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
  };
}

export function cronDetail(row: CronRow, now = Date.now()): CronDetail {
  return {
    ...cronView(row),
    lastRun: isoOrNull(row.lastRunAt),
    nextRun: row.enabled ? isoOrNull(row.nextRunAt) : null,
    nextRuns: row.enabled ? nextRuns(row.schedule, row.timezone, now, 5).map(iso) : [],
  };
}

export function runView(row: CronRunRow): CronRunView {
  return {
    jobName: row.jobName,
    status: row.status,
    trigger: row.trigger,
    startedAt: iso(row.startedAt),
    finishedAt: isoOrNull(row.finishedAt),
    exitCode: row.exitCode,
    error: row.error,
  };
}

export function cronStub(env: Env, cronId: string) {
  return env.CRON_JOB.get(env.CRON_JOB.idFromName(cronId));
}

export function logKey(cronId: string, jobName: string): string {
  return `cron-logs/${cronId}/${jobName}.log`;
}

export async function resolveCron(db: Db, accountId: string, id: string): Promise<CronRow> {
  const row = await db
    .select()
    .from(crons)
    .where(and(eq(crons.id, id), eq(crons.accountId, accountId)))
    .get();
  if (!row) throw new ApiError("CRON_NOT_FOUND", `cron job ${id} not found`);
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
};

/** Inserts the job and arms its Durable Object; if arming fails the row is removed again. */
export async function createCron(db: Db, env: Env, accountId: string, input: CronInput): Promise<CronRow> {
  const now = Date.now();
  const row: CronRow = { id: newId("cron"), accountId, ...input, lastRunAt: null, nextRunAt: null, createdAt: now, updatedAt: now };
  try {
    await db.insert(crons).values(row);
  } catch (err) {
    if (isUniqueViolation(err)) throw new ApiError("NAME_TAKEN", `a cron job named "${input.name}" already exists`);
    throw err;
  }
  try {
    row.nextRunAt = await cronStub(env, row.id).arm(row.id);
  } catch (err) {
    await db.delete(crons).where(eq(crons.id, row.id));
    throw err;
  }
  return row;
}

export type CronPatch = Partial<Omit<CronInput, "appId" | "name">>;

/** Changes only the supplied fields, then re-arms the alarm for the new schedule. */
export async function updateCron(db: Db, env: Env, cron: CronRow, patch: CronPatch): Promise<CronRow> {
  const [row] = await db
    .update(crons)
    .set({ ...patch, updatedAt: Date.now() })
    .where(eq(crons.id, cron.id))
    .returning();
  if (!row) throw new ApiError("CRON_NOT_FOUND", `cron job ${cron.id} not found`);
  row.nextRunAt = await cronStub(env, row.id).arm(row.id);
  return row;
}

/** Disarms the alarm first, then removes logs, runs and the job. */
export async function deleteCron(db: Db, env: Env, cron: CronRow): Promise<void> {
  await cronStub(env, cron.id).destroy();
  await deletePrefix(env.BUCKET, `cron-logs/${cron.id}/`);
  await db.delete(crons).where(eq(crons.id, cron.id));
}

export async function listRuns(db: Db, cronId: string): Promise<CronRunRow[]> {
  return db
    .select()
    .from(cronRuns)
    .where(eq(cronRuns.cronId, cronId))
    .orderBy(desc(cronRuns.startedAt), desc(cronRuns.jobName))
    .limit(RUN_HISTORY);
}

export async function resolveRun(db: Db, cronId: string, jobName: string): Promise<CronRunRow> {
  const row = await db
    .select()
    .from(cronRuns)
    .where(and(eq(cronRuns.cronId, cronId), eq(cronRuns.jobName, jobName)))
    .get();
  if (!row) throw new ApiError("RUN_NOT_FOUND", `run ${jobName} not found`);
  return row;
}
