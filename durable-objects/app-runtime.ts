import { DurableObject } from "cloudflare:workers";
import { and, eq } from "drizzle-orm";
import { DEFAULT_START_TIMEOUT_SECONDS, type ProcessSpec, type ProcessStatus } from "../builder/src/protocol/processes";
import { openDb } from "../worker/db/client";
import { type AppRow, apps, type DeploymentRow, deployments, disks } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import { getProcess, type NodeRef, startProcess, stopProcess } from "../worker/lib/builder-client";
import { ApiError } from "../worker/lib/errors";
import { appChanged } from "../worker/services/cron-targets";
import { GIB } from "../worker/services/disks";
import { envOf } from "../worker/services/env-vars";
import { forgetFleet, lostNode, nodeRef } from "../worker/services/fleet";
import { placeProcess } from "../worker/services/placement";
import { noteProgress } from "../worker/services/deployments";
import { EDGE_APP_TTL_MS } from "../worker/sites/serve";
import { presign } from "../worker/storage/presign";
import { type HistoryWindow, ShippedLog } from "./shipped-log";

/** One process the object started: where it runs (the node's id), and what for. */
type Instance = { processId: string; node: string; deploymentId: string };

/** A process starting to replace the live one (or to be the first): promoted once ready. */
type Pending = Instance & {
  /** `deploy`: a new release (fails the deployment if it never gets ready); `start`: the app (re)started. */
  reason: "deploy" | "start";
  /** Past this the release is given up (its health check's own timeout plus the release download). */
  deadline: number;
  /** When it became ready, while it must stay up `minReadySeconds` before it counts as deployed. */
  readySince?: number;
  /** The release that ran before, stopped first (an app with a disk, a worker without overlap): started again if this one fails. */
  previous?: string;
  /** The app's configuration version it was started with: changes up to it run once it serves. */
  configVersion: number;
  /** Its release's `minReadySeconds` (absent in a pending process recorded before it was kept here: none). */
  minReadySeconds?: number;
};

/** A deploy whose new process serves now, counted deployed once no edge can still hold the old one. */
type Settling = { deploymentId: string; at: number };

/** A new release that exits this many times before it was ever ready fails its deploy (the old one keeps serving). */
const EXITS_BEFORE_READY = 3;
/** Seconds a replaced process keeps serving: longer than the edge trusts its copy of the app (2 s). */
const DRAIN_SECONDS = 5;
/** Polling a starting process (its callbacks usually come first). */
const PENDING_POLL_MS = 1_000;
/** Checking that the live process still exists on its node (a node restarted without it is repaired). */
const LIVE_CHECK_MS = 60_000;
/** A start that could not be placed or delivered is tried again this much later. */
const START_RETRY_MS = 3_000;
/** Fetching a release and extracting it comes on top of the health check's time. */
const START_GRACE_MS = 120_000;
/** After the switch, until every edge isolate has dropped its copy of the app's old process. */
const SETTLE_MS = EDGE_APP_TTL_MS + 250;

/**
 * One object per app that runs (runtimes node, python, custom): the app's
 * desired state and the processes that realise it (DESIGN §9). Deploy, start,
 * stop, restart, restore, a configuration change and a lost process all go
 * through it; it drives the node (placement.ts says which) and records in D1
 * which process serves the app (`apps.live_process_id`, `live_node`, and its
 * state), which the edge forwards to, and what a deployment went through
 * (`deployments.progress`), which `svc deploy` narrates.
 *
 * A new release of a web app without a disk starts beside the old one and
 * takes the traffic only once its health check passed (and it stayed up
 * `minReadySeconds`); the old one then drains and stops. An app with a disk,
 * and a worker unless its release says `overlap`, is stopped before its new
 * process starts (one writer per disk, one consumer per queue); when the new
 * one fails, the previous release starts again. A deployment is `ready` only
 * once no edge can still route to the process it replaced: `svc deploy` says
 * "Deployed" when every request goes to the new release. A release that never
 * gets ready fails its deployment with a one-line reason and the process's
 * last lines, and the old one keeps serving.
 *
 * Every step is repeatable: callbacks and alarms arrive more than once, and a
 * step that failed half-way is taken again by the next alarm.
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

  private get live(): Instance | null {
    return this.ctx.storage.kv.get<Instance>("live") ?? null;
  }

  private get pending(): Pending | null {
    return this.ctx.storage.kv.get<Pending>("pending") ?? null;
  }

  private get settling(): Settling | null {
    return this.ctx.storage.kv.get<Settling>("settling") ?? null;
  }

  /**
   * Makes a deployment's release the app's: started beside the live process
   * and switched to once ready. A stopped app only records it (it runs when
   * the app starts). A release still starting is replaced by this newer one.
   */
  release(appId: string, deploymentId: string): Promise<void> {
    return this.inTurn(() => this.releaseNow(appId, deploymentId));
  }

  private async releaseNow(appId: string, deploymentId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get();
    if (!app || !deployment?.releaseKey) return;
    await this.abandonPending(`replaced by deployment ${deploymentId}`);
    if (app.status === "stopped") {
      await this.db.batch([
        this.db.update(deployments).set({ status: "ready", finishedAt: Date.now(), configVersion: app.configVersion }).where(eq(deployments.id, deploymentId)),
        this.db.update(apps).set({ activeDeploymentId: deploymentId, updatedAt: Date.now() }).where(eq(apps.id, appId)),
      ]);
      await noteProgress(this.db, deploymentId, "the app is stopped: the release runs when it starts");
      await appChanged(this.env, this.db, appId);
      return;
    }
    await this.launch(app, deployment, "deploy");
  }

  /** The app was started (restart, a restore finished): runs its active release, beside the live process if any. */
  start(appId: string): Promise<void> {
    return this.inTurn(() => this.startNow(appId));
  }

  private async startNow(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    if (!app || app.status === "stopped" || !app.activeDeploymentId) return;
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, app.activeDeploymentId)).get();
    if (!deployment?.releaseKey) return;
    await this.abandonPending("the app was restarted");
    await this.launch(app, deployment, "start");
  }

  /** The app was stopped (or deleted): its processes stop, and the edge answers 503. */
  stop(appId: string): Promise<void> {
    return this.inTurn(() => this.stopNow(appId));
  }

  private async stopNow(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    this.ctx.storage.kv.delete("retryStartAt");
    await this.abandonPending("the app was stopped");
    await this.settle(true);
    const live = this.live;
    this.ctx.storage.kv.delete("live");
    await this.db.update(apps).set({ liveProcessId: null, liveNode: null, processState: null }).where(eq(apps.id, appId));
    if (live) await this.retire(live, 0);
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
    if (this.live?.node === nodeId) await this.replaceLost(why);
  }

  /**
   * The node holding the runtime log of `processId` (else of the app): a
   * process starting (a first deploy has no live one yet), the live one, or
   * the last node a process of the app was started on (a failed first deploy's
   * output is there); null when none ever ran.
   */
  async logNode(processId?: string): Promise<string | null> {
    const pending = this.pending;
    const live = this.live;
    if (processId !== undefined && pending?.processId === processId) return pending.node;
    if (processId !== undefined && live?.processId === processId) return live.node;
    return live?.node ?? pending?.node ?? this.ctx.storage.kv.get<string>("logNode") ?? null;
  }

  /**
   * Keeps lines of the app's runtime log that `node` shipped, unless no
   * process of the app was ever started there: a node writes only into the
   * logs of apps it ran.
   */
  async keepLog(node: string, text: string): Promise<void> {
    if (this.logNodes().includes(node)) this.shipped.keep(node, text);
  }

  /** What nodes other than `exceptNode` shipped of the log (every node's when null), cut to `window`. */
  async logHistory(exceptNode: string | null, window: HistoryWindow, names: Record<string, string>): Promise<{ text: string; last: { node: string; time: string } | null }> {
    return this.shipped.history(exceptNode, window, names);
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
    const live = this.live;
    if (live?.processId !== status.id || (from !== undefined && from !== live.node)) return;
    const appId = this.ctx.storage.kv.get<string>("appId");
    if (appId) await this.db.update(apps).set({ processState: status.state }).where(and(eq(apps.id, appId), eq(apps.liveProcessId, status.id)));
    if (status.state === "failed" || status.state === "stopped") await this.replaceLost(`process ${status.id} ${status.state}`);
  }

  override alarm(): Promise<void> {
    return this.inTurn(() => this.tick());
  }

  private async tick(): Promise<void> {
    await this.retryStops();
    await this.settle(false);
    const retryAt = this.ctx.storage.kv.get<number>("retryStartAt");
    const appId = this.ctx.storage.kv.get<string>("appId");
    if (retryAt !== undefined && retryAt <= Date.now() && appId && !this.pending && !this.live) {
      this.ctx.storage.kv.delete("retryStartAt");
      await this.startNow(appId);
    }
    const pending = this.pending;
    if (pending) {
      const node = await nodeRef(this.env, pending.node).catch(() => null);
      const found = node ? await getProcess(this.config, node, pending.processId).catch(() => null) : null;
      if (found?.ok) await this.advance(pending, found.value);
      else if (found && found.status === 404) await this.failPending(pending, "the node lost the new process before it was ready", []);
      else if (Date.now() > pending.deadline) await this.failPending(pending, "the node running the new process could not be reached", []);
    } else if (this.live) {
      const live = this.live;
      const node = await nodeRef(this.env, live.node).catch(() => null);
      const found = node ? await getProcess(this.config, node, live.processId).catch(() => null) : null;
      const lost = found?.ok ? null : await lostNode(this.env, live.node);
      if (!node || lost) await this.replaceLost(`node ${lost?.name ?? live.node} ${lost ? "was lost" : "left the fleet"}`);
      else if (found && !found.ok && found.status === 404) await this.replaceLost(`the node has no process ${live.processId} (it restarted without it)`);
    }
    await this.schedule();
  }

  // -------------------------------------------------------------------------

  private async app(appId: string): Promise<AppRow | null> {
    return (await this.db.select().from(apps).where(eq(apps.id, appId)).get()) ?? null;
  }

  /**
   * Starts a process of the deployment's release, with the app's current
   * configuration (env vars, disk, memory, start settings). An app with a disk
   * and a worker without overlap first stop their live process.
   */
  private async launch(app: AppRow, deployment: DeploymentRow, reason: Pending["reason"]): Promise<void> {
    const config = this.config;
    const disk = await this.db.select().from(disks).where(eq(disks.appId, app.id)).get();
    // A disk being restored (a failover's, a drain's, a user's) is on its new node before its data is: a process
    // started there now would write to an empty disk, and the node then refuses the restore (the chaos run found
    // it). The restore's end starts the app.
    if (disk?.status === "restoring") {
      await this.couldNotStart(app, deployment, reason, undefined, `disk ${disk.name} is being restored; the app starts on its node once it is`);
      return;
    }
    // Stops not yet delivered (a process its node was lost with) go first: one process writes a disk at a time.
    if (disk) await this.retryStops();
    const live = this.live;
    const web = deployment.processType !== "worker";
    const stopFirst = disk !== undefined || (!web && deployment.overlap !== true);
    let previous: string | undefined;
    if (stopFirst && live) {
      previous = live.deploymentId;
      this.ctx.storage.kv.delete("live");
      await this.db.update(apps).set({ liveProcessId: null, liveNode: null, processState: null }).where(eq(apps.id, app.id));
      await this.retire(live, 0);
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
    // over for the next one that might; an app with a disk has only its disk's node.
    const refusedBy = new Set<string>();
    const refusals: string[] = [];
    let started: Awaited<ReturnType<typeof startProcess>> | { ok: false; status: 0; code: string; message: string };
    let node: NodeRef;
    for (;;) {
      try {
        node = await placeProcess(this.env, { disk: disk ?? null }, { memoryMb: app.memoryMb, exclude: refusedBy });
      } catch (err) {
        const why = [...refusals, err instanceof Error ? err.message : String(err)].join("; ");
        await this.couldNotStart(app, deployment, reason, previous, `the new process could not be placed: ${why}`);
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
      await this.couldNotStart(app, deployment, reason, previous, `the node refused the new process: ${started.message}`);
      return;
    }
    const pending: Pending = {
      processId: started.value.id,
      node: node.id,
      deploymentId: deployment.id,
      reason,
      deadline: Date.now() + startTimeout(deployment) * 1000 + START_GRACE_MS,
      ...(previous ? { previous } : {}),
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
      await noteProgress(this.db, deployment.id, `starting process ${pending.processId} of the release on node ${node.id}`);
    }
    // Nothing serves the app (first start, or its disk's process was stopped): this process serves it from now,
    // the node holding requests until it is ready.
    if (!this.live && reason === "start") await this.promote(pending, started.value);
    else await this.advance(pending, started.value);
    await this.schedule();
  }

  /** A launch that could not even start a process: a deploy fails with why; an app that should run tries again soon. */
  private async couldNotStart(app: AppRow, deployment: DeploymentRow, reason: Pending["reason"], previous: string | undefined, why: string): Promise<void> {
    if (reason === "deploy") await this.failDeployment(deployment.id, why, []);
    else console.error(JSON.stringify({ event: "app.unplaced", appId: app.id, why }));
    if (previous && reason === "deploy") await this.restorePrevious(app.id, previous);
    else if (!this.live) await this.retryStartSoon();
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
   * The pending process serves the app from now on; the one it replaces
   * drains and stops. A deploy counts as done once no edge can still hold
   * the old process ({@link SETTLE_MS}), which {@link settle} marks.
   */
  private async promote(pending: Pending, status: ProcessStatus): Promise<void> {
    const appId = this.ctx.storage.kv.get<string>("appId")!;
    const previous = this.live;
    const now = Date.now();
    const app = await this.app(appId);
    // The changes this process was started with are running now.
    const pendingChanges = (app?.pendingChanges ?? []).filter((change) => change.version > pending.configVersion);
    await this.db
      .update(apps)
      .set({
        liveProcessId: pending.processId,
        liveNode: pending.node,
        processState: status.state,
        activeDeploymentId: pending.deploymentId,
        pendingChanges: pendingChanges.length > 0 ? pendingChanges : null,
        updatedAt: now,
      })
      .where(eq(apps.id, appId));
    this.ctx.storage.kv.put("live", { processId: pending.processId, node: pending.node, deploymentId: pending.deploymentId });
    this.ctx.storage.kv.delete("pending");
    if (pending.reason === "deploy") {
      await noteProgress(this.db, pending.deploymentId, status.ready ? `healthy after ${readyTime(status)}; switching traffic to it` : "switching traffic to it");
      this.ctx.storage.kv.put("settling", { deploymentId: pending.deploymentId, at: now + SETTLE_MS } satisfies Settling);
    }
    if (previous && previous.processId !== pending.processId) {
      if (pending.reason === "deploy") await noteProgress(this.db, pending.deploymentId, `the previous release drains for ${DRAIN_SECONDS} s, then stops`);
      await this.retire(previous, DRAIN_SECONDS);
    }
    // The app's cron runs work in the active release.
    await appChanged(this.env, this.db, appId);
    await this.schedule();
  }

  /** A deploy that switched: `ready` once the edges' copies of the old process have expired (or at once, `now`). */
  private async settle(now: boolean): Promise<void> {
    const settling = this.settling;
    if (!settling || (!now && Date.now() < settling.at)) return;
    this.ctx.storage.kv.delete("settling");
    const done = await this.db
      .update(deployments)
      .set({ status: "ready", error: null, finishedAt: Date.now() })
      .where(and(eq(deployments.id, settling.deploymentId), eq(deployments.status, "deploying")))
      .returning({ id: deployments.id });
    if (done.length > 0) await noteProgress(this.db, settling.deploymentId, "serving: every request goes to the new release");
  }

  /** A release that cannot get ready: its deployment fails with why, its process stops, the live one keeps serving (or the previous one runs again). */
  private async failPending(pending: Pending, why: string, lastLines: string[]): Promise<void> {
    this.ctx.storage.kv.delete("pending");
    await this.retire(pending, 0);
    if (pending.reason === "deploy") await this.failDeployment(pending.deploymentId, why, lastLines);
    const appId = this.ctx.storage.kv.get<string>("appId");
    if (appId && pending.previous && pending.reason === "deploy") await this.restorePrevious(appId, pending.previous);
  }

  /** A release stopped to make room for one that failed runs again. */
  private async restorePrevious(appId: string, previous: string): Promise<void> {
    const app = await this.app(appId);
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, previous)).get();
    if (!app || app.status === "stopped" || !deployment?.releaseKey || this.live) return;
    console.warn(JSON.stringify({ event: "app.previous_restarted", appId, deploymentId: previous }));
    await this.launch(app, deployment, "start");
  }

  private async failDeployment(deploymentId: string, error: string, lastLines: string[]): Promise<void> {
    const line = error.split("\n")[0]!.slice(0, 1_000);
    await this.db
      .update(deployments)
      .set({ status: "failed", error: line, logExcerpt: lastLines.length > 0 ? lastLines : null, finishedAt: Date.now() })
      .where(and(eq(deployments.id, deploymentId), eq(deployments.status, "deploying")));
  }

  /** A release still starting is dropped (its deployment says why) before another takes its place. */
  private async abandonPending(why: string): Promise<void> {
    const pending = this.pending;
    if (!pending) return;
    this.ctx.storage.kv.delete("pending");
    await this.retire(pending, 0);
    if (pending.reason === "deploy") {
      await this.db
        .update(deployments)
        .set({ status: "cancelled", error: why, finishedAt: Date.now() })
        .where(and(eq(deployments.id, pending.deploymentId), eq(deployments.status, "deploying")));
    }
  }

  /** The live process is gone (its node restarted without it, or it failed for good): start the release again. */
  private async replaceLost(why: string): Promise<void> {
    const appId = this.ctx.storage.kv.get<string>("appId");
    if (!appId || this.pending) return;
    console.warn(JSON.stringify({ event: "app.process_lost", appId, why }));
    const live = this.live;
    this.ctx.storage.kv.delete("live");
    if (live) {
      // No longer the app's live process anywhere: a lost node that returns is told to stop it (fleet.ts), and so is
      // one that merely answered late, before a process of the app starts on its disk again (the chaos run found the
      // old one running beside the new for ten minutes, both writing the disk).
      await this.db
        .update(apps)
        .set({ liveProcessId: null, liveNode: null, processState: null })
        .where(and(eq(apps.id, appId), eq(apps.liveProcessId, live.processId)));
      await this.retire(live, 0);
    }
    await this.startNow(appId);
  }

  /** Asks the node to stop a process; a stop that could not be delivered is retried by the alarm. */
  private async retire(instance: Instance, drainSeconds: number): Promise<void> {
    const node = await nodeRef(this.env, instance.node).catch(() => null);
    // A node that left the fleet cannot be told. A lost one is told when it returns (its heartbeat's answer names
    // what no app runs there any more: fleet.ts), or by this stop, tried again until it is delivered.
    if (!node) return;
    const stopped = (await lostNode(this.env, instance.node)) ? null : await stopProcess(this.config, node, instance.processId, drainSeconds).catch(() => null);
    if (stopped?.ok) return;
    const stops = this.ctx.storage.kv.get<Instance[]>("stops") ?? [];
    this.ctx.storage.kv.put("stops", [...stops.filter((s) => s.processId !== instance.processId), instance]);
    await this.schedule();
  }

  private async retryStops(): Promise<void> {
    const stops = this.ctx.storage.kv.get<Instance[]>("stops") ?? [];
    if (stops.length === 0) return;
    this.ctx.storage.kv.delete("stops");
    for (const instance of stops) await this.retire(instance, 0);
  }

  /** A start that found no node to run on (or none answering) is tried again. */
  private async retryStartSoon(): Promise<void> {
    this.ctx.storage.kv.put("retryStartAt", Date.now() + START_RETRY_MS);
    await this.schedule();
  }

  /** The next alarm: the earliest of what is due (`at`, a settle, a pending poll, a retry, the live check). */
  private async schedule(at?: number): Promise<void> {
    const now = Date.now();
    const due: number[] = [];
    if (at !== undefined) due.push(at);
    const settling = this.settling;
    if (settling) due.push(settling.at);
    const retryAt = this.ctx.storage.kv.get<number>("retryStartAt");
    if (this.pending || (this.ctx.storage.kv.get<Instance[]>("stops") ?? []).length > 0) due.push(now + PENDING_POLL_MS);
    else if (retryAt !== undefined && !this.live) due.push(Math.max(retryAt, now));
    else if (this.live) due.push(now + LIVE_CHECK_MS);
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
