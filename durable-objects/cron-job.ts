import { DurableObject } from "cloudflare:workers";
import { and, asc, desc, eq } from "drizzle-orm";
import type { JobSpec, JobStatus } from "../builder/src/protocol";
import { openDb } from "../worker/db/client";
import { type AppRow, apps, type CronRow, type CronRunRow, cronRuns, crons, deployments, type DiskRow, disks } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import { cancelJob, getJob, jobLog, submitJob } from "../worker/lib/builder-client";
import { nextRuns } from "../worker/lib/cron";
import { randomBase62 } from "../worker/lib/ids";
import { presign } from "../worker/storage/presign";
import { GIB } from "../worker/services/disks";
import { envOf } from "../worker/services/env-vars";
import { logKey, RUN_HISTORY } from "../worker/services/crons";

/** Runs between history trims (trimming is a scan, so it is not done on every run). */
const TRIM_EVERY_RUNS = 10;

type Target = { app: AppRow; disk: DiskRow | null; sourceKey: string | null };

/** How a finished run ended, whatever reported it (callback, poll, or a dispatch failure). */
type Outcome = { status: "success" | "failed"; exitCode: number | null; error: string | null; log: string };

/** Poll running jobs quickly at first, then settle; callbacks usually arrive first. */
const FAST_POLL_MS = 2_000;
const SLOW_POLL_MS = 15_000;
const FAST_POLL_WINDOW_MS = 60_000;
/** A run with no builder job this long after it started never reached the builder. */
const DISPATCH_GRACE_MS = 60_000;
/** Past its timeout plus this, a run whose builder cannot be asked is given up. */
const LOST_CONTACT_GRACE_MS = 5 * 60_000;

const logLine = (text: string, at = Date.now()) => `${new Date(at).toISOString()} svc ${text}\n`;

/** The error line a failed run's log ends with (spec: a non-zero exit shows an error in the log). */
export function failureLine(status: JobStatus, timeoutSeconds: number): string {
  switch (status.reason) {
    case "exit_code":
      return status.exitCode === 127
        ? "error: command not found (exit code 127)"
        : `error: command exited with code ${status.exitCode}`;
    case "timeout":
      return `error: timed out after ${timeoutSeconds} s; the command and its children were killed`;
    case "OOMKilled":
      return `error: OOMKilled: ${status.error ?? "memory limit exceeded"}`;
    case "cancelled":
      return "error: cancelled";
    default:
      return `error: ${status.error ?? "the run failed"}`;
  }
}

/**
 * One object per cron job (DESIGN §4): its alarm is the job's only timer. The
 * alarm fires due runs and polls the builder for running ones; D1 holds the
 * job's definition and run history, storage holds only what the alarm needs.
 * Alarms are at-least-once, so firing is idempotent: a run's name is derived
 * from its scheduled second and inserted with ON CONFLICT DO NOTHING.
 */
export class CronJob extends DurableObject<Env> {
  private get db() {
    return openDb(this.env.DB);
  }

  private get config() {
    return configOf(this.env);
  }

  /** (Re)arms the alarm for the job's next run; returns that time (epoch ms) or null. */
  async arm(cronId: string): Promise<number | null> {
    await this.ctx.storage.put("cronId", cronId);
    const cron = await this.loadCron();
    if (!cron) {
      await this.destroy();
      return null;
    }
    return this.reschedule(cron);
  }

  /** Starts a manual run now, whatever the schedule and concurrency policy say. */
  async runNow(): Promise<{ jobName: string; status: CronRunRow["status"] } | null> {
    const job = await this.loadJob();
    if (!job?.target) return null;
    const { cron, target } = job;
    const now = Date.now();
    const jobName = `manual-${randomBase62(6).toLowerCase()}-${Math.floor(now / 1000)}`;
    const run = await this.insertRun(cron, jobName, "manual", now);
    if (!run) return null;
    await this.dispatch(cron, target, run);
    await this.reschedule(cron);
    const after = await this.loadRun(cron.id, jobName);
    return { jobName, status: after?.status ?? "running" };
  }

  /** Cancels a running run; the builder kills its process group. */
  async cancel(jobName: string): Promise<boolean> {
    const cron = await this.loadCron();
    const run = cron && (await this.loadRun(cron.id, jobName));
    if (!cron || !run || run.status !== "running") return false;
    await this.stopRun(cron, run, "cancelled");
    return true;
  }

  /** The builder's signed completion callback lands here (see worker/routes/internal.ts). */
  async jobFinished(status: JobStatus): Promise<void> {
    const cron = await this.loadCron();
    const jobName = status.labels.jobName;
    const run = cron && jobName ? await this.loadRun(cron.id, jobName) : null;
    if (!cron || !run || run.status !== "running" || run.builderJobId !== status.id) return;
    await this.completeFromBuilder(cron, run, status);
    await this.reschedule(cron);
  }

  /** Disarms and forgets everything; a stale alarm afterwards finds nothing to do. */
  async destroy(): Promise<void> {
    await this.ctx.storage.deleteAlarm();
    await this.ctx.storage.deleteAll();
  }

  override async alarm(): Promise<void> {
    const job = await this.loadJob();
    if (!job) {
      await this.destroy();
      return;
    }
    const now = Date.now();
    const [due, pollAt] = await Promise.all([
      this.ctx.storage.get<number>("scheduledFor"),
      this.ctx.storage.get<number>("pollAt"),
    ]);
    if (due !== undefined && due <= now) await this.fire(job.cron, job.target, due);
    if (pollAt !== undefined && pollAt <= now) await this.pollRunning(job.cron);
    await this.reschedule(job.cron);
  }

  private async loadCron(): Promise<CronRow | null> {
    const cronId = await this.ctx.storage.get<string>("cronId");
    if (!cronId) return null;
    return (await this.db.select().from(crons).where(eq(crons.id, cronId)).get()) ?? null;
  }

  /** The job with its app and the disk attached to it, in one query (the alarm's hot path). */
  private async loadJob(): Promise<{ cron: CronRow; target: Target | null } | null> {
    const cronId = await this.ctx.storage.get<string>("cronId");
    if (!cronId) return null;
    const row = await this.db
      .select({ cron: crons, app: apps, disk: disks, sourceKey: deployments.sourceKey })
      .from(crons)
      .leftJoin(apps, eq(apps.id, crons.appId))
      .leftJoin(disks, eq(disks.appId, crons.appId))
      .leftJoin(deployments, eq(deployments.id, apps.activeDeploymentId))
      .where(eq(crons.id, cronId))
      .get();
    if (!row) return null;
    return { cron: row.cron, target: row.app ? { app: row.app, disk: row.disk, sourceKey: row.sourceKey } : null };
  }

  private async loadRun(cronId: string, jobName: string): Promise<CronRunRow | null> {
    return (
      (await this.db
        .select()
        .from(cronRuns)
        .where(and(eq(cronRuns.cronId, cronId), eq(cronRuns.jobName, jobName)))
        .get()) ?? null
    );
  }

  private async runningRuns(cronId: string): Promise<CronRunRow[]> {
    return this.db
      .select()
      .from(cronRuns)
      .where(and(eq(cronRuns.cronId, cronId), eq(cronRuns.status, "running")))
      .orderBy(asc(cronRuns.startedAt));
  }

  /**
   * Next run strictly after now: a late alarm runs once and the schedule moves
   * on, never a catch-up burst. The alarm is the earlier of that and the next poll.
   */
  private async reschedule(cron: CronRow): Promise<number | null> {
    const now = Date.now();
    const next = nextRuns(cron.schedule, cron.timezone, now, 1)[0] ?? null;
    if (next === null) await this.ctx.storage.delete("scheduledFor");
    else await this.ctx.storage.put("scheduledFor", next);
    const running = await this.runningRuns(cron.id);
    // Keep a poll already planned (re-arming must not push it back), else plan the next one.
    const planned = await this.ctx.storage.get<number>("pollAt");
    const pollAt =
      running.length === 0
        ? null
        : planned !== undefined && planned > now
          ? planned
          : now + (running.some((r) => now - r.startedAt < FAST_POLL_WINDOW_MS) ? FAST_POLL_MS : SLOW_POLL_MS);
    if (pollAt === null) await this.ctx.storage.delete("pollAt");
    else await this.ctx.storage.put("pollAt", pollAt);
    const wake = Math.min(next ?? Number.POSITIVE_INFINITY, pollAt ?? Number.POSITIVE_INFINITY);
    if (Number.isFinite(wake)) await this.ctx.storage.setAlarm(wake);
    else await this.ctx.storage.deleteAlarm();
    if (cron.nextRunAt !== next) {
      await this.db.update(crons).set({ nextRunAt: next }).where(eq(crons.id, cron.id));
    }
    return next;
  }

  private async fire(cron: CronRow, target: Target | null, due: number): Promise<void> {
    if (!target || !cron.enabled || target.app.status === "stopped") return;
    const running = await this.runningRuns(cron.id);
    if (running.length > 0) {
      if (cron.concurrencyPolicy === "forbid") return;
      if (cron.concurrencyPolicy === "replace") {
        for (const run of running) await this.stopRun(cron, run, "replaced by the next scheduled run");
      }
    }
    const run = await this.insertRun(cron, `${cron.name}-${Math.floor(due / 1000)}`, "schedule", due);
    if (run) await this.dispatch(cron, target, run);
  }

  /** Inserts a `running` run; null when a run of that name exists (a duplicate alarm delivery). */
  private async insertRun(
    cron: CronRow,
    jobName: string,
    trigger: CronRunRow["trigger"],
    scheduledAt: number,
  ): Promise<CronRunRow | null> {
    // One round trip; on a duplicate delivery the update rewrites the same lastRunAt.
    const [[run]] = await this.db.batch([
      this.db
        .insert(cronRuns)
        .values({ cronId: cron.id, jobName, trigger, status: "running", scheduledAt, startedAt: Date.now() })
        .onConflictDoNothing()
        .returning(),
      this.db.update(crons).set({ lastRunAt: scheduledAt }).where(eq(crons.id, cron.id)),
    ]);
    if (!run) return null;
    const inserted = ((await this.ctx.storage.get<number>("runsSinceTrim")) ?? 0) + 1;
    if (inserted >= TRIM_EVERY_RUNS) await this.trimHistory(cron.id);
    await this.ctx.storage.put("runsSinceTrim", inserted >= TRIM_EVERY_RUNS ? 0 : inserted);
    return run;
  }

  /** Sends the run to the builder with the app's decrypted env vars and its disk. */
  private async dispatch(cron: CronRow, { app, disk, sourceKey }: Target, run: CronRunRow): Promise<void> {
    const config = this.config;
    try {
      if (disk?.status === "restoring") {
        await this.complete(cron, run, {
          status: "failed",
          exitCode: null,
          error: `disk ${disk.name} is being restored`,
          log: logLine(`error: disk ${disk.name} is being restored; the run did not start`),
        });
        return;
      }
      const spec: JobSpec = {
        tenant: cron.accountId,
        command: cron.command,
        env: await envOf(this.db, config, app.id),
        timeoutSeconds: cron.timeoutSeconds,
        memoryMb: app.memoryMb,
        callbackUrl: new URL("/internal/builder/callback", config.PUBLIC_URL).href,
        labels: { kind: "cron", cronId: cron.id, jobName: run.jobName },
        ...(disk ? { disk: { id: disk.id, mountPath: disk.mountPath, sizeBytes: disk.sizeGb * GIB } } : {}),
        // The app's environment: the source of its active deployment, extracted as the working directory.
        ...(sourceKey
          ? { sourceUrl: (await presign(config, { method: "GET", key: sourceKey, expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS })).url }
          : {}),
      };
      const submitted = await submitJob(config, spec);
      if (!submitted.ok) {
        const error = `the builder refused the run: ${submitted.message}`;
        await this.complete(cron, run, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
        return;
      }
      await this.db
        .update(cronRuns)
        .set({ builderJobId: submitted.value.id })
        .where(and(eq(cronRuns.cronId, cron.id), eq(cronRuns.jobName, run.jobName)));
    } catch (err) {
      const error = `the builder could not be reached: ${err instanceof Error ? err.message : String(err)}`;
      await this.complete(cron, run, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
    }
  }

  /** Asks the builder about every running run; a lost callback loses nothing. */
  private async pollRunning(cron: CronRow): Promise<void> {
    const now = Date.now();
    for (const run of await this.runningRuns(cron.id)) {
      if (!run.builderJobId) {
        if (now - run.startedAt > DISPATCH_GRACE_MS) {
          const error = "the run never reached the builder";
          await this.complete(cron, run, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
        }
        continue;
      }
      const job = await getJob(this.config, run.builderJobId).catch(() => null);
      if (job?.ok) {
        if (job.value.finishedAt !== null) await this.completeFromBuilder(cron, run, job.value);
      } else if (now - run.startedAt > cron.timeoutSeconds * 1000 + LOST_CONTACT_GRACE_MS) {
        const error = `lost contact with the builder${job ? `: ${job.message}` : ""}`;
        await this.complete(cron, run, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
      }
    }
  }

  private async stopRun(cron: CronRow, run: CronRunRow, why: string): Promise<void> {
    const cancelled = run.builderJobId ? await cancelJob(this.config, run.builderJobId).catch(() => null) : null;
    if (cancelled?.ok && cancelled.value.finishedAt !== null) {
      await this.completeFromBuilder(cron, run, cancelled.value, why);
      return;
    }
    await this.complete(cron, run, { status: "failed", exitCode: null, error: why, log: logLine(`error: ${why}`) });
  }

  private async completeFromBuilder(cron: CronRow, run: CronRunRow, status: JobStatus, why?: string): Promise<void> {
    const log = await jobLog(this.config, status.id).catch(() => null);
    const text = log?.ok ? log.value : logLine("warning: the builder's log could not be fetched");
    if (status.status === "succeeded") {
      await this.complete(cron, run, { status: "success", exitCode: status.exitCode, error: null, log: text });
      return;
    }
    const line = why ? `error: ${why}` : failureLine(status, cron.timeoutSeconds);
    await this.complete(cron, run, {
      status: "failed",
      exitCode: status.exitCode,
      error: line.replace(/^error: /, ""),
      log: `${text}${text.endsWith("\n") || text === "" ? "" : "\n"}${logLine(line)}`,
    });
  }

  /** Stores the log in R2, then records the outcome once (a racing callback and poll agree). */
  private async complete(cron: CronRow, run: CronRunRow, outcome: Outcome): Promise<void> {
    const key = logKey(cron.id, run.jobName);
    await this.env.BUCKET.put(key, outcome.log, { httpMetadata: { contentType: "text/plain; charset=utf-8" } });
    await this.db
      .update(cronRuns)
      .set({
        status: outcome.status,
        finishedAt: Date.now(),
        exitCode: outcome.exitCode,
        error: outcome.error,
        logKey: key,
      })
      .where(and(eq(cronRuns.cronId, cron.id), eq(cronRuns.jobName, run.jobName), eq(cronRuns.status, "running")));
  }

  /** Keeps the newest {@link RUN_HISTORY} runs (checked every {@link TRIM_EVERY_RUNS}); older ones go with their logs. */
  private async trimHistory(cronId: string): Promise<void> {
    const old = await this.db
      .select({ jobName: cronRuns.jobName })
      .from(cronRuns)
      .where(eq(cronRuns.cronId, cronId))
      .orderBy(desc(cronRuns.startedAt), desc(cronRuns.jobName))
      .limit(1000)
      .offset(RUN_HISTORY);
    if (old.length === 0) return;
    await this.env.BUCKET.delete(old.map((r) => logKey(cronId, r.jobName)));
    for (const { jobName } of old) {
      await this.db.delete(cronRuns).where(and(eq(cronRuns.cronId, cronId), eq(cronRuns.jobName, jobName)));
    }
  }
}
