import { DurableObject } from "cloudflare:workers";
import { and, eq } from "drizzle-orm";
import type { ProcessSpec, ProcessStatus } from "../builder/src/protocol";
import { openDb } from "../worker/db/client";
import { type AppRow, apps, type DeploymentRow, deployments, disks } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import { getProcess, type NodeRef, startProcess, stopProcess } from "../worker/lib/builder-client";
import { appChanged } from "../worker/services/cron-targets";
import { GIB } from "../worker/services/disks";
import { envOf } from "../worker/services/env-vars";
import { forgetFleet, lostNode, nodeRef } from "../worker/services/fleet";
import { placeProcess } from "../worker/services/placement";
import { presign } from "../worker/storage/presign";

/** One process the object started: where it runs (the node's id), and what for. */
type Instance = { processId: string; node: string; deploymentId: string };

/** A process starting to replace the live one (or to be the first): promoted once ready. */
type Pending = Instance & {
  /** `deploy`: a new release (fails the deployment if it never gets ready); `start`: the app (re)started. */
  reason: "deploy" | "start";
  /** Past this the release is given up (its health check's own timeout plus the release download). */
  deadline: number;
};

/** A new release that exits this many times before it was ever ready fails its deploy (the old one keeps serving). */
const EXITS_BEFORE_READY = 3;
/** Seconds a web release has from each start to pass its health check. */
export const HEALTH_CHECK_TIMEOUT_SECONDS = 60;
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

/**
 * One object per app that runs (runtimes node, python, custom): the app's
 * desired state and the processes that realise it (DESIGN §9). Deploy, start,
 * stop, restart, restore and a lost process all go through it; it drives the
 * node (placement.ts says which) and records in D1 which process serves the
 * app (`apps.live_process_id`, `live_node`), which the edge forwards to.
 *
 * A new release starts beside the old one and takes the traffic only once its
 * health check passed; the old one then drains and stops. A release that never
 * gets ready fails its deployment with the reason and the last log lines, and
 * the old one keeps serving. An app with a disk is stopped before its new
 * process starts (one writer per disk).
 *
 * Every step is repeatable: callbacks and alarms arrive more than once, and a
 * step that failed half-way is taken again by the next alarm.
 */
export class AppRuntime extends DurableObject<Env> {
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

  /**
   * Makes a deployment's release the app's: started beside the live process
   * and switched to once ready. A stopped app only records it (it runs when
   * the app starts). A release still starting is replaced by this newer one.
   */
  async release(appId: string, deploymentId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, deploymentId)).get();
    if (!app || !deployment?.releaseKey) return;
    await this.abandonPending(`replaced by deployment ${deploymentId}`);
    if (app.status === "stopped") {
      await this.db.batch([
        this.db.update(deployments).set({ status: "ready", finishedAt: Date.now() }).where(eq(deployments.id, deploymentId)),
        this.db.update(apps).set({ activeDeploymentId: deploymentId, updatedAt: Date.now() }).where(eq(apps.id, appId)),
      ]);
      await appChanged(this.env, this.db, appId);
      return;
    }
    await this.launch(app, deployment, "deploy");
  }

  /** The app was started (restart, a restore finished): runs its active release, beside the live process if any. */
  async start(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    const app = await this.app(appId);
    if (!app || app.status === "stopped" || !app.activeDeploymentId) return;
    const deployment = await this.db.select().from(deployments).where(eq(deployments.id, app.activeDeploymentId)).get();
    if (!deployment?.releaseKey) return;
    await this.abandonPending("the app was restarted");
    await this.launch(app, deployment, "start");
  }

  /** The app was stopped (or deleted): its processes stop, and the edge answers 503. */
  async stop(appId: string): Promise<void> {
    this.ctx.storage.kv.put("appId", appId);
    this.ctx.storage.kv.delete("retryStartAt");
    await this.abandonPending("the app was stopped");
    const live = this.live;
    this.ctx.storage.kv.delete("live");
    await this.db.update(apps).set({ liveProcessId: null, liveNode: null }).where(eq(apps.id, appId));
    if (live) await this.retire(live, 0);
  }

  /** The fleet declared `nodeId` lost: what ran there starts again elsewhere (an app whose disk is there waits for its disk). */
  async nodeLost(nodeId: string, why: string): Promise<void> {
    // This isolate's copy of the fleet may still call the node ready: placement must see it lost.
    forgetFleet();
    const pending = this.pending;
    if (pending?.node === nodeId) await this.failPending(pending, why, []);
    if (this.live?.node === nodeId) await this.replaceLost(why);
  }

  /** A process's state changed (the node's callback, or a poll). */
  async processChanged(status: ProcessStatus): Promise<void> {
    const pending = this.pending;
    if (pending?.processId === status.id) await this.advance(pending, status);
    else if (this.live?.processId === status.id && (status.state === "failed" || status.state === "stopped")) {
      await this.replaceLost(`process ${status.id} ${status.state}`);
    }
  }

  override async alarm(): Promise<void> {
    await this.retryStops();
    const retryAt = this.ctx.storage.kv.get<number>("retryStartAt");
    const appId = this.ctx.storage.kv.get<string>("appId");
    if (retryAt !== undefined && retryAt <= Date.now() && appId && !this.pending && !this.live) {
      this.ctx.storage.kv.delete("retryStartAt");
      await this.start(appId);
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

  /** Starts a process of the deployment's release; an app with a disk first stops its live one (one writer per disk). */
  private async launch(app: AppRow, deployment: DeploymentRow, reason: Pending["reason"]): Promise<void> {
    const config = this.config;
    const disk = await this.db.select().from(disks).where(eq(disks.appId, app.id)).get();
    const live = this.live;
    if (disk && live) {
      this.ctx.storage.kv.delete("live");
      await this.db.update(apps).set({ liveProcessId: null, liveNode: null }).where(eq(apps.id, app.id));
      await this.retire(live, 0);
    }
    const sequence = (this.ctx.storage.kv.get<number>("sequence") ?? 0) + 1;
    this.ctx.storage.kv.put("sequence", sequence);
    const release = await presign(config, {
      method: "GET",
      key: deployment.releaseKey!,
      expiresInSeconds: config.PRESIGNED_URL_TTL_SECONDS,
    });
    const web = deployment.processType !== "worker";
    const spec: ProcessSpec = {
      key: `${app.id}/${deployment.id}/${sequence}`,
      tenant: app.accountId,
      appId: app.id,
      release: { url: release.url, sha256: deployment.releaseSha256!, sizeBytes: deployment.releaseBytes! },
      type: web ? "web" : "worker",
      command: deployment.startCommand!,
      port: web ? deployment.port : null,
      healthCheck: web ? { path: deployment.healthCheckPath, timeoutSeconds: HEALTH_CHECK_TIMEOUT_SECONDS } : null,
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
        if (reason === "deploy") await this.failDeployment(deployment.id, `the new process could not be placed: ${why}`, []);
        else {
          console.error(JSON.stringify({ event: "app.unplaced", appId: app.id, why }));
          if (!this.live) await this.retryStartSoon();
        }
        return;
      }
      started = await startProcess(config, node, spec).catch((err: unknown) => ({
        ok: false as const,
        status: 0 as const,
        code: "BUILDER_UNAVAILABLE",
        message: err instanceof Error ? err.message : String(err),
      }));
      if (started.ok || started.status !== 507 || disk) break;
      refusedBy.add(node.id);
      refusals.push(`node ${node.id}: ${started.message}`);
    }
    if (!started.ok) {
      if (reason === "deploy") await this.failDeployment(deployment.id, `the node refused the new process: ${started.message}`, []);
      // The app should run and nothing serves it: try again shortly (placement may choose another node).
      else if (!this.live) await this.retryStartSoon();
      return;
    }
    const pending: Pending = {
      processId: started.value.id,
      node: node.id,
      deploymentId: deployment.id,
      reason,
      deadline: Date.now() + HEALTH_CHECK_TIMEOUT_SECONDS * 1000 + START_GRACE_MS,
    };
    this.ctx.storage.kv.put("pending", pending);
    // Nothing serves the app (first start, or its disk's process was stopped): this process serves it from now,
    // the node holding requests until it is ready.
    if (!this.live && reason === "start") await this.promote(pending);
    else await this.advance(pending, started.value);
    await this.schedule();
  }

  /** Takes a starting process's status: promote it once ready, fail its release when it cannot get there. */
  private async advance(pending: Pending, status: ProcessStatus): Promise<void> {
    if (status.ready && status.state === "running") {
      await this.promote(pending);
      return;
    }
    const hopeless =
      status.state === "crash_loop" ||
      status.state === "failed" ||
      status.state === "stopped" ||
      status.lastExit?.reason === "start_timeout" ||
      status.lastExit?.reason === "health_check" ||
      // A release that exited {@link EXITS_BEFORE_READY} times without ever being ready will not get there: say so now.
      (status.state === "backoff" && status.readyAt === null && status.restarts + 1 >= EXITS_BEFORE_READY);
    if (hopeless) await this.failPending(pending, status.lastExit?.message ?? `the process is ${status.state}`, status.lastLines);
    else if (Date.now() > pending.deadline) await this.failPending(pending, "the new release did not get ready in time", status.lastLines);
  }

  /** The pending process serves the app from now on; the one it replaces drains and stops. */
  private async promote(pending: Pending): Promise<void> {
    const appId = this.ctx.storage.kv.get<string>("appId")!;
    const previous = this.live;
    const now = Date.now();
    const switchApp = this.db
      .update(apps)
      .set({ liveProcessId: pending.processId, liveNode: pending.node, activeDeploymentId: pending.deploymentId, updatedAt: now })
      .where(eq(apps.id, appId));
    const markReady = this.db
      .update(deployments)
      .set({ status: "ready", error: null, finishedAt: now })
      .where(and(eq(deployments.id, pending.deploymentId), eq(deployments.status, "deploying")));
    if (pending.reason === "deploy") await this.db.batch([switchApp, markReady]);
    else await switchApp;
    this.ctx.storage.kv.put("live", { processId: pending.processId, node: pending.node, deploymentId: pending.deploymentId });
    this.ctx.storage.kv.delete("pending");
    if (previous && previous.processId !== pending.processId) await this.retire(previous, DRAIN_SECONDS);
    // The app's cron runs work in the active release.
    await appChanged(this.env, this.db, appId);
  }

  /** A release that cannot get ready: its deployment fails with why, its process stops, the live one keeps serving. */
  private async failPending(pending: Pending, why: string, lastLines: string[]): Promise<void> {
    this.ctx.storage.kv.delete("pending");
    await this.retire(pending, 0);
    if (pending.reason === "deploy") await this.failDeployment(pending.deploymentId, `the new release never became ready: ${why}`, lastLines);
  }

  private async failDeployment(deploymentId: string, error: string, lastLines: string[]): Promise<void> {
    const message = lastLines.length > 0 ? `${error}\nlast log lines:\n${lastLines.join("\n")}` : error;
    await this.db
      .update(deployments)
      .set({ status: "failed", error: message.slice(0, 8_000), finishedAt: Date.now() })
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
    this.ctx.storage.kv.delete("live");
    await this.start(appId);
  }

  /** Asks the node to stop a process; a stop that could not be delivered is retried by the alarm. */
  private async retire(instance: Instance, drainSeconds: number): Promise<void> {
    const node = await nodeRef(this.env, instance.node).catch(() => null);
    // A node that left the fleet or was lost cannot be told; its sandboxes end with its builder (--die-with-parent).
    if (!node || (await lostNode(this.env, instance.node))) return;
    const stopped = await stopProcess(this.config, node, instance.processId, drainSeconds).catch(() => null);
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

  private async schedule(): Promise<void> {
    const now = Date.now();
    const retryAt = this.ctx.storage.kv.get<number>("retryStartAt");
    if (this.pending || (this.ctx.storage.kv.get<Instance[]>("stops") ?? []).length > 0) await this.ctx.storage.setAlarm(now + PENDING_POLL_MS);
    else if (retryAt !== undefined && !this.live) await this.ctx.storage.setAlarm(Math.max(retryAt, now));
    else if (this.live) await this.ctx.storage.setAlarm(now + LIVE_CHECK_MS);
    else await this.ctx.storage.deleteAlarm();
  }
}
