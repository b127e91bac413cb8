import { DurableObject } from "cloudflare:workers";
import type { JobStatus } from "../builder/src/protocol";
import { openDb } from "../worker/db/client";
import { configOf, type Env } from "../worker/env";
import { getJob } from "../worker/lib/builder-client";

const FAST_POLL_MS = 2_000;
const SLOW_POLL_MS = 15_000;
const FAST_POLL_WINDOW_MS = 60_000;

/**
 * Shared shape of the objects that own one builder job each (a backup, a
 * restore, a deployment): remember the job, learn its end from the signed
 * callback or, if that is lost, from the alarm polling the builder, and finish
 * exactly once. Subclasses say what "finish" means.
 */
export abstract class SingleBuilderJob extends DurableObject<Env> {
  protected get db() {
    return openDb(this.env.DB);
  }

  protected get config() {
    return configOf(this.env);
  }

  /** Called once with the job's final status (or a synthetic failure). */
  protected abstract finish(status: JobStatus | { error: string }): Promise<void>;

  /** Gives up on a job the builder cannot report on after this long. */
  protected abstract maxRuntimeMs(): number;

  /** Records the builder job and starts polling for its end. */
  protected async watch(jobId: string): Promise<void> {
    await this.ctx.storage.put({ jobId, watchedAt: Date.now() });
    await this.ctx.storage.setAlarm(Date.now() + FAST_POLL_MS);
  }

  /** Finishes without a builder job (it could not be started). */
  protected async fail(error: string): Promise<void> {
    await this.finishOnce({ error });
  }

  /** The builder's completion callback. */
  async jobFinished(status: JobStatus): Promise<void> {
    if ((await this.ctx.storage.get<string>("jobId")) !== status.id) return;
    await this.finishOnce(status);
  }

  override async alarm(): Promise<void> {
    const jobId = await this.ctx.storage.get<string>("jobId");
    if (!jobId || (await this.ctx.storage.get<boolean>("finished"))) return;
    const watchedAt = (await this.ctx.storage.get<number>("watchedAt")) ?? Date.now();
    const job = await getJob(this.config, jobId).catch(() => null);
    if (job?.ok && job.value.finishedAt !== null) {
      await this.finishOnce(job.value);
      return;
    }
    const age = Date.now() - watchedAt;
    if (!job?.ok && age > this.maxRuntimeMs()) {
      await this.finishOnce({ error: `lost contact with the builder${job ? `: ${job.message}` : ""}` });
      return;
    }
    await this.ctx.storage.setAlarm(Date.now() + (age < FAST_POLL_WINDOW_MS ? FAST_POLL_MS : SLOW_POLL_MS));
  }

  private async finishOnce(status: JobStatus | { error: string }): Promise<void> {
    if (await this.ctx.storage.get<boolean>("finished")) return;
    await this.finish(status);
    await this.ctx.storage.put("finished", true);
    await this.ctx.storage.deleteAlarm();
  }
}

/** The failure message of a status that did not succeed; memory kills are named `OOMKilled` (spec, "Errors"). */
export function failureOf(status: JobStatus | { error: string }): string | null {
  if (!("id" in status)) return status.error;
  if (status.status === "succeeded") return null;
  const message = status.error ?? `the job ended ${status.status}`;
  return status.reason === "OOMKilled" ? `OOMKilled: ${message}` : message;
}
