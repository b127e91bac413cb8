import { DurableObject } from "cloudflare:workers";
import { and, eq, inArray, isNull, ne } from "drizzle-orm";
import type { NodeHeartbeat, NodeHeartbeatReply, NodeJoin, QuarantinedDisk } from "../builder/src/protocol";
import { openDb } from "../worker/db/client";
import { apps, disks, type NodeRow, type NodeState, nodes } from "../worker/db/schema";
import { configOf, type Env } from "../worker/env";
import type { ErrorCode } from "../worker/lib/errors";
import { newId } from "../worker/lib/ids";

/** What the placement function and the operator read of a node. */
export type FleetNode = Pick<
  NodeRow,
  | "id"
  | "name"
  | "address"
  | "state"
  | "cores"
  | "memoryMb"
  | "diskTotalBytes"
  | "diskFreeBytes"
  | "runningJobs"
  | "processes"
  | "pid"
  | "joinedAt"
  | "lastHeartbeatAt"
  | "lostAt"
> & { quarantined: QuarantinedDisk[] };

/** Refusals cross the RPC boundary as values (an error's class does not survive it). */
export type FleetResult<T> = { ok: true; value: T } | { ok: false; code: ErrorCode; message: string };

const refuse = (code: ErrorCode, message: string) => ({ ok: false as const, code, message });

/** Operator transitions (`svc admin nodes cordon|uncordon|drain`). */
export type NodeCommand = "cordon" | "uncordon" | "drain";

/**
 * The fleet's one object (DESIGN §10): every change of membership goes
 * through it (join, heartbeat, operator commands, loss), it writes the
 * `nodes` rows in D1 that are listed and placed on, and it holds the
 * heartbeat deadlines as one alarm (the earliest), not a polling loop. It
 * keeps the fleet in memory, so the hot paths read it without D1: a cron
 * run's placement costs no statement (worker/services/fleet.ts caches this
 * object's `view()` per isolate).
 *
 * A node silent past NODE_LOST_AFTER_SECONDS is `lost`: its apps without a
 * disk start again elsewhere at once (their AppRuntime objects are told), and
 * the jobs it held learn it when they next ask (fleet.ts `nodeLost`). A lost
 * node that heartbeats again is `ready`; disks whose record moved meanwhile
 * are fenced (the heartbeat's answer names them and the node sets them aside).
 */
export class Fleet extends DurableObject<Env> {
  /** What each node last reported having set aside (not worth a D1 column: it is reported again every heartbeat). */
  private quarantined = new Map<string, QuarantinedDisk[]>();

  /**
   * The fleet as D1 holds it: the rows are the truth (this object is their
   * only writer, and its calls run one at a time), read for every call; the
   * hot paths cache `view()` per isolate (fleet.ts), so this stays cheap.
   */
  private get nodes(): Promise<Map<string, FleetNode>> {
    return this.db
      .select()
      .from(nodes)
      .then((rows) => new Map(rows.map((row) => [row.id, { ...row, quarantined: this.quarantined.get(row.id) ?? [] }])));
  }

  private get db() {
    return openDb(this.env.DB);
  }

  private get config() {
    return configOf(this.env);
  }

  /** Every node, as the fleet knows it now. */
  async view(): Promise<FleetNode[]> {
    return [...(await this.nodes).values()];
  }

  /** A node joins (or joins again after a restart, with the id it was given). */
  async join(request: NodeJoin, now = Date.now()): Promise<FleetResult<{ nodeId: string }>> {
    const fleet = await this.nodes;
    const sameName = [...fleet.values()].find((node) => node.name === request.name);
    const known = request.nodeId ? fleet.get(request.nodeId) : undefined;
    if (sameName && sameName.id !== known?.id) {
      // A name names one node; a node whose host was rebuilt joins again under a new name, or after `remove`.
      return refuse("NAME_TAKEN", `a node named ${request.name} is already a member (${sameName.id}); remove it first or choose another name`);
    }
    const id = known?.id ?? newId("node");
    const node: FleetNode = {
      id,
      name: request.name,
      address: request.address,
      // A lost node that is back takes work again; cordoned and draining stay what the operator made them.
      state: known && known.state !== "lost" ? known.state : "ready",
      ...request.capacity,
      pid: request.pid ?? null,
      joinedAt: known?.joinedAt ?? now,
      lastHeartbeatAt: now,
      lostAt: null,
      quarantined: known?.quarantined ?? [],
    };
    const { quarantined: _, ...row } = node;
    await this.db.insert(nodes).values(row).onConflictDoUpdate({ target: nodes.id, set: row });
    // Disks made before nodes joined were on the one builder: the first node holding one claims it.
    const held = request.disks.map((disk) => disk.id);
    if (held.length > 0) {
      await this.db
        .update(disks)
        .set({ nodeId: id })
        .where(and(inArray(disks.id, held.slice(0, 90)), isNull(disks.nodeId)));
    }
    await this.arm();
    return { ok: true, value: { nodeId: id } };
  }

  /** A heartbeat: capacity and load recorded, the deadline moved; the answer names copies to fence. */
  async heartbeat(nodeId: string, report: NodeHeartbeat, now = Date.now()): Promise<NodeHeartbeatReply | null> {
    const [node] = await this.db.select({ state: nodes.state }).from(nodes).where(eq(nodes.id, nodeId));
    if (!node) return null;
    const wasLost = node.state === "lost";
    this.quarantined.set(nodeId, report.quarantined);
    await this.db
      .update(nodes)
      .set({ ...report.capacity, lastHeartbeatAt: now, ...(wasLost ? { state: "ready" as const, lostAt: null } : {}) })
      .where(eq(nodes.id, nodeId));
    await this.arm();
    return { fence: await this.staleCopies(nodeId, report) };
  }

  /** Disks the node holds whose record is gone, on another node or at a newer generation. */
  private async staleCopies(nodeId: string, report: NodeHeartbeat): Promise<string[]> {
    const fence: string[] = [];
    for (let i = 0; i < report.disks.length; i += 90) {
      const batch = report.disks.slice(i, i + 90);
      const records = await this.db
        .select({ id: disks.id, nodeId: disks.nodeId, generation: disks.generation })
        .from(disks)
        .where(inArray(
          disks.id,
          batch.map((disk) => disk.id),
        ));
      const byId = new Map(records.map((record) => [record.id, record]));
      for (const held of batch) {
        const record = byId.get(held.id);
        // Deleted while the node was away, moved to another node, or restored at a newer generation: set aside, never deleted silently.
        if (!record || (record.nodeId !== null && record.nodeId !== nodeId) || record.generation > held.generation) fence.push(held.id);
      }
    }
    return fence;
  }

  /** cordon: no new work; uncordon: ready again; drain: no new work, and what it holds is to move (see README: disks move by snapshot). */
  async command(nodeId: string, command: NodeCommand): Promise<FleetResult<FleetNode>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    if (node.state === "lost" && command !== "drain") return refuse("NODE_LOST", `node ${node.name} is lost; it becomes ready again when it heartbeats`);
    const state: NodeState = command === "uncordon" ? "ready" : command === "cordon" ? "cordoned" : "draining";
    node.state = node.state === "lost" ? "lost" : state;
    await this.db.update(nodes).set({ state: node.state }).where(eq(nodes.id, nodeId));
    return { ok: true, value: node };
  }

  /** Declares the node lost now (the operator knows the host is gone), as the deadline would. */
  async declareLost(nodeId: string, why: string): Promise<FleetResult<FleetNode>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    if (node.state !== "lost") await this.lose(node, why);
    return { ok: true, value: node };
  }

  /** Forgets an empty node: no disk placed on it and no app served from it. */
  async remove(nodeId: string): Promise<FleetResult<null>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    const [disk] = await this.db.select({ id: disks.id }).from(disks).where(eq(disks.nodeId, nodeId)).limit(1);
    const [app] = await this.db.select({ id: apps.id }).from(apps).where(eq(apps.liveNode, nodeId)).limit(1);
    if (disk || app || (node.state !== "lost" && node.runningJobs > 0)) {
      const holds = [disk && `disk ${disk.id}`, app && `app ${app.id}`, node.state !== "lost" && node.runningJobs > 0 && `${node.runningJobs} jobs`];
      return refuse("NODE_NOT_EMPTY", `node ${node.name} is not empty (it holds ${holds.filter(Boolean).join(", ")}); drain it first`);
    }
    await this.db.delete(nodes).where(eq(nodes.id, nodeId));
    this.quarantined.delete(nodeId);
    await this.arm();
    return { ok: true, value: null };
  }

  override async alarm(): Promise<void> {
    const now = Date.now();
    const lostAfter = this.config.NODE_LOST_AFTER_SECONDS * 1000;
    for (const node of (await this.nodes).values()) {
      if (node.state !== "lost" && now - node.lastHeartbeatAt >= lostAfter) {
        await this.lose(node, `no heartbeat for ${Math.round((now - node.lastHeartbeatAt) / 1000)} s`);
      }
    }
    await this.arm();
  }

  private async lose(node: FleetNode, why: string, now = Date.now()): Promise<void> {
    node.state = "lost";
    node.lostAt = now;
    await this.db.update(nodes).set({ state: "lost", lostAt: now }).where(eq(nodes.id, node.id));
    console.log(JSON.stringify({ event: "node.lost", node: node.id, name: node.name, why }));
    // Apps it served start again on another node; an app whose disk is on the lost node waits for its disk.
    const served = await this.db
      .select({ id: apps.id, diskNode: disks.nodeId })
      .from(apps)
      .leftJoin(disks, eq(disks.appId, apps.id))
      .where(and(eq(apps.liveNode, node.id), ne(apps.status, "stopped")));
    for (const app of served) {
      const runtime = this.env.APP_RUNTIME.get(this.env.APP_RUNTIME.idFromName(app.id));
      await runtime.nodeLost(node.id, `node ${node.name} was lost (${why})`).catch((err: unknown) => {
        console.error(`fleet: moving app ${app.id} off lost node ${node.id} failed`, err);
      });
    }
  }

  /** One alarm: the earliest heartbeat deadline of a node not yet lost. */
  private async arm(): Promise<void> {
    const lostAfter = this.config.NODE_LOST_AFTER_SECONDS * 1000;
    let next = Number.POSITIVE_INFINITY;
    for (const node of (await this.nodes).values()) if (node.state !== "lost") next = Math.min(next, node.lastHeartbeatAt + lostAfter);
    if (Number.isFinite(next)) await this.ctx.storage.setAlarm(next);
    else await this.ctx.storage.deleteAlarm();
  }
}
