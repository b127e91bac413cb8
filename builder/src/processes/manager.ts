/**
 * The app processes of this node (the "processes" room, STYLE 14): admission
 * (`POST /v1/processes`), one {@link Supervisor} per process, their records,
 * callbacks, the runtime logs, and the lookups of the proxy.
 *
 * Processes are not jobs: they take no job slot and never queue; each one is
 * bounded by its own cgroup (the app's memory limit). A process's disk is held
 * through the shared DiskLeases, so a restore or a deletion of it is refused
 * (DISK_BUSY) until the process has stopped, and a process cannot start on a
 * disk being restored.
 *
 * Records: `processes/<id>/process.json` holds the status and the callback URL,
 * never the spec (its env carries the app's secrets; it lives in memory only,
 * which is all restarting a crashed app needs). App processes do not survive a
 * builder restart (their sandboxes die with it): at startup, a record that was
 * not stopped becomes `failed` ("the builder restarted") and is reported, and
 * the control plane, which owns what should run, starts a new process. Records
 * of stopped and failed processes are kept 24 h for polling, as jobs are.
 */
import { mkdir, readFile, readdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { deliverCallback } from "../callback.js";
import type { DiskLeases } from "../disks/leases.js";
import type { DiskLease } from "../node/lease.js";
import type { DiskStore } from "../disks/store.js";
import { type HostRoom, InsufficientMemory } from "../sandbox/host-room.js";
import { isId, newId } from "../ids.js";
import { type ProcessSpec, ProcessStatus } from "../protocol/processes.js";
import { TENANT_PATTERN, type NodeCredentials } from "../protocol/shared.js";
import type { SandboxHost } from "../sandbox/host.js";
import { formatBytes } from "../units.js";
import type { TenantUsers } from "../sandbox/tenants.js";
import { AppLogs, type LogTap, ProcessOutput } from "./app-log.js";
import type { ProxiedProcess } from "./proxy.js";
import { ReleaseStore } from "./releases.js";
import { IN_FLIGHT_WAIT_MS, STOP_GRACE_MS, Supervisor } from "./supervisor.js";
import { promisedTreeBytes, removeWorkTree, workTreeBytes } from "./worktree.js";

const MIB = 1024 * 1024;
/** How long records of stopped and failed processes (and unused app logs) stay. */
const RETENTION_MS = 24 * 60 * 60 * 1000;
const PRUNE_INTERVAL_MS = 60 * 60 * 1000;
/** After every process has stopped, how long their last callbacks get at shutdown. */
const SHUTDOWN_CALLBACKS_MS = 10_000;

/** What the manager needs from the server. */
export interface ProcessManagerOptions {
  dataDir: string;
  credentials: NodeCredentials;
  host: SandboxHost;
  /** The host's room: every process's memory limit and working tree are promised through it. */
  room: HostRoom;
  tenants: TenantUsers;
  disks: DiskStore;
  leases: DiskLeases;
  /** The node's lease on its disks: a disk's process is not restarted without it. */
  lease: DiskLease;
  /** Sees every line the apps' logs get (the log shipper, on a node of a fleet). */
  logTap?: LogTap;
}

/** Answer to `POST /v1/processes` (`existing`: its key named a process already); refusals are values. */
export type ProcessAdmission =
  | { ok: true; status: ProcessStatus; existing: boolean }
  | { ok: false; code: "DISK_BUSY" | "UNAVAILABLE" | "INSUFFICIENT_MEMORY" | "INSUFFICIENT_STORAGE"; message: string };

interface Entry {
  dir: string;
  /** Null for a record an earlier builder left (its process is gone). */
  supervisor: Supervisor | null;
  /** The latest status (as recorded and reported). */
  status: ProcessStatus;
  callbackUrl: string | null;
  /** The last record write; writes follow one another. */
  persisted: Promise<void>;
  /** The callbacks in order; a newer status cuts short the delivery of an older one. */
  delivering: Promise<void>;
  delivery: AbortController | null;
  /** Set by a stop naming the process of the same app that replaces it here: new proxied requests go there while it is ready. */
  successor: string | null;
}

/** What the manager tells the node's native proxy (native-proxy.ts). */
export interface ProcessTraffic {
  sync(): Promise<void>;
  idle(processId: string, until: number): Promise<number>;
}

/** Successors followed at most from the process an edge named (one per deploy made within the edge's cache time). */
const MAX_SUCCESSOR_HOPS = 8;

const isFinal = (state: ProcessStatus["state"]) => state === "stopped" || state === "failed";

export class ProcessManager {
  readonly #options: ProcessManagerOptions;
  readonly #dir: string;
  readonly #entries = new Map<string, Entry>();
  readonly #byKey = new Map<string, Entry>();
  /** Admissions under way by key, so a retried POST never starts a second process. */
  readonly #admitting = new Map<string, Promise<ProcessAdmission>>();
  readonly #releases: ReleaseStore;
  readonly appLogs: AppLogs;
  readonly #deliveries = new Set<Promise<unknown>>();
  readonly #stopCallbacks = new AbortController();
  #closing = false;
  #pruneTimer: NodeJS.Timeout | undefined;
  /** The node's native proxy, once it runs: told of every change of a route, asked for a stopping process's requests. */
  #traffic: ProcessTraffic | null = null;

  private constructor(options: ProcessManagerOptions, releases: ReleaseStore) {
    this.#options = options;
    this.#dir = join(options.dataDir, "processes");
    this.#releases = releases;
    this.appLogs = new AppLogs(join(options.dataDir, "app-logs"), options.logTap);
    options.room.addDiskPromises(() => promisedTreeBytes(this.#dir));
  }

  /** Loads what an earlier builder left (its processes are gone: reported failed), then starts pruning. */
  static async open(options: ProcessManagerOptions): Promise<ProcessManager> {
    const releases = await ReleaseStore.open(join(options.dataDir, "releases"));
    const manager = new ProcessManager(options, releases);
    await mkdir(manager.#dir, { recursive: true, mode: 0o711 });
    await mkdir(join(options.dataDir, "app-logs"), { recursive: true, mode: 0o700 });
    await manager.#recover();
    manager.#pruneTimer = setInterval(() => void manager.#prune(), PRUNE_INTERVAL_MS);
    manager.#pruneTimer.unref();
    return manager;
  }

  /** From now on every change of a process's route reaches `traffic`. */
  attachTraffic(traffic: ProcessTraffic): void {
    this.#traffic = traffic;
    void traffic.sync();
  }

  /** Processes not yet stopped or failed, with their apps (what heartbeats report). */
  running(): { id: string; appId: string }[] {
    const running: { id: string; appId: string }[] = [];
    for (const [id, entry] of this.#entries) {
      if (entry.supervisor && !isFinal(entry.status.state)) running.push({ id, appId: entry.supervisor.spec.appId });
    }
    return running;
  }

  /** What each running process's instance uses now (app metrics: node/metrics.ts). */
  usage(): ({ id: string; appId: string } & NonNullable<ReturnType<Supervisor["usage"]>>)[] {
    const found = [];
    for (const [id, entry] of this.#entries) {
      const usage = entry.supervisor && !isFinal(entry.status.state) ? entry.supervisor.usage() : null;
      if (usage) found.push({ id, appId: entry.supervisor!.spec.appId, ...usage });
    }
    return found;
  }

  /** How many processes are not yet stopped or failed. */
  get live(): number {
    let live = 0;
    for (const entry of this.#entries.values()) if (!isFinal(entry.status.state)) live++;
    return live;
  }

  /** Starts a process (or answers the one its key already names). */
  start(spec: ProcessSpec): Promise<ProcessAdmission> {
    const known = this.#byKey.get(spec.key);
    if (known) return Promise.resolve({ ok: true, status: this.#statusOf(known), existing: true });
    const pending = this.#admitting.get(spec.key);
    if (pending) return pending.then((admission) => (admission.ok ? { ...admission, existing: true } : admission));
    const admission = this.#admit(spec).finally(() => this.#admitting.delete(spec.key));
    this.#admitting.set(spec.key, admission);
    return admission;
  }

  async #admit(spec: ProcessSpec): Promise<ProcessAdmission> {
    if (this.#closing) return { ok: false, code: "UNAVAILABLE", message: "builder is shutting down; start the process on another node" };
    const { disks, leases, tenants, host, room } = this.#options;
    if (spec.disk) {
      const owner = await disks.tenantOf(spec.disk.id);
      if (owner !== null && owner !== spec.tenant) return { ok: false, code: "DISK_BUSY", message: `disk ${spec.disk.id} belongs to another tenant` };
    }
    const user = await tenants.userOf(spec.tenant);
    const appLog = await this.appLogs.get(spec.appId);
    if (this.#closing) return { ok: false, code: "UNAVAILABLE", message: "builder is shutting down; start the process on another node" };
    // Its working tree is at least a workTreeBytes() image of the unpacked release (at least as big as the archive):
    // refused now when even that cannot fit, so the control plane tries another node (the exact size is checked when it is made).
    const tree = workTreeBytes(spec.release.sizeBytes);
    const disk = await room.diskRoom();
    if (disk.promisedBytes + tree > disk.freeBytes - disk.reserveBytes) {
      const message = `the builder's host cannot hold a working tree of ${formatBytes(tree)}: ${formatBytes(disk.freeBytes)} free, ${formatBytes(disk.reserveBytes)} kept in reserve, ${formatBytes(disk.promisedBytes)} promised`;
      return { ok: false, code: "INSUFFICIENT_STORAGE", message };
    }
    const id = newId("prc");
    try {
      room.promiseMemory(id, spec.memoryMb * MIB, `a process with a memory limit of ${spec.memoryMb} MiB`);
    } catch (error) {
      if (error instanceof InsufficientMemory) return { ok: false, code: "INSUFFICIENT_MEMORY", message: error.message };
      throw error;
    }
    let releaseDisk = () => {};
    if (spec.disk) {
      const lease = leases.acquire(spec.disk.id, { kind: "process", id }, false);
      if (!lease.ok) {
        room.releaseMemory(id);
        return { ok: false, code: "DISK_BUSY", message: lease.message };
      }
      releaseDisk = lease.release;
    }
    const dir = join(this.#dir, id);
    try {
      await mkdir(dir, { mode: 0o711 });
    } catch (error) {
      releaseDisk();
      room.releaseMemory(id);
      throw error;
    }
    const supervisor = new Supervisor(
      id,
      spec,
      {
        host,
        room,
        disks,
        releases: this.#releases,
        user,
        output: new ProcessOutput(appLog, id, spec.labels?.deploymentId ?? null),
        dir,
        releaseDisk,
        diskProblem: () => this.#options.lease.problem(),
        changed: (status) => this.#changed(entry, status),
        routed: () => void this.#traffic?.sync(),
        drained: (until) => this.#traffic?.idle(id, until) ?? Promise.resolve(0),
      },
      new Date().toISOString(),
    );
    const entry: Entry = {
      dir,
      supervisor,
      status: supervisor.status(),
      successor: null,
      callbackUrl: spec.callbackUrl ?? null,
      persisted: Promise.resolve(),
      delivering: Promise.resolve(),
      delivery: null,
    };
    this.#entries.set(id, entry);
    this.#byKey.set(spec.key, entry);
    supervisor.start();
    return { ok: true, status: this.#statusOf(entry), existing: false };
  }

  /** The process's status, or null for an unknown (or pruned) id. */
  status(id: string): ProcessStatus | null {
    const entry = this.#entry(id);
    return entry ? this.#statusOf(entry) : null;
  }

  /** The process started with this key, or null. */
  statusByKey(key: string): ProcessStatus | null {
    const entry = this.#byKey.get(key);
    return entry ? this.#statusOf(entry) : null;
  }

  /**
   * Stops the process (idempotent; see Supervisor.stop) and answers its
   * status (`stopping`, or already final); null when unknown. A `successor`
   * of another app, or not on this node, is ignored.
   */
  stop(id: string, drainSeconds: number, successor: string | null = null): ProcessStatus | null {
    const entry = this.#entry(id);
    if (!entry) return null;
    const next = successor === null || successor === id ? undefined : this.#entry(successor)?.supervisor;
    if (next && entry.supervisor && next.spec.appId === entry.supervisor.spec.appId) entry.successor = successor;
    entry.supervisor?.stop(drainSeconds);
    return this.#statusOf(entry);
  }

  /** Resolves once the node's native proxy routes as the processes are now (at once without one, bounded with one). */
  async routed(): Promise<void> {
    await this.#traffic?.sync();
  }

  /**
   * The live process the proxy forwards to, or undefined (unknown, or gone
   * with an earlier builder): a stopping process's successor (and its
   * successor's, a few deploys in a row) while that is ready.
   */
  lookup(id: string): ProxiedProcess | undefined {
    let entry = this.#entry(id);
    for (let hops = 0; entry?.successor && hops < MAX_SUCCESSOR_HOPS; hops++) {
      const next = this.#entry(entry.successor);
      if (next?.supervisor?.route().kind !== "ready") break;
      entry = next;
    }
    return entry?.supervisor ?? undefined;
  }

  /**
   * Stops every process (no drain: the builder is going away; requests in
   * flight still get their IN_FLIGHT_WAIT_MS), waits for them and for their
   * last callbacks (each bounded), then closes the runtime logs.
   */
  async shutdown(): Promise<void> {
    this.#closing = true;
    clearInterval(this.#pruneTimer);
    const live = [...this.#entries.values()].flatMap((entry) => (entry.supervisor ? [entry.supervisor] : []));
    for (const supervisor of live) supervisor.stop(0);
    await within(IN_FLIGHT_WAIT_MS + STOP_GRACE_MS + 5_000, Promise.all(live.map((supervisor) => supervisor.finished)));
    await within(SHUTDOWN_CALLBACKS_MS, Promise.all([...this.#deliveries]));
    this.#stopCallbacks.abort();
    await Promise.all([...this.#entries.values()].map((entry) => entry.persisted));
    await this.appLogs.close();
  }

  #entry(id: string): Entry | undefined {
    return isId("prc", id) ? this.#entries.get(id) : undefined;
  }

  #statusOf(entry: Entry): ProcessStatus {
    return entry.supervisor ? entry.supervisor.status() : { ...entry.status };
  }

  #changed(entry: Entry, status: ProcessStatus): void {
    entry.status = status;
    // A process that ended holds no memory of the host any more.
    if (isFinal(status.state)) this.#options.room.releaseMemory(status.id);
    void this.#persist(entry);
    this.#report(entry, status);
  }

  /** Sends the status to the callback URL after the ones before it; a newer status cuts short an older one's retries. */
  #report(entry: Entry, status: ProcessStatus): void {
    const url = entry.callbackUrl;
    if (!url) return;
    entry.delivery?.abort();
    const superseded = new AbortController();
    entry.delivery = superseded;
    const signal = AbortSignal.any([superseded.signal, this.#stopCallbacks.signal]);
    const delivery = entry.delivering.then(() => deliverCallback({ url, status, credentials: this.#options.credentials, signal }));
    entry.delivering = delivery.then(() => undefined);
    this.#deliveries.add(delivery);
    void delivery.finally(() => this.#deliveries.delete(delivery));
  }

  /** Writes process.json atomically (status and callback URL: never the spec, whose env holds secrets). */
  #persist(entry: Entry): Promise<void> {
    const write = async () => {
      try {
        const temporary = join(entry.dir, "process.json.tmp");
        await writeFile(temporary, JSON.stringify({ status: entry.status, callbackUrl: entry.callbackUrl }), { mode: 0o600 });
        await rename(temporary, join(entry.dir, "process.json"));
      } catch (error) {
        console.error(`builder: could not record process ${entry.status.id}: ${String(error)}`);
      }
    };
    entry.persisted = entry.persisted.then(write);
    return entry.persisted;
  }

  async #recover(): Promise<void> {
    const cutoff = Date.now() - RETENTION_MS;
    for (const id of await readdir(this.#dir)) {
      const dir = join(this.#dir, id);
      await removeWorkTree(this.#options.host, dir);
      let record: { status: ProcessStatus; callbackUrl: string | null } | null = null;
      try {
        const parsed = JSON.parse(await readFile(join(dir, "process.json"), "utf8")) as { status?: unknown; callbackUrl?: unknown };
        const status = ProcessStatus.safeParse(parsed.status);
        if (status.success && status.data.id === id) {
          record = { status: status.data, callbackUrl: typeof parsed.callbackUrl === "string" ? parsed.callbackUrl : null };
        }
      } catch {
        record = null;
      }
      const stoppedAt = record?.status.stoppedAt;
      if (!record || (stoppedAt && Date.parse(stoppedAt) < cutoff)) {
        await rm(dir, { recursive: true, force: true });
        continue;
      }
      const entry: Entry = {
        dir,
        supervisor: null,
        status: record.status,
        successor: null,
        callbackUrl: record.callbackUrl,
        persisted: Promise.resolve(),
        delivering: Promise.resolve(),
        delivery: null,
      };
      this.#entries.set(id, entry);
      this.#byKey.set(record.status.key, entry);
      if (isFinal(record.status.state)) continue;
      const message = "the builder restarted and the process ended with it; start a new process";
      const now = new Date().toISOString();
      if (TENANT_PATTERN.test(record.status.appId)) {
        const log = await this.appLogs.get(record.status.appId).catch(() => null);
        log?.append(Buffer.from(`${now} svc ${record.status.labels.deploymentId ?? "-"}/${id} failed: ${message}\n`));
      }
      this.#changed(entry, {
        ...record.status,
        state: "failed",
        ready: false,
        lastExit: { at: now, reason: "error", exitCode: null, signal: null, message },
        stoppedAt: now,
      });
    }
  }

  async #prune(): Promise<void> {
    const cutoff = Date.now() - RETENTION_MS;
    for (const [id, entry] of this.#entries) {
      const { stoppedAt, state, key } = this.#statusOf(entry);
      if (!isFinal(state) || stoppedAt === null || Date.parse(stoppedAt) >= cutoff) continue;
      this.#entries.delete(id);
      if (this.#byKey.get(key) === entry) this.#byKey.delete(key);
      await rm(entry.dir, { recursive: true, force: true });
    }
    const active = new Set([...this.#entries.values()].filter((entry) => !isFinal(this.#statusOf(entry).state)).map((entry) => entry.status.appId));
    await this.appLogs.prune((appId) => active.has(appId), RETENTION_MS);
  }
}

function within(ms: number, work: Promise<unknown>): Promise<unknown> {
  return Promise.race([work, new Promise((resolve) => setTimeout(resolve, ms).unref())]);
}
