import type { FleetNode } from "../../durable-objects/fleet";
import type { Config, Env } from "../env";
import { LONE_BUILDER_ID, type NodeRef, type NodeSickness, onNodeUnreachable } from "../lib/builder-client";
import { ApiError } from "../lib/errors";

/** How long an isolate trusts its copy of the fleet (the Fleet object's `view()`). */
const VIEW_TTL_MS = 2_000;

type View = { at: number; nodes: FleetNode[]; picks: Map<string, number> };
let cached: View | null = null;

/** The fleet's one object. */
export function fleetStub(env: Env) {
  return env.FLEET.get(env.FLEET.idFromName("fleet"));
}

/**
 * The nodes as the Fleet object knew them at most 2 s ago (one RPC, and the
 * object's one D1 read, per isolate per 2 s), with the work this isolate placed since
 * counted as load. While no node has joined, the lone builder at BUILDER_URL
 * (if configured) is the whole fleet.
 */
export async function fleet(env: Env, now = Date.now()): Promise<View> {
  listenForMisses(env);
  if (!cached || now - cached.at > VIEW_TTL_MS) {
    const nodes = await fleetStub(env).view();
    cached = { at: now, nodes: nodes.length > 0 || !env.BUILDER_URL ? nodes : [loneBuilder(env.BUILDER_URL, now)], picks: new Map() };
  }
  return cached;
}

let listening = false;

/**
 * A node that misses a call's deadline in this isolate is marked
 * unreachable in the Fleet object at once (one RPC), and in this isolate's
 * copy, so the calls after it here answer NODE_UNREACHABLE without waiting.
 * Registered the first time the isolate reads the fleet: every NodeRef comes
 * from here (nodeRef, placement).
 */
function listenForMisses(env: Env): void {
  if (listening) return;
  listening = true;
  onNodeUnreachable(async (node, reason, at) => {
    const held = cached?.nodes.find((candidate) => candidate.id === node.id);
    if (held && held.unreachableSince === null) Object.assign(held, { unreachableSince: at, unreachableReason: reason });
    if (node.id !== LONE_BUILDER_ID) await fleetStub(env).markUnreachable(node.id, reason, at);
  });
}

/** Why calls to `node` are not made now (lost, or unreachable since a missed deadline); null while it answers. */
export function sicknessOf(node: Pick<FleetNode, "state" | "lostAt" | "unreachableSince" | "unreachableReason">): NodeSickness | null {
  if (node.state === "lost") return { state: "lost", since: node.lostAt ?? Date.now(), reason: node.unreachableReason ?? "no heartbeat" };
  if (node.unreachableSince !== null) return { state: "unreachable", since: node.unreachableSince, reason: node.unreachableReason ?? "missed a deadline" };
  return null;
}

/** What calls to `node` need: where it is, and whether it is sick. */
export function refOf(node: FleetNode): NodeRef {
  return { id: node.id, address: node.address, name: node.name, sick: sicknessOf(node) };
}

/** Whether new work may go to `node`: ready, and answering. */
export function takesWork(node: Pick<FleetNode, "state" | "unreachableSince">): boolean {
  return node.state === "ready" && node.unreachableSince === null;
}

/**
 * How long a lost node's disks wait before they are restored elsewhere, from
 * when it was declared lost: the grace period (none on the operator's word,
 * `skipGrace`), and never less than its lease plus {@link LEASE_MARGIN_MS}:
 * the lease it was last granted has surely run out by then, so no writer is
 * left on it (docs/fleet.md, "Leases").
 */
export function failoverDelayMs(config: Config, skipGrace = false): number {
  const leaseOut = config.NODE_LEASE_SECONDS * 1000 + LEASE_MARGIN_MS;
  return skipGrace ? leaseOut : Math.max(leaseOut, config.DISK_FAILOVER_GRACE_SECONDS * 1000);
}

/** The lease watchdog's reaction: it checks every second, then kills the disk's writers and unmounts it. */
const LEASE_MARGIN_MS = 5_000;

/** Forgets this isolate's copy (after a membership change it made itself). */
export function forgetFleet(): void {
  cached = null;
}

function loneBuilder(address: string, now: number): FleetNode {
  return {
    id: LONE_BUILDER_ID,
    name: LONE_BUILDER_ID,
    address,
    state: "ready",
    cores: 1,
    memoryMb: 0,
    diskTotalBytes: 0,
    diskFreeBytes: 0,
    runningJobs: 0,
    processes: 0,
    memoryFreeMb: 0,
    pid: null,
    joinedAt: now,
    lastHeartbeatAt: now,
    lostAt: null,
    unreachableSince: null,
    unreachableReason: null,
    maxCores: null,
    maxMemoryMb: null,
    maxDiskBytes: null,
    quarantined: [],
    claimed: null,
  };
}

/** Where node `id` is reached, and whether it is sick; NODE_NOT_FOUND once it was removed. */
export async function nodeRef(env: Env, id: string): Promise<NodeRef> {
  const node = (await fleet(env)).nodes.find((candidate) => candidate.id === id);
  if (!node) throw new ApiError("NODE_NOT_FOUND", `node ${id} is no longer a member of the fleet`);
  return refOf(node);
}

/** The node, when it is lost (its work elsewhere must not wait for it); null otherwise. */
export async function lostNode(env: Env, id: string): Promise<FleetNode | null> {
  const node = (await fleet(env)).nodes.find((candidate) => candidate.id === id);
  return node?.state === "lost" ? node : null;
}

/** Counts one unit of work placed on `id` by this isolate until the next heartbeat reports it. */
export function notePlaced(view: View, id: string): void {
  view.picks.set(id, (view.picks.get(id) ?? 0) + 1);
}
