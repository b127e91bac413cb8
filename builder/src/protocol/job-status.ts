/**
 * What a job reports: its status (`GET /v1/jobs/:id`, the completion
 * callback), with the result of each kind of job.
 */
import { z } from "zod";
import { RestoreResult, SnapshotResult } from "./disks.js";
import { JobFailureReason, JobState } from "./jobs.js";
import { ReleaseResult } from "./processes.js";
import { BuildResult } from "./static.js";

/** Every kind of job result, told apart by `kind`. */
export const JobResult = z.discriminatedUnion("kind", [SnapshotResult, RestoreResult, BuildResult, ReleaseResult]);
export type JobResult = z.infer<typeof JobResult>;

/** What `GET /v1/jobs/:id` answers and what the completion callback carries. */
export const JobStatus = z.object({
  id: z.string(),
  /** The submission's idempotency key (null when it had none, and in records written before keys existed). */
  key: z.string().nullable().default(null),
  status: JobState,
  reason: JobFailureReason.nullable(),
  exitCode: z.int().nullable(),
  signal: z.string().nullable(),
  /** Human message, e.g. "memory limit 64 MiB exceeded (peak 71 MiB)". */
  error: z.string().nullable(),
  /** Highest memory use seen (cgroup peak, or the sampled RSS sum of the process tree). */
  peakMemoryBytes: z.int().nonnegative(),
  logBytes: z.int().nonnegative(),
  logTruncated: z.boolean(),
  createdAt: z.iso.datetime(),
  /** Null while queued. */
  startedAt: z.iso.datetime().nullable(),
  /**
   * While queued, why: its second has not come (`scheduled`: a run sent ahead,
   * made ready meanwhile), the tenant runs as many jobs as it may
   * (`tenant_limit`), or every slot of the builder is busy (`builder_full`); `ahead` counts the
   * tenant's own jobs queued before this one. Null otherwise (absent in records
   * written before tenants had limits).
   */
  waiting: z
    .object({
      reason: z.enum(["scheduled", "tenant_limit", "builder_full"]),
      tenantRunning: z.int().nonnegative(),
      tenantLimit: z.int().positive(),
      ahead: z.int().nonnegative(),
    })
    .nullable()
    .optional(),
  finishedAt: z.iso.datetime().nullable(),
  labels: z.record(z.string(), z.string()),
  /**
   * What a snapshot, restore or build job produced, once it succeeded (null
   * before and for other jobs; absent in records written before results
   * existed).
   */
  result: JobResult.nullable().optional(),
});
export type JobStatus = z.infer<typeof JobStatus>;
