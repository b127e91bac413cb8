import { DurableObject } from "cloudflare:workers";
import type { JobStatus } from "../builder/src/protocol/job-status";
import { openDb } from "../worker/db/client";
import { configOf, type Env } from "../worker/env";
import { type BuilderResult, describeWait, findJob, getJob, type NodeRef } from "../worker/lib/builder-client";
import { lostNode, nodeRef } from "../worker/services/fleet";

const FAST_POLL_MS = 2_000;
const SLOW_POLL_MS = 15_000;
const FAST_POLL_WINDOW_MS = 60_000;
/** A finish that failed half-way (storage or D1 unavailable) is tried again this much later. */
const FINISH_RETRY_MS = 5_000;
/** A finish still marked under way this long after it began was cut short (the runtime restarted): it runs again. */
const FINISH_STALE_MS = 60_000;

/** What a job ended with: the builder's final status, or why there is none. */
export type Ending = JobStatus | { error: string };

/**
 * Where a job that has not ended stands (issue 17): waiting for a slot on the
 * builder (`queued`, with the reason in words) or running since `startedAt`
 * (epoch ms, the builder's start). Before the builder answered, `queued`.
 */
export type JobProgress = { phase: "queued" | "running"; startedAt: number | null; waiting: string | null };

/**
 * Shared shape of the objects that own one builder job each (a backup, a
 * restore, a deployment): submit it under the object's own key, remember it,
 * learn its end from the signed callback or, if that is lost, from the alarm
 * polling the builder, and finish exactly once. Subclasses say what "finish"
 * means; their finish must be safe to run again after it failed part-way.
 *
 * Alarms, callbacks and polls all arrive more than once and may race: the
 * object claims the finish synchronously (before its first await), so a second
 * arrival returns at once instead of finishing twice.
 *
 * Until the job ends the object also knows whether the builder has started it
 * or holds it queued (the builder's answer to the submission, its start
 * callback, or a poll), and never goes back from running to queued.
 */
export abstract class SingleBuilderJob extends DurableObject<Env> {
  protected get db() {
    return openDb(this.env.DB);
  }

  protected get config() {
    return configOf(this.env);
  }

  /** Called once with how the job ended (a final status, or a failure without one). */
  protected abstract finish(ending: Ending): Promise<void>;

  /** Gives up on a job the builder cannot report on after this long. */
  protected abstract maxRuntimeMs(): number;

  /**
   * The job's node was lost before it ended. A job that is safe to repeat
   * (a build) sends itself to another node and answers true; the others fail
   * with the reason (default).
   */
  protected async retryElsewhere(): Promise<boolean> {
    return false;
  }

  /** Forgets the job sent to a lost node, so that a new submission is watched instead. */
  protected forgetJob(): void {
    for (const key of ["jobId", "jobKey", "node", "watchedAt", "phase", "startedAt", "waiting"]) this.ctx.storage.kv.delete(key);
  }

  /** Called once when the builder starts the job (epoch ms); a subclass records it where its views read it. */
  protected async started(_startedAt: number): Promise<void> {}

  /** Where the job stands, for the views; null once it has ended. */
  async progress(): Promise<JobProgress | null> {
    const kv = this.ctx.storage.kv;
    if (kv.get("finished") || kv.get("finishing")) return null;
    return {
      phase: kv.get<"queued" | "running">("phase") ?? "queued",
      startedAt: kv.get<number>("startedAt") ?? null,
      waiting: kv.get<string>("waiting") ?? null,
    };
  }

  /** Takes what the builder said of the job before its end: still queued (and why), or started. */
  protected async noteStatus(status: JobStatus): Promise<void> {
    const kv = this.ctx.storage.kv;
    if (kv.get("finished") || kv.get("finishing") || status.finishedAt !== null || kv.get("phase") === "running") return;
    if (status.status === "queued") {
      kv.put("phase", "queued");
      kv.put("waiting", describeWait(status) ?? "waiting for a free slot on the builder");
      return;
    }
    const startedAt = status.startedAt === null ? Date.now() : Date.parse(status.startedAt);
    kv.put("phase", "running");
    kv.put("startedAt", startedAt);
    kv.delete("waiting");
    await this.started(startedAt);
  }

  /**
   * Takes the outcome of a submission: watches the job it started, or fails.
   * A submission whose reply was lost is remembered by its key; the alarm asks
   * the builder for it again (the key makes a retried submission safe, too).
   */
  protected async submitted(
    key: string,
    node: NodeRef,
    result: BuilderResult<JobStatus> | { ok: false; message: string },
    what: string,
  ): Promise<void> {
    this.ctx.storage.kv.put("jobKey", key);
    this.ctx.storage.kv.put("node", node.id);
    if (result.ok) {
      await this.noteStatus(result.value);
      await this.watch(result.value.id);
      return;
    }
    if ("status" in result && result.status !== 0) {
      await this.fail(`the builder refused ${what}: ${result.message}`);
      return;
    }
    // Unreachable, or the reply was lost: find out by key at the next alarm.
    this.ctx.storage.kv.put("watchedAt", Date.now());
    await this.ctx.storage.setAlarm(Date.now() + FAST_POLL_MS);
  }

  /** The id of the node the job was sent to (where its live log is); null before it was sent. */
  async nodeId(): Promise<string | null> {
    return this.ctx.storage.kv.get<string>("node") ?? null;
  }

  /** The node the job was sent to; null before it was, or once the node left the fleet. */
  protected async jobNode(): Promise<NodeRef | null> {
    const nodeId = this.ctx.storage.kv.get<string>("node");
    return nodeId === undefined ? null : nodeRef(this.env, nodeId).catch(() => null);
  }

  /** Records the builder job and starts polling for its end. */
  protected async watch(jobId: string): Promise<void> {
    this.ctx.storage.kv.put("jobId", jobId);
    if (this.ctx.storage.kv.get("watchedAt") === undefined) this.ctx.storage.kv.put("watchedAt", Date.now());
    await this.ctx.storage.setAlarm(Date.now() + FAST_POLL_MS);
  }

  /** Finishes without a builder job (it could not be started). */
  protected async fail(error: string): Promise<void> {
    await this.finishOnce({ error });
  }

  /**
   * The builder's callback (worker/routes/internal.ts): the final status, or
   * the `running` status of a job that had waited in its queue (it asked for
   * that with `startCallback`), which only records the start.
   */
  async jobFinished(status: JobStatus): Promise<void> {
    const jobId = this.ctx.storage.kv.get<string>("jobId");
    const key = this.ctx.storage.kv.get<string>("jobKey");
    if (jobId !== status.id && (key === undefined || status.key !== key)) return;
    if (jobId === undefined) this.ctx.storage.kv.put("jobId", status.id);
    if (status.finishedAt === null) await this.noteStatus(status);
    else await this.finishOnce(status);
  }

  override async alarm(): Promise<void> {
    const kv = this.ctx.storage.kv;
    if (kv.get("finished")) return;
    const finishing = kv.get<number>("finishing");
    if (finishing !== undefined) {
      if (Date.now() - finishing < FINISH_STALE_MS) {
        await this.ctx.storage.setAlarm(finishing + FINISH_STALE_MS);
        return;
      }
      // Cut short (the chaos run restarted the Worker a second after a snapshot ended: its backup stayed
      // `creating`): the job's end is asked for again and finished again, every step being repeatable.
      kv.delete("finishing");
    }
    const watchedAt = this.ctx.storage.kv.get<number>("watchedAt") ?? Date.now();
    const age = Date.now() - watchedAt;
    const jobId = this.ctx.storage.kv.get<string>("jobId");
    const key = this.ctx.storage.kv.get<string>("jobKey");
    const nodeId = this.ctx.storage.kv.get<string>("node");
    if (nodeId === undefined || (jobId === undefined && key === undefined)) return;
    const node = await nodeRef(this.env, nodeId).catch(() => null);
    if (!node) {
      await this.finishOnce({ error: `node ${nodeId} was removed from the fleet before the job ended` });
      return;
    }
    let job: BuilderResult<JobStatus> | null;
    if (jobId !== undefined) job = await getJob(this.config, node, jobId).catch(() => null);
    else job = await findJob(this.config, node, key!).catch(() => null);
    const lost = job?.ok ? null : await lostNode(this.env, nodeId);
    if (lost && (await this.retryElsewhere())) return;
    if (lost) {
      // The disk or the work is on a node the fleet declared lost: waiting longer would only delay the news.
      await this.finishOnce({ error: `node lost: ${lost.name} stopped answering${lost.lostAt ? ` (declared lost at ${new Date(lost.lostAt).toISOString()})` : ""}` });
      return;
    }
    if (job?.ok) {
      if (jobId === undefined) this.ctx.storage.kv.put("jobId", job.value.id);
      if (job.value.finishedAt !== null) {
        await this.finishOnce(job.value);
        return;
      }
      await this.noteStatus(job.value);
    } else if (job?.status === 404) {
      // The builder answers, and has no such job: it was lost (a restart without its records), or never arrived.
      const lost =
        jobId === undefined
          ? "the job never reached the builder"
          : `the builder has no record of job ${jobId}: it was lost (the builder restarted without its records)`;
      await this.finishOnce({ error: lost });
      return;
    } else if (age > this.maxRuntimeMs()) {
      await this.finishOnce({ error: `lost contact with the builder${job ? `: ${job.message}` : ""}` });
      return;
    }
    await this.ctx.storage.setAlarm(Date.now() + (age < FAST_POLL_WINDOW_MS ? FAST_POLL_MS : SLOW_POLL_MS));
  }

  private async finishOnce(ending: Ending): Promise<void> {
    const kv = this.ctx.storage.kv;
    if (kv.get("finished") || kv.get("finishing")) return;
    const began = Date.now();
    kv.put("finishing", began);
    // Polling is over, but an alarm stays until the finish is done, so one the runtime cuts short runs again;
    // a subclass's finish may set an alarm of its own (a deployment publishing in steps), which then stands.
    const safety = began + FINISH_STALE_MS;
    await this.ctx.storage.setAlarm(safety);
    try {
      await this.finish(ending);
    } catch (err) {
      // Let the alarm try again (it polls the builder for the same outcome); finish steps are repeatable.
      kv.delete("finishing");
      await this.ctx.storage.setAlarm(Date.now() + FINISH_RETRY_MS);
      throw err;
    }
    kv.put("finished", true);
    kv.delete("finishing");
    if ((await this.ctx.storage.getAlarm()) === safety) await this.ctx.storage.deleteAlarm();
  }
}

/** The failure message of an ending that did not succeed; memory kills are named `OOMKilled` (spec, "Errors"). */
export function failureOf(ending: Ending): string | null {
  if (!("id" in ending)) return ending.error;
  if (ending.status === "succeeded") return null;
  const message = ending.error ?? `the job ended ${ending.status}`;
  return ending.reason === "OOMKilled" ? `OOMKilled: ${message}` : message;
}
