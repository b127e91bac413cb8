import { eq } from "drizzle-orm";
import type { Db } from "../db/client";
import { accounts, type Plan } from "../db/schema";
import { ApiError } from "./errors";

const GIB = 1024 ** 3;

/** What one plan allows an account (docs/api.md, "Plans and limits"). */
export type PlanLimits = {
  /** Backup retention (spec: 7 to 90 days, by plan). */
  backupRetentionDays: number;
  /** One backup space shared by disk backups and database dumps. */
  backupQuotaBytes: number;
  /**
   * Most automatic snapshots one disk may keep (its `snapshotKeep`): a daily
   * snapshot for each day of the plan's retention, after which they expire anyway.
   */
  snapshotKeep: number;
  /** Disks the account may have. */
  disks: number;
  /** Largest single disk. */
  diskSizeGb: number;
  /** All the account's disks together: disks are reserved at their full size. */
  totalDiskGb: number;
  /** Highest memory limit of one app (its builds, runs and processes). */
  appMemoryMb: number;
  /** Apps the account may have (static sites included). */
  apps: number;
  /**
   * The memory limits of all the account's apps that run a process, together:
   * what it may reserve of the fleet's memory, whatever the hosts have free.
   */
  totalAppMemoryMb: number;
  /** Most processes one app may run (`instances`); each reserves the app's memory limit in the total above. */
  instances: number;
  /** Cron jobs the account may have. */
  cronJobs: number;
  /**
   * The account's share of the builder: this many of its jobs (cron runs,
   * builds, backups, restores) run at once, the rest wait `queued` in the
   * account's own queue.
   */
  concurrentJobs: number;
  /** A manual cron run is refused (429 TOO_MANY_JOBS) while this many of the account's jobs already wait. */
  manualRunQueueLimit: number;
};

/**
 * What each plan buys (DESIGN §3). What an account reserves (disk space,
 * memory, scheduled work, builder slots) is bounded here, so no account can
 * claim more of the data plane than its plan says, whatever the hosts have
 * free. The largest plan's `concurrentJobs` stays below the builder's default
 * 8 slots, so one account at its limit never fills a default builder.
 */
export const PLAN_LIMITS: Record<Plan, PlanLimits> = {
  free: {
    backupRetentionDays: 7,
    snapshotKeep: 7,
    backupQuotaBytes: 10 * GIB,
    disks: 2,
    diskSizeGb: 10,
    totalDiskGb: 10,
    appMemoryMb: 2048,
    apps: 10,
    totalAppMemoryMb: 4096,
    instances: 3,
    cronJobs: 20,
    concurrentJobs: 2,
    manualRunQueueLimit: 8,
  },
  pro: {
    backupRetentionDays: 30,
    snapshotKeep: 30,
    backupQuotaBytes: 100 * GIB,
    disks: 10,
    diskSizeGb: 250,
    totalDiskGb: 1000,
    appMemoryMb: 8192,
    apps: 50,
    totalAppMemoryMb: 16_384,
    instances: 10,
    cronJobs: 200,
    concurrentJobs: 4,
    manualRunQueueLimit: 16,
  },
  business: {
    backupRetentionDays: 90,
    snapshotKeep: 90,
    backupQuotaBytes: 1024 * GIB,
    disks: 50,
    diskSizeGb: 1000,
    totalDiskGb: 10_000,
    appMemoryMb: 16_384,
    apps: 200,
    totalAppMemoryMb: 65_536,
    instances: 20,
    cronJobs: 5000,
    concurrentJobs: 6,
    manualRunQueueLimit: 24,
  },
};

/** The account's plan and its limits (one indexed read). */
export async function planOf(db: Db, accountId: string): Promise<{ plan: Plan; limits: PlanLimits }> {
  const account = await db.select({ plan: accounts.plan }).from(accounts).where(eq(accounts.id, accountId)).get();
  if (!account) throw new ApiError("UNAUTHORIZED", "account not found");
  return { plan: account.plan, limits: PLAN_LIMITS[account.plan] };
}

/** The refusal of something the plan does not allow: says which limit, what is in use, and the way out. */
export function planLimitError(plan: Plan, what: string, remedy: string): ApiError {
  return new ApiError("PLAN_LIMIT_EXCEEDED", `${what} on the ${plan} plan; ${remedy}, or upgrade the plan`);
}

/**
 * The fair-share fields of a submission to the builder for an account on
 * `plan`: its concurrency, and a report of the start of a job that had to
 * wait (runs, deployments and backups show `queued` until then).
 */
export function builderShare(plan: Plan): { tenantConcurrency: number; startCallback: true } {
  return { tenantConcurrency: PLAN_LIMITS[plan].concurrentJobs, startCallback: true };
}
