/**
 * The "run" job: a user command (cron run, one-off task) in the app's
 * environment, with its source and disk. A plain function of its inputs, so
 * the HTTP layer and the queue stay out of it and other jobs can reuse its steps.
 */
import { chown, mkdir, rm, rmdir } from "node:fs/promises";
import { join } from "node:path";
import type { DiskStore } from "../disks.js";
import type { JobSpec } from "../protocol.js";
import { type CgroupV2, type JobLog, type JobUser, type SandboxOutcome, runInSandbox } from "../sandbox.js";
import { fetchSourceArchive } from "../source-archive.js";

/** Inputs of {@link runJob}. */
export interface RunJobInput {
  id: string;
  spec: JobSpec;
  /** `jobs/<id>`; the job works in `jobs/<id>/work`, removed when it ends. */
  jobDir: string;
  log: JobLog;
  disks: DiskStore;
  cgroups: CgroupV2 | null;
  user: JobUser | null;
  /** Aborting cancels the job (reason "shutdown" when the builder stops). */
  signal: AbortSignal;
}

/**
 * Prepares the working directory (source archive, disk), runs the command in
 * the sandbox and writes the outcome as the log's last line, so a log read on
 * its own says how the run ended.
 */
export async function runJob(input: RunJobInput): Promise<SandboxOutcome> {
  const { spec, log } = input;
  const workDir = join(input.jobDir, "work");
  const deadline = Date.now() + spec.timeoutSeconds * 1000;
  try {
    await mkdir(workDir, { mode: 0o700 });
    if (input.user) await chown(workDir, input.user.uid, input.user.gid);
    const disk = spec.disk
      ? {
          path: input.disks.dataPath(spec.disk.id),
          mountPath: spec.disk.mountPath,
          quotaBytes: (await input.disks.put(spec.disk.id, spec.disk.sizeBytes)).info.sizeBytes,
        }
      : null;

    if (spec.sourceUrl) {
      const timeout = AbortSignal.timeout(spec.timeoutSeconds * 1000);
      const source = await fetchSourceArchive({
        url: spec.sourceUrl,
        jobDir: input.jobDir,
        workDir,
        user: input.user,
        log,
        signal: AbortSignal.any([input.signal, timeout]),
      });
      if (!source.ok) {
        if (input.signal.aborted) return finish(log, interrupted(input.signal));
        if (timeout.aborted) return finish(log, failure("timeout", `timed out after ${spec.timeoutSeconds} s`));
        return finish(log, failure("error", source.error));
      }
    }

    const outcome = await runInSandbox({
      jobId: input.id,
      command: spec.command,
      env: spec.env,
      workDir,
      timeoutMs: Math.max(1, deadline - Date.now()),
      memoryLimitBytes: spec.memoryMb * 1024 * 1024,
      disk,
      user: input.user,
      cgroups: input.cgroups,
      log,
      signal: input.signal,
    });
    if (outcome.reason === "timeout") outcome.error = `timed out after ${spec.timeoutSeconds} s`;
    return finish(log, outcome);
  } finally {
    await removeWorkDir(workDir);
  }
}

/** Most runs leave an empty directory, which one rmdir removes; anything else needs the recursive walk. */
export async function removeWorkDir(workDir: string): Promise<void> {
  try {
    await rmdir(workDir);
  } catch {
    await rm(workDir, { recursive: true, force: true });
  }
}

/** An outcome for a job that ended before or without its command (shared by the job kinds). */
export function failure(reason: SandboxOutcome["reason"], error: string): SandboxOutcome {
  return { exitCode: null, signal: null, reason, error, peakMemoryBytes: 0 };
}

/** The outcome of a job whose signal was aborted: a cancel, or the builder shutting down. */
export function interrupted(signal: AbortSignal): SandboxOutcome {
  return signal.reason === "shutdown"
    ? failure("error", "builder shut down before the job finished")
    : failure("cancelled", "cancelled");
}

/** Writes the outcome as the log's last line (format in protocol.ts), so a log read on its own says how the job ended. */
export function finish(log: JobLog, outcome: SandboxOutcome): SandboxOutcome {
  if (outcome.reason === null) log.note("job succeeded (exit code 0)");
  else if (outcome.reason === "cancelled") log.note("job cancelled");
  else log.note(`job failed: ${outcome.error}`);
  return outcome;
}
