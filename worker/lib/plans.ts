import type { Plan } from "../db/schema";

const GIB = 1024 ** 3;

/**
 * What each plan buys (DESIGN §3): backup retention (spec: 7 to 90 days) and
 * one backup space shared by disk backups and database dumps.
 */
export const PLAN_LIMITS: Record<Plan, { backupRetentionDays: number; backupQuotaBytes: number }> = {
  free: { backupRetentionDays: 7, backupQuotaBytes: 10 * GIB },
  pro: { backupRetentionDays: 30, backupQuotaBytes: 100 * GIB },
  business: { backupRetentionDays: 90, backupQuotaBytes: 1024 * GIB },
};
