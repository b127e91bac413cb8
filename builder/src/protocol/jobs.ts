/**
 * Jobs: work that runs to an end in a sandbox (runs, builds, snapshots,
 * restores), submitted with `POST /v1/jobs` (and its kin), followed through
 * their log and status (job-status.ts).
 *
 *
 * Job log format
 * --------------
 * `GET /v1/jobs/:id/logs` returns UTF-8 text, one record per line:
 *
 *     2026-11-21T10:00:00.000Z out hello world
 *     2026-11-21T10:00:00.004Z err sh: 1: nosuchcmd: not found
 *     2026-11-21T10:00:00.005Z svc job failed: exit code 127 (command not found)
 *
 * i.e. `<ISO-8601 UTC time with ms> <stream> <text>` where stream is `out`
 * (the command's stdout), `err` (its stderr) or `svc` (a message from the
 * builder itself: source download, limits, the final outcome). stdout and stderr
 * are interleaved in the order lines complete; a last line without a newline is
 * flushed when the job ends; a line longer than {@link LOG_MAX_LINE_BYTES} is
 * split. The log keeps at most {@link LOG_LIMIT_BYTES}; beyond that the command's
 * output is dropped and one `svc` line {@link LOG_TRUNCATION_MARKER} marks the cut
 * (the builder's own final lines still follow it).
 */
import { z } from "zod";
import { DISK_ID_PATTERN, ENV_NAME_PATTERN, diskGeneration, httpUrl, noNul, tenant } from "./shared.js";

/** Most bytes a job log keeps (DESIGN §7: 10 MiB per run or build). */
export const LOG_LIMIT_BYTES = 10 * 1024 * 1024;
/** Text of the `svc` line written where a log was cut at {@link LOG_LIMIT_BYTES}. */
export const LOG_TRUNCATION_MARKER = "[log truncated at 10 MiB]";
/** Longest command output line kept as one record; longer ones are split. */
export const LOG_MAX_LINE_BYTES = 64 * 1024;

/**
 * The submission's idempotency key, chosen by the control plane (the run,
 * backup, restore or deployment it belongs to): submitting again with a key the
 * builder knows returns that job instead of starting another, so a retry after a
 * lost reply never runs anything twice. `GET /v1/jobs?key=…` finds it too.
 */
export const JOB_KEY_PATTERN = /^[A-Za-z0-9_.:/-]{1,200}$/;
export const key = z.string().regex(JOB_KEY_PATTERN, "must be 1-200 characters of letters, digits and _.:/-");

/**
 * Fair share between tenants (issue 17): every submission counts against its
 * tenant, which runs at most `tenantConcurrency` jobs at once (its plan's
 * limit; the builder's default when absent, and never every slot of the
 * builder). Free slots go to the tenant with the fewest running jobs, so one
 * tenant's backlog never holds up another's next job.
 */
export const fairShare = {
  tenantConcurrency: z.int().min(1).max(1024).optional(),
  /** Refuse the submission (429 TENANT_QUEUE_FULL) when the tenant already has this many jobs queued; no bound when absent. */
  tenantMaxQueued: z.int().min(0).max(100_000).optional(),
  /** Also POST the status to `callbackUrl` when a job that was answered `queued` starts (its `running` status). */
  startCallback: z.boolean().optional(),
};

/**
 * Directories of a job's sandbox (the host's system directories it sees
 * read-only, and its own /proc, /dev, /tmp, /work, /home, /run): a disk may not
 * be mounted on or under them.
 */
export const SANDBOX_RESERVED_PATHS = [
  "/usr",
  "/bin",
  "/sbin",
  "/lib",
  "/lib32",
  "/lib64",
  "/libx32",
  "/etc",
  "/proc",
  "/dev",
  "/sys",
  "/tmp",
  "/work",
  "/home",
  "/run",
] as const;

/** Why a disk cannot be mounted at `mountPath` (the sandbox directory it would cover), or null when it can. */
export function mountPathProblem(mountPath: string): string | null {
  const segments = mountPath.split("/").filter(Boolean);
  if (!mountPath.startsWith("/") || segments.length === 0) return "must be an absolute path below /";
  if (segments.includes("..") || segments.includes(".")) return "must not contain . or .. segments";
  const normal = `/${segments.join("/")}`;
  const taken = SANDBOX_RESERVED_PATHS.find((path) => normal === path || normal.startsWith(`${path}/`));
  return taken ? `${taken} belongs to the job's sandbox; choose another path, e.g. /data` : null;
}

/** How far ahead of its second a run may be sent ({@link JobSpec}'s `startAt`). */
export const STAGE_AHEAD_MAX_MS = 5 * 60_000;

/** A job to run: what the Worker posts to `POST /v1/jobs`. */
export const JobSpec = z.object({
  key: key.optional(),
  /** The account the job belongs to: it runs as that account's user and may use only its disks. */
  tenant,
  command: z.string().min(1).max(100_000).refine(noNul, "must not contain NUL"),
  /**
   * Exactly the environment the command sees, plus PATH and HOME defaults (which
   * these values override) and the builder's SVC_* variables (which they do not).
   */
  env: z
    .record(z.string().regex(ENV_NAME_PATTERN, "invalid environment variable name"), z.string().refine(noNul, "must not contain NUL"))
    .default({}),
  /** A `.tar.gz` downloaded and extracted into the working directory before the command runs. */
  sourceUrl: httpUrl.optional(),
  disk: z
    .object({
      id: z.string().regex(DISK_ID_PATTERN),
      /** Where the job sees the disk (SVC_DISK_PATH and SVC_DISK_MOUNT_PATH name it); not a directory of the sandbox itself. */
      mountPath: z
        .string()
        .max(4096)
        .refine(noNul, "must not contain NUL")
        .superRefine((path, context) => {
          const problem = mountPathProblem(path);
          if (problem) context.addIssue({ code: "custom", message: problem });
        }),
      sizeBytes: z.int().positive(),
      generation: diskGeneration,
    })
    .optional(),
  timeoutSeconds: z.int().min(1).max(43_200),
  memoryMb: z.int().min(16).max(65_536),
  /**
   * The run's second (epoch ms), for a run sent ahead of it (a cron job's, issue
   * 33): the builder makes its sandbox now (cgroups, network, mounts, source)
   * and starts the command at that time, or once a slot is free after it, never
   * before; its time limit counts from then. Until then it is `queued`
   * (waiting `scheduled`) and a cancel ends it unstarted. At most
   * {@link STAGE_AHEAD_MAX_MS} ahead; a time past is now.
   */
  startAt: z
    .int()
    .positive()
    .refine((at) => at <= Date.now() + STAGE_AHEAD_MAX_MS, `must be at most ${STAGE_AHEAD_MAX_MS / 60_000} minutes ahead`)
    .optional(),
  /** Receives the final {@link JobStatus}, signed, when the job ends. */
  callbackUrl: httpUrl.optional(),
  /** Opaque to the builder; echoed in every status so callbacks can be routed. */
  labels: z.record(z.string(), z.string()).optional(),
  ...fairShare,
});
export type JobSpec = z.infer<typeof JobSpec>;

/** `queued` while the builder, or the job's tenant, is at its concurrency limit. */
export const JobState = z.enum(["queued", "running", "succeeded", "failed", "cancelled"]);
export type JobState = z.infer<typeof JobState>;

/** Why a job did not succeed (null while running and on success). */
export const JobFailureReason = z.enum(["exit_code", "timeout", "OOMKilled", "disk_quota", "cancelled", "error"]);
export type JobFailureReason = z.infer<typeof JobFailureReason>;

/** Origin of a log line. */
export type LogStream = "out" | "err" | "svc";

const LOG_LINE = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z) (out|err|svc) (.*)$/s;

/**
 * Splits one log line (without its newline) into its parts, so the Worker can
 * render run logs without re-deriving the format; null when it is not a record.
 */
export function parseLogLine(line: string): { time: string; stream: LogStream; text: string } | null {
  const match = LOG_LINE.exec(line);
  if (!match) return null;
  return { time: match[1]!, stream: match[2] as LogStream, text: match[3]! };
}
