import { DurableObject } from "cloudflare:workers";
import { and, desc, eq, gt, inArray, isNull, ne, sql } from "drizzle-orm";
import type { NodeCapacity, NodeHeartbeat, NodeHeartbeatReply, NodeJoin, NodeRejoin, QuarantinedDisk } from "../builder/src/protocol/node";
import { openDb } from "../worker/db/client";
import { apps, backups, disks, type NodeRow, type NodeState, nodeJoinTokens, nodes, restores } from "../worker/db/schema";
import { type Config, configOf, type Env } from "../worker/env";
import type { ErrorCode } from "../worker/lib/errors";
import { type NodeRef, probe } from "../worker/lib/builder-client";
import { newId } from "../worker/lib/ids";
import { appRuntimeStub, runsProcess, servedFrom } from "../worker/services/app-runtime";
import { setAppStatus } from "../worker/services/apps";
import { startBackup } from "../worker/services/backups";
import { appChanged } from "../worker/services/cron-targets";
import { failoverDelayMs } from "../worker/services/fleet";
import { GIB } from "../worker/services/disks";
import { placeDiskAmong } from "../worker/services/placement";
import { newestReadyBackup, relocateDisk } from "../worker/services/relocation";
import { emitOperator } from "../worker/services/webhooks";

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
  | "memoryFreeMb"
  | "pid"
  | "joinedAt"
  | "lastHeartbeatAt"
  | "lostAt"
  | "unreachableSince"
  | "unreachableReason"
  | "maxCores"
  | "maxMemoryMb"
  | "maxDiskBytes"
> & {
  quarantined: QuarantinedDisk[];
  /** What the node last reported when it claimed more than its caps allow (its row holds the capped figures); null otherwise. */
  claimed: NodeCapacity | null;
};

/** The most a node is believed to have (its row's caps, else the fleet's NODE_MAX_*). */
export type NodeCaps = { cores: number; memoryMb: number; diskBytes: number };

/** A node's caps: its own (from its join token or the operator), else the fleet's defaults. */
export function capsOf(node: Pick<NodeRow, "maxCores" | "maxMemoryMb" | "maxDiskBytes">, config: Config): NodeCaps {
  return {
    cores: node.maxCores ?? config.NODE_MAX_CORES,
    memoryMb: node.maxMemoryMb ?? config.NODE_MAX_MEMORY_MB,
    diskBytes: node.maxDiskBytes ?? config.NODE_MAX_DISK_GB * GIB,
  };
}

/**
 * What placement believes of a node's report: never more than its caps, so a
 * node claiming a petabyte free (a bug, or a node someone took over) is held
 * to what the operator said its host has.
 */
export function believed(reported: NodeCapacity, caps: NodeCaps): NodeCapacity {
  const diskTotalBytes = Math.min(reported.diskTotalBytes, caps.diskBytes);
  return {
    ...reported,
    cores: Math.min(reported.cores, caps.cores),
    memoryMb: Math.min(reported.memoryMb, caps.memoryMb),
    memoryFreeMb: Math.min(reported.memoryFreeMb, caps.memoryMb),
    diskTotalBytes,
    diskFreeBytes: Math.min(reported.diskFreeBytes, diskTotalBytes),
  };
}

const overClaims = (reported: NodeCapacity, held: NodeCapacity) =>
  reported.cores !== held.cores ||
  reported.memoryMb !== held.memoryMb ||
  reported.memoryFreeMb !== held.memoryFreeMb ||
  reported.diskTotalBytes !== held.diskTotalBytes ||
  reported.diskFreeBytes !== held.diskFreeBytes;

/** Refusals cross the RPC boundary as values (an error's class does not survive it). */
export type FleetResult<T> = { ok: true; value: T } | { ok: false; code: ErrorCode; message: string };

const refuse = (code: ErrorCode, message: string) => ({ ok: false as const, code, message });

/** Operator transitions (`svc admin nodes cordon|uncordon|drain`). */
export type NodeCommand = "cordon" | "uncordon" | "drain";

/**
 * A disk on its way off a draining node: its app stopped, a final snapshot,
 * then a restore on another node (the app starts there when it ends).
 */
type Move = {
  diskId: string;
  from: string;
  /** Whether its app ran before the move (it runs again after). */
  appWasRunning: boolean;
  backupId: string | null;
  restoreId: string | null;
  startedAt: number;
};

/** How often a lost node's disks that could not be restored elsewhere are tried again. */
const FAILOVER_RETRY_MS = 30_000;
/** How often the alarm advances moves under way. */
const MOVE_TICK_MS = 1_000;
/** No heartbeat from any node for this long (two intervals and a second) is a silence of the fleet itself, not of its nodes. */
const SILENCE_OF_ALL_MS = (heartbeatSeconds: number) => (2 * heartbeatSeconds + 1) * 1000;
/** How often an unreachable node is probed (its /healthz, within a call's deadline) until it answers. */
const PROBE_EVERY_MS = 2_000;

/**
 * The fleet's one object (DESIGN §10): every change of membership goes
 * through it (join, heartbeat, operator commands, loss), it writes the
 * `nodes` rows in D1 that are listed and placed on, and it holds the
 * heartbeat deadlines as one alarm (the earliest), not a polling loop. Its
 * `view()` reads the `nodes` rows (one statement); the hot paths cache it
 * per isolate for 2 s (worker/services/fleet.ts), so a cron run's placement
 * adds no statement to the run itself.
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
  /** What each node last reported of itself when that was more than its caps (reported again every heartbeat). */
  private claims = new Map<string, NodeCapacity>();

  /**
   * The fleet as D1 holds it: the rows are the truth (this object is their
   * only writer), read for every call; the hot paths cache `view()` per
   * isolate (fleet.ts), so this stays cheap.
   */
  private get nodes(): Promise<Map<string, FleetNode>> {
    return this.db
      .select()
      .from(nodes)
      .then(
        (rows) =>
          new Map(rows.map((row) => [row.id, { ...row, quarantined: this.quarantined.get(row.id) ?? [], claimed: this.claims.get(row.id) ?? null }])),
      );
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

  /**
   * A new node joins with a join token (`tokenHash`: its SHA-256), which
   * admits new nodes only: the node gets a new id, never an existing one (a
   * node that joined before joins again with {@link rejoin}, signed with its
   * own key). Each join spends one of the token's uses.
   */
  async join(tokenHash: string, request: NodeJoin, now = Date.now()): Promise<FleetResult<{ nodeId: string }>> {
    const token = await this.db.select().from(nodeJoinTokens).where(eq(nodeJoinTokens.hash, tokenHash)).get();
    if (!token || token.usesLeft <= 0 || token.expiresAt <= now) {
      return refuse("UNAUTHORIZED", "the join token is unknown, used up or expired; mint one with `svc admin nodes token`");
    }
    if (request.nodeId !== undefined) {
      return refuse(
        "FORBIDDEN",
        `a join token only admits new nodes; a node that joined before (${request.nodeId.slice(0, 64)}) joins again by signing with its own key (POST /internal/nodes/rejoin)`,
      );
    }
    const taken = await this.nameTaken(request.name, null);
    if (taken) return taken;
    const spent = await this.db
      .update(nodeJoinTokens)
      .set({ usesLeft: sql`${nodeJoinTokens.usesLeft} - 1`, lastUsedAt: now })
      .where(and(eq(nodeJoinTokens.id, token.id), gt(nodeJoinTokens.usesLeft, 0), gt(nodeJoinTokens.expiresAt, now)))
      .returning({ id: nodeJoinTokens.id });
    if (spent.length === 0) return refuse("UNAUTHORIZED", "the join token is unknown, used up or expired; mint one with `svc admin nodes token`");
    const id = newId("node");
    const caps = { maxCores: token.maxCores, maxMemoryMb: token.maxMemoryMb, maxDiskBytes: token.maxDiskBytes };
    try {
      await this.db.insert(nodes).values({
        id,
        name: request.name,
        address: request.address,
        state: "ready",
        ...this.hold(id, request.capacity, caps),
        pid: request.pid ?? null,
        joinedAt: now,
        lastHeartbeatAt: now,
        lostAt: null,
        ...caps,
      });
    } catch (err) {
      // Another node took the name meanwhile: the use goes back to the token.
      await this.db.update(nodeJoinTokens).set({ usesLeft: sql`${nodeJoinTokens.usesLeft} + 1` }).where(eq(nodeJoinTokens.id, token.id));
      return (await this.nameTaken(request.name, null)) ?? refuse("INTERNAL", `the node could not be recorded: ${err instanceof Error ? err.message : String(err)}`);
    }
    console.log(JSON.stringify({ event: "node.joined", node: id, name: request.name, address: request.address, token: token.id }));
    this.heard(Date.now());
    await this.claimLegacyDisks(id, request.disks);
    await this.arm();
    return { ok: true, value: { nodeId: id } };
  }

  /**
   * A node that joined before joins again (after a restart, or from a new
   * address): the caller proved it holds the node's key, so it may say where
   * the node is now reached. A lost node that is back takes work again;
   * cordoned and draining stay what the operator made them.
   */
  async rejoin(nodeId: string, request: NodeRejoin, now = Date.now()): Promise<FleetResult<{ nodeId: string }>> {
    const known = (await this.nodes).get(nodeId);
    if (!known) return refuse("NODE_NOT_FOUND", `node ${nodeId} is not a member of the fleet (it was removed); join as a new node with a join token`);
    const taken = await this.nameTaken(request.name, nodeId);
    if (taken) return taken;
    this.heard(Date.now());
    await this.db
      .update(nodes)
      .set({
        name: request.name,
        address: request.address,
        ...this.hold(nodeId, request.capacity, known),
        pid: request.pid ?? null,
        lastHeartbeatAt: now,
        // It proved it is alive and said where it is reached now: calls are tried again (a deadline missed marks it again).
        unreachableSince: null,
        unreachableReason: null,
        ...(known.state === "lost" ? { state: "ready" as const, lostAt: null } : {}),
      })
      .where(eq(nodes.id, nodeId));
    if (known.address !== request.address) {
      console.log(JSON.stringify({ event: "node.address_changed", node: nodeId, from: known.address, to: request.address }));
    }
    if (known.state === "lost") await this.returned(nodeId, now);
    await this.claimLegacyDisks(nodeId, request.disks);
    await this.arm();
    return { ok: true, value: { nodeId } };
  }

  /** NAME_TAKEN when another node than `self` has the name. */
  private async nameTaken(name: string, self: string | null): Promise<{ ok: false; code: ErrorCode; message: string } | null> {
    const [other] = await this.db.select({ id: nodes.id }).from(nodes).where(eq(nodes.name, name)).limit(1);
    if (!other || other.id === self) return null;
    // A name names one node; a node whose host was rebuilt joins again under a new name, or after `remove`.
    return refuse("NAME_TAKEN", `a node named ${name} is already a member (${other.id}); remove it first or choose another name`);
  }

  /** The capacity columns of a report, held to the node's caps; an over-claim is remembered for the operator's view. */
  private hold(nodeId: string, reported: NodeCapacity, caps: Pick<NodeRow, "maxCores" | "maxMemoryMb" | "maxDiskBytes">): NodeCapacity {
    const held = believed(reported, capsOf(caps, this.config));
    if (overClaims(reported, held)) {
      if (!this.claims.has(nodeId)) console.warn(JSON.stringify({ event: "node.over_claim", node: nodeId, reported, held }));
      this.claims.set(nodeId, reported);
    } else {
      this.claims.delete(nodeId);
    }
    const { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes, memoryFreeMb } = held;
    return { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes, memoryFreeMb };
  }

  /** Disks made before nodes joined were on the one builder: the first node holding one claims it. */
  private async claimLegacyDisks(nodeId: string, held: NodeRejoin["disks"]): Promise<void> {
    if (held.length === 0) return;
    await this.db
      .update(disks)
      .set({ nodeId })
      .where(and(inArray(disks.id, held.slice(0, 90).map((disk) => disk.id)), isNull(disks.nodeId)));
  }

  /** The operator changes what a node may claim (null: back to the fleet's default). */
  async setCaps(nodeId: string, caps: Partial<Pick<NodeRow, "maxCores" | "maxMemoryMb" | "maxDiskBytes">>): Promise<FleetResult<FleetNode>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    const next = { maxCores: node.maxCores, maxMemoryMb: node.maxMemoryMb, maxDiskBytes: node.maxDiskBytes, ...caps };
    // The row's figures are held to the new caps now; the next heartbeat's report is held to them too.
    const reported = this.claims.get(nodeId) ?? node;
    await this.db.update(nodes).set({ ...next, ...this.hold(nodeId, reported, next) }).where(eq(nodes.id, nodeId));
    return { ok: true, value: (await this.nodes).get(nodeId)! };
  }

  /**
   * A node's heartbeat: its report is recorded, and the answer names its
   * stale copies and grants its lease (docs/fleet.md, "Leases"): a node
   * that is not lost may hold its disks for NODE_LEASE_SECONDS more. A lost
   * node that heartbeats is back, unless calls to it still go unanswered
   * (a partition in one direction): then it stays lost, gets no lease, and
   * its watchdog stops its disks' writers before any of them is restored
   * elsewhere.
   */
  async heartbeat(nodeId: string, report: NodeHeartbeat, now = Date.now()): Promise<NodeHeartbeatReply | null> {
    const [node] = await this.db
      .select({
        state: nodes.state,
        unreachableSince: nodes.unreachableSince,
        maxCores: nodes.maxCores,
        maxMemoryMb: nodes.maxMemoryMb,
        maxDiskBytes: nodes.maxDiskBytes,
      })
      .from(nodes)
      .where(eq(nodes.id, nodeId));
    if (!node) return null;
    this.heard(now);
    const returned = node.state === "lost" && node.unreachableSince === null;
    this.quarantined.set(nodeId, report.quarantined);
    if (returned) await this.returned(nodeId, now);
    await this.db
      .update(nodes)
      .set({ ...this.hold(nodeId, report.capacity, node), lastHeartbeatAt: now, ...(returned ? { state: "ready" as const, lostAt: null } : {}) })
      .where(eq(nodes.id, nodeId));
    await this.arm();
    const lost = node.state === "lost" && !returned;
    const stop = returned ? await this.strayProcesses(nodeId, report) : [];
    return {
      fence: await this.staleCopies(nodeId, report),
      leaseSeconds: lost ? 0 : this.config.NODE_LEASE_SECONDS,
      ...(stop.length > 0 ? { stop } : {}),
    };
  }

  /**
   * The processes a node back from lost still runs whose apps no longer run
   * there (they were started elsewhere while it was lost): nothing new is
   * placed on a lost node, so any process of it that is not its app's live
   * one is a leftover.
   */
  private async strayProcesses(nodeId: string, report: NodeHeartbeat): Promise<string[]> {
    const running = report.processes ?? [];
    if (running.length === 0) return [];
    const live = await this.db.select({ instances: apps.liveInstances }).from(apps).where(servedFrom(nodeId));
    const kept = new Set(live.flatMap((row) => (row.instances ?? []).filter((i) => i.node === nodeId).map((i) => i.processId)));
    const stray = running.filter((process) => !kept.has(process.id)).map((process) => process.id);
    if (stray.length > 0) console.log(JSON.stringify({ event: "node.stray_processes", node: nodeId, stop: stray }));
    return stray;
  }

  /**
   * A call to the node missed its deadline (builder-client.ts): it takes no
   * new work from now, calls about what it holds answer NODE_UNREACHABLE at
   * once, and it is probed until it answers. Marked once: the first miss
   * says since when.
   */
  async markUnreachable(nodeId: string, reason: string, at = Date.now()): Promise<void> {
    const node = (await this.nodes).get(nodeId);
    if (!node || node.unreachableSince !== null) return;
    await this.db.update(nodes).set({ unreachableSince: at, unreachableReason: reason }).where(eq(nodes.id, nodeId));
    console.log(JSON.stringify({ event: "node.unreachable", node: nodeId, name: node.name, reason }));
    this.ctx.waitUntil(emitOperator(this.env, "node.unreachable", { node: { id: nodeId, name: node.name }, reason, since: new Date(at).toISOString() }));
    await this.arm();
  }

  /** A lost node is back (it joined again or heartbeats): disks still recorded on it were never restored elsewhere. */
  private async returned(nodeId: string, now: number): Promise<void> {
    this.ctx.storage.kv.delete(`failoverNow:${nodeId}`);
    await this.db
      .update(disks)
      .set({ placementNote: `its node was lost and came back at ${new Date(now).toISOString()} before the disk was restored elsewhere: nothing was lost` })
      .where(eq(disks.nodeId, nodeId));
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
    if (command === "drain" && node.state === "draining") {
      await this.planDrain(node);
      await this.arm();
    }
    return { ok: true, value: node };
  }

  /**
   * Declares the node lost now (the operator knows the host is gone), as the
   * deadline would; with `restoreDisksNow`, its disks are restored elsewhere
   * without waiting for the grace period.
   */
  async declareLost(nodeId: string, why: string, restoreDisksNow = false): Promise<FleetResult<FleetNode>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    if (node.state !== "lost") await this.lose(node, why);
    if (restoreDisksNow) {
      this.ctx.storage.kv.put(`failoverNow:${nodeId}`, true);
      // Not before the node's last lease has surely run out: until then, one of its disks' writers may still run there.
      if (this.failoverDue(node, Date.now())) await this.failOver(node, Date.now());
    }
    await this.arm();
    return { ok: true, value: node };
  }

  /** Forgets an empty node: no disk placed on it and no app served from it. */
  async remove(nodeId: string): Promise<FleetResult<null>> {
    const node = (await this.nodes).get(nodeId);
    if (!node) return refuse("NODE_NOT_FOUND", `no node ${nodeId}`);
    const [disk] = await this.db.select({ id: disks.id }).from(disks).where(eq(disks.nodeId, nodeId)).limit(1);
    const [app] = await this.db.select({ id: apps.id }).from(apps).where(servedFrom(nodeId)).limit(1);
    if (disk || app || (node.state !== "lost" && node.runningJobs > 0)) {
      const holds = [disk && `disk ${disk.id}`, app && `app ${app.id}`, node.state !== "lost" && node.runningJobs > 0 && `${node.runningJobs} jobs`];
      return refuse("NODE_NOT_EMPTY", `node ${node.name} is not empty (it holds ${holds.filter(Boolean).join(", ")}); drain it first`);
    }
    await this.db.delete(nodes).where(eq(nodes.id, nodeId));
    this.quarantined.delete(nodeId);
    this.claims.delete(nodeId);
    await this.arm();
    return { ok: true, value: null };
  }

  override async alarm(): Promise<void> {
    const now = Date.now();
    const lostAfter = this.config.NODE_LOST_AFTER_SECONDS * 1000;
    const all = [...(await this.nodes).values()];
    await Promise.all(all.filter((node) => node.unreachableSince !== null).map((node) => this.probe(node)));
    const from = this.listeningFrom(now);
    for (const node of all) {
      if (node.state !== "lost" && now - Math.max(node.lastHeartbeatAt, from) >= lostAfter) {
        await this.lose(node, `no heartbeat for ${Math.round((now - node.lastHeartbeatAt) / 1000)} s`);
      } else if (node.state !== "lost" && node.unreachableSince !== null && now - node.unreachableSince >= lostAfter) {
        await this.lose(node, `no answer to calls for ${Math.round((now - node.unreachableSince) / 1000)} s (${node.unreachableReason})`);
      }
      if (node.state === "lost" && this.failoverDue(node, now)) await this.failOver(node, now);
    }
    for (const move of this.moves()) await this.advance(move).catch((err: unknown) => console.error(`fleet: moving disk ${move.diskId}`, err));
    await this.arm();
  }

  /**
   * From when a node's silence counts: the fleet hears heartbeats only while
   * it runs and can be reached, so a silence of every node at once (the
   * control plane's own restart or outage: the heartbeats had nowhere to go)
   * is not held against them: from the end of such a silence each node has a
   * whole NODE_LOST_AFTER_SECONDS again. One fresh threshold per silence, no
   * more: when every node is really gone, they are declared lost one
   * threshold later than one node alone would be.
   */
  private listeningFrom(now: number): number {
    const kv = this.ctx.storage.kv;
    const heardAt = kv.get<number>("heardAt") ?? now;
    const from = kv.get<number>("listeningFrom") ?? 0;
    if (heardAt <= from || now - heardAt <= SILENCE_OF_ALL_MS(this.config.NODE_HEARTBEAT_SECONDS)) return from;
    kv.put("listeningFrom", now);
    return now;
  }

  /** A node spoke (a heartbeat, a join) at `now`: after a silence of every node, their thresholds start again from here. */
  private heard(now: number): void {
    this.listeningFrom(now);
    this.ctx.storage.kv.put("heardAt", now);
  }

  /** An unreachable node that answers its probe is reachable again (a lost one then returns at its next heartbeat). */
  private async probe(node: FleetNode): Promise<void> {
    if (!(await probe(node))) return;
    await this.db.update(nodes).set({ unreachableSince: null, unreachableReason: null }).where(eq(nodes.id, node.id));
    console.log(JSON.stringify({ event: "node.reachable", node: node.id, name: node.name, after: Date.now() - (node.unreachableSince ?? Date.now()) }));
    node.unreachableSince = null;
    node.unreachableReason = null;
  }

  /**
   * When a lost node's disks may be restored elsewhere: after the grace period
   * (at once on the operator's word), and never before its last lease has
   * surely run out (granted at the latest when it was declared lost), so no
   * writer is left on it by then.
   */
  private failoverAt(node: FleetNode): number | null {
    if (node.lostAt === null) return null;
    return node.lostAt + failoverDelayMs(this.config, Boolean(this.ctx.storage.kv.get(`failoverNow:${node.id}`)));
  }

  private failoverDue(node: FleetNode, now: number): boolean {
    const at = this.failoverAt(node);
    return at !== null && now >= at;
  }

  /**
   * Restores each disk of a lost node from its newest ready backup on a
   * healthy node, saying so on the disk; a disk without a backup stays where
   * it is (it comes back if the node does), and says that too. Never an empty
   * disk in its place.
   */
  private async failOver(node: FleetNode, now: number): Promise<void> {
    const held = await this.db.select().from(disks).where(and(eq(disks.nodeId, node.id), eq(disks.status, "available")));
    const lostAt = new Date(node.lostAt ?? now).toISOString();
    for (const disk of held) {
      const backup = await newestReadyBackup(this.db, disk.id);
      if (!backup) {
        const note = `node ${node.name} was lost at ${lostAt} with this disk, which had no ready backup: its data is only on that node, and comes back if the node does`;
        if (disk.placementNote !== note) await this.db.update(disks).set({ placementNote: note, updatedAt: now }).where(eq(disks.id, disk.id));
        continue;
      }
      let target: NodeRef;
      try {
        target = await placeDiskAmong(this.db, [...(await this.nodes).values()], disk.sizeGb * GIB);
      } catch (err) {
        const note = `node ${node.name} was lost at ${lostAt}; no other node can take this disk yet (${err instanceof Error ? err.message : String(err)}); retrying`;
        if (disk.placementNote !== note) await this.db.update(disks).set({ placementNote: note, updatedAt: now }).where(eq(disks.id, disk.id));
        continue;
      }
      // A snapshot reads a live disk: what was written once it began may or may not be in it.
      const begun = new Date(backup.createdAt).toISOString();
      const targetName = (await this.nodes).get(target.id)?.name ?? target.id;
      const note = `node ${node.name} was lost at ${lostAt}; restored on node ${targetName} from the backup begun at ${begun} (${backup.id}); writes since it began may be lost`;
      const why = await relocateDisk(this.env, this.db, disk, backup, target, note);
      console.log(JSON.stringify({ event: "disk.failover", disk: disk.id, from: node.id, to: target.id, backup: backup.id, refused: why }));
    }
  }

  /** Plans moving every disk off a draining node, and moves its apps without a disk now (start elsewhere, then stop there). */
  private async planDrain(node: FleetNode): Promise<void> {
    const moves = new Map(this.moves().map((move) => [move.diskId, move]));
    const held = await this.db
      .select({ id: disks.id, appStatus: apps.status })
      .from(disks)
      .leftJoin(apps, eq(apps.id, disks.appId))
      .where(eq(disks.nodeId, node.id));
    for (const disk of held) {
      if (moves.has(disk.id)) continue;
      moves.set(disk.id, { diskId: disk.id, from: node.id, appWasRunning: disk.appStatus === "running", backupId: null, restoreId: null, startedAt: Date.now() });
    }
    this.ctx.storage.kv.put("moves", [...moves.values()]);
    const served = await this.db
      .select({ id: apps.id })
      .from(apps)
      .leftJoin(disks, eq(disks.appId, apps.id))
      .where(and(servedFrom(node.id), ne(apps.status, "stopped"), isNull(disks.id)));
    // Each process here is replaced on a ready node; the new one takes the traffic once healthy and the one here drains.
    for (const app of served) await appRuntimeStub(this.env, app.id).moveOff(app.id, node.id);
  }

  private moves(): Move[] {
    return this.ctx.storage.kv.get<Move[]>("moves") ?? [];
  }

  private saveMove(move: Move | null, diskId: string): void {
    const rest = this.moves().filter((m) => m.diskId !== diskId);
    this.ctx.storage.kv.put("moves", move ? [...rest, move] : rest);
  }

  /**
   * One step of a disk's move off a draining node, from where it stands:
   * app stopped and final snapshot started; snapshot ready, restore started
   * on another node; restore ended. Nothing written after the final snapshot
   * is lost, because the app (the only writer) was stopped before it.
   */
  private async advance(move: Move): Promise<void> {
    const disk = await this.db.select().from(disks).where(eq(disks.id, move.diskId)).get();
    if (!disk) return this.saveMove(null, move.diskId);
    const from = (await this.nodes).get(move.from);
    const fromName = from?.name ?? move.from;
    const abandon = async (why: string) => {
      await this.db.update(disks).set({ placementNote: `a drain of node ${fromName} could not move this disk: ${why}` }).where(eq(disks.id, disk.id));
      if (move.appWasRunning && disk.appId) await this.setRunning(disk.appId, true);
      this.saveMove(null, move.diskId);
    };
    if (move.restoreId) {
      const restore = await this.db.select().from(restores).where(eq(restores.id, move.restoreId)).get();
      if (restore?.status === "running") return;
      if (restore?.status === "failed") await this.db.update(disks).set({ placementNote: `${disk.placementNote} — the restore failed: ${restore.error}` }).where(eq(disks.id, disk.id));
      // The restore's end started the app again (on the new node) when it had one.
      if (!move.appWasRunning && disk.appId) await this.setRunning(disk.appId, false);
      return this.saveMove(null, move.diskId);
    }
    if (!move.backupId) {
      if (disk.nodeId !== move.from) return this.saveMove(null, move.diskId);
      if (disk.status !== "available") return; // a restore of the user's own is under way; try again after it
      if (move.appWasRunning && disk.appId) await this.setRunning(disk.appId, false);
      try {
        const backup = await startBackup(this.db, this.env, disk.accountId, disk, `final snapshot before moving off node ${fromName}`, true);
        this.saveMove({ ...move, backupId: backup.id }, move.diskId);
      } catch (err) {
        await abandon(`its final snapshot could not start (${err instanceof Error ? err.message : String(err)})`);
      }
      return;
    }
    const backup = await this.db.select().from(backups).where(eq(backups.id, move.backupId)).get();
    if (!backup || backup.status === "failed") return abandon(`its final snapshot failed${backup?.failureReason ? ` (${backup.failureReason})` : ""}`);
    if (backup.status !== "ready") return;
    let target: NodeRef;
    try {
      target = await placeDiskAmong(this.db, [...(await this.nodes).values()], disk.sizeGb * GIB);
    } catch (err) {
      return abandon(err instanceof Error ? err.message : String(err));
    }
    const targetName = (await this.nodes).get(target.id)?.name ?? target.id;
    const at = new Date(backup.completedAt ?? Date.now()).toISOString();
    const note = `moved from node ${fromName} to node ${targetName} by a drain: its app was stopped and nothing written before the final snapshot of ${at} (${backup.id}) is lost`;
    const why = await relocateDisk(this.env, this.db, disk, backup, target, note);
    if (why) return abandon(why);
    const restore = await this.db.select({ id: restores.id }).from(restores).where(eq(restores.backupId, backup.id)).orderBy(desc(restores.createdAt)).get();
    this.saveMove({ ...move, restoreId: restore?.id ?? null }, move.diskId);
  }

  /** Starts or stops an app as its owner's stop and start do (status, process, cron targets). */
  private async setRunning(appId: string, running: boolean): Promise<void> {
    const app = await this.db.select().from(apps).where(eq(apps.id, appId)).get();
    if (!app || (app.status === "running") === running) return;
    await setAppStatus(this.db, app, running ? "running" : "stopped");
    if (runsProcess(app.runtime)) {
      const runtime = appRuntimeStub(this.env, app.id);
      await (running ? runtime.start(app.id) : runtime.stop(app.id));
    }
    await appChanged(this.env, this.db, app.id);
  }

  private async holdsDisks(nodeId: string): Promise<boolean> {
    const [disk] = await this.db.select({ id: disks.id }).from(disks).where(and(eq(disks.nodeId, nodeId), eq(disks.status, "available"))).limit(1);
    return disk !== undefined;
  }

  private async lose(node: FleetNode, why: string, now = Date.now()): Promise<void> {
    node.state = "lost";
    node.lostAt = now;
    await this.db.update(nodes).set({ state: "lost", lostAt: now }).where(eq(nodes.id, node.id));
    console.log(JSON.stringify({ event: "node.lost", node: node.id, name: node.name, why }));
    this.ctx.waitUntil(emitOperator(this.env, "node.lost", { node: { id: node.id, name: node.name }, reason: why, lostAt: new Date(now).toISOString() }));
    // Apps it served start again on another node; an app whose disk is on the lost node waits for its disk.
    const served = await this.db
      .select({ id: apps.id, diskNode: disks.nodeId })
      .from(apps)
      .leftJoin(disks, eq(disks.appId, apps.id))
      .where(and(servedFrom(node.id), ne(apps.status, "stopped")));
    for (const app of served) {
      await appRuntimeStub(this.env, app.id).nodeLost(node.id, `node ${node.name} was lost (${why})`).catch((err: unknown) => {
        console.error(`fleet: moving app ${app.id} off lost node ${node.id} failed`, err);
      });
    }
  }

  /** One alarm: the earliest heartbeat deadline of a node not yet lost, a lost node's failover, or the next step of a move. */
  private async arm(): Promise<void> {
    const lostAfter = this.config.NODE_LOST_AFTER_SECONDS * 1000;
    const from = this.listeningFrom(Date.now());
    let next = this.moves().length > 0 ? Date.now() + MOVE_TICK_MS : Number.POSITIVE_INFINITY;
    for (const node of (await this.nodes).values()) {
      // An unreachable node is probed until it answers (lost or not: a lost one that heartbeats waits for it).
      if (node.unreachableSince !== null) next = Math.min(next, Date.now() + PROBE_EVERY_MS);
      if (node.state !== "lost") next = Math.min(next, Math.max(node.lastHeartbeatAt, from) + lostAfter, node.unreachableSince === null ? next : node.unreachableSince + lostAfter);
      // Its disks' failover is due at the end of the grace period; until they have left, a lost node
      // keeps the alarm coming (a failover that found no room, or no backup yet, tries again).
      else if (node.lostAt !== null && (await this.holdsDisks(node.id))) {
        const due = this.failoverDue(node, Date.now()) ? Date.now() + FAILOVER_RETRY_MS : (this.failoverAt(node) ?? Date.now());
        next = Math.min(next, due);
      }
    }
    if (!Number.isFinite(next)) {
      await this.ctx.storage.deleteAlarm();
      return;
    }
    // Heartbeats re-arm every few seconds: an earlier alarm already set is kept, or a move's next step
    // (always "a second from now") would be pushed back by each heartbeat and never come.
    const current = await this.ctx.storage.getAlarm();
    if (current !== null && current > Date.now() && current <= next) return;
    await this.ctx.storage.setAlarm(next);
  }
}
