import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readdir, rmdir } from "node:fs/promises";
import { join, relative } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";

const run = promisify(execFile);

/** Where nft resolves `socket cgroupv2` paths from. */
const CGROUP_MOUNT = "/sys/fs/cgroup";

/** Which way a node's traffic is cut: calls the control plane (and the edge) make to it, what it sends to the control plane, or both. */
export type Cut = "to-node" | "from-node" | "both";

/**
 * Real network partitions between the control plane and one node of a
 * local stack, made with nftables (and removed) by the test itself: packets
 * are dropped, so connections hang as they do when a host drops off the
 * network, rather than being refused.
 *
 * - to the node: every TCP packet for the node's port (the Worker's calls, the
 *   edge's proxied requests) is dropped;
 * - from the node: every TCP packet the node's own sockets send to the
 *   Worker's port (heartbeats, callbacks) is dropped. The node is told apart
 *   by its cgroup v2 (`socket cgroupv2`): each node of the stack starts in a
 *   cgroup of its own under {@link cgroupRoot} (LocalStackOptions.nodeCgroupRoot).
 *
 * Needs root, `nft` and a cgroup v2 hierarchy (this VM: the hybrid layout,
 * v2 at /sys/fs/cgroup/unified).
 */
export class Partitions {
  readonly cgroupRoot: string;
  /** The cgroup v2 hierarchy's mount: a cgroup's `level` counts from here. */
  readonly #v2: string;
  readonly #table: string;
  readonly #cuts = new Map<string, string[]>();

  private constructor(v2: string, table: string) {
    this.#v2 = v2;
    this.cgroupRoot = join(v2, `svc-partition-${process.pid}`);
    this.#table = table;
  }

  /** Ready to cut, or why this host cannot. */
  static async open(): Promise<Partitions | { reason: string }> {
    if (process.getuid?.() !== 0) return { reason: "needs root" };
    const v2 = existsSync(join(CGROUP_MOUNT, "cgroup.controllers")) ? CGROUP_MOUNT : join(CGROUP_MOUNT, "unified");
    if (!existsSync(join(v2, "cgroup.procs"))) return { reason: "no cgroup v2 hierarchy" };
    const table = `svc_partition_${process.pid}`;
    try {
      await run("nft", ["add", "table", "inet", table]);
      await run("nft", ["add", "chain", "inet", table, "out", "{ type filter hook output priority 0; policy accept; }"]);
    } catch (error) {
      return { reason: `nft: ${error instanceof Error ? error.message : String(error)}` };
    }
    const partitions = new Partitions(v2, table);
    await mkdir(partitions.cgroupRoot, { recursive: true });
    return partitions;
  }

  /** Cuts `node` (its name in the stack, and its port) off the Worker at `workerPort`, one way or both. */
  async cut(node: { name: string; url: string }, workerPort: number, cut: Cut): Promise<void> {
    const nodePort = Number(new URL(node.url).port);
    const dir = join(this.cgroupRoot, node.name);
    const cgroup = relative(CGROUP_MOUNT, dir);
    const level = relative(this.#v2, dir).split("/").length;
    const rules: string[] = [];
    if (cut !== "from-node") rules.push(`tcp dport ${nodePort} drop`);
    if (cut !== "to-node") rules.push(`socket cgroupv2 level ${level} "${cgroup}" tcp dport ${workerPort} drop`);
    this.#cuts.set(node.name, rules);
    await this.#apply();
  }

  /** Ends every cut of `node`. */
  async heal(node: { name: string }): Promise<void> {
    this.#cuts.delete(node.name);
    await this.#apply();
  }

  /** Removes the table and the nodes' cgroups (once the nodes have stopped). */
  async close(): Promise<void> {
    await run("nft", ["delete", "table", "inet", this.#table]).catch(() => undefined);
    // A node's lease watchdog outlives it by up to a second (it ends when the node's data directory goes).
    for (let attempt = 0; attempt < 10 && existsSync(this.cgroupRoot); attempt++) {
      for (const name of await readdir(this.cgroupRoot).catch(() => [] as string[])) await rmdir(join(this.cgroupRoot, name)).catch(() => undefined);
      await rmdir(this.cgroupRoot).catch(() => undefined);
      if (existsSync(this.cgroupRoot)) await sleep(500);
    }
  }

  async #apply(): Promise<void> {
    const rules = [...this.#cuts.values()].flat();
    const script = [`flush chain inet ${this.#table} out`, ...rules.map((rule) => `add rule inet ${this.#table} out ${rule}`)].join("\n");
    await new Promise<void>((resolve, reject) => {
      const child = execFile("nft", ["-f", "-"], (error) => (error ? reject(error) : resolve()));
      child.stdin?.end(`${script}\n`);
    });
  }
}
