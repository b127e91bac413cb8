import { and, eq, isNotNull, lt } from "drizzle-orm";
import { LATE_AFTER_MS } from "../../durable-objects/cron-job";
import { openDb } from "../db/client";
import { crons } from "../db/schema";
import type { Env } from "../env";
import { pushTargets, staleTargets } from "./cron-targets";
import { cronStub } from "./crons";

/** Jobs re-armed per pass; more wait for the next pass (a few minutes), so one pass stays within its limits. */
const MAX_PER_PASS = 200;

export type WatchResult = { resynced: number; rearmed: number; failures: number };

/**
 * The cron watchdog (every 5 minutes, from scheduled()). A job's alarm that
 * keeps failing past the runtime's retries (D1 or the builder down for long)
 * is never re-armed by anything else, and a push of an app's target can fail:
 * this finds jobs whose next run is overdue and runs their alarm now (a late
 * job runs once, not a burst), and pushes again to jobs whose copy of their
 * app is older than the app.
 */
export async function watchCrons(env: Env, now: number): Promise<WatchResult> {
  const db = openDb(env.DB);
  const result: WatchResult = { resynced: 0, rearmed: 0, failures: 0 };
  for (const { appId } of (await staleTargets(db)).slice(0, MAX_PER_PASS)) {
    await pushTargets(env, db, appId).then(
      () => result.resynced++,
      (err: unknown) => {
        result.failures++;
        console.error(`watchdog: pushing app ${appId}'s target failed`, err);
      },
    );
  }
  const overdue = await db
    .select({ id: crons.id })
    .from(crons)
    .where(and(eq(crons.enabled, true), isNotNull(crons.nextRunAt), lt(crons.nextRunAt, now - LATE_AFTER_MS)))
    .limit(MAX_PER_PASS);
  for (const { id } of overdue) {
    await cronStub(env, id)
      .rearm()
      .then(
        () => result.rearmed++,
        (err: unknown) => {
          result.failures++;
          console.error(`watchdog: re-arming cron job ${id} failed`, err);
        },
      );
  }
  if (result.resynced + result.rearmed + result.failures > 0) console.log(JSON.stringify({ event: "cron.watchdog", ...result }));
  return result;
}
