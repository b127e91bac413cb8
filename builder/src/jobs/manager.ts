/**
 * The builder's jobs: admission (at most N at once, each tenant at most its
 * own limit, the rest queued per tenant and started fairly across tenants),
 * records that outlive the process (`jobs/<id>/status.json` + `jobs/<id>/log`,
 * kept 24 h so the Worker can poll after a lost callback), cancellation, and the
 * completion callback. Running one job is `runJob`'s business, not this file's.
 */
import { mkdir, readFile, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { deliverCallback } from "../callback.js";
import type { DiskLeases } from "../disks/leases.js";
import type { DiskStore } from "../disks/store.js";
import { newId } from "../ids.js";
import { NO_PIP_SOURCES, type PipSources, runBuild } from "./build.js";
import type { DependencyCache } from "./dependency-cache.js";
import type { PackageCaches } from "./package-cache.js";
import { restoreJob } from "./restore.js";
import { runJob } from "./run.js";
import { snapshotJob } from "./snapshot.js";
import type { LogSource } from "../logs.js";
import type { RestoreSpec, SnapshotSpec } from "../protocol/disks.js";
import { type JobResult, JobStatus } from "../protocol/job-status.js";
import type { JobSpec } from "../protocol/jobs.js";
import type { NodeCredentials } from "../protocol/shared.js";
import type { BuildSpec } from "../protocol/static.js";
import type { SandboxHost } from "../sandbox/host.js";
import { JobLog, type SandboxOutcome } from "../sandbox/sandbox.js";
import type { TenantUsers } from "../sandbox/tenants.js";
import { Changes } from "../changes.js";

/** How long finished jobs (status and log) stay available. */
const JOB_RETENTION_MS = 24 * 60 * 60 * 1000;
const PRUNE_INTERVAL_MS = 60 * 60 * 1000;
/** After the grace period, how long interrupted jobs and their callbacks get to finish. */
const SHUTDOWN_WAIT_MS = 10_000;
const JOB_ID_PATTERN = /^job_[0-9A-Za-z]{24}$/;

/** What {@link JobWork.execute} gets from the manager. */
export interface JobContext {
  id: string;
  /** `jobs/<id>`: the log and status live here; `work/` below it is removed after a restart. */
  jobDir: string;
  log: JobLog;
  /** Aborted on cancel (reason "cancelled") and on shutdown (reason "shutdown"). */
  signal: AbortSignal;
  /** A job made ready before its second: it may start its command once this resolves (null: at once). */
  hold: Promise<void> | null;
  /** Called once a held job is made ready (its sandbox waits for `hold`). */
  onStaged: () => void;
}

/** How a job ended, plus what it produced (snapshots and restores). */
export interface JobOutcome extends SandboxOutcome {
  result?: JobResult;
}

/**
 * One kind of job (run, snapshot, restore) as the manager sees it: the queue,
 * records, disk bookkeeping and callback are shared, only `execute` differs.
 */
interface JobWork {
  key: string | undefined;
  labels: Record<string, string> | undefined;
  callbackUrl: string | undefined;
  /** The account whose share the job counts against. */
  tenant: string;
  /** Its plan's concurrency as the submission gave it; the builder's default when absent. */
  tenantConcurrency: number | undefined;
  /** Refuse the job when it would wait and the tenant already has this many waiting; no bound when absent. */
  tenantMaxQueued: number | undefined;
  /** Report the start of a job that had to wait through its callback, too. */
  startCallback: boolean;
  /** Not before this time (epoch ms): made ready meanwhile when there is room (a run's `startAt`); null for at once. */
  startAt: number | null;
  /**
   * The disk the job uses. An exclusive job (a restore) is refused while any
   * other job or an app process uses the disk, and every other job is refused
   * while it holds it (disks/leases.ts).
   */
  disk: { id: string; exclusive: boolean } | null;
  /** Runs the job; ends the log with the outcome line and never throws for expected failures. */
  execute(context: JobContext): Promise<JobOutcome>;
}

/** Answer to a submission (`existing`: its key named a job already submitted); refusals are values, mapped to HTTP by the routes. */
export type Admission =
  | { ok: true; status: JobStatus; existing: boolean }
  | { ok: false; code: "UNAVAILABLE" | "DISK_BUSY" | "TENANT_QUEUE_FULL"; message: string };

interface JobEntry {
  status: JobStatus;
  /** Whose share the job counts against ("" for records recovered from a previous process, which never queue). */
  tenant: string;
  /** The most jobs of its tenant that may run while this one starts (the submission's limit, capped). */
  limit: number;
  /** Admission order: between tenants with as many jobs running, the job that waited longest starts first. */
  seq: number;
  /** Send the `running` status through the callback when it starts (it was answered `queued` and asked for this). */
  notifyStart: boolean;
  /** Before its second (a staged run): what queues it then. */
  due: NodeJS.Timeout | null;
  /** A staged run whose sandbox is made, being made or to be made: starts its command. */
  release: (() => void) | null;
  /** What that command waits for. */
  hold: Promise<void> | null;
  /** While its sandbox is being made: ends that (made, or the job ended first), letting the next be made. */
  made: (() => void) | null;
  /** Its work is under way (a running job, or a staged run being made ready). */
  executing: boolean;
  /** It holds a slot (of the builder's and of its tenant's). */
  counted: boolean;
  dir: string;
  /** Where the final status goes; kept on disk (callback.json) so a restarted builder can still report it. */
  callbackUrl: string | null;
  /** Held only until the job ends: a run's env may carry the app's secrets. */
  work: JobWork | null;
  /** Returns the job's lease on its disk (a no-op without one); called when the job ends. */
  releaseDisk: () => void;
  log: JobLog | null;
  abort: AbortController;
  changes: Changes;
  /** Resolves once the final status is recorded on disk. */
  finished: Promise<void>;
  markFinished: () => void;
  /** The last status.json write; writes follow one another so an older one never lands after a newer one. */
  persisted: Promise<void>;
}

/** What the manager needs from the server. */
export interface JobManagerOptions {
  dataDir: string;
  /** Slots: jobs running at once, all tenants together. */
  maxConcurrent: number;
  /** Runs made ready ahead of their second at once (each holds a sandbox and a network namespace); those beyond are made at it. */
  maxStaged: number;
  /** Jobs one tenant runs at once when its submission names no limit. */
  tenantConcurrency: number;
  credentials: NodeCredentials;
  disks: DiskStore;
  /** Disk use shared with the app processes: a restore waits for neither, it is refused while either holds the disk. */
  leases: DiskLeases;
  host: SandboxHost;
  tenants: TenantUsers;
  /** Room a build gets for its project, dependencies and output. */
  buildScratchBytes: number;
  /** Package mirror that builds install through (NPM_CONFIG_REGISTRY); null keeps npm's default. */
  npmRegistry: string | null;
  /** Where python builds install from (BUILDER_PIP_INDEX_URL, BUILDER_PIP_FIND_LINKS); absent: nowhere. */
  pip?: PipSources;
  /** What builds install, kept per app for its next build (jobs/dependency-cache.ts); absent: nothing kept. */
  dependencyCache?: DependencyCache;
  /** What package managers download, kept per account for its next builds (jobs/package-cache.ts); absent: nothing kept. */
  packageCaches?: PackageCaches;
}

/** Run network namespaces a staged run leaves free beyond the slots jobs may still take: for app processes starting meanwhile. */
const STAGING_NETWORK_RESERVE = 16;
/**
 * Staged runs whose sandboxes are made at once: a minute's burst of hundreds
 * is made a few at a time, soonest second first, so that making them never
 * keeps the builder from answering (a submission unanswered for 1 s marks the
 * node unreachable).
 */
const STAGING_AT_ONCE = 2;

/** The staging and slot fields of an entry whose work has not begun. */
const notStarted = (): Pick<JobEntry, "due" | "release" | "hold" | "made" | "executing" | "counted"> => ({
  due: null,
  release: null,
  hold: null,
  made: null,
  executing: false,
  counted: false,
});

const isFinal = (status: JobStatus["status"]) => status === "succeeded" || status === "failed" || status === "cancelled";

/** Snapshots and restores of a disk without a recorded owner (made before tenants existed) share this tenant. */
const UNKNOWN_TENANT = "";

/** One tenant's part of the builder: its jobs running now, and its queue in submission order. */
interface TenantShare {
  running: number;
  queue: JobEntry[];
}

/** What the submission routes pass on about fair sharing. */
type FairShareSpec = { tenantConcurrency?: number | undefined; tenantMaxQueued?: number | undefined; startCallback?: boolean | undefined };

const fairShareOf = (spec: FairShareSpec) => ({
  tenantConcurrency: spec.tenantConcurrency,
  tenantMaxQueued: spec.tenantMaxQueued,
  startCallback: spec.startCallback ?? false,
});

/** Owns every job of this builder process. */
export class JobManager {
  readonly #options: JobManagerOptions;
  readonly #jobsDir: string;
  readonly #jobs = new Map<string, JobEntry>();
  readonly #byKey = new Map<string, JobEntry>();
  /** Callbacks under way, awaited (up to a bound) by a shutdown. */
  readonly #deliveries = new Set<Promise<boolean>>();
  /** Tenants with queued or running jobs; a tenant leaves once it has neither. */
  readonly #shares = new Map<string, TenantShare>();
  #admitted = 0;
  /** Jobs before their second (`startAt`); those being made ready count in {@link #preparing}. */
  readonly #staged = new Set<JobEntry>();
  #preparing = 0;
  /** Staged runs whose sandboxes are still to be made, soonest second first; {@link #making} are being made. */
  readonly #toMake: { entry: JobEntry; startAt: number }[] = [];
  #making = 0;
  readonly #stopCallbacks = new AbortController();
  #running = 0;
  #closing = false;
  #pruneTimer: NodeJS.Timeout | undefined;

  private constructor(options: JobManagerOptions) {
    this.#options = options;
    this.#jobsDir = join(options.dataDir, "jobs");
  }

  /**
   * Loads the records a previous process left and ends its unfinished jobs,
   * reporting each through its callback at once (a crash loses the job, not
   * the news of it), then starts pruning.
   */
  static async open(options: JobManagerOptions): Promise<JobManager> {
    const manager = new JobManager(options);
    await mkdir(manager.#jobsDir, { recursive: true, mode: 0o711 });
    await manager.#recover();
    manager.#pruneTimer = setInterval(() => void manager.#prune(), PRUNE_INTERVAL_MS);
    manager.#pruneTimer.unref();
    return manager;
  }

  /** Jobs running or waiting for a slot now (what heartbeats report as the node's load). */
  get load(): number {
    let queued = 0;
    for (const share of this.#shares.values()) queued += share.queue.length;
    return this.#running + queued + this.#staged.size;
  }

  /**
   * Accepts a run job: it starts at once, or queues while the builder is at its
   * limit; refused once shutting down, or while its disk is being restored. One
   * with a `startAt` to come is staged: its sandbox made now, its command
   * started at that second ({@link #stage}).
   */
  submit(spec: JobSpec): Promise<Admission> {
    const { disks, host, tenants } = this.#options;
    return this.#admit({
      key: spec.key,
      labels: spec.labels,
      callbackUrl: spec.callbackUrl,
      tenant: spec.tenant,
      ...fairShareOf(spec),
      startAt: spec.startAt ?? null,
      disk: spec.disk ? { id: spec.disk.id, exclusive: false } : null,
      execute: async (context) => runJob({ ...context, spec, disks, host, user: await tenants.userOf(spec.tenant) }),
    });
  }

  /** Accepts a static-site build (jobs/build.ts), queued and refused like a run; it uses no disk. */
  submitBuild(spec: BuildSpec): Promise<Admission> {
    const { host, tenants, credentials, npmRegistry, buildScratchBytes, pip = NO_PIP_SOURCES, dependencyCache, packageCaches } = this.#options;
    // Both ids are path segments the protocol checked (BuildSpec's tenant and app).
    const dependencies = dependencyCache?.enabled && spec.app !== undefined ? { cache: dependencyCache, scope: { tenant: spec.tenant, app: spec.app } } : null;
    return this.#admit({
      key: spec.key,
      labels: spec.labels,
      callbackUrl: spec.callbackUrl,
      tenant: spec.tenant,
      ...fairShareOf(spec),
      startAt: null,
      disk: null,
      execute: async (context) =>
        runBuild({
          ...context,
          spec,
          host,
          user: await tenants.userOf(spec.tenant),
          scratchBytes: buildScratchBytes,
          credentials,
          npmRegistry,
          pip,
          dependencies,
          packageCaches: packageCaches ?? null,
        }),
    });
  }

  /**
   * Accepts a disk snapshot (jobs/snapshot.ts). It only reads the disk, so runs
   * and other snapshots may share it; deleting or restoring the disk may not.
   */
  async submitSnapshot(spec: SnapshotSpec): Promise<Admission> {
    const { disks, credentials } = this.#options;
    return this.#admit({
      key: spec.key,
      labels: spec.labels,
      callbackUrl: spec.callbackUrl,
      tenant: spec.tenant ?? (await disks.tenantOf(spec.diskId)) ?? UNKNOWN_TENANT,
      ...fairShareOf(spec),
      startAt: null,
      disk: { id: spec.diskId, exclusive: false },
      execute: (context) => snapshotJob({ ...context, spec, disks, credentials }),
    });
  }

  /**
   * Accepts a disk restore (jobs/restore.ts): refused while any job uses the
   * disk, and refusing every job naming it until it has ended.
   */
  async submitRestore(spec: RestoreSpec): Promise<Admission> {
    const { disks } = this.#options;
    return this.#admit({
      key: spec.key,
      labels: spec.labels,
      callbackUrl: spec.callbackUrl,
      tenant: spec.tenant ?? (await disks.tenantOf(spec.diskId)) ?? UNKNOWN_TENANT,
      ...fairShareOf(spec),
      startAt: null,
      disk: { id: spec.diskId, exclusive: true },
      execute: async (context) => restoreJob({ ...context, spec, disks, user: await disks.owner(spec.diskId) }),
    });
  }

  async #admit(work: JobWork): Promise<Admission> {
    const known = work.key === undefined ? undefined : this.#byKey.get(work.key);
    if (known) return { ok: true, status: this.#snapshot(known), existing: true };
    if (this.#closing) return { ok: false, code: "UNAVAILABLE", message: "builder is shutting down; retry on another instance" };
    const limit = this.#limitOf(work.tenantConcurrency);
    const full = this.#queueFull(work, limit);
    if (full) return { ok: false, code: "TENANT_QUEUE_FULL", message: full };
    const { disk } = work;
    const id = newId("job");
    let releaseDisk = () => {};
    if (disk) {
      // Taken before the first await, so two submissions cannot both pass the check.
      const lease = this.#options.leases.acquire(disk.id, { kind: "job", id }, disk.exclusive);
      if (!lease.ok) return { ok: false, code: "DISK_BUSY", message: lease.message };
      releaseDisk = lease.release;
    }
    const dir = join(this.#jobsDir, id);
    try {
      await mkdir(dir, { mode: 0o711 });
    } catch (error) {
      releaseDisk();
      throw error;
    }
    let markFinished = () => {};
    const finished = new Promise<void>((resolve) => {
      markFinished = resolve;
    });
    const entry: JobEntry = {
      status: {
        id,
        key: work.key ?? null,
        status: "queued",
        reason: null,
        exitCode: null,
        signal: null,
        error: null,
        peakMemoryBytes: 0,
        logBytes: 0,
        logTruncated: false,
        createdAt: new Date().toISOString(),
        startedAt: null,
        waiting: null,
        finishedAt: null,
        labels: work.labels ?? {},
        result: null,
      },
      tenant: work.tenant,
      limit,
      seq: this.#admitted++,
      notifyStart: false,
      ...notStarted(),
      dir,
      callbackUrl: work.callbackUrl ?? null,
      work,
      releaseDisk,
      log: null,
      abort: new AbortController(),
      changes: new Changes(),
      finished,
      markFinished,
      persisted: Promise.resolve(),
    };
    this.#jobs.set(id, entry);
    if (work.key !== undefined) this.#byKey.set(work.key, entry);
    if (entry.callbackUrl) await writeFile(join(dir, "callback.json"), JSON.stringify({ url: entry.callbackUrl }), { mode: 0o600 });
    if (work.startAt !== null && work.startAt > Date.now()) this.#stage(entry, work.startAt);
    else {
      this.#shareOf(work.tenant).queue.push(entry);
      this.#pump();
    }
    if (entry.status.status === "queued") {
      // Only a job answered `queued` has a start the Worker has not heard of.
      entry.notifyStart = work.startCallback && entry.callbackUrl !== null;
      await this.#persist(entry);
    }
    return { ok: true, status: this.#snapshot(entry), existing: false };
  }

  /**
   * The tenant's limit for a job: what its submission asked for (its plan's)
   * or the builder's default, and never every slot when there is more than
   * one, so that one tenant alone never makes another's job wait.
   */
  #limitOf(requested: number | undefined): number {
    const { maxConcurrent, tenantConcurrency } = this.#options;
    return Math.min(requested ?? tenantConcurrency, Math.max(1, maxConcurrent - 1));
  }

  /** Why a job with a bound on its tenant's queue is refused (it would wait, and enough already do), or null. */
  #queueFull(work: JobWork, limit: number): string | null {
    if (work.tenantMaxQueued === undefined) return null;
    const share = this.#shares.get(work.tenant);
    const queued = share?.queue.length ?? 0;
    const wouldWait = this.#running >= this.#options.maxConcurrent || (share?.running ?? 0) >= limit || queued > 0;
    if (!wouldWait || queued < work.tenantMaxQueued) return null;
    return `tenant ${work.tenant} already has ${queued} job${queued === 1 ? "" : "s"} waiting for a slot (at most ${work.tenantMaxQueued}) and ${share?.running ?? 0} running; retry once some have started`;
  }

  #shareOf(tenant: string): TenantShare {
    let share = this.#shares.get(tenant);
    if (!share) {
      share = { running: 0, queue: [] };
      this.#shares.set(tenant, share);
    }
    return share;
  }

  /**
   * A run sent ahead of its second: it joins its tenant's queue at `startAt`,
   * and meanwhile, when there is room, its work begins with a hold: the
   * sandbox is made, the source unpacked, and the command waits for the slot
   * {@link #pump} gives it (so at the second only its exec is left). Room: at
   * most `maxStaged` at once, and run network namespaces left for every slot
   * jobs may still take plus {@link STAGING_NETWORK_RESERVE}.
   */
  #stage(entry: JobEntry, startAt: number): void {
    this.#staged.add(entry);
    // A timer may fire up to a millisecond early; the second is never anticipated.
    const arm = () => {
      entry.due = setTimeout(() => {
        if (Date.now() < startAt) return arm();
        entry.due = null;
        this.#staged.delete(entry);
        this.#shareOf(entry.tenant).queue.push(entry);
        this.#pump();
      }, startAt - Date.now());
    };
    arm();
    const network = this.#options.host.network;
    const room =
      this.#preparing < this.#options.maxStaged &&
      // Those still to be made (and being made) will take theirs.
      (network === null || network.available - this.#toMake.length - this.#making > this.#options.maxConcurrent - this.#running + STAGING_NETWORK_RESERVE);
    if (!room) return;
    this.#preparing++;
    entry.hold = new Promise<void>((resolve) => {
      entry.release = resolve;
    });
    const at = this.#toMake.findIndex((other) => other.startAt > startAt);
    this.#toMake.splice(at === -1 ? this.#toMake.length : at, 0, { entry, startAt });
    this.#makeNext();
  }

  /** Begins making the next staged runs' sandboxes, {@link STAGING_AT_ONCE} at a time. */
  #makeNext(): void {
    while (this.#making < STAGING_AT_ONCE && this.#toMake.length > 0) {
      const { entry } = this.#toMake.shift()!;
      this.#making++;
      entry.made = () => {
        entry.made = null;
        this.#making--;
        this.#makeNext();
      };
      void this.#execute(entry, entry.hold);
    }
  }

  /** Takes a job that has not started out of the waiting (before its second, or queued). */
  #unqueue(entry: JobEntry): void {
    if (entry.due) clearTimeout(entry.due);
    entry.due = null;
    this.#staged.delete(entry);
    if (this.#takeUnmade(entry)) this.#dropHold(entry);
    const share = this.#shares.get(entry.tenant);
    const at = share ? share.queue.indexOf(entry) : -1;
    if (at >= 0) share!.queue.splice(at, 1);
    this.#settle(entry.tenant);
  }

  /** Takes a staged run out of those whose sandboxes are still to be made; whether it was one. */
  #takeUnmade(entry: JobEntry): boolean {
    const at = this.#toMake.findIndex((item) => item.entry === entry);
    if (at !== -1) this.#toMake.splice(at, 1);
    return at !== -1;
  }

  /** Gives back a staged run's staging room; its release (null when it holds none). */
  #dropHold(entry: JobEntry): (() => void) | null {
    const release = entry.release;
    if (release) {
      entry.release = null;
      this.#preparing--;
    }
    return release;
  }

  /** Forgets a tenant with nothing queued or running. */
  #settle(tenant: string): void {
    const share = this.#shares.get(tenant);
    if (share && share.running === 0 && share.queue.length === 0) this.#shares.delete(tenant);
  }

  /** The job submitted with this key, or null. */
  statusByKey(key: string): JobStatus | null {
    const entry = this.#byKey.get(key);
    return entry ? this.#snapshot(entry) : null;
  }

  /** The job's current status, or null for an unknown (or pruned) id. */
  status(id: string): JobStatus | null {
    const entry = this.#entry(id);
    return entry ? this.#snapshot(entry) : null;
  }

  /**
   * Cancels a queued or running job and answers once it has ended; a finished
   * job is left as it was. `unstarted`: only a job whose command has not
   * started (a run staged for its second whose definition changed); a running
   * one is left running.
   */
  async cancel(id: string, options: { unstarted?: boolean } = {}): Promise<JobStatus | null> {
    const entry = this.#entry(id);
    if (!entry) return null;
    if (entry.status.status === "queued") {
      this.#unqueue(entry);
      // A staged run being made ready ends through its work (its sandbox is killed unstarted).
      if (entry.executing) {
        entry.abort.abort("cancelled");
        await entry.finished;
      } else await this.#finish(entry, { exitCode: null, signal: null, reason: "cancelled", error: "cancelled", peakMemoryBytes: 0 });
    } else if (entry.status.status === "running" && !options.unstarted) {
      entry.abort.abort("cancelled");
      await entry.finished;
    }
    return this.#snapshot(entry);
  }

  /** The job's log as the log route reads it, or null for an unknown id. */
  logSource(id: string): LogSource | null {
    const entry = this.#entry(id);
    if (!entry) return null;
    return {
      path: join(entry.dir, "log"),
      // Live jobs count flushed bytes; finished ones their recorded size; queued ones have no log yet.
      available: () => entry.log?.bytes ?? (isFinal(entry.status.status) ? entry.status.logBytes : 0),
      ended: () => isFinal(entry.status.status),
      changed: () => entry.changes.wait(),
    };
  }

  /**
   * Stops accepting jobs, lets running ones finish for up to `graceMs`, then
   * ends the rest (their status says the builder shut down) and delivers every
   * final status through its callback before returning (each bounded), so the
   * control plane hears of everything at once rather than by polling.
   */
  async shutdown(graceMs: number): Promise<void> {
    this.#closing = true;
    clearInterval(this.#pruneTimer);
    const outcome: SandboxOutcome = {
      exitCode: null,
      signal: null,
      reason: "error",
      error: "builder shut down before the job started",
      peakMemoryBytes: 0,
    };
    const queued = [...[...this.#shares.values()].flatMap((share) => share.queue.splice(0)), ...this.#staged];
    const preparing: JobEntry[] = [];
    for (const entry of queued) {
      this.#unqueue(entry);
      if (entry.executing) {
        entry.abort.abort("shutdown");
        preparing.push(entry);
      } else await this.#finish(entry, outcome);
    }
    const running = () => [...this.#jobs.values()].filter((entry) => entry.status.status === "running");
    const within = (ms: number, work: Promise<unknown>) =>
      Promise.race([work, new Promise((resolve) => setTimeout(resolve, ms).unref())]);
    if (graceMs > 0 && running().length > 0) await within(graceMs, Promise.all(running().map((entry) => entry.finished)));
    const interrupted = running();
    for (const entry of interrupted) entry.abort.abort("shutdown");
    await within(SHUTDOWN_WAIT_MS, Promise.all([...interrupted, ...preparing].map((entry) => entry.finished)));
    await within(SHUTDOWN_WAIT_MS, Promise.all(this.#deliveries));
    this.#stopCallbacks.abort();
  }

  #entry(id: string): JobEntry | undefined {
    return JOB_ID_PATTERN.test(id) ? this.#jobs.get(id) : undefined;
  }

  #snapshot(entry: JobEntry): JobStatus {
    const { status, log } = entry;
    return {
      ...status,
      waiting: this.#waiting(entry),
      logBytes: log ? log.bytes : status.logBytes,
      logTruncated: log ? log.truncated : status.logTruncated,
      labels: { ...status.labels },
    };
  }

  /** Why a queued job waits (live, not stored); null for every other job. */
  #waiting(entry: JobEntry): JobStatus["waiting"] {
    if (entry.status.status !== "queued") return null;
    const share = this.#shares.get(entry.tenant);
    if (this.#staged.has(entry)) return { reason: "scheduled", tenantRunning: share?.running ?? 0, tenantLimit: entry.limit, ahead: 0 };
    const ahead = share ? share.queue.indexOf(entry) : -1;
    if (!share || ahead < 0) return null;
    return {
      reason: share.running >= entry.limit ? "tenant_limit" : "builder_full",
      tenantRunning: share.running,
      tenantLimit: entry.limit,
      ahead,
    };
  }

  /** Starts queued jobs while slots are free, each going to {@link #nextShare}'s tenant. */
  #pump(): void {
    while (this.#running < this.#options.maxConcurrent) {
      const share = this.#nextShare();
      if (!share) return;
      const entry = share.queue.shift()!;
      share.running++;
      this.#running++;
      entry.counted = true;
      entry.status.status = "running";
      entry.status.startedAt = new Date().toISOString();
      if (entry.notifyStart) this.#report(entry);
      // A staged run's sandbox waits for this word (one not begun yet is made now, as any job); any other job's work begins now.
      const unmade = this.#takeUnmade(entry);
      const release = this.#dropHold(entry);
      if (release && !unmade) release();
      else void this.#execute(entry, null);
    }
  }

  /**
   * The tenant whose first queued job takes the next free slot: of those below
   * their limit, the one running the fewest jobs (so a tenant with a backlog
   * never goes before one waiting for its first slot), and between equals the
   * one whose job has waited longest (first come, first served, in turns).
   */
  #nextShare(): TenantShare | undefined {
    let best: TenantShare | undefined;
    for (const share of this.#shares.values()) {
      const head = share.queue[0];
      if (head === undefined || share.running >= head.limit) continue;
      if (!best || share.running < best.running || (share.running === best.running && head.seq < best.queue[0]!.seq)) best = share;
    }
    return best;
  }

  async #execute(entry: JobEntry, hold: Promise<void> | null): Promise<void> {
    const work = entry.work!;
    entry.executing = true;
    let outcome: JobOutcome;
    let recorded: Promise<void> = Promise.resolve();
    try {
      entry.log = await JobLog.open(join(entry.dir, "log"), () => entry.changes.notify());
      // Recording "running" (so a restart can tell the job was cut short) need not delay the command.
      recorded = this.#persist(entry);
      outcome = await work.execute({ id: entry.status.id, jobDir: entry.dir, log: entry.log, signal: entry.abort.signal, hold, onStaged: () => entry.made?.() });
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      console.error(`builder: job ${entry.status.id} failed inside the builder: ${message}`);
      entry.log?.note("job failed: internal error in the builder");
      outcome = { exitCode: null, signal: null, reason: "error", error: `internal error: ${message}`, peakMemoryBytes: 0 };
    }
    await entry.log?.close().catch((error: unknown) => console.error(`builder: closing log failed: ${String(error)}`));
    await recorded;
    // Ended before its second (it could not be made ready, or was cancelled): it never took a slot.
    this.#dropHold(entry);
    entry.made?.();
    this.#unqueue(entry);
    if (entry.counted) {
      this.#running--;
      const share = this.#shares.get(entry.tenant);
      if (share) share.running--;
    }
    this.#settle(entry.tenant);
    await this.#finish(entry, outcome);
    this.#pump();
  }

  async #finish(entry: JobEntry, outcome: JobOutcome): Promise<void> {
    const { status } = entry;
    status.status = outcome.reason === null ? "succeeded" : outcome.reason === "cancelled" ? "cancelled" : "failed";
    status.reason = outcome.reason;
    status.exitCode = outcome.exitCode;
    status.signal = outcome.signal;
    status.error = outcome.error;
    status.peakMemoryBytes = outcome.peakMemoryBytes;
    status.logBytes = entry.log?.bytes ?? status.logBytes;
    status.logTruncated = entry.log?.truncated ?? status.logTruncated;
    status.finishedAt = new Date().toISOString();
    status.result = outcome.result ?? null;
    entry.log = null;
    entry.releaseDisk();
    entry.work = null;
    entry.changes.notify();
    await this.#persist(entry);
    entry.markFinished();
    this.#report(entry);
  }

  /** Sends the final status to the job's callback URL (in the background, tracked for shutdown). */
  #report(entry: JobEntry): void {
    if (!entry.callbackUrl) return;
    const delivery = deliverCallback({
      url: entry.callbackUrl,
      status: this.#snapshot(entry),
      credentials: this.#options.credentials,
      signal: this.#stopCallbacks.signal,
    });
    this.#deliveries.add(delivery);
    void delivery.finally(() => this.#deliveries.delete(delivery));
  }

  /**
   * Writes status.json atomically, so a crash leaves the old or the new record,
   * never half. Writes of one job are queued behind each other (they share the
   * temporary file), and each records the status as it is when its turn comes.
   */
  #persist(entry: JobEntry): Promise<void> {
    const write = async () => {
      try {
        const temporary = join(entry.dir, "status.json.tmp");
        await writeFile(temporary, JSON.stringify(this.#snapshot(entry)), { mode: 0o600 });
        await rename(temporary, join(entry.dir, "status.json"));
      } catch (error) {
        console.error(`builder: could not record job ${entry.status.id}: ${String(error)}`);
      }
    };
    entry.persisted = entry.persisted.then(write);
    return entry.persisted;
  }

  async #recover(): Promise<void> {
    const cutoff = Date.now() - JOB_RETENTION_MS;
    for (const name of await readdir(this.#jobsDir)) {
      const dir = join(this.#jobsDir, name);
      let status: JobStatus | null = null;
      try {
        const parsed = JobStatus.safeParse(JSON.parse(await readFile(join(dir, "status.json"), "utf8")));
        if (parsed.success && parsed.data.id === name) status = parsed.data;
      } catch {
        status = null;
      }
      if (!status || (status.finishedAt !== null && Date.parse(status.finishedAt) < cutoff)) {
        await rm(dir, { recursive: true, force: true });
        continue;
      }
      const callback = await readFile(join(dir, "callback.json"), "utf8").then(
        (text) => (JSON.parse(text) as { url?: unknown }).url,
        () => undefined,
      );
      const entry: JobEntry = {
        status,
        tenant: UNKNOWN_TENANT,
        limit: 1,
        seq: 0,
        notifyStart: false,
        ...notStarted(),
        dir,
        callbackUrl: typeof callback === "string" ? callback : null,
        work: null,
        releaseDisk: () => {},
        log: null,
        abort: new AbortController(),
        changes: new Changes(),
        finished: Promise.resolve(),
        markFinished: () => {},
        persisted: Promise.resolve(),
      };
      this.#jobs.set(name, entry);
      if (status.key !== null) this.#byKey.set(status.key, entry);
      if (!isFinal(status.status)) {
        await rm(join(dir, "work"), { recursive: true, force: true });
        status.logBytes = await stat(join(dir, "log")).then(
          (stats) => stats.size,
          () => 0,
        );
        await this.#finish(entry, {
          exitCode: null,
          signal: null,
          reason: "error",
          error: "builder restarted before the job finished",
          peakMemoryBytes: 0,
        });
      }
    }
  }

  async #prune(): Promise<void> {
    const cutoff = Date.now() - JOB_RETENTION_MS;
    for (const [id, entry] of this.#jobs) {
      const { finishedAt } = entry.status;
      if (finishedAt !== null && Date.parse(finishedAt) < cutoff) {
        this.#jobs.delete(id);
        if (entry.status.key !== null && this.#byKey.get(entry.status.key) === entry) this.#byKey.delete(entry.status.key);
        await rm(entry.dir, { recursive: true, force: true });
      }
    }
  }
}
