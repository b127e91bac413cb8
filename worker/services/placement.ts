import { and, eq, sql } from "drizzle-orm";
import type { FleetNode } from "../../durable-objects/fleet";
import type { Db } from "../db/client";
import { openDb } from "../db/client";
import { disks, nodes } from "../db/schema";
import { configOf, type Env } from "../env";
import { LONE_BUILDER_ID, type NodeRef, type NodeSickness, refuseSick } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { failoverDelayMs, fleet, nodeRef, notePlaced, refOf, takesWork } from "./fleet";
import { newestReadyBackup } from "./relocation";

/**
 * Where work runs: the one place the control plane decides it (DESIGN §10).
 * Nodes never choose.
 *
 * - A disk is placed at creation on a ready node that can hold it: the most
 *   room left once every disk already placed there is counted full (the disks
 *   are sparse images; the node refuses what its host could not hold), ties
 *   to the node with fewer disks, so disks spread.
 * - Everything touching a disk (its app's runs, backups, restores, the app's
 *   process) goes to the disk's node.
 * - Stateless work (builds, runs and processes of apps without a disk) goes
 *   to the least loaded ready node (an app's instances first to a node
 *   running the fewest of them, so they spread): jobs and processes per core at its last
 *   heartbeat, plus what this isolate placed since. It reads the Fleet
 *   object's view, cached 2 s per isolate (at most one D1 read per isolate
 *   per 2 s, shared by every run placed meanwhile), so a scheduled run costs
 *   no statement of its own more than it did with one builder.
 */

/** Share of a node's disk kept for the node itself (job scratch, logs, releases), as the node keeps by default. */
const NODE_RESERVE_SHARE = 0.1;

/** A ready node for a new disk of `sizeBytes`, or INSUFFICIENT_STORAGE naming the best room there is. */
export async function placeDisk(env: Env, db: Db, sizeBytes: number): Promise<NodeRef> {
  return placeDiskAmong(db, (await fleet(env)).nodes, sizeBytes);
}

/** {@link placeDisk} over a given fleet (the Fleet object places with its own copy). */
export async function placeDiskAmong(db: Db, all: FleetNode[], sizeBytes: number): Promise<NodeRef> {
  const ready = all.filter(takesWork);
  if (ready.length === 0) throw noReadyNode(all);
  // The lone builder of a control plane without joined nodes has no row and reports no capacity: it takes every disk.
  if (ready.length === 1 && ready[0]!.diskTotalBytes === 0) return refOf(ready[0]!);
  const promised = await db
    .select({ nodeId: disks.nodeId, bytes: sql<number>`sum(${disks.sizeGb}) * 1073741824`, count: sql<number>`count(*)` })
    .from(disks)
    .innerJoin(nodes, and(eq(nodes.id, disks.nodeId), eq(nodes.state, "ready")))
    .groupBy(disks.nodeId);
  const byNode = new Map(promised.map((row) => [row.nodeId, row]));
  const room = (node: FleetNode) => node.diskTotalBytes * (1 - NODE_RESERVE_SHARE) - Number(byNode.get(node.id)?.bytes ?? 0);
  const candidates = ready
    .map((node) => ({ node, room: room(node), count: Number(byNode.get(node.id)?.count ?? 0) }))
    .sort((a, b) => b.room - a.room || a.count - b.count);
  const best = candidates[0]!;
  if (best.room < sizeBytes) {
    throw new ApiError(
      "INSUFFICIENT_STORAGE",
      `no node can hold a disk of ${Math.round(sizeBytes / 2 ** 30)} GB: the most room left on a ready node is ${Math.max(0, Math.floor(best.room / 2 ** 30))} GB`,
    );
  }
  return refOf(best.node);
}

/** What a piece of stateless work needs of its node. */
export type StatelessNeed = {
  /** A process's memory limit: nodes that reported less free memory are passed over while another has room. */
  memoryMb?: number;
  /** Nodes already tried (they refused it): never chosen again for this work. */
  exclude?: ReadonlySet<string>;
  /** An app's instances per node: the node with the fewest of them wins before load counts (instances spread). */
  spread?: ReadonlyMap<string, number>;
};

/**
 * The least loaded ready node, for work that touches no disk; for a process,
 * among the nodes that reported room for its memory when any did (else the
 * least loaded: the node itself has the last word, and refuses with 507).
 */
export async function placeStateless(env: Env, need: StatelessNeed = {}): Promise<NodeRef> {
  const view = await fleet(env);
  const ready = view.nodes.filter((node) => takesWork(node) && !need.exclude?.has(node.id));
  if (ready.length === 0) throw need.exclude?.size ? noRoomLeft(view.nodes, need) : noReadyNode(view.nodes);
  const memory = need.memoryMb;
  // The lone builder reports no capacity (memoryFreeMb 0): it is never passed over.
  const roomy = memory === undefined ? ready : ready.filter((node) => node.id === LONE_BUILDER_ID || node.memoryFreeMb >= memory);
  const candidates = roomy.length > 0 ? roomy : ready;
  const load = (node: FleetNode) => (node.runningJobs + node.processes + (view.picks.get(node.id) ?? 0)) / Math.max(1, node.cores);
  const sharing = (node: FleetNode) => need.spread?.get(node.id) ?? 0;
  const better = (a: FleetNode, b: FleetNode) => sharing(a) - sharing(b) || load(a) - load(b) || Math.random() - 0.5;
  let best = candidates[0]!;
  for (const node of candidates) if (better(node, best) < 0) best = node;
  notePlaced(view, best.id);
  return refOf(best);
}

/**
 * Where work about the disk goes: the node holding it (a disk made before
 * nodes joined: the lone builder or any ready node). A disk on a sick node
 * answers 503 NODE_UNREACHABLE at once, saying what happens to it next.
 */
export async function diskNode(env: Env, disk: { id: string; nodeId: string | null }): Promise<NodeRef> {
  if (!disk.nodeId) return placeStateless(env);
  const node = await nodeRef(env, disk.nodeId);
  if (node.sick) throw refuseSick(node, node.sick, await diskFate(env, disk.id, node.sick));
  return node;
}

/**
 * What happens to a disk whose node is sick, in words with times: declared
 * lost after NODE_LOST_AFTER_SECONDS without an answer, then restored
 * elsewhere from its newest ready backup after the grace period (and never
 * before the node's lease ran out), unless the node answers first.
 */
async function diskFate(env: Env, diskId: string, sick: NodeSickness): Promise<string> {
  const config = configOf(env);
  const lostAt = sick.state === "lost" ? sick.since : sick.since + config.NODE_LOST_AFTER_SECONDS * 1000;
  const restoreAt = lostAt + failoverDelayMs(config);
  const backup = await newestReadyBackup(openDb(env.DB), diskId);
  const at = (ms: number) => new Date(ms).toISOString();
  const lost = sick.state === "lost" ? "" : `it is declared lost at ${at(lostAt)} unless it answers; `;
  if (!backup) return `${lost}disk ${diskId} has no ready backup, so it stays on that node until the node returns`;
  return `${lost}disk ${diskId} is restored on another node from the backup begun at ${at(backup.createdAt)} (${backup.id}) at ${at(restoreAt)} unless the node returns`;
}

/** The node an app's process runs on: its disk's node when it has one, else the least loaded with room for it. */
export async function placeProcess(env: Env, app: { disk: { id: string; nodeId: string | null } | null }, need: StatelessNeed = {}): Promise<NodeRef> {
  return app.disk ? diskNode(env, app.disk) : placeStateless(env, need);
}

function noRoomLeft(all: FleetNode[], need: StatelessNeed): ApiError {
  const ready = all.filter(takesWork);
  return new ApiError(
    "INSUFFICIENT_STORAGE",
    `no node can hold it${need.memoryMb === undefined ? "" : ` (a process with a memory limit of ${need.memoryMb} MiB)`}: every ready node (${ready.map((n) => n.name).join(", ")}) refused`,
  );
}

function noReadyNode(all: FleetNode[]): ApiError {
  const states = all.map((node) => `${node.name} ${node.state === "ready" && node.unreachableSince !== null ? "unreachable" : node.state}`).join(", ");
  return new ApiError("BUILDER_UNAVAILABLE", `no builder node is ready to take work${states ? ` (${states})` : " (none has joined)"}`);
}
