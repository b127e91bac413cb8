import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from "vitest";
import { fleetClocks, type LocalNode, type LocalStack } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startOwnStack } from "../cli/svc.js";
import { type DiskView, fleetApi, type NodeView, type Run, until } from "./fleet-api.js";
import { type Cut, Partitions } from "../../scripts/partition.js";
import { Webhook } from "standardwebhooks";
import { Receiver, signedBy } from "./webhook-receiver.js";

/** Short enough for a test; the same code paths as the defaults (60 s, 300 s, 60 s). */
const LOST_AFTER_S = 6;
const GRACE_S = 4;
const LEASE_S = 4;
/** Calls about a sick node's resources answer within this (issue 30). */
const ANSWER_WITHIN_MS = 2_000;
/**
 * A node cut off ends its disk's writers within its lease (counted from its last heartbeat's sending, before
 * the sickness), the watchdog's second and the kill; the rest is this test seeing it on a loaded machine.
 */
const WRITER_GONE_WITHIN_MS = (LEASE_S + 5) * 1000;

const partitions = await Partitions.open();
if ("reason" in partitions) throw new Error(`the partition tests cannot cut the network here: ${partitions.reason}`);

/**
 * Live (not zombie) disk writers: the shell a run's command is (`/bin/sh -c <command>`, the
 * sandbox's last exec) whose command carries `marker`. The sandbox's own processes (bwrap) carry
 * the command among their arguments too, and are not counted.
 */
async function writersWith(marker: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const [program, flag, command] = (await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "")).split("\0");
    if (program !== "/bin/sh" || flag !== "-c" || !command?.includes(marker)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    if (stat && !/^\d+ \(.*\) Z /.test(stat)) found.push(Number(entry));
  }
  return found;
}

/** The 99th percentile of `samples` (ms). */
const p99 = (samples: number[]) => [...samples].sort((a, b) => a - b)[Math.ceil(samples.length * 0.99) - 1]!;

/**
 * Issue 30: a node that hangs, is partitioned (both ways, or one) or slows
 * down stalls no API call and leaves no second writer on a disk. Three node
 * processes of `npm start -- --nodes 3`'s kind; the network is cut by this
 * test with nftables (scripts/partition.ts), a hang is the node agent
 * stopped (SIGSTOP: the kernel still accepts its connections), and a slow
 * node is one frozen 2.5 s of every 3 s. Disk writers are cron runs that
 * append to their disk until stopped, found by a marker in their command line.
 */
describe("sick nodes", () => {
  let stack: LocalStack & { stateDir: string };
  let api: ReturnType<typeof fleetApi>;
  /** A second account: its calls touch no sick node, and keep their speed. */
  let bystander: { keys: string[]; appId: string; diskId: string };
  const frozen = new Set<number>();
  const workerPort = () => Number(new URL(stack.apiUrl).port);
  /** The operator's receiver: the local account is the operator's (it may subscribe to node events). */
  const operatorHooks = new Receiver();

  beforeAll(async () => {
    stack = await startOwnStack({
      workerLogs: true,
      nodes: 3,
      nodeCgroupRoot: partitions.cgroupRoot,
      workerVars: fleetClocks({ lostAfterSeconds: LOST_AFTER_S, graceSeconds: GRACE_S, leaseSeconds: LEASE_S }),
    });
    api = fleetApi(stack);
    const account = await api.ok<{ apiKey: { key: string } }>("POST", "/v1/accounts", { name: "bystander", plan: "business" }, api.operator());
    const key = account.apiKey.key;
    const app = await api.newApp("calm", "static", key);
    // Its disk on the third node: the first two are the ones that hang and are cut off while its calls are timed.
    const [first, second] = stack.nodes;
    for (const node of [first!, second!]) await api.ok("POST", `/v1/operator/nodes/${node.id}/cordon`, {}, api.operator());
    const disk = await api.ok<DiskView>("POST", "/v1/disks", { name: "calm", sizeGb: 1, mountPath: "/data" }, key);
    for (const node of [first!, second!]) await api.ok("POST", `/v1/operator/nodes/${node.id}/uncordon`, {}, api.operator());
    await api.ok("POST", `/v1/disks/${disk.id}/attach`, { app: app.id }, key);
    // Keys of its own to spread its timed calls over (one key may make 100 requests in 10 s).
    const keys = await Promise.all(
      [1, 2, 3, 4, 5, 6].map(async (n) => (await api.ok<{ key: string }>("POST", "/v1/api-keys", { name: `calm-${n}`, scopes: ["deploy"] }, key)).key),
    );
    bystander = { keys, appId: app.id, diskId: disk.id };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await operatorHooks.stop();
    for (const pid of frozen) process.kill(pid, "SIGCONT");
    await stack?.stop();
    await partitions.close();
  });

  /** The bystander's calls, timed: its app, its apps, its disk (whose usage its own healthy node answers). */
  const bystanderLatencies = async (rounds: number): Promise<number[]> => {
    const times: number[] = [];
    for (let i = 0; i < rounds; i++) {
      for (const path of [`/v1/apps/${bystander.appId}`, "/v1/apps", `/v1/disks/${bystander.diskId}`]) {
        const started = performance.now();
        const res = await api.call("GET", path, undefined, bystander.keys[times.length % bystander.keys.length]);
        times.push(performance.now() - started);
        expect(res.status, `${path}: ${JSON.stringify(res.data)}`).toBe(200);
      }
    }
    return times;
  };

  /**
   * An app of the admin's account with a disk on `node` (the other nodes cordoned while it is
   * placed) and a cron job that writes to it until stopped, started and running.
   */
  const diskWriterOn = async (node: LocalNode) => {
    const tag = randomBytes(3).toString("hex");
    const app = await api.newApp(`sick-${tag}`);
    const others = stack.nodes.filter((n) => n !== node);
    for (const other of others) await api.ok("POST", `/v1/operator/nodes/${other.id}/cordon`, {}, api.operator());
    // Making a disk's image may outlast its 10 s deadline when the machine stalls (it did in CI, heartbeats of two
    // nodes missed at the same moment): the node, answering its health check, is "busy" (503 with Retry-After),
    // nothing is kept, and a client tries again after the time it was told.
    let made = await api.call<DiskView>("POST", "/v1/disks", { name: `sick-${tag}`, sizeGb: 1, mountPath: "/data" });
    for (let attempt = 1; attempt < 3 && made.status === 503 && / is busy /.test(JSON.stringify(made.data)); attempt++) {
      await sleep(Number(made.headers.get("Retry-After") ?? 2) * 1000);
      made = await api.call<DiskView>("POST", "/v1/disks", { name: `sick-${tag}`, sizeGb: 1, mountPath: "/data" });
    }
    if (made.status !== 201) throw new Error(`POST /v1/disks: ${made.status} ${JSON.stringify(made.data)}`);
    const disk = made.data;
    for (const other of others) await api.ok("POST", `/v1/operator/nodes/${other.id}/uncordon`, {}, api.operator());
    expect(api.holder(disk.id)).toBe(node);
    await api.ok("POST", `/v1/disks/${disk.id}/attach`, { app: app.id });
    const marker = `svc-writer-${tag}`;
    const writer = await api.newCron(app.id, `writer-${tag}`, `while :; do date +%s%N >> /data/writes; sleep 0.2; done # ${marker}`);
    const check = await api.newCron(app.id, `check-${tag}`, "wc -l < /data/writes");
    const started = await api.run(writer.id, false);
    await until("the writer to run", async () => {
      const runs = await api.ok<(Run & { phase: string | null })[]>("GET", `/v1/crons/${writer.id}/runs`);
      return runs.some((r) => r.jobName === started.jobName && r.phase === "running") && (await writersWith(marker)).length === 1;
    });
    return { app, disk, marker, writer, check };
  };

  /** A call about the sick node's resources: answered within 2 s, whatever it says. */
  const timedCall = async (method: string, path: string, body?: unknown) => {
    const started = performance.now();
    const res = await api.call(method, path, body);
    const ms = performance.now() - started;
    expect(ms, `${method} ${path} took ${ms.toFixed(0)} ms: ${res.status} ${JSON.stringify(res.data)}`).toBeLessThan(ANSWER_WITHIN_MS);
    return { ...res, ms };
  };

  const nodeView = async (node: LocalNode): Promise<NodeView> => (await api.nodesNow()).find((n) => n.id === node.id)!;
  /** Every node ready and answering (the case before healed and returned). */
  const allWell = () =>
    until("every node to be ready and answering", async () => (await api.nodesNow()).every((n) => n.state === "ready" && n.unreachable === null), 60_000);

  /**
   * The bystander's p99 while a node is sick (`sick`: up to three samples), held to 1.5x the healthy run's
   * (or 25 ms more, on loopback where a p99 is tens of milliseconds). The other suites share the machine
   * and their load comes and goes within seconds, so the healthy run is sampled before the sickness and
   * again after it (the slower of the two is the reference), and a sick sample the neighbours slowed is
   * taken again: what is measured is whether the sick node slows the bystander, which never touches it.
   */
  const sickSamples = async (bound: number): Promise<number[]> => {
    const tries: number[] = [];
    for (let attempt = 0; attempt < 3 && (tries.length === 0 || tries.at(-1)! > bound); attempt++) tries.push(p99(await bystanderLatencies(30)));
    return tries;
  };
  const boundOf = (healthy: number) => Math.max(1.5 * healthy, healthy + 25);
  const expectKeptSpeed = async (before: number[], sick: number[], what: string) => {
    const after = p99(await bystanderLatencies(30));
    const healthy = Math.max(p99(before), after);
    console.log(
      `sick nodes: the bystander's p99 ${p99(before).toFixed(0)} ms healthy before, ${sick.map((t) => t.toFixed(0)).join(", ")} ms while ${what}, ${after.toFixed(0)} ms healthy after (${(Math.min(...sick) / healthy).toFixed(2)}x)`,
    );
    expect(Math.min(...sick)).toBeLessThanOrEqual(boundOf(healthy));
  };

  const freeze = (node: LocalNode) => {
    const pid = node.pid();
    process.kill(pid, "SIGSTOP");
    frozen.add(pid);
    return () => {
      process.kill(pid, "SIGCONT");
      frozen.delete(pid);
    };
  };

  it(
    "a hung node: calls about it answer within 2 s with NODE_UNREACHABLE, others keep their p99, its disk's writer ends with its lease before the disk comes back elsewhere, and back it is fenced",
    async () => {
      onTestFailed(() => api.showLog());
      const victim = stack.nodes[0]!;
      await allWell();
      const { disk, marker, writer, check } = await diskWriterOn(victim);
      const backup = await api.ok<{ id: string }>("POST", `/v1/disks/${disk.id}/backups`, { description: "before the hang" });
      await until("the backup", async () =>
        (await api.ok<{ id: string; status: string }[]>("GET", `/v1/disks/${disk.id}/backups`)).some((b) => b.id === backup.id && b.status === "ready"),
      );
      const healthy = await bystanderLatencies(30);
      await operatorHooks.start();
      const { secret } = await api.ok<{ secret: string }>("POST", "/v1/webhooks", { url: `http://127.0.0.1:${operatorHooks.port}/fleet`, events: ["node.unreachable", "node.lost"] });

      const thaw = freeze(victim);
      const hungAt = Date.now();
      // The first call finds the hang (its deadline passes, the node is marked unreachable); the next are refused at once.
      const first = await timedCall("POST", `/v1/crons/${check.id}/run`, {});
      const refused = await until("a call refused with NODE_UNREACHABLE", async () => {
        const res = await timedCall("POST", `/v1/crons/${check.id}/run`, {});
        return res.status === 503 ? res : null;
      });
      console.log(`sick nodes: first call after the hang ${first.status} in ${first.ms.toFixed(0)} ms; then ${refused.status} in ${refused.ms.toFixed(0)} ms`);
      const error = (refused.data as unknown as { error: { code: string; message: string } }).error;
      expect(error.code).toBe("NODE_UNREACHABLE");
      expect(refused.headers.get("Retry-After")).toMatch(/^\d+$/);
      expect(error.message).toMatch(/stopped answering at \S+Z .*; it is declared lost at \S+Z unless it answers; disk \S+ is restored on another node from the backup begun at \S+ \(bak_\w+\) at \S+Z unless the node returns/);
      expect((await timedCall("GET", `/v1/disks/${disk.id}`)).status).toBe(200);
      expect((await nodeView(victim)).unreachable).not.toBeNull();
      // Work that needs no disk goes on elsewhere: manual runs of a stateless app start (202) and finish on the others.
      const spare = await api.newApp(`spare-${randomBytes(3).toString("hex")}`);
      const tick = await api.newCron(spare.id, "tick", "true");
      const ticks = await Promise.all([1, 2, 3].map(() => api.run(tick.id)));
      expect(ticks.map((r) => r.status)).toEqual(["success", "success", "success"]);

      const sick = await sickSamples(boundOf(p99(healthy)));

      // Its agent is stopped, yet its lease watchdog ends the writer once the lease has run out.
      const goneAt = await until("the hung node's writer to end", async () => ((await writersWith(marker)).length === 0 ? Date.now() : null), 30_000);
      console.log(`sick nodes: the hung node's disk writer ended ${((goneAt - hungAt) / 1000).toFixed(1)} s after the hang (lease ${LEASE_S} s)`);
      expect(goneAt - hungAt).toBeLessThanOrEqual(WRITER_GONE_WITHIN_MS);

      const restored = await until(
        "the disk restored elsewhere",
        async () => {
          const now = await api.diskInfo(disk.name);
          return now.status === "available" && now.placement?.includes("restored on node") ? { at: Date.now(), now } : null;
        },
        90_000,
      );
      console.log(`sick nodes: disk restored elsewhere ${((restored.at - hungAt) / 1000).toFixed(1)} s after the hang; its old writer had ended ${((restored.at - goneAt) / 1000).toFixed(1)} s before`);
      expect(goneAt).toBeLessThan(restored.at);
      // The operator heard of both, signed: the missed deadline, then the loss.
      const heard = await until("node.unreachable and node.lost at the operator's receiver", async () => {
        const [unreachable] = operatorHooks.of("node.unreachable");
        const [lost] = operatorHooks.of("node.lost");
        return unreachable && lost ? { unreachable, lost } : null;
      }, 30_000);
      for (const event of [heard.unreachable, heard.lost]) {
        expect(event.event.data).toMatchObject({ node: { id: victim.id } });
        expect(new Webhook(secret).verify(event.body, event.headers)).toEqual(event.event);
        expect(signedBy(secret, event)).toBe(true);
      }
      expect(Date.parse(heard.lost.event.timestamp)).toBeGreaterThanOrEqual(Date.parse(heard.unreachable.event.timestamp));
      // Its new copy is on another node (the hung node's own copy is set aside once it answers again).
      expect(stack.nodes.some((node) => node !== victim && existsSync(join(node.dataDir, "disks", disk.id, "disk.json")))).toBe(true);
      // The writer again, on the disk's new node: one writer, never two.
      await api.run(writer.id, false);
      await until("the new writer", async () => (await writersWith(marker)).length === 1);

      thaw();
      const back = await until("the hung node to return with its stale copy quarantined", async () => {
        const node = await nodeView(victim);
        return node.state === "ready" && node.unreachable === null && node.quarantined.some((q) => q.diskId === disk.id) ? node : null;
      });
      expect(back.disks).not.toContain(disk.id);
      await sleep(2_000);
      expect(await writersWith(marker)).toHaveLength(1);
      await expectKeptSpeed(healthy, sick, "a node hangs");
    },
    240_000,
  );

  for (const cut of ["both", "to-node", "from-node"] as Cut[]) {
    it(`a partition (${cut === "both" ? "both directions" : cut === "to-node" ? "control plane to node only" : "node to control plane only"}): calls about it answer within 2 s, its disk's writer ends with its lease, and healed it serves its disk again`, async () => {
      onTestFailed(() => api.showLog());
      const victim = stack.nodes[cut === "both" ? 1 : 2]!;
      await allWell();
      const { disk, marker, check } = await diskWriterOn(victim);
      const healthy = cut === "both" ? await bystanderLatencies(30) : [];
      let sick: number[] = [];

      await partitions.cut(victim, workerPort(), cut);
      const cutAt = Date.now();
      try {
        // Calls that reach for the node: answered within 2 s, whatever the direction cut.
        for (let i = 0; i < 3; i++) {
          await timedCall("POST", `/v1/crons/${check.id}/run`, {});
          await timedCall("GET", `/v1/disks/${disk.id}`);
        }
        if (cut !== "from-node") expect((await nodeView(victim)).unreachable).not.toBeNull();
        if (cut === "both") sick = await sickSamples(boundOf(p99(healthy)));
        // Cut off from the control plane (or declared lost while heartbeating), the node ends its disk's writers.
        const goneAt = await until("the partitioned node's writer to end", async () => ((await writersWith(marker)).length === 0 ? Date.now() : null), 30_000);
        const lostAt = await until("the node to be lost", async () => ((await nodeView(victim)).state === "lost" ? Date.now() : null), 30_000);
        console.log(`sick nodes (${cut}): writer ended ${((goneAt - cutAt) / 1000).toFixed(1)} s after the cut, node lost ${((lostAt - cutAt) / 1000).toFixed(1)} s after`);
        // Unable to renew its lease, the node ends its writers within it; one still heartbeating ends them once it
        // is declared lost (no lease is granted to it any more). Either way before the disk could be restored
        // elsewhere: never sooner than the lease (and 5 s) after the node was declared lost.
        if (cut !== "to-node") expect(goneAt - cutAt).toBeLessThanOrEqual(WRITER_GONE_WITHIN_MS);
        expect(goneAt).toBeLessThan(lostAt + (LEASE_S + 5) * 1000);
      } finally {
        await partitions.heal(victim);
      }
      await until(
        "the healed node to return",
        async () => {
          const node = await nodeView(victim);
          return node.state === "ready" && node.unreachable === null;
        },
        30_000,
      );
      // Healed before the failover was due: the disk is still its own, mounted again, with its writes.
      const runAgain = await until("a run on the disk to succeed", async () => {
        const done = await api.run(check.id);
        return done.status === "success" ? done : null;
      });
      expect(Number(/ out (\d+)\b/.exec(runAgain.log)?.[1]), runAgain.log).toBeGreaterThan(0);
      expect(api.holder(disk.id)).toBe(victim);
      if (cut === "both") await expectKeptSpeed(healthy, sick, "a node is partitioned");
    }, 180_000);
  }

  it("a slow node (frozen 2.5 s of every 3 s): calls about it answer within 2 s", async () => {
    onTestFailed(() => api.showLog());
    const victim = stack.nodes[1]!;
    await allWell();
    const { disk } = await diskWriterOn(victim);
    let slowing = true;
    const slow = (async () => {
      while (slowing) {
        const thaw = freeze(victim);
        await sleep(2_500);
        thaw();
        await sleep(500);
      }
    })();
    try {
      const answered: number[] = [];
      for (let i = 0; i < 6; i++) answered.push((await timedCall("GET", `/v1/disks/${disk.id}`)).ms);
      console.log(`sick nodes: calls about a slow node's disk answered in ${answered.map((ms) => ms.toFixed(0)).join(", ")} ms`);
    } finally {
      slowing = false;
      await slow;
    }
  }, 120_000);
});
