import { DurableObject } from "cloudflare:workers";
import { and, asc, eq } from "drizzle-orm";
import type { JobStatus } from "../builder/src/protocol/job-status";
import type { JobSpec } from "../builder/src/protocol/jobs";
import { RELEASE_PATH } from "../builder/src/protocol/processes";
import { countingD1, openDb } from "../worker/db/client";
import { cronRuns, crons, type Plan } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import { ApiError } from "../worker/lib/errors";
import { cancelJob, describeWait, findJob, getJob, jobLog, LONE_BUILDER_ID, neverSent, type NodeRef, submitJob } from "../worker/lib/builder-client";
import { lostNode, nodeRef } from "../worker/services/fleet";
import { diskNode, placeStateless } from "../worker/services/placement";
import { nextRuns } from "../worker/lib/cron";
import { randomBase62 } from "../worker/lib/ids";
import { builderShare, PLAN_LIMITS } from "../worker/lib/plans";
import { type CronTarget, loadTarget } from "../worker/services/cron-targets";
import type { CronDefinition, CronRunRecord } from "../worker/services/crons";
import { logKey, RUN_HISTORY } from "../worker/services/crons";
import { GIB } from "../worker/services/disks";
import { metricsStub } from "../worker/services/metrics";
import { decryptEnv } from "../worker/services/env-vars";
import { emit } from "../worker/services/webhooks";
import { presign } from "../worker/storage/presign";

/** How a finished run ended, whatever reported it (callback, poll, or a dispatch failure). */
type Outcome = { status: "success" | "failed"; exitCode: number | null; error: string | null; log: string };

type RunRow = {
  seq: number;
  job_name: string;
  trigger: "schedule" | "manual";
  status: "running" | "success" | "failed";
  /** While `running`: whether the builder has started the command or holds it queued (null in rows from before phases). */
  phase: "queued" | "running" | null;
  /** Why a queued run waits, in words. */
  waiting: string | null;
  scheduled_at: number;
  /** When the run was dispatched (null in rows from before phases: then `started_at`). */
  queued_at: number | null;
  /** The builder's start of the command; until it starts (and for a run that never did), when it was dispatched. */
  started_at: number;
  finished_at: number | null;
  exit_code: number | null;
  error: string | null;
  builder_job_id: string | null;
  /** The node the run was sent to (null in rows from before the fleet). */
  node_id: string | null;
  /** The submission's idempotency key at the builder (null in rows from before staging: `<cron id>/<job name>`). */
  builder_key: string | null;
  log_key: string | null;
};

/** Poll running jobs quickly at first, then settle; callbacks usually arrive first. */
const FAST_POLL_MS = 2_000;
const SLOW_POLL_MS = 15_000;
const FAST_POLL_WINDOW_MS = 60_000;
/** A run the builder has no record of this long after it started never reached the builder. */
const DISPATCH_GRACE_MS = 60_000;
/** Past its timeout plus this, a run whose builder cannot be asked is given up. */
const LOST_CONTACT_GRACE_MS = 5 * 60_000;
/** The alarm is this late (or missing) before the job's detail calls it late. */
export const LATE_AFTER_MS = 2 * 60_000;
/**
 * A scheduled run of a job without a disk is sent to its node 10 to 30 s before
 * its second (issue 33): the node makes its sandbox meanwhile, and at the second
 * only the command's exec is left (builder/src/jobs/manager.ts, staging). Each
 * job has its own lead in that range (from its id), so a thousand jobs of one
 * minute reach their node over 20 s, not in one burst a node cannot answer
 * within its deadline.
 */
export function stageLead(cronId: string): number {
  let hash = 2166136261;
  for (let i = 0; i < cronId.length; i++) hash = Math.imul(hash ^ cronId.charCodeAt(i), 16777619) >>> 0;
  return STAGE_LEAD_MAX_MS - (hash % (STAGE_LEAD_MAX_MS - STAGE_LEAD_MIN_MS + 1));
}
const STAGE_LEAD_MIN_MS = 10_000;
const STAGE_LEAD_MAX_MS = 30_000;

/** Why a manual run was refused before it existed anywhere. */
type Refusal = { code: "TOO_MANY_JOBS" | "NODE_UNREACHABLE" | "BUILDER_UNAVAILABLE"; message: string };

/** What a manual run request comes to: the run (queued or running), or why it was refused. */
export type ManualRun =
  | { ok: true; jobName: string; status: RunRow["status"]; phase: RunRow["phase"] }
  | { ok: false; code: "RUN_IN_PROGRESS" | Refusal["code"]; message: string };

/** A scheduled run's name: the job's and its second's (so a repeated alarm names the same run). */
const scheduledName = (job: CronDefinition, due: number) => `${job.name}-${Math.floor(due / 1000)}`;

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

const recordOf = (row: RunRow): CronRunRecord => ({
  jobName: row.job_name,
  trigger: row.trigger,
  status: row.status,
  phase: row.status === "running" ? (row.phase ?? "running") : null,
  waiting: row.status === "running" && row.phase === "queued" ? row.waiting : null,
  scheduledAt: row.scheduled_at,
  queuedAt: row.queued_at ?? row.started_at,
  startedAt: row.started_at,
  finishedAt: row.finished_at,
  exitCode: row.exit_code,
  error: row.error,
});

/**
 * One object per cron job (DESIGN §4): its alarm is the job's only timer, and
 * it owns the job's runs (status, times, exit code, builder job, log key) in
 * its own SQLite storage. Everything a scheduled run needs is already here:
 * the job's definition (written by create/update) and its app's target
 * (pushed when the app changes, see services/cron-targets.ts). So when the
 * alarm fires, the command goes to the builder at once; D1 is written once,
 * after, with the job's last and next run (the list and the watchdog read it).
 *
 * Alarms are at-least-once and may race with updates: a run is named after its
 * scheduled second and inserted only if new, so a duplicate delivery does
 * nothing; the next alarm is always computed from the definition stored now,
 * so an update that lands while the alarm runs wins; a run ends once (a
 * conditional update), whichever of callback, poll or cancel gets there first.
 */
export class CronJob extends DurableObject<Env> {
  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS runs (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      job_name TEXT NOT NULL UNIQUE,
      trigger TEXT NOT NULL,
      status TEXT NOT NULL,
      scheduled_at INTEGER NOT NULL,
      started_at INTEGER NOT NULL,
      finished_at INTEGER,
      exit_code INTEGER,
      error TEXT,
      builder_job_id TEXT,
      log_key TEXT
    )`);
    ctx.storage.sql.exec("CREATE INDEX IF NOT EXISTS runs_running ON runs (status) WHERE status = 'running'");
    // Columns added with the builder's fair queue (issue 17); objects made before get them on first use.
    const columns = new Set(ctx.storage.sql.exec<{ name: string }>("PRAGMA table_info(runs)").toArray().map((c) => c.name));
    for (const [column, type] of [
      ["phase", "TEXT"],
      ["waiting", "TEXT"],
      ["queued_at", "INTEGER"],
      ["node_id", "TEXT"],
      ["builder_key", "TEXT"],
    ] as const) {
      if (!columns.has(column)) ctx.storage.sql.exec(`ALTER TABLE runs ADD COLUMN ${column} ${type}`);
    }
  }

  /** D1 statements this object ran while handling the current alarm (logged with each run: issue 11 counts them). */
  private d1Queries = 0;

  private get config() {
    return configOf(this.env);
  }

  private get db() {
    return openDb(countingD1(this.env.DB, () => this.d1Queries++));
  }

  private get kv() {
    return this.ctx.storage.kv;
  }

  private job(): CronDefinition | undefined {
    return this.kv.get<CronDefinition>("job");
  }

  private target(): CronTarget | undefined {
    return this.kv.get<CronTarget>("target");
  }

  /**
   * Stores the job's definition (create and every update) and, when given,
   * its app's target; re-arms the alarm for the next run, which it returns
   * (epoch ms).
   */
  async configure(job: CronDefinition, target: CronTarget | null): Promise<number | null> {
    // Enabled again (by hand, after it disabled itself or not): its failures in a row count from zero.
    if (job.enabled && this.job()?.enabled === false) this.kv.delete("failures");
    this.kv.put("job", job);
    if (target) this.storeTarget(target);
    // A run already sent for its second carries the old definition: taken back, and sent again as it is now.
    await this.unstage();
    return this.reschedule();
  }

  /** A newer copy of the app's target (older pushes, arriving late, are ignored). */
  async setTarget(target: CronTarget): Promise<void> {
    const before = this.target();
    this.storeTarget(target);
    if (this.target()?.version === before?.version) return;
    // A run already sent for its second carries the old environment, release or disk: taken back and sent again.
    const unstaged = await this.unstage();
    // An app stopping or starting again is what arms or disarms its jobs' alarms.
    if ((unstaged || (this.target()?.stopped === true) !== (before?.stopped === true)) && this.job()) await this.reschedule();
  }

  private storeTarget(target: CronTarget): void {
    const current = this.target();
    if (!current || current.version <= target.version) this.kv.put("target", target);
  }

  /**
   * Starts a manual run now, whatever the schedule says, within the job's
   * concurrency policy (forbid: refused while a run is queued or running;
   * replace: that run is cancelled; allow: another run) and the account's
   * plan: refused while `manualRunQueueLimit` of its jobs wait for a slot.
   */
  async runNow(plan: Plan): Promise<ManualRun | null> {
    const job = this.job();
    const target = this.target();
    if (!job || !target) return null;
    // A run sent ahead whose second has not come is not in progress: under forbid it is taken back (its
    // second decides again, as for any scheduled run), under allow and replace it stays for its second.
    if (job.concurrencyPolicy === "forbid") await this.unstage();
    const ahead = this.stagedRow()?.job_name;
    const rows = this.runningRows();
    const running = rows.filter((row) => row.job_name !== ahead);
    // Under forbid, one its node could not be asked to take back still runs at its second: it counts.
    const busy = rows[0];
    if (busy && job.concurrencyPolicy === "forbid") {
      const phase = busy.phase ?? "running";
      return {
        ok: false,
        code: "RUN_IN_PROGRESS",
        message: `run ${busy.job_name} of cron job ${job.name} is still ${busy.job_name === ahead ? "staged on its node for its second (which could not be asked to take it back)" : phase === "queued" ? "queued (waiting for a slot)" : "running"}, and the job's concurrency policy is forbid; wait for it, cancel it (POST /v1/crons/${job.id}/runs/${busy.job_name}/cancel, or svc cron cancel ${job.name} ${busy.job_name}), or set concurrencyPolicy to allow or replace`,
      };
    }
    const now = Date.now();
    const jobName = `manual-${randomBase62(6).toLowerCase()}-${Math.floor(now / 1000)}`;
    this.insertRun(jobName, "manual", now);
    const refused = await this.dispatch(job, { ...target, plan }, jobName, { maxQueued: PLAN_LIMITS[plan].manualRunQueueLimit });
    if (refused) {
      // Refused before it existed anywhere: no run to list, as for a stopped app.
      this.ctx.storage.sql.exec("DELETE FROM runs WHERE job_name = ? AND builder_job_id IS NULL", jobName);
      if (refused.code !== "TOO_MANY_JOBS") return { ok: false, code: refused.code, message: `the run did not start: ${refused.message}` };
      const { concurrentJobs, manualRunQueueLimit } = PLAN_LIMITS[plan];
      return {
        ok: false,
        code: "TOO_MANY_JOBS",
        message: `the account already has ${manualRunQueueLimit} jobs waiting for a slot (the ${plan} plan runs ${concurrentJobs} at once, and refuses manual runs while ${manualRunQueueLimit} wait); wait for some to start, or cancel queued runs`,
      };
    }
    this.kv.put("lastRunAt", now);
    if (job.concurrencyPolicy === "replace") {
      for (const row of running) await this.stopRun(job, row, `replaced by manual run ${jobName}`);
    }
    await this.reschedule();
    await this.recordInD1(job);
    const run = this.row(jobName);
    return { ok: true, jobName, status: run?.status ?? "running", phase: run?.status === "running" ? (run.phase ?? "running") : null };
  }

  /** The newest runs first (the last {@link RUN_HISTORY} are kept). */
  async runs(): Promise<CronRunRecord[]> {
    return this.ctx.storage.sql
      .exec<RunRow>("SELECT * FROM runs ORDER BY seq DESC LIMIT ?", RUN_HISTORY)
      .toArray()
      .map(recordOf);
  }

  async run(jobName: string): Promise<CronRunRecord | null> {
    const row = this.row(jobName);
    return row ? recordOf(row) : null;
  }

  /** A run's log: stored in R2 once it ended, read live from the builder while it runs; null for an unknown run. */
  async logs(jobName: string): Promise<string | null> {
    const row = this.row(jobName);
    if (!row) return null;
    if (row.log_key) return (await (await this.env.BUCKET.get(row.log_key))?.text()) ?? "";
    const node = await this.nodeOf(row);
    const live = row.builder_job_id && node ? await jobLog(this.config, node, row.builder_job_id).catch(() => null) : null;
    return live?.ok ? live.value : "";
  }

  /** Cancels a running run (the builder kills its processes); the run as it is afterwards, null when unknown. */
  async cancel(jobName: string): Promise<CronRunRecord | null> {
    const row = this.row(jobName);
    const job = this.job();
    if (!row || !job) return null;
    if (row.status === "running") {
      await this.stopRun(job, row, "cancelled");
      await this.reschedule();
    }
    return this.run(jobName);
  }

  /** Last and next run, and whether the schedule is behind (an alarm that did not fire). */
  async detail(): Promise<{ lastRunAt: number | null; nextRunAt: number | null; late: boolean }> {
    const job = this.job();
    const next = this.kv.get<number>("scheduledFor") ?? null;
    const alarm = await this.ctx.storage.getAlarm();
    const late =
      Boolean(job?.enabled) && next !== null && Date.now() - next > LATE_AFTER_MS && (alarm === null || alarm > next);
    return { lastRunAt: this.kv.get<number>("lastRunAt") ?? null, nextRunAt: job?.enabled ? next : null, late };
  }

  /**
   * The watchdog's call for a job whose next run is overdue (its alarm failed
   * past the runtime's retries): runs what is due now, once, and re-arms.
   */
  async rearm(): Promise<number | null> {
    const job = this.job();
    if (!job) return null;
    await this.alarm();
    await this.recordInD1(this.job() ?? job);
    return this.kv.get<number>("scheduledFor") ?? null;
  }

  /**
   * The builder's signed callback lands here (see worker/routes/internal.ts):
   * a run's final status, or the `running` status of a run that had waited in
   * the builder's queue (which only records its start).
   */
  async jobFinished(status: JobStatus): Promise<void> {
    const job = this.job();
    const jobName = status.labels.jobName;
    const row = jobName ? this.row(jobName) : null;
    if (!job || !row || row.status !== "running") return;
    if (row.builder_job_id !== null && row.builder_job_id !== status.id) return;
    if (status.finishedAt === null) {
      this.noteStatus(row.job_name, status);
      return;
    }
    await this.completeFromBuilder(job, row, status);
    await this.reschedule();
  }

  /** Disarms and forgets everything; a stale alarm afterwards finds nothing to do. */
  async destroy(): Promise<void> {
    await this.unstage();
    await this.ctx.storage.deleteAlarm();
    await this.ctx.storage.deleteAll();
  }

  override async alarm(): Promise<void> {
    this.d1Queries = 0;
    const job = this.job() ?? (await this.adoptLegacy());
    if (!job) {
      await this.destroy();
      return;
    }
    const due = this.kv.get<number>("scheduledFor");
    const staged = this.kv.get<number>("stagedFor");
    let ran: number | undefined;
    let dispatchedAt: number | null = null;
    if (staged !== undefined && staged <= Date.now()) {
      // A run sent ahead: at its second only the bookkeeping is left (its node starts it on its own).
      ran = staged;
      dispatchedAt = this.atSecond(job, staged);
      if (dispatchedAt !== null) await this.replacePrevious(job, scheduledName(job, staged));
    } else if (due !== undefined && due <= Date.now()) {
      ran = due;
      dispatchedAt = await this.fire(job, due);
    }
    const skipped = this.kv.get<number>("stageSkipped");
    if (due !== undefined && due > Date.now() && due !== staged && due !== skipped && due - Date.now() <= stageLead(job.id)) await this.stage(job, due);
    const pollAt = this.kv.get<number>("pollAt");
    if (pollAt !== undefined && pollAt <= Date.now()) await this.pollRunning();
    // From the definition stored now: an update that landed while this alarm ran wins.
    await this.reschedule();
    if (dispatchedAt !== null && ran !== undefined) {
      await this.recordInD1(this.job() ?? job);
      await this.trimHistory();
      // One structured line per scheduled run: how late the builder had it (negative: sent ahead), and what it cost D1.
      console.log(
        JSON.stringify({
          event: "cron.run",
          cronId: job.id,
          jobName: scheduledName(job, ran),
          dispatchLagMs: dispatchedAt - ran,
          d1Queries: this.d1Queries,
        }),
      );
    }
  }

  private row(jobName: string): RunRow | null {
    return this.ctx.storage.sql.exec<RunRow>("SELECT * FROM runs WHERE job_name = ?", jobName).toArray()[0] ?? null;
  }

  private runningRows(): RunRow[] {
    return this.ctx.storage.sql.exec<RunRow>("SELECT * FROM runs WHERE status = 'running' ORDER BY seq").toArray();
  }

  /**
   * Inserts a `running` run, `queued` until the builder says it started; false
   * when one of that name exists (a duplicate alarm delivery). Its key at the
   * builder is `<cron id>/<job name>`; a run sent ahead adds the time it was
   * sent, since one taken back (its job changed) is sent again as a new
   * submission and a key names one.
   */
  private insertRun(jobName: string, trigger: RunRow["trigger"], scheduledAt: number, ahead = false): boolean {
    const now = Date.now();
    const key = `${this.job()?.id ?? ""}/${jobName}${ahead ? `/${now}` : ""}`;
    const cursor = this.ctx.storage.sql.exec(
      "INSERT INTO runs (job_name, trigger, status, phase, scheduled_at, queued_at, started_at, builder_key) VALUES (?, ?, 'running', 'queued', ?, ?, ?, ?) ON CONFLICT (job_name) DO NOTHING",
      jobName,
      trigger,
      scheduledAt,
      now,
      now,
      key,
    );
    return cursor.rowsWritten > 0;
  }

  /**
   * Takes what the builder said of a run before its end: still queued (and
   * why), or started at its `startedAt`. Only a running run changes, and never
   * from started back to queued (a slow poll's answer arriving after the start).
   */
  private noteStatus(jobName: string, status: JobStatus): void {
    if (status.finishedAt !== null) return;
    if (status.status === "queued") {
      this.ctx.storage.sql.exec(
        "UPDATE runs SET waiting = ? WHERE job_name = ? AND status = 'running' AND phase = 'queued'",
        describeWait(status),
        jobName,
      );
      return;
    }
    this.noteStarted(jobName, status.startedAt === null ? Date.now() : Date.parse(status.startedAt));
  }

  /** The builder's start of a run still recorded as queued (its `running` status, or its end's, when that came first). */
  private noteStarted(jobName: string, startedAt: number): void {
    this.ctx.storage.sql.exec(
      "UPDATE runs SET phase = 'running', waiting = NULL, started_at = max(coalesce(queued_at, started_at), ?) WHERE job_name = ? AND status = 'running' AND phase = 'queued'",
      startedAt,
      jobName,
    );
  }

  /**
   * Next run strictly after now, from the stored definition: a late alarm runs
   * once and the schedule moves on, never a catch-up burst. The alarm is the
   * earlier of that and the next poll of running runs.
   */
  private async reschedule(): Promise<number | null> {
    const now = Date.now();
    const job = this.job();
    // A disabled job, or one of a stopped app, is not armed at all: 10,000 paused jobs wake nobody.
    // Enabling it (configure) or starting the app (setTarget) arms the next run again.
    const active = job?.enabled === true && this.target()?.stopped !== true;
    const next = job && active ? (nextRuns(job.schedule, job.timezone, now, 1)[0] ?? null) : null;
    if (next === null) this.kv.delete("scheduledFor");
    else this.kv.put("scheduledFor", next);
    const staged = this.kv.get<number>("stagedFor");
    // The next run is sent ahead when it can be; one sent already wakes the job at its second.
    const ahead = next !== null && next !== staged && next !== this.kv.get<number>("stageSkipped") && job !== undefined && this.stageable(job);
    const send = next === null ? null : ahead ? Math.max(now, next - stageLead(job.id)) : next;
    // A run sent ahead is asked about from its second (before it, the node has nothing to tell).
    const running = this.runningRows().map((r) => ({ ...r, from: Math.max(now, r.scheduled_at) }));
    // Keep a poll already planned (re-arming must not push it back), else plan the next one.
    const planned = this.kv.get<number>("pollAt");
    const pollAt =
      running.length === 0
        ? null
        : planned !== undefined && planned > now
          ? planned
          : Math.min(...running.map((r) => r.from + (r.from - r.started_at < FAST_POLL_WINDOW_MS ? FAST_POLL_MS : SLOW_POLL_MS)));
    if (pollAt === null) this.kv.delete("pollAt");
    else this.kv.put("pollAt", pollAt);
    const wake = Math.min(send ?? Number.POSITIVE_INFINITY, staged ?? Number.POSITIVE_INFINITY, pollAt ?? Number.POSITIVE_INFINITY);
    if (Number.isFinite(wake)) await this.ctx.storage.setAlarm(wake);
    else await this.ctx.storage.deleteAlarm();
    return next;
  }

  /** Starts the run due at `due`, unless the job or its app says not to; when one started, the time the builder had it. */
  private async fire(job: CronDefinition, due: number): Promise<number | null> {
    const target = this.target();
    if (!job.enabled || !target || target.stopped) return null;
    const running = this.runningRows();
    if (running.length > 0 && job.concurrencyPolicy === "forbid") return null;
    const jobName = scheduledName(job, due);
    if (!this.insertRun(jobName, "schedule", due)) return null;
    this.kv.put("lastRunAt", due);
    // The only wait before the command starts is the builder's answer; the rest is bookkeeping after.
    await this.dispatch(job, target, jobName);
    const dispatchedAt = Date.now();
    await this.replacePrevious(job, jobName);
    return dispatchedAt;
  }

  /** Under `replace`, the runs still going when `jobName` is due are stopped. */
  private async replacePrevious(job: CronDefinition, jobName: string): Promise<void> {
    if (job.concurrencyPolicy !== "replace") return;
    for (const row of this.runningRows()) if (row.job_name !== jobName) await this.stopRun(job, row, "replaced by the next scheduled run");
  }

  /** Whether the job's next run may be sent ahead: it runs, on an app that runs, without a disk (whose lease and moves are settled at the second), and `forbid` has nothing running. */
  private stageable(job: CronDefinition): boolean {
    const target = this.target();
    if (!job.enabled || !target || target.stopped || target.disk) return false;
    return job.concurrencyPolicy !== "forbid" || this.runningRows().length === 0;
  }

  /**
   * Sends the run due at `due` to its node now, to start at that second
   * (the node stages it). Anything in the way (no node, a refusal) leaves it to
   * be sent at the second as any other run.
   */
  private async stage(job: CronDefinition, due: number): Promise<void> {
    const target = this.target();
    if (!target || !this.stageable(job)) return;
    const jobName = scheduledName(job, due);
    this.kv.put("stagedFor", due);
    // Its row exists: this is a repeated delivery of the alarm that sent it.
    if (!this.insertRun(jobName, "schedule", due, true)) return;
    const refused = await this.dispatch(job, target, jobName, { startAt: due });
    if (!refused) return;
    this.ctx.storage.sql.exec("DELETE FROM runs WHERE job_name = ? AND builder_job_id IS NULL", jobName);
    this.kv.delete("stagedFor");
    // Not tried again before the second (each try would cost a placement): sent then, as any run.
    this.kv.put("stageSkipped", due);
    console.log(JSON.stringify({ event: "cron.stage_skipped", cronId: job.id, jobName, reason: refused.message }));
  }

  /** The second of a run sent ahead: its node starts it; what is left is the record. Returns when it was sent. */
  private atSecond(job: CronDefinition, due: number): number | null {
    this.kv.delete("stagedFor");
    const row = this.row(scheduledName(job, due));
    if (!row) return null;
    this.kv.put("lastRunAt", due);
    return row.queued_at ?? due;
  }

  /** The run sent ahead whose second has not come, while it is running (sent, not ended); null when there is none. */
  private stagedRow(): RunRow | null {
    const due = this.kv.get<number>("stagedFor");
    if (due === undefined || due <= Date.now()) return null;
    return (
      this.ctx.storage.sql.exec<RunRow>("SELECT * FROM runs WHERE scheduled_at = ? AND trigger = 'schedule' AND status = 'running'", due).toArray()[0] ?? null
    );
  }

  /**
   * Takes back a run sent ahead whose second has not come (the job or its app
   * changed, or the job is going): its node cancels it only if its command has
   * not started, and the run is forgotten, to be sent again as things are now.
   * One its node cannot be asked about, or that has started, runs as it was
   * sent: a change reaches the runs after it. True when one was taken back.
   */
  private async unstage(): Promise<boolean> {
    const row = this.stagedRow();
    if (!row?.builder_job_id) return false;
    const node = await this.nodeOf(row);
    const cancelled = node ? await cancelJob(this.config, node, row.builder_job_id, { unstarted: true }).catch(() => null) : null;
    if (!cancelled?.ok || cancelled.value.status !== "cancelled" || cancelled.value.startedAt !== null) return false;
    this.ctx.storage.sql.exec("DELETE FROM runs WHERE job_name = ?", row.job_name);
    this.kv.delete("stagedFor");
    return true;
  }

  /**
   * Sends the run to the builder with the app's env vars, disk and source,
   * counted against the account's share (its plan's concurrency); a refusal
   * or an outage fails it. A run of an app without a disk goes to another
   * node when the one picked is held sick. With `maxQueued` (manual runs), a
   * run that cannot start anywhere is refused before it exists: the answer
   * says why (the account has that many jobs waiting, or no node takes work
   * now) and the run's row is gone; a scheduled run fails with the reason.
   * With `startAt` (a run sent ahead of its second), anything in the way is
   * answered so too, and the run is sent again at its second.
   */
  private async dispatch(job: CronDefinition, target: CronTarget, jobName: string, options: { maxQueued?: number; startAt?: number } = {}): Promise<Refusal | null> {
    const config = this.config;
    const { disk } = target;
    const { maxQueued, startAt } = options;
    const refuseEarly = maxQueued !== undefined || startAt !== undefined;
    const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err));
    const fail = async (error: string) => {
      await this.complete(jobName, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
      return null;
    };
    if (disk?.restoring) return fail(`disk ${disk.name} is being restored; the run did not start`);
    /** Nodes that refused the run unsent (held sick): a run without a disk tries the others. */
    const passedOver = new Map<string, string>();
    for (;;) {
      let node: NodeRef;
      try {
        // A run of an app with a disk goes to the disk's node; any other to the least loaded (no D1 read either way).
        node = disk
          ? await diskNode(this.env, { id: disk.id, nodeId: disk.nodeId ?? null })
          : await placeStateless(this.env, passedOver.size > 0 ? { exclude: new Set(passedOver.keys()) } : {});
      } catch (err) {
        const reason = passedOver.size > 0 ? `no other node takes work (${[...passedOver.values()].join(", ")} not answering)` : messageOf(err);
        if (refuseEarly) return { code: passedOver.size > 0 || (err instanceof ApiError && err.code === "NODE_UNREACHABLE") ? "NODE_UNREACHABLE" : "BUILDER_UNAVAILABLE", message: reason };
        return fail(`the run did not start: ${reason}`);
      }
      try {
        this.ctx.storage.sql.exec("UPDATE runs SET node_id = ? WHERE job_name = ?", node.id, jobName);
        const submitted = await submitJob(config, node, await this.spec(job, target, jobName, maxQueued, startAt));
        if (!submitted.ok) {
          if (refuseEarly && submitted.code === "TENANT_QUEUE_FULL") return { code: "TOO_MANY_JOBS", message: submitted.message };
          if (startAt !== undefined) return { code: "BUILDER_UNAVAILABLE", message: submitted.message };
          return fail(`the builder refused the run: ${submitted.message}`);
        }
        this.ctx.storage.sql.exec("UPDATE runs SET builder_job_id = ? WHERE job_name = ?", submitted.value.id, jobName);
        this.noteStatus(jobName, submitted.value);
        return null;
      } catch (err) {
        // Its node is held sick and was not asked: the run never started there. Without a disk, another node may take it.
        if (neverSent(err)) {
          if (!disk) {
            passedOver.set(node.id, node.name ?? node.id);
            continue;
          }
          if (refuseEarly) return { code: "NODE_UNREACHABLE", message: messageOf(err) };
          return fail(`the run did not start: ${messageOf(err)}`);
        }
        // Unreachable even after retries. The key lets the next poll find the run if the builder did get it.
        this.kv.put(`unreachable:${jobName}`, `the builder could not be reached: ${messageOf(err)}`);
        return null;
      }
    }
  }

  /** What the builder is asked to run: the command with the app's env vars, disk and source, within the account's share. */
  private async spec(job: CronDefinition, target: CronTarget, jobName: string, maxQueued: number | undefined, startAt: number | undefined): Promise<JobSpec> {
    const config = this.config;
    const { disk } = target;
    return {
      key: this.row(jobName)?.builder_key ?? `${job.id}/${jobName}`,
      ...(startAt === undefined ? {} : { startAt }),
      tenant: job.accountId,
      command: job.command,
      // A release's commands (`npm run report`, a venv's scripts) are on the PATH, unless the app sets its own.
      env: { ...(target.release ? { PATH: RELEASE_PATH } : {}), ...(await decryptEnv(config, target.appId, target.env)) },
      timeoutSeconds: job.timeoutSeconds,
      memoryMb: target.memoryMb,
      callbackUrl: new URL("/internal/builder/callback", config.PUBLIC_URL).href,
      labels: { kind: "cron", cronId: job.id, jobName },
      // A target stored before it carried the plan leaves the builder's default.
      ...(target.plan ? builderShare(target.plan) : {}),
      ...(maxQueued === undefined ? {} : { tenantMaxQueued: maxQueued }),
      ...(disk
        ? { disk: { id: disk.id, mountPath: disk.mountPath, sizeBytes: disk.sizeGb * GIB, ...(disk.generation ? { generation: disk.generation } : {}) } }
        : {}),
      // The app's environment: its active release (or a static site's source), extracted as the working directory.
      ...(target.sourceKey
        ? { sourceUrl: (await presign(config, { method: "GET", key: target.sourceKey, expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS })).url }
        : {}),
    };
  }

  /** The node a run was sent to; null when it left the fleet (or the row predates the fleet and no lone builder is configured). */
  private async nodeOf(row: Pick<RunRow, "node_id">): Promise<NodeRef | null> {
    return nodeRef(this.env, row.node_id ?? LONE_BUILDER_ID).catch(() => null);
  }

  /** Asks the builder about every running run; a lost callback or a lost submission reply loses nothing. */
  private async pollRunning(): Promise<void> {
    const job = this.job();
    if (!job) return;
    const now = Date.now();
    for (const row of this.runningRows()) {
      const node = await this.nodeOf(row);
      const found = !node
        ? null
        : row.builder_job_id
          ? await getJob(this.config, node, row.builder_job_id).catch(() => null)
          : await findJob(this.config, node, row.builder_key ?? `${job.id}/${row.job_name}`).catch(() => null);
      const lost = !found?.ok && row.node_id ? await lostNode(this.env, row.node_id) : null;
      if (lost) {
        const target = this.target();
        // A run the lost node never started is safe to send again; one it started may have done part of its work.
        // One sent ahead whose second has not come goes to another node for that same second.
        if (row.phase === "queued" && target && !target.stopped) {
          await this.dispatch(job, target, row.job_name, row.scheduled_at > Date.now() ? { startAt: row.scheduled_at } : {});
        }
        else {
          const error = `node lost: ${lost.name} stopped answering while the run was running; it was not started again (it may have done part of its work)`;
          await this.complete(row.job_name, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
        }
        continue;
      }
      if (found?.ok) {
        if (!row.builder_job_id) this.ctx.storage.sql.exec("UPDATE runs SET builder_job_id = ? WHERE job_name = ?", found.value.id, row.job_name);
        if (found.value.finishedAt !== null) await this.completeFromBuilder(job, { ...row, builder_job_id: found.value.id }, found.value);
        else this.noteStatus(row.job_name, found.value);
        continue;
      }
      const unreachable = this.kv.get<string>(`unreachable:${row.job_name}`);
      const age = now - row.started_at;
      let error: string | null = null;
      if (row.builder_job_id) {
        // The builder took the run; it answers that it has no such job (lost), or not at all for too long.
        if (found?.status === 404) error = `the builder has no record of job ${row.builder_job_id}: it was lost (the builder restarted without its records)`;
        else if (!found && age > job.timeoutSeconds * 1000 + LOST_CONTACT_GRACE_MS) error = "lost contact with the builder";
      } else if (found?.status === 404) {
        // The submission was never confirmed, and the builder does not know its key: it never arrived.
        error = unreachable ?? "the run never reached the builder";
      } else if (!found && age > DISPATCH_GRACE_MS) {
        error = unreachable ?? "the run never reached the builder";
      }
      if (error !== null) await this.complete(row.job_name, { status: "failed", exitCode: null, error, log: logLine(`error: ${error}`) });
    }
  }

  private async stopRun(job: CronDefinition, row: RunRow, why: string): Promise<void> {
    const node = await this.nodeOf(row);
    const cancelled = row.builder_job_id && node ? await cancelJob(this.config, node, row.builder_job_id).catch(() => null) : null;
    if (cancelled?.ok && cancelled.value.finishedAt !== null) {
      await this.completeFromBuilder(job, row, cancelled.value, why);
      return;
    }
    await this.complete(row.job_name, { status: "failed", exitCode: null, error: why, log: logLine(`error: ${why}`) });
  }

  private async completeFromBuilder(job: CronDefinition, row: RunRow, status: JobStatus, why?: string): Promise<void> {
    // Its start's own news may not have come (a run sent ahead ends quickly after its second): the end says when.
    if (status.startedAt !== null) this.noteStarted(row.job_name, Date.parse(status.startedAt));
    const node = await this.nodeOf(row);
    const log = node ? await jobLog(this.config, node, status.id).catch(() => null) : null;
    const finishedFor = status.finishedAt === null ? 0 : Date.now() - Date.parse(status.finishedAt);
    if (!log?.ok && why === undefined && log?.status !== 404 && finishedFor < LOST_CONTACT_GRACE_MS) {
      // The builder keeps a finished job's log: the run stays running and the next poll fetches it
      // again, rather than storing a run without its output (seen under a burst of 1,000 runs).
      return;
    }
    const text = log?.ok ? log.value : logLine("warning: the builder's log could not be fetched");
    if (status.status === "succeeded") {
      await this.complete(row.job_name, { status: "success", exitCode: status.exitCode, error: null, log: text });
      return;
    }
    const line = why ? `error: ${why}` : failureLine(status, job.timeoutSeconds);
    await this.complete(row.job_name, {
      status: "failed",
      exitCode: status.exitCode,
      error: line.replace(/^error: /, ""),
      log: `${text}${text.endsWith("\n") || text === "" ? "" : "\n"}${logLine(line)}`,
    });
  }

  /** Records the outcome once (a racing callback, poll and cancel agree on the first), then stores the log in R2. */
  private async complete(jobName: string, outcome: Outcome): Promise<void> {
    const now = Date.now();
    const ended = this.ctx.storage.sql
      .exec<{ started_at: number }>(
        "UPDATE runs SET status = ?, finished_at = ?, exit_code = ?, error = ? WHERE job_name = ? AND status = 'running' RETURNING started_at",
        outcome.status,
        now,
        outcome.exitCode,
        outcome.error,
        jobName,
      )
      .toArray()[0];
    if (!ended) return;
    this.kv.delete(`unreachable:${jobName}`);
    const job = this.job();
    if (!job) return;
    await metricsStub(this.env, job.id)
      .recordRun(now, { durationMs: now - ended.started_at, ok: outcome.status === "success" })
      .catch((error: unknown) => console.error("cron run metrics write failed", error));
    const key = logKey(job.id, jobName);
    await this.env.BUCKET.put(key, outcome.log, { httpMetadata: { contentType: "text/plain; charset=utf-8" } });
    this.ctx.storage.sql.exec("UPDATE runs SET log_key = ? WHERE job_name = ?", key, jobName);
    await this.countOutcome(job, jobName, outcome);
  }

  /**
   * Failed runs in a row: each failure from the job's `notifyAfterFailures`th
   * on goes out as `cron.failed` (with the count); at its
   * `disableAfterFailures` it disables itself, saying
   * why, and `cron.disabled` goes out. A success starts the count again.
   */
  private async countOutcome(job: CronDefinition, jobName: string, outcome: Outcome): Promise<void> {
    if (outcome.status === "success") {
      this.kv.delete("failures");
      return;
    }
    const failures = (this.kv.get<number>("failures") ?? 0) + 1;
    this.kv.put("failures", failures);
    const about = { cron: { id: job.id, name: job.name, appId: job.appId }, run: { jobName, exitCode: outcome.exitCode, error: outcome.error }, consecutiveFailures: failures };
    if (failures >= (job.notifyAfterFailures ?? 1)) await emit(this.env, job.accountId, "cron.failed", about);
    if (!job.enabled || job.disableAfterFailures === null || failures < job.disableAfterFailures) return;
    const reason = `disabled after ${failures} failed runs in a row (the last: ${outcome.error ?? "failed"})`;
    await this.db.update(crons).set({ enabled: false, disabledReason: reason, updatedAt: Date.now() }).where(eq(crons.id, job.id));
    this.kv.put("job", { ...job, enabled: false, disabledReason: reason });
    await this.reschedule();
    console.log(JSON.stringify({ event: "cron.disabled", cronId: job.id, reason }));
    await emit(this.env, job.accountId, "cron.disabled", { ...about, reason });
  }

  /** The job's last and next run, for the list and the watchdog: the one D1 write of a run, after it started. */
  private async recordInD1(job: CronDefinition): Promise<void> {
    await this.db
      .update(crons)
      .set({ lastRunAt: this.kv.get<number>("lastRunAt") ?? null, nextRunAt: this.kv.get<number>("scheduledFor") ?? null })
      .where(eq(crons.id, job.id));
  }

  /** Keeps the newest {@link RUN_HISTORY} runs; reads only the rows past them (by the primary key), never scans. */
  private async trimHistory(): Promise<void> {
    const job = this.job();
    const old = this.ctx.storage.sql
      .exec<{ seq: number; job_name: string }>("SELECT seq, job_name FROM runs ORDER BY seq DESC LIMIT -1 OFFSET ?", RUN_HISTORY)
      .toArray();
    if (!job || old.length === 0) return;
    await this.env.BUCKET.delete(old.map((r) => logKey(job.id, r.job_name)));
    this.ctx.storage.sql.exec("DELETE FROM runs WHERE seq <= ?", old[0]!.seq);
  }

  /**
   * An object made before objects owned their runs holds only its job's id:
   * reads the definition and target from D1 once, takes the job's runs over
   * from D1's cron_runs (deleting them there), and carries on.
   */
  private async adoptLegacy(): Promise<CronDefinition | undefined> {
    const cronId = this.kv.get<string>("cronId");
    if (!cronId) return undefined;
    const db = this.db;
    const row = await db.select().from(crons).where(eq(crons.id, cronId)).get();
    if (!row) return undefined;
    const { lastRunAt, nextRunAt: _next, targetVersion: _version, ...job } = row;
    const [target, legacy] = await Promise.all([
      loadTarget(db, row.appId),
      db.select().from(cronRuns).where(eq(cronRuns.cronId, cronId)).orderBy(asc(cronRuns.startedAt)),
    ]);
    for (const run of legacy) {
      this.ctx.storage.sql.exec(
        "INSERT INTO runs (job_name, trigger, status, scheduled_at, started_at, finished_at, exit_code, error, builder_job_id, log_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_name) DO NOTHING",
        run.jobName,
        run.trigger,
        run.status,
        run.scheduledAt,
        run.startedAt,
        run.finishedAt,
        run.exitCode,
        run.error,
        run.builderJobId,
        run.logKey,
      );
    }
    this.kv.put("job", job);
    if (target) this.storeTarget(target);
    if (lastRunAt !== null) this.kv.put("lastRunAt", lastRunAt);
    this.kv.delete("cronId");
    if (legacy.length > 0) await db.delete(cronRuns).where(and(eq(cronRuns.cronId, cronId)));
    return job;
  }
}
