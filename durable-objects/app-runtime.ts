import { DurableObject } from "cloudflare:workers";
import { and, eq } from "drizzle-orm";
import { DEFAULT_START_TIMEOUT_SECONDS, type ProcessSpec, type ProcessStatus } from "../builder/src/protocol/processes";
import { openDb } from "../worker/db/client";
import { type AppRow, apps, type DeploymentRow, deployments, type DiskRow, disks, SCALE_EVENTS_KEPT } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import { getProcess, type NodeRef, startProcess, stopProcess } from "../worker/lib/builder-client";
import { ApiError } from "../worker/lib/errors";
import { appChanged } from "../worker/services/cron-targets";
import { GIB } from "../worker/services/disks";
import { envOf } from "../worker/services/env-vars";
import { forgetFleet, lostNode, nodeRef } from "../worker/services/fleet";
import { metricsStub } from "../worker/services/metrics";
import { placeProcess } from "../worker/services/placement";
import { deploymentEvent, emit } from "../worker/services/webhooks";
import { scaleApp } from "../worker/services/apps";
import { noteProgress } from "../worker/services/deployments";
import { REPORT_EVERY_MS } from "../worker/sites/load-meter";
import { EDGE_APP_TTL_MS, EDGE_IDLE_APP_TTL_MS } from "../worker/sites/serve";
import { presign } from "../worker/storage/presign";
import type { ProcessSample } from "./app-metrics";
import { type HistoryWindow, ShippedLog } from "./shipped-log";

/** One process the object started: where it runs (the node's id), what release, since when (ms). */
type Instance = { processId: string; node: string; deploymentId: string; startedAt: number; state?: string; evict?: boolean };

/** A process starting to serve the app (a new release's, a replacement, one more): promoted once ready. */
type Pending = Omit<Instance, "startedAt" | "state" | "evict"> & {
  /** `deploy`: a new release (fails the deployment if it never gets ready); `start`: the app's release (re)started. */
  reason: "deploy" | "start";
  /** Past this the release is given up (its health check's own timeout plus the release download). */
  deadline: number;
  /** When it became ready, while it must stay up `minReadySeconds` before it counts as deployed. */
  readySince?: number;
  /** The app's configuration version it was started with: changes up to it run once it serves. */
  configVersion: number;
  /** Its release's `minReadySeconds` (absent in a pending process recorded before it was kept here: none). */
  minReadySeconds?: number;
};

/**
 * What the app's processes should be: every one running `deploymentId`,
 * started at or after `after` (a restart or a configuration change replaces
 * the older ones). `deploy` names the deployment rolling out (`ready` once
 * every instance runs it), `previous` the release it rolls back to when a new
 * instance fails.
 */
type Target = { deploymentId: string; after: number; deploy?: string; previous?: string; previousInstances?: number };

/** A deploy whose new processes serve now, counted deployed once no edge can still hold an old one. */
type Settling = { deploymentId: string; at: number };

/** A new release that exits this many times before it was ever ready fails its deploy (the old one keeps serving). */
const EXITS_BEFORE_READY = 3;
/** Seconds a replaced process keeps serving: longer than the edge trusts its copy of the app (1 s). */
const DRAIN_SECONDS = 5;
/** Polling a starting process (its callbacks usually come first). */
const PENDING_POLL_MS = 1_000;
/** Checking that the live processes still exist on their nodes (a node restarted without one is repaired). */
const LIVE_CHECK_MS = 60_000;
/** A start that could not be placed, delivered or made ready is tried again this much later, doubling to {@link START_RETRY_MAX_MS}. */
const START_RETRY_MS = 3_000;
const START_RETRY_MAX_MS = 30_000;
/** Fetching a release and extracting it comes on top of the health check's time. */
const START_GRACE_MS = 120_000;
/** Beyond the edge's trust in its copy of an app: the copies' own clocks and reads in flight. */
const SETTLE_MARGIN_MS = 250;
/** After the switch, until every edge isolate has dropped its copy of the app's old processes. */
const SETTLE_MS = EDGE_APP_TTL_MS + SETTLE_MARGIN_MS;
/** An isolate's report of an app's load counts this long (an isolate whose requests stopped reports nothing more). */
const LOAD_FRESH_MS = 3 * REPORT_EVERY_MS;
/** How often scaling on load looks again while it may have something to do. */
const AUTOSCALE_TICK_MS = 2_000;

/** Scaling on load's memory: since when the app has needed more (or fewer) instances than it runs. */
type ScaleWatch = { upSince?: number; downSince?: number };

/**
 * One object per app that runs (runtimes node, python, custom): the app's
 * desired state (a release, a number of instances) and the processes that
 * realise it (DESIGN §9). Deploy, scale, start, stop, restart, restore, a
 * configuration change, a drain and a lost process all go through it; it
 * drives the nodes (placement.ts says which, spreading an app's instances
 * over nodes) and records in D1 which processes serve the app
 * (`apps.live_instances`, the first also in `live_process_id`/`live_node`,
 * and its state), which the edge balances over, and what a deployment went
 * through (`deployments.progress`), which `svc deploy` narrates.
 *
 * One process starts at a time (surge 1). A web app without a disk rolls:
 * each new process starts beside the old ones and takes traffic once its
 * health check passed (and it stayed up `minReadySeconds`); then one old
 * process drains and stops, and the next new one starts, so no instance is
 * ever missing (`2/3 instances on the new release`). A new process that
 * fails its check fails the deploy, and the instances already on the new
 * release are replaced by the previous release's the same way. An app with a
 * disk (one instance), and a worker of one instance unless its release says
 * `overlap`, stop their process before its replacement starts (one writer
 * per disk, one consumer per queue). A deployment is `ready` only once no
 * edge can still route to a process it replaced.
 *
 * Every step is repeatable: callbacks and alarms arrive more than once, and a
 * step that failed half-way is taken again by the next alarm ({@link converge}
 * compares what runs with the target and takes the next step).
 */
export class AppRuntime extends DurableObject<Env> {
  #shipped: ShippedLog | null = null;
  /** The change of the app's processes under way; the next waits for it (see {@link inTurn}). */
  #turn: Promise<unknown> = Promise.resolve();

  /**
   * One change of the app's processes at a time. Each awaits its nodes, and an
   * object takes other calls meanwhile: a restore's end starting the app
   * while the alarm started it too made two processes, the second overwrote
   * the first's record, and the first ran on unknown, writing the same disk
   * (the chaos run found three of one app on one node).
   */
  private inTurn<T>(change: () => Promise<T>): Promise<T> {
    const next = this.#turn.then(change, change);
    this.#turn = next.catch(() => undefined);
    return next;
  }

  /** The app's runtime log as its nodes shipped it (made on first use: most calls never read it). */
  private get shipped(): ShippedLog {
    this.#shipped ??= new ShippedLog(this.ctx.storage);
    return this.#shipped;
  }

  private get db() {
    return openDb(this.env.DB);
  }

  private get config() {
    return configOf(this.env);
  }

  /** The processes serving the app, oldest first (an object from before instances kept one, as `live`). */
  private get instances(): Instance[] {
    const kept = this.ctx.storage.kv.get<Instance[]>("instances");
    if (kept) return kept;
    const live = this.ctx.storage.kv.get<Omit<Instance, "startedAt">>("live");
    return live ? [{ ...live, startedAt: 0 }] : [];
  }

  private get pending(): Pending | null {
    return this.ctx.storage.kv.get<Pending>("pending") ?? null;
  }

  private get settling(): Settling | null {
    return this.ctx.storage.kv.get<Settling>("settling") ?? null;
  }

  private get target(): Target | null {
    return this.ctx.storage.kv.get<Target>("target") ?? null;
  }

  private get appId(): string | null {
    return this.ctx.storage.kv.get<string>("appId") ?? null;
  }

  /**
   * Makes a deployment's release the app's: rolled out over its instances,
   * each new process taking traffic once ready. A stopped app only records it
   * (it runs when the app starts). A release still rolling out is replaced by
   * this newer one.
   */
  release(appId: string, deploymentId: string): Promise<void> {
    return this.inTurn(() => this.releaseNow(appId, deploymentId));
  }

  private async releaseNow(appId: string, deploymentId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get();
    if (!app || !deployment?.releaseKey) return;
    const before = this.target;
    await this.abandonPending(`replaced by deployment ${deploymentId}`);
    if (before?.deploy && before.deploy !== deploymentId) await this.cancelDeployment(before.deploy, `replaced by deployment ${deploymentId}`);
    if (app.status === "stopped") {
      this.ctx.storage.kv.put("target", { deploymentId, after: Date.now() } satisfies Target);
      await this.db.batch([
        this.db.update(deployments).set({ status: "ready", finishedAt: Date.now(), configVersion: app.configVersion }).where(eq(deployments.id, deploymentId)),
        this.db.update(apps).set({ activeDeploymentId: deploymentId, updatedAt: Date.now() }).where(eq(apps.id, appId)),
      ]);
      await noteProgress(this.db, deploymentId, "the app is stopped: the release runs when it starts");
      await appChanged(this.env, this.db, appId);
      return;
    }
    const scaled = deployment.instances !== null && deployment.instances !== app.instances && (await this.takeInstances(app, deploymentId, deployment.instances));
    // What to roll back to: the release the app ran before this deploy (a deploy replaced half-way: what ran before it), with its count.
    const previous = before?.deploy ? before.previous : (before?.deploymentId ?? app.activeDeploymentId ?? undefined);
    const previousInstances = before?.deploy ? before.previousInstances : scaled ? app.instances : undefined;
    this.ctx.storage.kv.put("target", {
      deploymentId,
      after: Date.now(),
      deploy: deploymentId,
      ...(previous && previous !== deploymentId ? { previous } : {}),
      ...(previousInstances !== undefined ? { previousInstances } : {}),
    } satisfies Target);
    this.ctx.storage.kv.delete("retry");
    await this.converge();
  }

  /**
   * svc.json's `instances` becomes the app's as its release rolls out (back
   * to what it was if the deploy fails), when the plan and the app allow it;
   * else the deployment says why not. Whether the count changed.
   */
  private async takeInstances(app: AppRow, deploymentId: string, instances: number): Promise<boolean> {
    try {
      await scaleApp(this.db, app, instances);
      await noteProgress(this.db, deploymentId, `svc.json asks for ${instances} instance${instances === 1 ? "" : "s"}: the app runs ${instances} (it ran ${app.instances})`);
      return true;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      await noteProgress(this.db, deploymentId, `svc.json asks for ${instances} instances, but ${err.message}: the app keeps ${app.instances}`);
      return false;
    }
  }

  /** The app was started (restart, a restore finished): its active release runs again, each instance replaced in turn. */
  start(appId: string): Promise<void> {
    return this.inTurn(() => this.startNow(appId));
  }

  private async startNow(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    if (!app || app.status === "stopped" || !app.activeDeploymentId) return;
    const before = this.target;
    await this.abandonPending("the app was restarted");
    if (before?.deploy) await this.cancelDeployment(before.deploy, "the app was restarted");
    this.ctx.storage.kv.put("target", { deploymentId: app.activeDeploymentId, after: Date.now() } satisfies Target);
    this.ctx.storage.kv.delete("retry");
    await this.converge();
  }

  /** The app's number of instances or its scaling on load changed (`PATCH /v1/apps/{app}`): one more started, or the extra ones drained. */
  scale(appId: string): Promise<void> {
    return this.inTurn(async () => {
      this.ctx.storage.kv.put("appId", appId);
      this.ctx.storage.kv.delete("retry");
      this.ctx.storage.kv.delete("scaleWatch");
      await this.converge();
      await this.autoscale();
    });
  }

  /**
   * An edge isolate's average of the app's requests in flight since its last
   * report (worker/sites/load-meter.ts); scaling on load looks at the sum of
   * the fresh reports.
   */
  reportLoad(isolate: string, concurrency: number): Promise<void> {
    const now = Date.now();
    const loads = Object.fromEntries(Object.entries(this.loads).filter(([, load]) => now - load.at < LOAD_FRESH_MS));
    loads[isolate] = { concurrency: Number.isFinite(concurrency) ? Math.max(0, concurrency) : 0, at: now };
    this.ctx.storage.kv.put("loads", loads);
    return this.inTurn(() => this.autoscale());
  }

  private get loads(): Record<string, { concurrency: number; at: number }> {
    return this.ctx.storage.kv.get<Record<string, { concurrency: number; at: number }>>("loads") ?? {};
  }

  /**
   * Scaling on load, when the app has it: the instances the load needs (its
   * requests in flight over the target per instance, within the bounds).
   * Needed for AUTOSCALE_UP_SECONDS, they are added at once; fewer needed for
   * AUTOSCALE_DOWN_SECONDS, one is drained, and the watch starts again. Every
   * decision is kept on the app with its reason.
   */
  private async autoscale(): Promise<void> {
    const appId = this.appId;
    const app = appId ? await this.app(appId) : null;
    if (!app?.autoscaling || app.status === "stopped" || !app.activeDeploymentId) {
      this.ctx.storage.kv.delete("scaleWatch");
      return;
    }
    const { minInstances, maxInstances, targetConcurrency } = app.autoscaling;
    const now = Date.now();
    const load = Object.values(this.loads)
      .filter((report) => now - report.at < LOAD_FRESH_MS)
      .reduce((sum, report) => sum + report.concurrency, 0);
    const needed = Math.min(maxInstances, Math.max(minInstances, Math.ceil(load / targetConcurrency - 0.001)));
    const watch = this.ctx.storage.kv.get<ScaleWatch>("scaleWatch") ?? {};
    const config = this.config;
    const measured = `${load.toFixed(1)} requests in flight (${(load / app.instances).toFixed(1)} per instance, target ${targetConcurrency})`;
    let next: ScaleWatch = {};
    if (needed > app.instances) {
      next = { upSince: watch.upSince ?? now };
      if (now - next.upSince! >= config.AUTOSCALE_UP_SECONDS * 1000) {
        next = {};
        await this.decide(app, needed, `${measured} for ${config.AUTOSCALE_UP_SECONDS} s: ${needed} needed`);
      }
    } else if (needed < app.instances) {
      next = { downSince: watch.downSince ?? now };
      if (now - next.downSince! >= config.AUTOSCALE_DOWN_SECONDS * 1000) {
        next = {};
        await this.decide(app, app.instances - 1, `${measured} for ${config.AUTOSCALE_DOWN_SECONDS} s: ${needed} would do; draining one`);
      }
    }
    // Watched while it may change: load seen lately, a move under way, or more than the minimum running.
    if (next.upSince !== undefined || next.downSince !== undefined || app.instances > minInstances || load > 0) this.ctx.storage.kv.put("scaleWatch", next);
    else this.ctx.storage.kv.delete("scaleWatch");
    await this.schedule();
  }

  /** A scaling decision: the app's count changes (within the plan's memory) and the processes follow; kept with its reason either way. */
  private async decide(app: AppRow, to: number, reason: string): Promise<void> {
    let why = reason;
    let count = to;
    try {
      await scaleApp(this.db, app, to);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      count = app.instances;
      why = `${reason}, but ${err.message}`;
      if (app.scaleEvents?.at(-1)?.reason === why) return;
    }
    const events = [...(app.scaleEvents ?? []), { at: Date.now(), from: app.instances, to: count, reason: why }].slice(-SCALE_EVENTS_KEPT);
    await this.db.update(apps).set({ scaleEvents: events }).where(eq(apps.id, app.id));
    console.log(JSON.stringify({ event: "app.autoscaled", appId: app.id, from: app.instances, to: count, reason: why }));
    if (count !== app.instances) await this.converge();
  }

  /** The app was stopped (or deleted): its processes stop, and the edge answers 503. */
  stop(appId: string): Promise<void> {
    return this.inTurn(() => this.stopNow(appId));
  }

  private async stopNow(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    this.ctx.storage.kv.delete("retry");
    this.ctx.storage.kv.delete("looping");
    const target = this.target;
    await this.abandonPending("the app was stopped");
    if (target?.deploy) await this.cancelDeployment(target.deploy, "the app was stopped");
    if (target) this.ctx.storage.kv.put("target", { deploymentId: target.deploymentId, after: target.after } satisfies Target);
    await this.settle(true);
    const running = this.instances;
    await this.record([]);
    for (const instance of running) await this.retire(instance, 0);
  }

  /** The fleet declared `nodeId` lost: what ran there starts again elsewhere (an app whose disk is there waits for its disk). */
  nodeLost(nodeId: string, why: string): Promise<void> {
    return this.inTurn(() => this.nodeLostNow(nodeId, why));
  }

  private async nodeLostNow(nodeId: string, why: string): Promise<void> {
    // This isolate's copy of the fleet may still call the node ready: placement must see it lost.
    forgetFleet();
    const pending = this.pending;
    if (pending?.node === nodeId) await this.failPending(pending, why, []);
    const gone = this.instances.filter((instance) => instance.node === nodeId);
    if (gone.length > 0) await this.replaceLost(gone, why);
  }

  /** The node is draining: the app's processes there are replaced on other nodes (each new one ready before the old drains). */
  moveOff(appId: string, nodeId: string): Promise<void> {
    return this.inTurn(async () => {
      this.ctx.storage.kv.put("appId", appId);
      const instances = this.instances;
      if (!instances.some((instance) => instance.node === nodeId)) return;
      this.ctx.storage.kv.put(
        "instances",
        instances.map((instance) => (instance.node === nodeId ? { ...instance, evict: true } : instance)),
      );
      await this.converge();
    });
  }

  /**
   * The node holding the runtime log of `processId` (else of the app): a
   * process starting (a first deploy has no live one yet), a live one, or
   * the last node a process of the app was started on (a failed first deploy's
   * output is there); null when none ever ran.
   */
  async logNode(processId?: string): Promise<string | null> {
    const pending = this.pending;
    const instances = this.instances;
    if (processId !== undefined && pending?.processId === processId) return pending.node;
    const named = processId === undefined ? undefined : instances.find((instance) => instance.processId === processId);
    if (named) return named.node;
    return instances[0]?.node ?? pending?.node ?? this.ctx.storage.kv.get<string>("logNode") ?? null;
  }

  /**
   * Keeps lines of the app's runtime log that `node` shipped, unless no
   * process of the app was ever started there: a node writes only into the
   * logs of apps it ran.
   */
  async keepLog(node: string, text: string): Promise<void> {
    if (this.logNodes().includes(node)) this.shipped.keep(node, text);
  }

  /**
   * A node's report of the app's processes' usage (node/metrics.ts), kept with
   * the app's metrics when the node is one the app ran on (as its log is).
   */
  async recordUsage(node: string, at: number, samples: ProcessSample[]): Promise<void> {
    const appId = this.appId;
    if (appId === null || !this.logNodes().includes(node)) return;
    await metricsStub(this.env, appId).recordProcesses(at, samples);
  }

  /** What nodes other than those in `except` shipped of the log, cut to `window`. */
  async logHistory(except: string[], window: HistoryWindow, names: Record<string, string>): Promise<{ text: string; last: { node: string; time: string } | null }> {
    return this.shipped.history(except, window, names);
  }

  /** The app was deleted: its shipped log goes with it. */
  async dropLog(): Promise<void> {
    this.shipped.drop();
  }

  /** Every node a process of the app was started on (those whose log shipments are kept). */
  private logNodes(): string[] {
    const last = this.ctx.storage.kv.get<string>("logNode");
    const nodes = this.ctx.storage.kv.get<string[]>("logNodes") ?? [];
    return last && !nodes.includes(last) ? [...nodes, last] : nodes;
  }

  /** A process's state changed (the node's callback, or a poll); `from` is the node that said so. */
  processChanged(status: ProcessStatus, from?: string): Promise<void> {
    return this.inTurn(() => this.processChangedNow(status, from));
  }

  private async processChangedNow(status: ProcessStatus, from?: string): Promise<void> {
    const pending = this.pending;
    if (pending?.processId === status.id && (from === undefined || from === pending.node)) {
      await this.advance(pending, status);
      return;
    }
    const instances = this.instances;
    const instance = instances.find((i) => i.processId === status.id && (from === undefined || from === i.node));
    if (!instance) return;
    // A crash loop is told (webhooks) as it starts; the way out of it once no process of the app loops.
    if (status.state === "crash_loop" && instance.state !== "crash_loop") {
      this.ctx.storage.kv.put("looping", true);
      await this.tell("app.crash_loop", status);
    }
    if (status.state === "failed" || status.state === "stopped") {
      await this.replaceLost([instance], `process ${status.id} ${status.state}`);
      return;
    }
    if (instance.state === status.state) return;
    await this.record(instances.map((i) => (i === instance ? { ...i, state: status.state } : i)));
    await this.recovered(status);
  }

  /** `app.recovered`, once, when the app crash-looped and now none of its processes does and one runs (it came back, or a fix replaced it). */
  private async recovered(status: ProcessStatus): Promise<void> {
    if (!this.ctx.storage.kv.get<boolean>("looping")) return;
    const instances = this.instances;
    if (instances.some((i) => i.state === "crash_loop") || !instances.some((i) => i.state === "running")) return;
    this.ctx.storage.kv.delete("looping");
    await this.tell("app.recovered", status);
  }

  /** `app.crash_loop` or `app.recovered` of one of the app's processes, with its node's account of it. */
  private async tell(event: "app.crash_loop" | "app.recovered", status: ProcessStatus): Promise<void> {
    const app = this.appId ? await this.app(this.appId) : null;
    if (!app) return;
    await emit(this.env, app.accountId, event, {
      app: { id: app.id, name: app.name },
      process: { id: status.id, state: status.state, restarts: status.restarts, lastExit: status.lastExit, lastLines: status.lastLines },
    });
  }

  override alarm(): Promise<void> {
    return this.inTurn(() => this.tick());
  }

  private async tick(): Promise<void> {
    await this.retryStops();
    await this.settle(false);
    if (this.ctx.storage.kv.get<ScaleWatch>("scaleWatch")) await this.autoscale();
    const pending = this.pending;
    if (pending) {
      const node = await nodeRef(this.env, pending.node).catch(() => null);
      const found = node ? await getProcess(this.config, node, pending.processId).catch(() => null) : null;
      if (found?.ok) await this.advance(pending, found.value);
      else if (found && found.status === 404) await this.failPending(pending, "the node lost the new process before it was ready", []);
      else if (Date.now() > pending.deadline) await this.failPending(pending, "the node running the new process could not be reached", []);
    } else {
      const checkAt = this.ctx.storage.kv.get<number>("checkAt") ?? 0;
      if (Date.now() >= checkAt) {
        this.ctx.storage.kv.put("checkAt", Date.now() + LIVE_CHECK_MS);
        await this.checkInstances();
      }
      await this.converge();
    }
    await this.schedule();
  }

  /** Asks each live process's node for it: one whose node was lost, left the fleet or restarted without it is replaced. */
  private async checkInstances(): Promise<void> {
    for (const instance of this.instances) {
      const node = await nodeRef(this.env, instance.node).catch(() => null);
      const found = node ? await getProcess(this.config, node, instance.processId).catch(() => null) : null;
      const lost = found?.ok ? null : await lostNode(this.env, instance.node);
      if (!node || lost) await this.replaceLost([instance], `node ${lost?.name ?? instance.node} ${lost ? "was lost" : "left the fleet"}`);
      else if (found && !found.ok && found.status === 404) await this.replaceLost([instance], `the node has no process ${instance.processId} (it restarted without it)`);
    }
  }

  // -------------------------------------------------------------------------

  private async app(appId: string): Promise<AppRow | null> {
    return (await this.db.select().from(apps).where(eq(apps.id, appId)).get()) ?? null;
  }

  /**
   * One step from what runs towards the target, when nothing is starting: a
   * process of the target's release started when fewer than the app's
   * instances run it; else the processes it replaced (or beyond the count)
   * drained; a deploy whose every instance runs its release then settles.
   */
  private async converge(): Promise<void> {
    const appId = this.appId;
    const target = this.target;
    if (!appId || !target || this.pending) return;
    const app = await this.app(appId);
    if (!app || app.status === "stopped") return;
    const disk = await this.db.select().from(disks).where(eq(disks.appId, app.id)).get();
    const wanted = disk ? 1 : app.instances;
    const instances = this.instances;
    const current = instances.filter((i) => isCurrent(i, target));
    const retry = this.ctx.storage.kv.get<{ at: number; delay: number }>("retry");
    if (current.length < wanted) {
      if (retry && retry.at > Date.now()) return;
      const deployment = await this.db.select().from(deployments).where(eq(deployments.id, target.deploymentId)).get();
      if (!deployment?.releaseKey) return;
      await this.launch(app, deployment, target.deploy === target.deploymentId ? "deploy" : "start", disk ?? null, wanted);
      return;
    }
    // Enough run the target's release: what they replaced, and any beyond the count (the newest first), drain and stop.
    const surplus = [...instances.filter((i) => !isCurrent(i, target)), ...current.slice(wanted).reverse()];
    if (surplus.length > 0) {
      const leaving = new Set(surplus.map((i) => i.processId));
      const staying = instances.filter((i) => !leaving.has(i.processId));
      const successors = new Map<string, string>();
      for (const instance of surplus) {
        const next = this.successorOn(instance.node, staying);
        if (next) successors.set(instance.processId, next.processId);
      }
      await this.record(staying, {}, new Set(successors.keys()));
      for (const instance of surplus) await this.retire(instance, DRAIN_SECONDS, successors.get(instance.processId));
      if (target.deploy) await noteProgress(this.db, target.deploy, `the previous release drains for ${DRAIN_SECONDS} s, then stops`);
    }
    if (target.deploy) {
      this.ctx.storage.kv.put("target", { deploymentId: target.deploymentId, after: target.after } satisfies Target);
      this.ctx.storage.kv.put("settling", { deploymentId: target.deploy, at: this.settleAt() } satisfies Settling);
    }
    await this.schedule();
  }

  /**
   * Starts a process of the deployment's release, with the app's current
   * configuration (env vars, disk, memory, start settings), on a node its
   * other instances are not on where there is one. An app with a disk and a
   * worker of one instance without overlap first stop a process they replace.
   */
  private async launch(app: AppRow, deployment: DeploymentRow, reason: Pending["reason"], disk: DiskRow | null, wanted: number): Promise<void> {
    const config = this.config;
    const target = this.target!;
    // A disk being restored (a failover's, a drain's, a user's) is on its new node before its data is: a process
    // started there now would write to an empty disk, and the node then refuses the restore (the chaos run found
    // it). The restore's end starts the app.
    if (disk?.status === "restoring") {
      await this.couldNotStart(app, deployment, reason, `disk ${disk.name} is being restored; the app starts on its node once it is`);
      return;
    }
    // Stops not yet delivered (a process its node was lost with) go first: one process writes a disk at a time.
    if (disk) await this.retryStops();
    const web = deployment.processType !== "worker";
    const stopFirst = disk !== null || (!web && deployment.overlap !== true && wanted === 1);
    const replaced = this.instances.find((i) => !isCurrent(i, target));
    if (stopFirst && replaced) {
      await this.record(this.instances.filter((i) => i.processId !== replaced.processId));
      await this.retire(replaced, 0);
      if (reason === "deploy") {
        await noteProgress(this.db, deployment.id, disk ? "stopped the running release first: one process writes a disk at a time" : "stopped the running worker first (set \"overlap\": true in svc.json to run both during a deploy)");
      }
    }
    const sequence = (this.ctx.storage.kv.get<number>("sequence") ?? 0) + 1;
    this.ctx.storage.kv.put("sequence", sequence);
    const release = await presign(config, {
      method: "GET",
      key: deployment.releaseKey!,
      expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS,
    });
    const spec: ProcessSpec = {
      key: `${app.id}/${deployment.id}/${sequence}`,
      tenant: app.accountId,
      appId: app.id,
      release: { url: release.url, sha256: deployment.releaseSha256!, sizeBytes: deployment.releaseBytes! },
      type: web ? "web" : "worker",
      command: app.startCommand ?? deployment.startCommand!,
      port: web ? deployment.port : null,
      healthCheck: web ? { path: app.healthCheckPath ?? deployment.healthCheckPath, timeoutSeconds: startTimeout(deployment) } : null,
      env: await envOf(this.db, config, app.id),
      memoryMb: app.memoryMb,
      disk: disk ? { id: disk.id, mountPath: disk.mountPath, sizeBytes: disk.sizeGb * GIB, generation: disk.generation } : undefined,
      callbackUrl: new URL("/internal/processes/callback", config.PUBLIC_URL).href,
      labels: { appId: app.id, deploymentId: deployment.id },
    };
    // A node whose host cannot hold the process (507: memory or room for its working tree) is passed
    // over for the next one that might; an app with a disk has only its disk's node. The app's other
    // instances' nodes come last (spread first, then least loaded).
    const refusedBy = new Set<string>();
    const refusals: string[] = [];
    const spread = new Map<string, number>();
    for (const instance of this.instances) if (!instance.evict) spread.set(instance.node, (spread.get(instance.node) ?? 0) + 1);
    let started: Awaited<ReturnType<typeof startProcess>> | { ok: false; status: 0; code: string; message: string };
    let node: NodeRef;
    for (;;) {
      try {
        node = await placeProcess(this.env, { disk }, { memoryMb: app.memoryMb, exclude: refusedBy, spread });
      } catch (err) {
        const why = [...refusals, err instanceof Error ? err.message : String(err)].join("; ");
        await this.couldNotStart(app, deployment, reason, `the new process could not be placed: ${why}`);
        return;
      }
      // Its node may ship the app's first lines before the start's answer is back here: they are kept from now.
      this.ctx.storage.kv.put("logNodes", [...new Set([...this.logNodes(), node.id])]);
      started = await startProcess(config, node, spec).catch((err: unknown) => ({
        ok: false as const,
        status: 0 as const,
        code: err instanceof ApiError ? err.code : "BUILDER_UNAVAILABLE",
        message: err instanceof Error ? err.message : String(err),
      }));
      // A node that cannot hold it (507) or did not answer in time (now marked unreachable) passes it to the next.
      if (started.ok || (started.status !== 507 && started.code !== "NODE_UNREACHABLE") || disk) break;
      refusedBy.add(node.id);
      refusals.push(`node ${node.id}: ${started.message}`);
    }
    if (!started.ok) {
      await this.couldNotStart(app, deployment, reason, `the node refused the new process: ${started.message}`);
      return;
    }
    const pending: Pending = {
      processId: started.value.id,
      node: node.id,
      deploymentId: deployment.id,
      reason,
      deadline: Date.now() + startTimeout(deployment) * 1000 + START_GRACE_MS,
      configVersion: app.configVersion,
      minReadySeconds: deployment.minReadySeconds ?? 0,
    };
    this.ctx.storage.kv.put("pending", pending);
    this.ctx.storage.kv.put("logNode", node.id);
    if (reason === "deploy") {
      await this.db
        .update(deployments)
        .set({ processId: pending.processId, configVersion: app.configVersion })
        .where(eq(deployments.id, deployment.id));
      const of = wanted > 1 ? ` (instance ${this.instances.filter((i) => isCurrent(i, target)).length + 1} of ${wanted})` : "";
      await noteProgress(this.db, deployment.id, `starting process ${pending.processId} of the release on node ${node.id}${of}`);
    }
    // Nothing serves the app (first start, or its disk's process was stopped): this process serves it from now,
    // the node holding requests until it is ready.
    if (this.instances.length === 0 && reason === "start") await this.promote(pending, started.value);
    else await this.advance(pending, started.value);
    await this.schedule();
  }

  /** A launch that could not even start a process: a deploy fails with why (and rolls back); an app that should run tries again later. */
  private async couldNotStart(app: AppRow, deployment: DeploymentRow, reason: Pending["reason"], why: string): Promise<void> {
    if (reason === "deploy") {
      await this.failDeployment(deployment.id, why, []);
      await this.rollBack();
    } else console.error(JSON.stringify({ event: "app.unplaced", appId: app.id, why }));
    this.retryLater();
    await this.schedule();
  }

  /**
   * Takes a starting process's status: counts it deployed once ready and up
   * `minReadySeconds`, fails its release when it cannot get there (or dies
   * within them).
   */
  private async advance(pending: Pending, status: ProcessStatus): Promise<void> {
    const minReadySeconds = pending.reason === "deploy" ? (pending.minReadySeconds ?? 0) : 0;
    if (status.ready && status.state === "running") {
      const readyAt = status.readyAt ? Date.parse(status.readyAt) : Date.now();
      if (minReadySeconds > 0 && Date.now() < readyAt + minReadySeconds * 1000) {
        if (pending.readySince === undefined) {
          this.ctx.storage.kv.put("pending", { ...pending, readySince: readyAt });
          await noteProgress(this.db, pending.deploymentId, `ready after ${readyTime(status)}; it counts as deployed once up ${minReadySeconds} s`);
        }
        await this.schedule(readyAt + minReadySeconds * 1000);
        return;
      }
      await this.promote(pending, status);
      return;
    }
    // Ready once, then gone before its minReadySeconds were up: it is not the release to keep.
    const diedWhileCounted = pending.readySince !== undefined && status.state !== "running";
    const hopeless =
      diedWhileCounted ||
      status.state === "crash_loop" ||
      status.state === "failed" ||
      status.state === "stopped" ||
      status.lastExit?.reason === "start_timeout" ||
      status.lastExit?.reason === "health_check" ||
      status.lastExit?.reason === "port" ||
      // A release that exited {@link EXITS_BEFORE_READY} times without ever being ready will not get there: say so now.
      (status.state === "backoff" && status.readyAt === null && status.restarts + 1 >= EXITS_BEFORE_READY);
    if (hopeless) await this.failPending(pending, startFailure(status, diedWhileCounted ? minReadySeconds : null), status.lastLines);
    else if (Date.now() > pending.deadline) await this.failPending(pending, "it did not get ready in time", status.lastLines);
  }

  /**
   * The pending process serves the app from now on, beside the others; one
   * it replaces (another release's, an older start's, one beyond the count)
   * drains and stops, and the next step follows ({@link converge}).
   */
  private async promote(pending: Pending, status: ProcessStatus): Promise<void> {
    const appId = this.appId!;
    const target = this.target;
    const app = await this.app(appId);
    // The changes this process was started with are running now.
    const pendingChanges = (app?.pendingChanges ?? []).filter((change) => change.version > pending.configVersion);
    this.ctx.storage.kv.delete("pending");
    this.ctx.storage.kv.delete("retry");
    const joined: Instance = { processId: pending.processId, node: pending.node, deploymentId: pending.deploymentId, startedAt: Date.now(), state: status.state };
    const instances = [...this.instances, joined];
    const wanted = app ? app.instances : 1;
    // The one it replaces: a process not of the target (evicted ones first), else the oldest beyond the count.
    const stale = target ? instances.filter((i) => !isCurrent(i, target)).sort((a, b) => Number(b.evict ?? false) - Number(a.evict ?? false)) : [];
    const replaced = instances.length > wanted ? (stale[0] ?? null) : null;
    const serving = replaced ? instances.filter((i) => i !== replaced) : instances;
    // On one node the old process hands its requests to the new one at once (ProcessStop's successor).
    const successor = replaced ? this.successorOn(replaced.node, serving)?.processId : undefined;
    await this.record(
      serving,
      { activeDeploymentId: pending.deploymentId, pendingChanges: pendingChanges.length > 0 ? pendingChanges : null, updatedAt: Date.now() },
      new Set(replaced && successor ? [replaced.processId] : []),
    );
    if (pending.reason === "deploy") {
      const onNew = target ? serving.filter((i) => isCurrent(i, target)).length : 1;
      const ready = status.ready ? `healthy after ${readyTime(status)}; ` : "";
      await noteProgress(this.db, pending.deploymentId, wanted > 1 ? `${ready}${onNew}/${wanted} instances on the new release` : `${ready}switching traffic to it`);
    }
    await this.recovered(status);
    if (replaced) {
      if (pending.reason === "deploy") {
        const which = wanted > 1 ? `process ${replaced.processId} of the previous release` : "the previous release";
        // On one node its new requests already go to the new release: what is left is what it has in flight.
        const drain = successor
          ? `${which} hands its new requests to the new release and stops once those in flight end (at most ${DRAIN_SECONDS} s)`
          : `${which} drains for ${DRAIN_SECONDS} s, then stops`;
        await noteProgress(this.db, pending.deploymentId, drain);
      }
      await this.retire(replaced, DRAIN_SECONDS, successor);
    }
    // The app's cron runs work in the active release.
    await appChanged(this.env, this.db, appId);
    await this.converge();
    await this.schedule();
  }

  /**
   * Writes which processes serve the app (the edge reads them) and the app's
   * process state: `running` while any runs, else the first one's; with
   * `also`, more of the app's columns in the same statement; `forwarded`:
   * processes leaving the row whose node is about to send their requests to
   * a successor (retire's).
   */
  private async record(instances: Instance[], also: Partial<AppRow> = {}, forwarded: ReadonlySet<string> = new Set()): Promise<void> {
    const appId = this.appId;
    this.noteStaleCopies(instances, forwarded);
    this.ctx.storage.kv.put("instances", instances);
    this.ctx.storage.kv.delete("live");
    if (!appId) return;
    const first = instances[0];
    const state = instances.some((i) => i.state === "running") ? "running" : (first?.state ?? null);
    await this.db
      .update(apps)
      .set({
        liveInstances: instances.length > 0 ? instances.map((i) => ({ processId: i.processId, node: i.node })) : null,
        liveProcessId: first?.processId ?? null,
        liveNode: first?.node ?? null,
        processState: state,
        ...also,
      })
      .where(eq(apps.id, appId));
  }

  /**
   * Keeps until when an edge isolate may still hold a copy of the app row
   * that does not send a request to the processes now recorded
   * (`edgesStaleUntil`, {@link settleAt}): a process taken out of the row
   * may be named by copies for {@link EDGE_APP_TTL_MS} unless its node
   * forwards its requests to its successor (`forwarded`: such removed
   * processes); a row that had no process may be copied as such for
   * {@link EDGE_IDLE_APP_TTL_MS} after it gains one.
   */
  private noteStaleCopies(instances: Instance[], forwarded: ReadonlySet<string>): void {
    const before = this.instances;
    const kept = new Set(instances.map((i) => i.processId));
    if (before.some((i) => !kept.has(i.processId) && !forwarded.has(i.processId))) this.staleFor(SETTLE_MS);
    else if (before.length === 0 && instances.length > 0) this.staleFor(EDGE_IDLE_APP_TTL_MS + SETTLE_MARGIN_MS);
  }

  /** Edges' copies of the app row may be stale for `ms` from now (`edgesStaleUntil` only moves later). */
  private staleFor(ms: number): void {
    const until = Date.now() + ms;
    if (until > (this.ctx.storage.kv.get<number>("edgesStaleUntil") ?? 0)) this.ctx.storage.kv.put("edgesStaleUntil", until);
  }

  /**
   * When a deploy that switched is `ready`: once no edge isolate can still
   * send a request to a process the deploy replaced, or answer that the app
   * has none ({@link noteStaleCopies}). A replaced process whose node
   * forwards to its successor costs no wait: a redeploy on one node, like a
   * first deploy, is done within {@link EDGE_IDLE_APP_TTL_MS} or at once.
   */
  private settleAt(): number {
    return Math.max(Date.now(), this.ctx.storage.kv.get<number>("edgesStaleUntil") ?? 0);
  }

  /** A current process on `node` to take over from a process leaving it, if the deploy put one there. */
  private successorOn(node: string, among: Instance[]): Instance | undefined {
    const target = this.target;
    return among.find((i) => i.node === node && i.state === "running" && (!target || isCurrent(i, target)));
  }

  /** A deploy that switched: `ready` once the edges' copies of the old processes have expired (or at once, `now`). */
  private async settle(now: boolean): Promise<void> {
    const settling = this.settling;
    if (!settling || (!now && Date.now() < settling.at)) return;
    this.ctx.storage.kv.delete("settling");
    const done = await this.db
      .update(deployments)
      .set({ status: "ready", error: null, finishedAt: Date.now() })
      .where(and(eq(deployments.id, settling.deploymentId), eq(deployments.status, "deploying")))
      .returning({ id: deployments.id });
    if (done.length > 0) {
      await noteProgress(this.db, settling.deploymentId, "serving: every request goes to the new release");
      await deploymentEvent(this.env, settling.deploymentId, "succeeded");
    }
  }

  /** A process that cannot get ready: its deployment fails with why (rolled back), its process stops, the others keep serving. */
  private async failPending(pending: Pending, why: string, lastLines: string[]): Promise<void> {
    this.ctx.storage.kv.delete("pending");
    await this.retire(pending, 0);
    if (pending.reason === "deploy") {
      await this.failDeployment(pending.deploymentId, why, lastLines);
      await this.rollBack();
    } else {
      console.warn(JSON.stringify({ event: "app.start_failed", appId: this.appId, why }));
      this.retryLater();
    }
    await this.converge();
    await this.schedule();
  }

  /** A failed deploy: the target is the release before it again, which replaces any instance already on the new one. */
  private async rollBack(): Promise<void> {
    const target = this.target;
    if (!target?.deploy) return;
    if (!target.previous) {
      // A first deploy has nothing to go back to: what it started stops.
      this.ctx.storage.kv.delete("target");
      const running = this.instances;
      await this.record([]);
      for (const instance of running) await this.retire(instance, 0);
      return;
    }
    const appId = this.appId;
    this.ctx.storage.kv.put("target", { deploymentId: target.previous, after: 0 } satisfies Target);
    const instances = target.previousInstances !== undefined ? { instances: target.previousInstances } : {};
    if (appId) await this.db.update(apps).set({ activeDeploymentId: target.previous, ...instances }).where(eq(apps.id, appId));
    if (this.instances.some((i) => i.deploymentId !== target.previous)) console.warn(JSON.stringify({ event: "app.rolling_back", appId, deploymentId: target.previous }));
  }

  /** A start that failed (no node, a refusal, never ready) is tried again later, each time twice as late. */
  private retryLater(): void {
    const delay = Math.min(START_RETRY_MAX_MS, (this.ctx.storage.kv.get<{ at: number; delay: number }>("retry")?.delay ?? START_RETRY_MS / 2) * 2);
    this.ctx.storage.kv.put("retry", { at: Date.now() + delay, delay });
  }

  private async failDeployment(deploymentId: string, error: string, lastLines: string[]): Promise<void> {
    const line = error.split("\n")[0]!.slice(0, 1_000);
    const failed = await this.db
      .update(deployments)
      .set({ status: "failed", error: line, logExcerpt: lastLines.length > 0 ? lastLines : null, finishedAt: Date.now() })
      .where(and(eq(deployments.id, deploymentId), eq(deployments.status, "deploying")))
      .returning({ id: deployments.id });
    if (failed.length > 0) await deploymentEvent(this.env, deploymentId, "failed");
  }

  private async cancelDeployment(deploymentId: string, why: string): Promise<void> {
    await this.db
      .update(deployments)
      .set({ status: "cancelled", error: why, finishedAt: Date.now() })
      .where(and(eq(deployments.id, deploymentId), eq(deployments.status, "deploying")));
  }

  /** A process still starting is dropped (its deployment says why) before another takes its place. */
  private async abandonPending(why: string): Promise<void> {
    const pending = this.pending;
    if (!pending) return;
    this.ctx.storage.kv.delete("pending");
    await this.retire(pending, 0);
    if (pending.reason === "deploy") await this.cancelDeployment(pending.deploymentId, why);
  }

  /** Live processes are gone (their node was lost or restarted without them, or they failed for good): others take their place. */
  private async replaceLost(gone: Instance[], why: string): Promise<void> {
    const appId = this.appId;
    if (!appId) return;
    console.warn(JSON.stringify({ event: "app.process_lost", appId, processes: gone.map((i) => i.processId), why }));
    const leaving = new Set(gone.map((i) => i.processId));
    // No longer the app's processes anywhere: a lost node that returns is told to stop them (fleet.ts), and so is
    // one that merely answered late, before a process of the app starts on its disk again (the chaos run found the
    // old one running beside the new for ten minutes, both writing the disk).
    await this.record(this.instances.filter((i) => !leaving.has(i.processId)));
    for (const instance of gone) await this.retire(instance, 0);
    this.ctx.storage.kv.delete("retry");
    await this.converge();
  }

  /** Asks the node to stop a process; a stop that could not be delivered is retried by the alarm. */
  private async retire(instance: Pick<Instance, "processId" | "node">, drainSeconds: number, successor?: string): Promise<void> {
    const node = await nodeRef(this.env, instance.node).catch(() => null);
    const stopped =
      node && !(await lostNode(this.env, instance.node)) ? await stopProcess(this.config, node, instance.processId, drainSeconds, successor).catch(() => null) : null;
    // Not told of its successor: edges' copies naming it are stale until they expire (record counted on the forward).
    if (successor !== undefined && !stopped?.ok) this.staleFor(SETTLE_MS);
    // A node that left the fleet cannot be told. A lost one is told when it returns (its heartbeat's answer names
    // what no app runs there any more: fleet.ts), or by this stop, tried again until it is delivered.
    if (!node || stopped?.ok) return;
    const stops = this.ctx.storage.kv.get<Pick<Instance, "processId" | "node">[]>("stops") ?? [];
    this.ctx.storage.kv.put("stops", [...stops.filter((s) => s.processId !== instance.processId), { processId: instance.processId, node: instance.node }]);
    await this.schedule();
  }

  private async retryStops(): Promise<void> {
    const stops = this.ctx.storage.kv.get<Pick<Instance, "processId" | "node">[]>("stops") ?? [];
    if (stops.length === 0) return;
    this.ctx.storage.kv.delete("stops");
    for (const instance of stops) await this.retire(instance, 0);
  }

  /** The next alarm: the earliest of what is due (`at`, a settle, a pending poll, a stop to deliver, a retry, the live check). */
  private async schedule(at?: number): Promise<void> {
    const now = Date.now();
    const due: number[] = [];
    if (at !== undefined) due.push(at);
    const settling = this.settling;
    if (settling) due.push(settling.at);
    const retry = this.ctx.storage.kv.get<{ at: number }>("retry");
    if (this.pending || (this.ctx.storage.kv.get<unknown[]>("stops") ?? []).length > 0) due.push(now + PENDING_POLL_MS);
    else if (retry && this.target) due.push(Math.max(retry.at, now));
    if (this.instances.length > 0) due.push(Math.max(now, this.ctx.storage.kv.get<number>("checkAt") ?? now + LIVE_CHECK_MS));
    if (this.ctx.storage.kv.get<ScaleWatch>("scaleWatch")) due.push(now + AUTOSCALE_TICK_MS);
    if (due.length === 0) {
      await this.ctx.storage.deleteAlarm();
      return;
    }
    const next = Math.max(now, Math.min(...due));
    const current = await this.ctx.storage.getAlarm();
    if (current !== null && current > now && current <= next) return;
    await this.ctx.storage.setAlarm(next);
  }
}

/** Whether a live process is what the target asks for: its release, started since the target's restart, on a node not drained. */
function isCurrent(instance: Instance, target: Target): boolean {
  return instance.deploymentId === target.deploymentId && instance.startedAt >= target.after && instance.evict !== true;
}

/** `2.1 s` from a status's start to its readiness. */
function readyTime(status: ProcessStatus): string {
  if (!status.startedAt || !status.readyAt) return "its health check";
  return `${((Date.parse(status.readyAt) - Date.parse(status.startedAt)) / 1000).toFixed(1)} s`;
}

/** Seconds a web release has from each start to pass its health check: svc.json's `startTimeoutSeconds`, else the default. */
function startTimeout(deployment: Pick<DeploymentRow, "startTimeoutSeconds">): number {
  return deployment.startTimeoutSeconds ?? DEFAULT_START_TIMEOUT_SECONDS;
}

/**
 * Why a starting process will not be the app's, in one line: `process exited
 * with code 3 during start` (or `within its first 10 s` when it died while
 * its `minReadySeconds` were counted), or the node's own reason
 * (`listens on 127.0.0.1:8080 only; …`, `not ready within 60 s: …`).
 */
function startFailure(status: ProcessStatus, countedSeconds: number | null): string {
  const exit = status.lastExit;
  if (!exit) return `the process is ${status.state}`;
  if (exit.reason !== "exit_code" && exit.reason !== "OOMKilled") return exit.message;
  const when = countedSeconds === null ? "during start" : `within its first ${countedSeconds} s`;
  return exit.reason === "OOMKilled" ? `${exit.message} (${when})` : `process ${exit.message} ${when}`;
}
