/**
 * The fleet: how a node joins, rejoins and heartbeats, what it reports of
 * itself and of the disks it holds, and the lease it is granted.
 */
import { z } from "zod";
import { DISK_ID_PATTERN, TENANT_PATTERN, httpUrl } from "./shared.js";
import { encoder, hmacKey, toHex } from "./signing.js";

// The fleet
// ---------
// A new node joins with `POST /v1/nodes/join` on the Worker (`Authorization:
// Bearer <join token>`, a {@link NodeJoin}): the token (minted by the operator,
// good for a number of joins until it expires) only ever admits a new node,
// which gets a new id and its key ({@link NodeJoined}) and keeps both in its
// data directory. After a restart it joins again as itself with
// `POST /internal/nodes/rejoin` (a {@link NodeRejoin}, signed with its key,
// {@link HEADER_NODE} = its id): only that signature, never a token, lets a
// node be a node that joined before or move its address. It then heartbeats
// `POST /internal/nodes/heartbeat` (signed the same way, a {@link NodeHeartbeat})
// every `heartbeatSeconds`; the answer ({@link NodeHeartbeatReply}) names the
// disks it holds whose copy of record is elsewhere: it quarantines them.

/** Node ids are chosen by the control plane; a node signs with `nodeKey(secret, id)`. */
export const NODE_ID_PATTERN = /^node_[A-Za-z0-9]{8,40}$/;

/** A node's signing key: HMAC-SHA256(BUILDER_SECRET, `node\n<id>`) as hex. Only the Worker can derive it. */
export async function nodeKey(secret: string, nodeId: string): Promise<string> {
  return toHex(await crypto.subtle.sign("HMAC", await hmacKey(secret), encoder.encode(`node\n${nodeId}`)));
}

/** What a node measures of itself, at join and in every heartbeat. */
export const NodeCapacity = z.object({
  cores: z.int().min(1).max(4096),
  memoryMb: z.int().min(1),
  /** The data directory's filesystem. */
  diskTotalBytes: z.int().nonnegative(),
  diskFreeBytes: z.int().nonnegative(),
  /** Jobs running or queued, and app processes, on the node now. */
  runningJobs: z.int().nonnegative(),
  processes: z.int().nonnegative(),
  /** Memory the node may still promise to app processes (its host's, less a reserve and every promise on the host). */
  memoryFreeMb: z.int().nonnegative(),
})
  .refine((capacity) => capacity.diskFreeBytes <= capacity.diskTotalBytes, { path: ["diskFreeBytes"], message: "cannot exceed diskTotalBytes" })
  .refine((capacity) => capacity.memoryFreeMb <= capacity.memoryMb, { path: ["memoryFreeMb"], message: "cannot exceed memoryMb" });
export type NodeCapacity = z.infer<typeof NodeCapacity>;

/** A disk copy a node holds, with the generation it was made at. */
export const HeldDisk = z.object({ id: z.string().regex(DISK_ID_PATTERN), generation: z.int().positive() });
export type HeldDisk = z.infer<typeof HeldDisk>;

/** A stale copy a node set aside (never served, written or snapshotted again). */
export const QuarantinedDisk = z.object({
  /** Its folder under the node's `quarantine/`. */
  name: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/),
  diskId: z.string().regex(DISK_ID_PATTERN),
  generation: z.int().positive(),
  quarantinedAt: z.iso.datetime(),
});
export type QuarantinedDisk = z.infer<typeof QuarantinedDisk>;

/** How a node describes itself when it joins or joins again. */
export const NodeRejoin = z.object({
  /** Unique among nodes; the host name by default. */
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, "letters, digits, '.', '_' and '-', at most 63"),
  /** Where the Worker reaches the node. */
  address: httpUrl,
  /** The node's process id on its host (shown to the operator). */
  pid: z.int().positive().optional(),
  capacity: NodeCapacity,
  disks: z.array(HeldDisk).max(100_000),
});
export type NodeRejoin = z.infer<typeof NodeRejoin>;

/**
 * A new node's join. `nodeId` is refused (403): a node that joined before
 * joins again by signing with its own key ({@link NodeRejoin}), never by
 * presenting a token, so a token cannot take over a node.
 */
export const NodeJoin = NodeRejoin.extend({ nodeId: z.string().optional() });
export type NodeJoin = z.infer<typeof NodeJoin>;

/** What the control plane tells a node that joined or joined again. */
export const NodeRejoined = z.object({
  nodeId: z.string().regex(NODE_ID_PATTERN),
  heartbeatSeconds: z.int().positive(),
  /** Apps are served at `<app>.<appsDomain>`: a cookie an app sets for this domain (or a parent of it) is dropped. */
  appsDomain: z.string().min(1),
  /** The node's first lease on its disks (as a heartbeat's answer grants it), counted from the request's sending; absent: no leases. */
  leaseSeconds: z.int().nonnegative().optional(),
});
export type NodeRejoined = z.infer<typeof NodeRejoined>;

/** A new node's id, key and settings. */
export const NodeJoined = NodeRejoined.extend({ key: z.string().regex(/^[0-9a-f]{64}$/) });
export type NodeJoined = z.infer<typeof NodeJoined>;

/** An app process's id as heartbeats report it and their answers name it (ids.ts: `prc_…`). */
const ReportedProcessId = z.string().regex(/^prc_[A-Za-z0-9]{1,64}$/);

export const NodeHeartbeat = z.object({
  capacity: NodeCapacity,
  disks: z.array(HeldDisk).max(100_000),
  quarantined: z.array(QuarantinedDisk).max(100_000),
  /** The app processes it runs (not stopped or failed); absent from nodes that predate it. */
  processes: z
    .array(z.object({ id: ReportedProcessId, appId: z.string().regex(TENANT_PATTERN) }))
    .max(100_000)
    .optional(),
});
export type NodeHeartbeat = z.infer<typeof NodeHeartbeat>;

export const NodeHeartbeatReply = z.object({
  /** Disks whose copy on this node is no longer the copy of record: set them aside now. */
  fence: z.array(z.string().regex(DISK_ID_PATTERN)),
  /**
   * How long the node may hold its disks, counted from when it sent this
   * heartbeat; 0: not at all (it was declared lost). Absent from a control
   * plane without leases: the node holds them without one.
   */
  leaseSeconds: z.number().int().nonnegative().optional(),
  /**
   * Processes to stop now: a node that returns after it was declared lost runs
   * processes whose apps were started elsewhere meanwhile.
   */
  stop: z.array(ReportedProcessId).max(100_000).optional(),
});
export type NodeHeartbeatReply = z.infer<typeof NodeHeartbeatReply>;

/**
 * What a node's apps used since its last report (node/metrics.ts), sent
 * signed to `POST /internal/nodes/metrics` every 10 s: each running process's
 * CPU seconds, memory charged now and restarts, and each disk's use.
 */
export const NodeMetricsReport = z.object({
  processes: z
    .array(
      z.object({
        id: ReportedProcessId,
        appId: z.string().regex(TENANT_PATTERN),
        cpuSeconds: z.number().nonnegative().max(86_400),
        memoryBytes: z.int().nonnegative(),
        memoryLimitBytes: z.int().positive(),
        restarts: z.int().nonnegative().max(1_000_000),
      }),
    )
    .max(10_000),
  disks: z
    .array(
      z.object({
        id: z.string().regex(DISK_ID_PATTERN),
        usedBytes: z.int().nonnegative(),
        usedInodes: z.int().nonnegative(),
        sizeBytes: z.int().positive(),
        inodeLimit: z.int().positive(),
      }),
    )
    .max(10_000),
});
export type NodeMetricsReport = z.infer<typeof NodeMetricsReport>;
