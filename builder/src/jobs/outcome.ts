/**
 * How the builder's own jobs (snapshot, restore) end. They run no user
 * command, so there is no exit code or memory peak to report, and they end
 * their log the same way every job does: a last `svc` line with the outcome.
 */
import type { JobOutcome } from "./manager.js";
import type { JobResult } from "../protocol/job-status.js";
import type { JobLog } from "../sandbox/sandbox.js";

const NO_PROCESS = { exitCode: null, signal: null, peakMemoryBytes: 0 } as const;

/** Logs success and carries the job's result into its status. */
export function succeeded(log: JobLog, result: JobResult): JobOutcome {
  log.note("job succeeded");
  return { ...NO_PROCESS, reason: null, error: null, result };
}

/** Logs and reports a failure, or the cancellation or shutdown that caused it. */
export function failed(log: JobLog, signal: AbortSignal, error: string): JobOutcome {
  if (signal.aborted && signal.reason !== "shutdown") {
    log.note("job cancelled");
    return { ...NO_PROCESS, reason: "cancelled", error: "cancelled" };
  }
  const message = signal.aborted ? "builder shut down before the job finished" : error;
  log.note(`job failed: ${message}`);
  return { ...NO_PROCESS, reason: "error", error: message };
}

/** The message of anything thrown. */
export function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
