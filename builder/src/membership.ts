/**
 * A node's membership of the fleet (DESIGN §10): it joins the control plane
 * with the operator's token, keeps the id and key it was given in its data
 * directory (joining again with that id after a restart, so its disks stay
 * its own), and heartbeats its capacity, its disks and its quarantined
 * copies. The control plane's answer names disks whose copy of record is
 * elsewhere now; they are set aside at once. The node never decides where
 * work goes: it reports, and does what it is sent.
 */
import { readFile, rename, statfs, writeFile } from "node:fs/promises";
import { availableParallelism, hostname, totalmem } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { JoinConfig } from "./config.js";
import type { DiskStore } from "./disks.js";
import {
  type NodeCapacity,
  type NodeCredentials,
  NodeHeartbeatReply,
  type NodeJoin,
  NodeJoined,
  signRequest,
} from "./protocol.js";

/** What the node reports as its load; read at every heartbeat. */
export interface NodeLoad {
  jobs(): number;
  processes(): number;
}

type SavedIdentity = { nodeId: string; key: string };

/** Joins with retries: a node started before its control plane waits for it rather than exiting. */
export async function joinFleet(options: {
  join: JoinConfig;
  dataDir: string;
  /** Where this node listens (the advertised address when none is configured). */
  listening: string;
  disks: DiskStore;
  signal: AbortSignal;
}): Promise<{ credentials: NodeCredentials; heartbeatMs: number; name: string }> {
  const { join: config, dataDir, disks } = options;
  const identityFile = join(dataDir, "node.json");
  const saved = await readFile(identityFile, "utf8").then(
    (text) => JSON.parse(text) as SavedIdentity,
    () => null,
  );
  const name = config.name ?? `${hostname().replace(/[^A-Za-z0-9_.-]/g, "-").slice(0, 50)}-${new URL(options.listening).port}`;
  const body: NodeJoin = {
    ...(saved ? { nodeId: saved.nodeId } : {}),
    name,
    address: config.advertiseUrl ?? options.listening,
    pid: process.pid,
    capacity: await measureCapacity(dataDir, { jobs: () => 0, processes: () => 0 }),
    disks: await disks.held(),
  };
  let delay = 500;
  for (;;) {
    options.signal.throwIfAborted();
    const problem = await fetch(new URL("/v1/nodes/join", config.controlUrl), {
      method: "POST",
      headers: { Authorization: `Bearer ${config.token}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.any([options.signal, AbortSignal.timeout(10_000)]),
    }).then(
      async (response) => {
        const text = await response.text();
        if (!response.ok) return `HTTP ${response.status}: ${text.slice(0, 300)}`;
        return NodeJoined.parse(JSON.parse(text));
      },
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    if (typeof problem !== "string") {
      const identity: SavedIdentity = { nodeId: problem.nodeId, key: problem.key };
      await writeFile(`${identityFile}.tmp`, JSON.stringify(identity), { mode: 0o600 });
      await rename(`${identityFile}.tmp`, identityFile);
      return { credentials: { node: problem.nodeId, key: problem.key }, heartbeatMs: problem.heartbeatSeconds * 1000, name };
    }
    // A wrong token or a refused name will not get better by waiting: say so and stop.
    if (/^HTTP 4\d\d/.test(problem)) throw new Error(`the control plane refused this node: ${problem}`);
    console.error(`builder: could not join ${config.controlUrl} yet (${problem}); retrying`);
    await sleep(delay, undefined, { signal: options.signal });
    delay = Math.min(delay * 2, 10_000);
  }
}

/** Heartbeats until `signal` aborts; quarantines what the answers name. */
export async function heartbeat(options: {
  controlUrl: string;
  credentials: NodeCredentials;
  intervalMs: number;
  dataDir: string;
  disks: DiskStore;
  load: NodeLoad;
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
      });
      const headers = await signRequest({ secret: options.credentials.key, node: options.credentials.node, method: "POST", path: url.pathname, body });
      const response = await fetch(url, {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: AbortSignal.any([options.signal, AbortSignal.timeout(10_000)]),
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 200)}`);
      const reply = NodeHeartbeatReply.parse(await response.json());
      for (const id of reply.fence) await options.disks.fence(id);
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
  };
}
