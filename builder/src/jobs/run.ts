/**
 * The "run" job: a user command (cron run, one-off task) in the app's
 * environment, with its source and disk, in a sandbox of its own. A plain
 * function of its inputs, so the HTTP layer and the queue stay out of it and
 * other jobs can reuse its steps.
 */
import { rm, rmdir } from "node:fs/promises";
import type { DiskStore } from "../disks/store.js";
import type { JobSpec } from "../protocol/jobs.js";
import type { SandboxHost } from "../sandbox/host.js";
import { type JobLog, type SandboxOutcome, runInSandbox } from "../sandbox/sandbox.js";
import type { JobUser } from "../sandbox/tenants.js";
import { downloadSource } from "./source-archive.js";

/** Inputs of {@link runJob}. */
export interface RunJobInput {
  id: string;
  spec: JobSpec;
  /** `jobs/<id>`: the source archive is downloaded here. */
  jobDir: string;
  log: JobLog;
  disks: DiskStore;
  host: SandboxHost;
  /** The tenant's user. */
  user: JobUser;
  /** Aborting cancels the job (reason "shutdown" when the builder stops). */
  signal: AbortSignal;
  /** A run staged before its second: everything is made ready now, the command starts when this resolves (its time limit from then). */
  hold: Promise<void> | null;
  /** Called once the held sandbox is made (the command waits for `hold`). */
  onStaged: () => void;
}

/**
 * Prepares the disk and the source, runs the command in its sandbox and writes
 * the outcome as the log's last line, so a log read on its own says how the run
 * ended. The working directory lives in memory (it counts against the job's
 * memory limit, of which it may take half) and disappears with the sandbox.
 */
export async function runJob(input: RunJobInput): Promise<SandboxOutcome> {
  const { spec, log } = input;
  const deadline = Date.now() + spec.timeoutSeconds * 1000;
  let source: string | null = null;
  try {
    let disk = null;
    if (spec.disk) {
      await input.disks.ensure(spec.disk.id, spec.disk.sizeBytes, spec.tenant);
      disk = { path: input.disks.dataPath(spec.disk.id), mountPath: spec.disk.mountPath, quotaBytes: spec.disk.sizeBytes };
    }
    if (spec.sourceUrl) {
      const timeout = AbortSignal.timeout(spec.timeoutSeconds * 1000);
      const downloaded = await downloadSource({
        url: spec.sourceUrl,
        jobDir: input.jobDir,
        user: input.user,
        log,
        signal: AbortSignal.any([input.signal, timeout]),
      });
      if (!downloaded.ok) {
        if (input.signal.aborted) return finish(log, interrupted(input.signal));
        if (timeout.aborted) return finish(log, failure("timeout", `timed out after ${spec.timeoutSeconds} s`));
        return finish(log, failure("error", downloaded.error));
      }
      source = downloaded.path;
    }
    const memoryLimitBytes = spec.memoryMb * 1024 * 1024;
    const outcome = await runInSandbox({
      host: input.host,
      jobId: input.id,
      command: spec.command,
      env: spec.env,
      user: input.user,
      // Half the memory limit: with /tmp and /dev/shm, in-memory files can fill it but not pass it.
      work: { tmpfsBytes: Math.floor(memoryLimitBytes / 2) },
      source,
      network: "egress",
      tools: null,
      // Staged, what came before the second (the source's download) does not count against the limit.
      timeoutMs: input.hold ? spec.timeoutSeconds * 1000 : Math.max(1, deadline - Date.now()),
      ...(input.hold ? { hold: input.hold, onStaged: input.onStaged } : {}),
      memoryLimitBytes,
      disk,
      log,
      signal: input.signal,
    });
    if (outcome.reason === "timeout") outcome.error = `timed out after ${spec.timeoutSeconds} s`;
    return finish(log, outcome);
  } catch (error) {
    return finish(log, failure("error", error instanceof Error ? error.message : String(error)));
  } finally {
    if (source) await rm(source, { force: true });
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

/** Writes the outcome as the log's last line (format in protocol/jobs.ts), so a log read on its own says how the job ended. */
export function finish(log: JobLog, outcome: SandboxOutcome): SandboxOutcome {
  if (outcome.reason === null) log.note("job succeeded (exit code 0)");
  else if (outcome.reason === "cancelled") log.note("job cancelled");
  else log.note(`job failed: ${outcome.error}`);
  return outcome;
}
