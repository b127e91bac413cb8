/**
 * A node's membership of the fleet (DESIGN §10): a new node joins the control
 * plane with a join token the operator minted, keeps the id and key it was
 * given in its data directory, and from then on joins again as itself by
 * signing with that key (after a restart, or from a new address): the token
 * is never needed again, and never lets anyone be this node. It heartbeats
 * its capacity, its disks and its quarantined copies; the control plane's
 * answer names disks whose copy of record is elsewhere now, and they are set
 * aside at once. The node never decides where work goes: it reports, and
 * does what it is sent.
 */
import { readFile, rename, statfs, writeFile } from "node:fs/promises";
import { availableParallelism, hostname, totalmem } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { JoinConfig } from "../config.js";
import type { DiskStore } from "../disks/store.js";
import { type DiskLease, uptime } from "./lease.js";
import { type NodeCapacity, NodeHeartbeatReply, NodeJoined, type NodeRejoin, NodeRejoined } from "../protocol/node.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { signRequest } from "../protocol/signing.js";

/** What the node reports as its load; read at every heartbeat. */
export interface NodeLoad {
  jobs(): number;
  processes(): number;
  /** Memory (MiB) the node may still promise to app processes. */
  memoryFreeMb(): number;
}

/** The node's app processes, as heartbeats report them and their answers stop them. */
export interface NodeProcesses {
  running(): { id: string; appId: string }[];
  stop(id: string, drainSeconds: number): unknown;
}

type SavedIdentity = { nodeId: string; key: string };

/** What joining gave the node: with its first lease on its disks (seconds, from `leaseSentAt` on the boot clock). */
export type Membership = {
  credentials: NodeCredentials;
  heartbeatMs: number;
  name: string;
  appsDomain: string;
  leaseSeconds: number | undefined;
  leaseSentAt: number;
};

/** A refusal that waiting will not change (a spent token, a taken name): the node stops and says why. */
class Refused extends Error {}

/**
 * Joins (or joins again as itself), with retries: a node started before its
 * control plane waits for it rather than exiting. A node whose saved identity
 * the control plane no longer knows (it was removed) joins as a new node when
 * it has a token, and stops otherwise.
 */
export async function joinFleet(options: {
  join: JoinConfig;
  dataDir: string;
  /** Where this node listens (the advertised address when none is configured). */
  listening: string;
  disks: DiskStore;
  load: NodeLoad;
  signal: AbortSignal;
}): Promise<Membership> {
  const { join: config, dataDir, disks } = options;
  const identityFile = join(dataDir, "node.json");
  const saved = await readFile(identityFile, "utf8").then(
    (text) => JSON.parse(text) as SavedIdentity,
    () => null,
  );
  const name = config.name ?? `${hostname().replace(/[^A-Za-z0-9_.-]/g, "-").slice(0, 50)}-${new URL(options.listening).port}`;
  const body: NodeRejoin = {
    name,
    address: config.advertiseUrl ?? options.listening,
    pid: process.pid,
    capacity: await measureCapacity(dataDir, options.load),
    disks: await disks.held(),
  };
  let sentAt = uptime();
  if (saved) {
    const again = await retrying(options.signal, config.controlUrl, async () => {
      sentAt = uptime();
      const text = JSON.stringify(body);
      const path = "/internal/nodes/rejoin";
      const headers = await signRequest({ secret: saved.key, node: saved.nodeId, method: "POST", path, body: text });
      const response = await post(config.controlUrl, path, { ...headers, "Content-Type": "application/json" }, text, options.signal);
      // Unknown to the control plane (removed, or its key no longer signs): not this node any more.
      if (response.status === 401 || response.status === 404) return null;
      return NodeRejoined.parse(await accepted(response));
    });
    if (again) {
      const lease = { leaseSeconds: again.leaseSeconds, leaseSentAt: sentAt };
      return { credentials: { node: saved.nodeId, key: saved.key }, heartbeatMs: again.heartbeatSeconds * 1000, name, appsDomain: again.appsDomain, ...lease };
    }
    if (!config.token) throw new Error(`the control plane no longer knows node ${saved.nodeId}; start it with a new BUILDER_JOIN_TOKEN (svc admin nodes token) to join as a new node`);
    console.error(`builder: the control plane no longer knows node ${saved.nodeId}; joining as a new node with the join token`);
  } else if (!config.token) {
    throw new Error(`this node has not joined yet (no ${identityFile}): start it with BUILDER_JOIN_TOKEN (svc admin nodes token)`);
  }
  const token = config.token!;
  const joined = await retrying(options.signal, config.controlUrl, async () => {
    sentAt = uptime();
    const response = await post(config.controlUrl, "/v1/nodes/join", { Authorization: `Bearer ${token}`, "Content-Type": "application/json" }, JSON.stringify(body), options.signal);
    return NodeJoined.parse(await accepted(response));
  });
  const identity: SavedIdentity = { nodeId: joined.nodeId, key: joined.key };
  await writeFile(`${identityFile}.tmp`, JSON.stringify(identity), { mode: 0o600 });
  await rename(`${identityFile}.tmp`, identityFile);
  const lease = { leaseSeconds: joined.leaseSeconds, leaseSentAt: sentAt };
  return { credentials: { node: joined.nodeId, key: joined.key }, heartbeatMs: joined.heartbeatSeconds * 1000, name, appsDomain: joined.appsDomain, ...lease };
}

function post(controlUrl: string, path: string, headers: Record<string, string>, body: string, signal: AbortSignal): Promise<Response> {
  return fetch(new URL(path, controlUrl), { method: "POST", headers, body, signal: AbortSignal.any([signal, AbortSignal.timeout(10_000)]) });
}

/** The answer's JSON; a 4xx is a {@link Refused} (waiting will not change it), a 5xx an error to retry. */
async function accepted(response: Response): Promise<unknown> {
  const text = await response.text();
  if (response.ok) return JSON.parse(text);
  const problem = `HTTP ${response.status}: ${text.slice(0, 300)}`;
  throw response.status < 500 ? new Refused(problem) : new Error(problem);
}

/** Tries `attempt` until it answers, backing off on network errors and 5xx; a refusal stops the node. */
async function retrying<T>(signal: AbortSignal, controlUrl: string, attempt: () => Promise<T>): Promise<T> {
  let delay = 500;
  for (;;) {
    signal.throwIfAborted();
    try {
      return await attempt();
    } catch (error) {
      if (error instanceof Refused) throw new Error(`the control plane refused this node: ${error.message}`);
      if (signal.aborted) throw error;
      console.error(`builder: could not join ${controlUrl} yet (${error instanceof Error ? error.message : String(error)}); retrying`);
    }
    await sleep(delay, undefined, { signal });
    delay = Math.min(delay * 2, 10_000);
  }
}

/** A control plane that grants no lease (it predates leases): the node holds its disks as before. */
export const UNLEASED_SECONDS = 10 * 365 * 24 * 3600;

/**
 * Heartbeats until `signal` aborts; quarantines what the answers name, then
 * takes the lease they grant (counted from the heartbeat's sending).
 */
export async function heartbeat(options: {
  controlUrl: string;
  credentials: NodeCredentials;
  intervalMs: number;
  dataDir: string;
  disks: DiskStore;
  lease: DiskLease;
  load: NodeLoad;
  processes: NodeProcesses;
  signal: AbortSignal;
}): Promise<void> {
  const url = new URL("/internal/nodes/heartbeat", options.controlUrl);
  let failing = false;
  while (!options.signal.aborted) {
    try {
      const body = JSON.stringify({
        capacity: await measureCapacity(options.dataDir, options.load),
        disks: await options.disks.held(),
        quarantined: await options.disks.quarantined(),
        processes: options.processes.running(),
      });
      const headers = await signRequest({ secret: options.credentials.key, node: options.credentials.node, method: "POST", path: url.pathname, body });
      const sentAt = uptime();
      const response = await fetch(url, {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: AbortSignal.any([options.signal, AbortSignal.timeout(10_000)]),
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 200)}`);
      const reply = NodeHeartbeatReply.parse(await response.json());
      for (const id of reply.fence) await options.disks.fence(id);
      await options.lease.grant(sentAt, reply.leaseSeconds ?? UNLEASED_SECONDS);
      for (const id of reply.stop ?? []) {
        console.error(`builder: stopping process ${id}: its app runs on another node now`);
        options.processes.stop(id, 0);
      }
      if (failing) console.error("builder: heartbeats reach the control plane again");
      failing = false;
    } catch (error) {
      if (options.signal.aborted) return;
      if (!failing) console.error(`builder: heartbeat failed (${error instanceof Error ? error.message : String(error)}); retrying`);
      failing = true;
    }
    await sleep(options.intervalMs, undefined, { signal: options.signal }).catch(() => undefined);
  }
}

async function measureCapacity(dataDir: string, load: NodeLoad): Promise<NodeCapacity> {
  const fs = await statfs(dataDir);
  return {
    cores: availableParallelism(),
    memoryMb: Math.floor(totalmem() / 1024 / 1024),
    diskTotalBytes: fs.blocks * fs.bsize,
    diskFreeBytes: fs.bavail * fs.bsize,
    runningJobs: load.jobs(),
    processes: load.processes(),
    memoryFreeMb: Math.min(load.memoryFreeMb(), Math.floor(totalmem() / 1024 / 1024)),
  };
}
