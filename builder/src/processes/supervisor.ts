/**
 * One app process: a release running in a sandbox of its own, kept running by
 * an explicit state machine (Kubernetes' kubelet and pod phases are the model,
 * STYLE 14). Every state is named (protocol/processes.ts, ProcessState), every change
 * goes through {@link Supervisor.#transition}, which checks it against
 * {@link TRANSITIONS}, writes it to the app's runtime log with its reason
 * (`prc_… backoff: exited with code 1; restarting in 0.5 s`) and reports it.
 *
 *     starting ──ready──▶ running ──exit──▶ backoff ──▶ starting …
 *        │                                    │ (5 exits without 10 minutes of running between)
 *        └──────exit / start timeout──────────┴──▶ crash_loop (still restarted, every 60 s)
 *     any ──stop──▶ stopping ──▶ stopped          (release unusable, sandbox impossible) ──▶ failed
 *
 * The first start fetches the release (releases.ts) and unpacks it into the
 * process's own working tree (worktree.ts), which later instances reuse. Each
 * instance is a sandbox made exactly like a run job's (sandbox/sandbox.ts: the tenant's
 * user, namespaces, cgroups under the app's memory limit, the run network, its
 * disk at its mountPath), without a wall clock, its output going to the app's
 * runtime log. The node checks its readiness from outside (health.ts).
 *
 * A stop keeps proxied traffic flowing for `drainSeconds`, then refuses new
 * requests (404 PROCESS_NOT_FOUND: the edge looks the app up again), waits for
 * the requests in flight (at most 30 s), then ends the sandbox: SIGTERM to its
 * processes, SIGKILL after 10 s.
 */
import { Agent, type AgentOptions } from "node:http";
import type { Socket } from "node:net";
import { constants } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { DiskStore } from "../disks/store.js";
import { DEFAULT_START_TIMEOUT_SECONDS, type ProcessExitReason, type ProcessSpec, type ProcessState, type ProcessStatus } from "../protocol/processes.js";
import type { SandboxHost } from "../sandbox/host.js";
import type { ProcessUsage } from "../sandbox/cgroups.js";
import { type SandboxOutcome, runInSandbox } from "../sandbox/sandbox.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";
import { ArchiveRejected, TarFormatError } from "../tar/extract.js";
import type { HostRoom } from "../sandbox/host-room.js";
import type { ProcessOutput } from "./app-log.js";
import { type Listener, listeners, type ProbeResult, probe } from "./health.js";
import { type ReleaseHandle, type ReleaseStore, ReleaseUnavailable } from "./releases.js";
import { type WorkTree, createWorkTree, removeWorkTree } from "./worktree.js";
import { Changes } from "../changes.js";

/** Restarts: 0.5 s doubling to 30 s; 5 exits without 10 minutes of running make a crash loop, retried every 60 s. */
export const RESTART_POLICY = {
  firstDelayMs: 500,
  maxDelayMs: 30_000,
  /** An instance that ran (ready) this long wipes the slate: its exit counts as the first. */
  resetAfterMs: 10 * 60 * 1000,
  crashLoopExits: 5,
  crashLoopRetryMs: 60_000,
} as const;

/** How often a disk's process waiting for the node's lease checks it again. */
const LEASE_RECHECK_MS = 1_000;

/** Between SIGTERM and SIGKILL when an instance is ended. */
export const STOP_GRACE_MS = 10_000;
/** Longest wait, once draining is over, for proxied requests in flight to finish. */
export const IN_FLIGHT_WAIT_MS = 30_000;
/** Health checks: every 100 ms for the first 2 s of an instance (a restart should take traffic fast), then every 250 ms. */
const FAST_PROBE_MS = 100;
/** While an instance is not ready, the log says it still waits this often. */
const WAITING_NOTE_MS = 5_000;
/** The first of those notes: a start that takes a second is already worth saying. */
const FIRST_WAITING_NOTE_MS = 1_000;
/** An instance listening only on loopback (other ports than its own) has this long to listen on its port too. */
const LOOPBACK_GRACE_MS = 3_000;
const FAST_PROBE_PERIOD_MS = 2_000;
const SLOW_PROBE_MS = 250;
const PROBE_TIMEOUT_MS = 2_000;
/** Even the check just before the deadline gets this long to be answered. */
const MIN_PROBE_TIMEOUT_MS = 200;
/** PATH an app gets unless its env sets one: its own virtualenv and node_modules tools first. */
export const APP_DEFAULT_PATH = "/work/.venv/bin:/work/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";
const MIB = 1024 * 1024;

/** Every transition the machine may make; anything else is a bug and throws. */
export const TRANSITIONS: Readonly<Record<ProcessState, readonly ProcessState[]>> = {
  starting: ["running", "backoff", "crash_loop", "stopping", "failed"],
  running: ["backoff", "crash_loop", "stopping"],
  backoff: ["starting", "stopping"],
  crash_loop: ["starting", "stopping"],
  stopping: ["stopped"],
  stopped: [],
  failed: [],
};

/**
 * What follows an instance's exit (pure, so it is unit-tested): the exit
 * count without 10 minutes of running in between, and whether to back off
 * (how long) or call it a crash loop.
 */
export function afterExit(previousExits: number, ranMs: number): { exits: number; state: "backoff" | "crash_loop"; delayMs: number } {
  const exits = ranMs >= RESTART_POLICY.resetAfterMs ? 1 : previousExits + 1;
  if (exits >= RESTART_POLICY.crashLoopExits) return { exits, state: "crash_loop", delayMs: RESTART_POLICY.crashLoopRetryMs };
  return { exits, state: "backoff", delayMs: Math.min(RESTART_POLICY.firstDelayMs * 2 ** (exits - 1), RESTART_POLICY.maxDelayMs) };
}

/** What the supervisor needs from the manager. */
export interface SupervisorContext {
  host: SandboxHost;
  room: HostRoom;
  disks: DiskStore;
  releases: ReleaseStore;
  /** The tenant's user. */
  user: JobUser;
  /** The process's writer into its app's runtime log. */
  output: ProcessOutput;
  /** `processes/<id>`: the working tree lives here. */
  dir: string;
  /** Returns the process's lease on its disk (a no-op without one). */
  releaseDisk: () => void;
  /** Why a process with a disk may not start an instance now (the node holds no lease on its disks), or null. */
  diskProblem: () => string | null;
  /** Called after every change of the status (persist it, report it). */
  changed: (status: ProcessStatus) => void;
  /** Called after every change of where proxied requests go (route()). */
  routed: () => void;
  /** Waits (until the time given) for the requests in flight the node's native proxy sent the process: how many were left. */
  drained: (until: number) => Promise<number>;
}

/** How the proxy may reach the process now. */
export type Route =
  | {
      kind: "ready";
      address: string;
      port: number;
      agent: Agent;
      /** Counts one proxied request in flight (a stop waits for them); call the result when it is over. */
      track: () => () => void;
      /** Upgraded connections (WebSockets), destroyed when the instance ends. */
      upgrades: Set<Socket>;
    }
  | { kind: "wait"; changed: Promise<void> }
  | { kind: "gone" }
  /** It exists but will not take traffic (failed, or a worker), and says why. */
  | { kind: "unavailable"; message: string };

/** One sandbox of the process, from spawn to exit. */
interface Instance {
  number: number;
  abort: AbortController;
  /** Set when the supervisor ends the instance itself, and why. */
  endedBy: { reason: "stop" | "start_timeout" | "health_check" | "port"; message: string } | null;
  address: string | null;
  /** The sandbox's first process (its network namespace is the instance's). */
  pid: number | null;
  /** Reads what the sandbox uses now; null until it started. */
  usage: (() => ProcessUsage) | null;
  /** Where traffic goes: the spec's port, or the one the app was found listening on instead. */
  port: number | null;
  agent: Agent;
  startedAt: number;
  readyAt: number | null;
  exited: boolean;
  /** Resolves once the sandbox is gone (its network, cgroup and processes). */
  done: Promise<void>;
  upgrades: Set<Socket>;
}

export class Supervisor {
  readonly id: string;
  /** Held in memory only: `env` carries the app's secrets. */
  readonly spec: ProcessSpec;
  readonly #context: SupervisorContext;
  readonly #status: ProcessStatus;
  #instance: Instance | null = null;
  #instances = 0;
  /** Exits without 10 minutes of running in between. */
  #exits = 0;
  #timer: NodeJS.Timeout | null = null;
  /** Whether a restart waits for the node's lease (said once in the log). */
  #waitingForLease = false;
  #release: ReleaseHandle | null = null;
  #tree: WorkTree | null = null;
  readonly #preparing = new AbortController();
  #booting: Promise<void> = Promise.resolve();
  /** Set by the first stop: when draining ends (moved earlier by a later stop with a shorter drain). */
  #stop: { drainUntil: number; wake: Changes } | null = null;
  /** Whether proxied requests are still let through (false once a stop's drain is over). */
  #accepting = true;
  #inFlight = 0;
  readonly #idle = new Changes();
  /** Wakes proxied requests waiting for the process to become ready (or go). */
  readonly #routing = new Changes();
  readonly #finished: Promise<void>;
  #markFinished = () => {};

  constructor(id: string, spec: ProcessSpec, context: SupervisorContext, createdAt: string) {
    this.id = id;
    this.spec = spec;
    this.#context = context;
    this.#status = {
      id,
      key: spec.key,
      appId: spec.appId,
      state: "starting",
      ready: false,
      restarts: 0,
      lastExit: null,
      lastLines: [],
      memoryLimitBytes: spec.memoryMb * MIB,
      port: spec.port,
      createdAt,
      startedAt: null,
      readyAt: null,
      stoppedAt: null,
      labels: spec.labels ?? {},
    };
    this.#finished = new Promise((resolve) => {
      this.#markFinished = resolve;
    });
  }

  /** A copy of the current status. */
  status(): ProcessStatus {
    const instance = this.#instance;
    const ready = instance?.readyAt != null && !instance.exited && this.#accepting && (this.#status.state === "running" || this.#status.state === "stopping");
    return { ...this.#status, ready, lastLines: [...this.#status.lastLines], labels: { ...this.#status.labels } };
  }

  /**
   * What the running instance uses now, with its number (a new instance's CPU
   * counts from 0) and the process's restarts so far; null while none runs.
   */
  usage(): { instance: number; restarts: number; memoryLimitBytes: number; cpuSeconds: number | null; memoryBytes: number } | null {
    const instance = this.#instance;
    if (!instance?.usage || instance.exited) return null;
    return { instance: instance.number, restarts: this.#status.restarts, memoryLimitBytes: this.#status.memoryLimitBytes, ...instance.usage() };
  }

  /** Resolves once the process is stopped or failed (everything of it released). */
  get finished(): Promise<void> {
    return this.#finished;
  }

  /** Begins: the creation itself is the first transition into `starting`. */
  start(): void {
    this.#note(`starting: release ${this.spec.release.sha256.slice(0, 12)}, ${this.spec.type} process, memory limit ${this.spec.memoryMb} MiB`);
    this.#context.changed(this.status());
    this.#booting = this.#boot();
  }

  /**
   * Stops the process (idempotent): drain for `drainSeconds` while an instance
   * takes traffic, then end it. A later call with a shorter drain shortens it.
   */
  stop(drainSeconds: number): void {
    const { state } = this.#status;
    if (state === "stopped" || state === "failed") return;
    const drainUntil = Date.now() + (this.#instance?.readyAt != null ? drainSeconds * 1000 : 0);
    if (this.#stop) {
      if (drainUntil < this.#stop.drainUntil) {
        this.#stop.drainUntil = drainUntil;
        this.#stop.wake.notify();
      }
      return;
    }
    this.#stop = { drainUntil, wake: new Changes() };
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#preparing.abort();
    const draining = drainUntil > Date.now();
    this.#transition("stopping", draining ? `draining ${drainSeconds} s, then ending the process` : "stop requested");
    void this.#stopSequence();
  }

  /** Where a proxied request goes now: the ready instance, a wait, or nowhere. */
  route(): Route {
    const { state } = this.#status;
    if (state === "stopped") return { kind: "gone" };
    if (state === "failed") return { kind: "unavailable", message: `failed: ${this.#status.lastExit?.message ?? "unknown"}` };
    if (!this.#accepting) return { kind: "gone" };
    if (this.spec.type === "worker") return { kind: "unavailable", message: "a worker process takes no HTTP traffic" };
    const instance = this.#instance;
    if (instance?.readyAt != null && !instance.exited && instance.address !== null && this.spec.port !== null) {
      return { kind: "ready", address: instance.address, port: instance.port ?? this.spec.port, agent: instance.agent, track: () => this.#track(), upgrades: instance.upgrades };
    }
    // A stopping process never starts again: send the edge to look the app up.
    if (state === "stopping") return { kind: "gone" };
    return { kind: "wait", changed: this.#routing.wait() };
  }

  // -------------------------------------------------------------------------
  // Start: release, working tree, instances
  // -------------------------------------------------------------------------

  async #boot(): Promise<void> {
    const { host, room, disks, releases, user, dir } = this.#context;
    const { spec } = this;
    try {
      if (host.failure !== null) return this.#fail(`the sandbox cannot be created on this builder: ${host.failure}`);
      if (spec.type === "web" && host.network === null) {
        return this.#fail("this builder cannot run web processes: it has no run network to reach them through (it needs root, iproute2 and nftables)");
      }
      if (spec.disk) await disks.ensure(spec.disk.id, spec.disk.sizeBytes, spec.tenant);
      this.#release = await releases.acquire(spec.release, this.#preparing.signal, (text) => this.#note(text));
      if (this.#stop) return;
      const tree = await createWorkTree({
        host,
        room,
        processDir: dir,
        archive: this.#release.path,
        expandedBytes: this.#release.expandedBytes,
        user,
      });
      this.#tree = tree;
      this.#note(`unpacked the release: ${tree.entries} entries, ${formatBytes(this.#release.expandedBytes)}, into a working tree of ${formatBytes(tree.sizeBytes)}`);
    } catch (error) {
      if (this.#stop) return;
      return this.#fail(prepareFailure(error));
    }
    if (!this.#stop) this.#launch();
  }

  /** Starts one instance; its end comes back through {@link #exited}. */
  #launch(): void {
    this.#timer = null;
    if (this.#stop || !this.#tree) return;
    // A disk's writer is not started while the node holds no lease on its disks (its watchdog may have
    // ended the last one): it waits, and starts once the lease holds again, unless it is stopped meanwhile.
    const unleased = this.spec.disk ? this.#context.diskProblem() : null;
    if (unleased !== null) {
      if (!this.#waitingForLease) this.#note(`not restarted: ${unleased}`);
      this.#waitingForLease = true;
      this.#timer = setTimeout(() => this.#launch(), LEASE_RECHECK_MS);
      return;
    }
    this.#waitingForLease = false;
    const number = ++this.#instances;
    if (number > 1) {
      this.#status.restarts = number - 1;
      this.#transition("starting", `restarting (instance ${number})`, () => this.#beginInstance());
    } else {
      this.#beginInstance();
      this.#context.changed(this.status());
    }
    const instance = this.#instance!;
    const { spec } = this;
    const { host, user, output } = this.#context;
    const env: Record<string, string> = {
      PATH: APP_DEFAULT_PATH,
      ...spec.env,
      ...(spec.type === "web" && spec.port !== null ? { PORT: String(spec.port) } : {}),
      SVC_APP_ID: spec.appId,
      SVC_PROCESS_ID: this.id,
    };
    const ended = runInSandbox({
      host,
      jobId: this.id,
      command: spec.command,
      env,
      user,
      work: { path: this.#tree.work, home: this.#tree.home },
      source: null,
      network: "egress",
      tools: null,
      timeoutMs: null,
      memoryLimitBytes: spec.memoryMb * MIB,
      disk: spec.disk ? { path: this.#context.disks.dataPath(spec.disk.id), mountPath: spec.disk.mountPath, quotaBytes: spec.disk.sizeBytes } : null,
      log: output,
      signal: instance.abort.signal,
      killGraceMs: STOP_GRACE_MS,
      onStart: ({ address, pid, usage }) => {
        instance.address = address;
        instance.pid = pid;
        instance.usage = usage;
        void this.#awaitReady(instance);
      },
    });
    instance.done = ended.then(
      (outcome) => this.#exited(instance, outcome),
      (error: unknown) => this.#exited(instance, { exitCode: null, signal: null, reason: "error", error: String(error), peakMemoryBytes: 0 }),
    );
  }

  #beginInstance(): void {
    const now = Date.now();
    this.#instance = {
      number: this.#instances,
      abort: new AbortController(),
      endedBy: null,
      address: null,
      pid: null,
      usage: null,
      port: this.spec.port,
      // Idle connections close after 4 s, before the app's own keep-alive timeout (Node's default is 5 s) can race a request.
      agent: new Agent({ keepAlive: true, scheduling: "lifo", timeout: 4_000, noDelay: true } as AgentOptions),
      startedAt: now,
      readyAt: null,
      exited: false,
      done: Promise.resolve(),
      upgrades: new Set(),
    };
    this.#status.startedAt = new Date(now).toISOString();
    this.#status.readyAt = null;
  }

  /**
   * Health-checks a web instance until it is ready or its start timeout
   * passes (then ends it); a worker is ready at once. While nothing answers,
   * what the instance listens on is read from its network namespace
   * ({@link #endedByListening}): a wrong interface ends it within seconds, another
   * single port is adopted, and every few seconds the log says it still waits.
   */
  async #awaitReady(instance: Instance): Promise<void> {
    const { spec } = this;
    if (spec.type === "worker") return this.#ready(instance, "started (a worker is ready once it runs)");
    const address = instance.address;
    if (address === null || instance.port === null) return;
    const path = spec.healthCheck ? spec.healthCheck.path : null;
    const timeoutSeconds = spec.healthCheck?.timeoutSeconds ?? DEFAULT_START_TIMEOUT_SECONDS;
    const deadline = instance.startedAt + timeoutSeconds * 1000;
    /** The last answer the app gave (an HTTP status): once it answers, a timeout is the health check's failure. */
    let answered: ProbeResult | null = null;
    let nextNote = instance.startedAt + FIRST_WAITING_NOTE_MS;
    const listening = { loopbackSince: null as number | null };
    while (!instance.exited && !this.#stop) {
      const port = instance.port;
      const last = await probe(address, port, path, Math.max(MIN_PROBE_TIMEOUT_MS, Math.min(PROBE_TIMEOUT_MS, deadline - Date.now())));
      if (instance.exited || this.#stop) return;
      if (last.ok) return this.#ready(instance, last.detail);
      if (last.answered) answered = last;
      else if (this.#endedByListening(instance, listening)) return;
      const now = Date.now();
      if (now >= deadline) {
        instance.endedBy = answered
          ? { reason: "health_check", message: `health check failed for ${timeoutSeconds} s: ${answered.detail}` }
          : { reason: "start_timeout", message: `not ready within ${timeoutSeconds} s: ${this.#listeningSummary(instance) ?? last.detail}` };
        instance.abort.abort("cancelled");
        return;
      }
      if (now >= nextNote) {
        this.#note(`waiting for ${path === null ? `port ${instance.port}` : `GET ${path} on port ${instance.port} to answer 2xx`} (${Math.round((now - instance.startedAt) / 1000)} s)`);
        nextNote += WAITING_NOTE_MS;
      }
      const pause = now - instance.startedAt < FAST_PROBE_PERIOD_MS ? FAST_PROBE_MS : SLOW_PROBE_MS;
      await sleep(Math.min(pause, Math.max(0, deadline - now)));
    }
  }

  /**
   * What the instance listens on, while its port refuses connections: on its
   * port but only on loopback ends it at once (nothing outside the sandbox
   * could ever reach it); on exactly one other port of all interfaces, that
   * port is adopted (and the log says so); on other ports on loopback alone,
   * for {@link LOOPBACK_GRACE_MS}, it is ended too. True when it ended it.
   */
  #endedByListening(instance: Instance, seen: { loopbackSince: number | null }): boolean {
    const found = instance.pid === null ? null : listeners(instance.pid);
    if (!found || found.length === 0 || instance.port === null) return false;
    const expected = instance.port;
    const end = (message: string) => {
      instance.endedBy = { reason: "port", message };
      instance.abort.abort("cancelled");
      return true;
    };
    const onPort = found.filter((listener) => listener.port === expected);
    if (onPort.length > 0) {
      if (onPort.every((listener) => listener.loopback)) {
        return end(`listens on ${where(onPort[0]!)} only; listen on 0.0.0.0 (all interfaces), e.g. listen(PORT, "0.0.0.0"), or nothing outside the app can reach it`);
      }
      return false;
    }
    const reachable = [...new Set(found.filter((listener) => !listener.loopback).map((listener) => listener.port))];
    if (reachable.length === 1) {
      instance.port = reachable[0]!;
      this.#status.port = instance.port;
      this.#note(`PORT is ${expected} but the app listens on ${instance.port}: sending traffic to ${instance.port} (set "port": ${instance.port} in svc.json to say so)`);
      return false;
    }
    if (reachable.length > 0) return false;
    seen.loopbackSince ??= Date.now();
    if (Date.now() - seen.loopbackSince < LOOPBACK_GRACE_MS) return false;
    return end(`listens on ${found.map(where).join(", ")} only, not on port ${expected}; listen on 0.0.0.0:$PORT (all interfaces)`);
  }

  /** What the instance listens on, in words, for a start that timed out; null when it cannot be read. */
  #listeningSummary(instance: Instance): string | null {
    const found = instance.pid === null ? null : listeners(instance.pid);
    if (!found) return null;
    if (found.length === 0) return `nothing listens on port ${instance.port} (nor on any other port)`;
    return `nothing listens on port ${instance.port}; the app listens on ${found.map(where).join(", ")} (set "port" in svc.json to the one it serves on)`;
  }

  #ready(instance: Instance, detail: string): void {
    if (instance.exited || this.#instance !== instance || this.#stop) return;
    const now = Date.now();
    instance.readyAt = now;
    this.#transition("running", `ready after ${now - instance.startedAt} ms (${detail})`, () => {
      this.#status.readyAt = new Date(now).toISOString();
    });
  }

  /** An instance ended: by a stop (the stop sequence goes on), else back off or call it a crash loop. */
  #exited(instance: Instance, outcome: SandboxOutcome): void {
    instance.exited = true;
    instance.agent.destroy();
    for (const socket of instance.upgrades) socket.destroy();
    instance.upgrades.clear();
    if (this.#instance === instance) this.#instance = null;
    this.#routeChanged();
    if (this.#stop) return;
    const exit = describeExit(instance, outcome);
    const ranMs = instance.readyAt === null ? 0 : Date.now() - instance.readyAt;
    const next = afterExit(this.#exits, ranMs);
    this.#exits = next.exits;
    const then =
      next.state === "crash_loop"
        ? `${next.exits} exits without ${RESTART_POLICY.resetAfterMs / 60_000} minutes of running; retrying every ${RESTART_POLICY.crashLoopRetryMs / 1000} s`
        : `restarting in ${next.delayMs / 1000} s`;
    this.#transition(next.state, `${exit.message}; ${then}`, () => {
      this.#status.lastExit = { at: new Date().toISOString(), ...exit };
      this.#status.lastLines = this.#context.output.lastLines();
    });
    this.#timer = setTimeout(() => this.#launch(), next.delayMs);
  }

  // -------------------------------------------------------------------------
  // Stop
  // -------------------------------------------------------------------------

  async #stopSequence(): Promise<void> {
    const stop = this.#stop!;
    await this.#booting;
    for (let left = stop.drainUntil - Date.now(); left > 0; left = stop.drainUntil - Date.now()) {
      await Promise.race([sleep(left), stop.wake.wait()]);
    }
    this.#accepting = false;
    this.#routeChanged();
    const idleBy = Date.now() + IN_FLIGHT_WAIT_MS;
    while (this.#inFlight > 0 && Date.now() < idleBy) await Promise.race([this.#idle.wait(), sleep(idleBy - Date.now())]);
    const inFlight = this.#inFlight + (await this.#context.drained(idleBy));
    const instance = this.#instance;
    if (instance && !instance.exited) {
      instance.endedBy = { reason: "stop", message: "stopped" };
      instance.abort.abort("cancelled");
    }
    await instance?.done;
    await this.#cleanup();
    const detail = inFlight > 0 ? `stopped (${inFlight} requests still in flight after ${IN_FLIGHT_WAIT_MS / 1000} s were cut)` : "stopped";
    this.#transition("stopped", detail, () => {
      this.#status.stoppedAt = new Date().toISOString();
    });
    this.#markFinished();
  }

  #routeChanged(): void {
    this.#routing.notify();
    this.#context.routed();
  }

  #track(): () => void {
    this.#inFlight++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--this.#inFlight === 0) this.#idle.notify();
    };
  }

  /** The process cannot run at all: say why, release everything. */
  async #fail(message: string): Promise<void> {
    this.#preparing.abort();
    await this.#cleanup();
    // A stop that came meanwhile ends the process as stopped (its sequence waits for this one).
    if (this.#stop) return;
    this.#transition("failed", message, () => {
      this.#status.lastExit = { at: new Date().toISOString(), reason: "error", exitCode: null, signal: null, message };
      this.#status.lastLines = this.#context.output.lastLines();
      this.#status.stoppedAt = new Date().toISOString();
    });
    this.#markFinished();
  }

  /** Releases what the process holds; idempotent (a tree half made by a failed start goes too). */
  async #cleanup(): Promise<void> {
    await removeWorkTree(this.#context.host, this.#context.dir);
    this.#tree = null;
    this.#release?.release();
    this.#release = null;
    this.#context.releaseDisk();
  }

  // -------------------------------------------------------------------------
  // The machine
  // -------------------------------------------------------------------------

  /**
   * The one way the state changes: checked against {@link TRANSITIONS}, written
   * to the runtime log with its reason, `update` applied, then reported.
   */
  #transition(to: ProcessState, reason: string, update?: () => void): void {
    const from = this.#status.state;
    if (!TRANSITIONS[from].includes(to)) throw new Error(`process ${this.id}: no transition from ${from} to ${to} (${reason})`);
    this.#note(`${to}: ${reason}`);
    this.#status.state = to;
    update?.();
    this.#routeChanged();
    this.#context.changed(this.status());
  }

  /** A line of the platform's about this process in its app's runtime log (the proxy's too: a cookie it dropped). */
  note(text: string): void {
    this.#note(text);
  }

  #note(text: string): void {
    this.#context.output.note(text);
  }
}

/** lastExit's reason and message for an instance's end. */
function describeExit(instance: Instance, outcome: SandboxOutcome): { reason: ProcessExitReason; exitCode: number | null; signal: string | null; message: string } {
  const codes = { exitCode: outcome.exitCode, signal: outcome.signal };
  const by = instance.endedBy;
  if (by && by.reason !== "stop") return { reason: by.reason, ...codes, message: by.message };
  switch (outcome.reason) {
    case "OOMKilled":
      return { reason: "OOMKilled", ...codes, message: `OOMKilled: ${outcome.error ?? "memory limit exceeded"}` };
    case null:
    case "exit_code":
      return { reason: "exit_code", ...codes, message: describeCode(outcome.exitCode, outcome.signal) };
    default:
      return { reason: "error", ...codes, message: outcome.error ?? "the process ended" };
  }
}

const SIGNAL_NAMES = new Map(Object.entries(constants.signals).map(([name, number]) => [number, name]));

/** `exited with code 1`; a shell's 128 + N names the signal N that ended the process. */
function describeCode(code: number | null, signal: string | null): string {
  if (code === null) return `killed by ${signal ?? "a signal"}`;
  if (code === 127) return "exited with code 127 (command not found)";
  if (code > 128 && code <= 128 + 64) return `exited with code ${code} (killed by ${SIGNAL_NAMES.get(code - 128) ?? `signal ${code - 128}`})`;
  return `exited with code ${code}`;
}

/** `127.0.0.1:8080`, `[::1]:8080`. */
function where(listener: Listener): string {
  return listener.address.includes(":") ? `[${listener.address}]:${listener.port}` : `${listener.address}:${listener.port}`;
}

/** What stopped the release from becoming a working tree, for lastExit and the log. */
function prepareFailure(error: unknown): string {
  if (error instanceof ReleaseUnavailable) return error.message;
  if (error instanceof ArchiveRejected || error instanceof TarFormatError) return `the release could not be unpacked: ${error.message}`;
  return `the process could not be prepared: ${error instanceof Error ? error.message : String(error)}`;
}
