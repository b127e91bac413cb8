import type { Plan } from "../db/schema";

const GIB = 1024 ** 3;

/**
 * What each plan buys (DESIGN §3): backup retention (spec: 7 to 90 days) and
 * one backup space shared by disk backups and database dumps.
 *
 * And the account's share of the builder (issue 17, docs/api.md "Limits"):
 * `concurrentJobs` of its jobs (cron runs, builds, backups, restores) run at
 * once, the rest wait `queued` in the account's own queue; a manual cron run
 * is refused (429 TOO_MANY_JOBS) while `manualRunQueueLimit` of its jobs
 * already wait. The largest plan stays below the builder's default 8 slots, so
 * one account at its limit never fills a default builder.
 */
export const PLAN_LIMITS: Record<Plan, { backupRetentionDays: number; backupQuotaBytes: number } & JobLimits> = {
  free: { backupRetentionDays: 7, backupQuotaBytes: 10 * GIB, concurrentJobs: 2, manualRunQueueLimit: 8 },
  pro: { backupRetentionDays: 30, backupQuotaBytes: 100 * GIB, concurrentJobs: 4, manualRunQueueLimit: 16 },
  business: { backupRetentionDays: 90, backupQuotaBytes: 1024 * GIB, concurrentJobs: 6, manualRunQueueLimit: 24 },
};

type JobLimits = { concurrentJobs: number; manualRunQueueLimit: number };

/**
 * The fair-share fields of a submission to the builder for an account on
 * `plan`: its concurrency, and a report of the start of a job that had to
 * wait (runs, deployments and backups show `queued` until then).
 */
export function builderShare(plan: Plan): { tenantConcurrency: number; startCallback: true } {
  return { tenantConcurrency: PLAN_LIMITS[plan].concurrentJobs, startCallback: true };
}
