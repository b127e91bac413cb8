import { readdir, readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";

/** A moment a disk had live writers on more than one node, or more than one process of its app. */
export type TwoWriters = { disk: string; at: string; nodes: string[]; appProcesses: number };

/**
 * Watches /proc for the processes that write each disk: the shell running a
 * command that carries the disk's marker (the app's start command, its cron
 * job's command: `/bin/sh -c <command>`) and a `node` started with the marker
 * as an argument. Each is counted on the node whose cgroup (v2) it runs in:
 * every node of the stack runs in a cgroup of its own (`local-1`, …), and its
 * jobs and app processes inherit it, even once their agent is gone. Two
 * nodes at once for one disk is a second writer; so are two processes of its
 * app (a run of its cron job beside the app is not: runs share their app's disk).
 */
export class WriterWatch {
  readonly moments: TwoWriters[] = [];
  /** Looks taken, and in how many a disk had a writer at all (the watch sees them). */
  samples = 0;
  seen = 0;
  readonly #markers: Map<string, string>;
  #running = false;
  #loop: Promise<void> = Promise.resolve();

  /** `markers`: disk name → the marker its writers carry. */
  constructor(markers: Map<string, string>) {
    this.#markers = markers;
  }

  start(everyMs = 200): void {
    this.#running = true;
    this.#loop = (async () => {
      while (this.#running) {
        await this.sample();
        await sleep(everyMs);
      }
    })();
  }

  async stop(): Promise<void> {
    this.#running = false;
    await this.#loop;
  }

  /** One look at every process: which node each disk's live writers run on. */
  async sample(): Promise<void> {
    const on = new Map<string, Set<string>>();
    const apps = new Map<string, number>();
    for (const entry of await readdir("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      const argv = (await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "")).split("\0");
      for (const [disk, marker] of this.#markers) {
        const shell = argv[0] === "/bin/sh" && argv[1] === "-c" && argv[2]?.includes(marker);
        const node = /(^|\/)node$/.test(argv[0] ?? "") && argv.slice(1).includes(marker);
        if (!shell && !node) continue;
        const stat = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
        if (!stat || /^\d+ \(.*\) Z /.test(stat)) continue;
        const cgroup = await readFile(`/proc/${entry}/cgroup`, "utf8").catch(() => "");
        const name = /^0::.*\/(local-\d+)(\/|$)/m.exec(cgroup)?.[1] ?? `pid ${entry} outside every node's cgroup`;
        const nodes = on.get(disk) ?? new Set<string>();
        nodes.add(name);
        on.set(disk, nodes);
        if (node) apps.set(disk, (apps.get(disk) ?? 0) + 1);
      }
    }
    this.samples++;
    for (const [disk, nodes] of on) {
      this.seen++;
      const appProcesses = apps.get(disk) ?? 0;
      if (nodes.size > 1 || appProcesses > 1) this.moments.push({ disk, at: new Date().toISOString(), nodes: [...nodes].sort(), appProcesses });
    }
  }
}
