import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fleetClocks, type LocalStack, startLocalStack } from "../local-stack.js";
import { Partitions } from "../partition.js";
import { percentile } from "../percentile.js";
import { apiFailures, failedRows, formatTable, lossWindows, lostWrites, nodeJobs, type Row, runsExecutedTwice } from "./check.js";
import { type Ack, deploy, edgeRequest, type LedgerApp, makeLedgerApp, type Note, removeSource, TimedApi, watchPlacement, writeLedger } from "./load.js";
import { describeFault, type Fault, faultSchedule } from "./schedule.js";
import { WriterWatch } from "./writers.js";

/** The fleet's clocks, short enough for minutes of chaos; the same code paths as the defaults (60 s, 300 s, 60 s). */
const LOST_AFTER_S = 6;
const GRACE_S = 4;
const LEASE_S = 4;
/**
 * The longest fault: past the moment a silent node's disks move (lost after LOST_AFTER_S, then the grace or
 * the lease and its 5 s margin, whichever is longer: worker/services/fleet.ts), so some faults move disks.
 */
const LONGEST_FAULT_MS = (LOST_AFTER_S + Math.max(GRACE_S, LEASE_S + 5) + 3) * 1000;
/** How long the run waits, once the chaos ends, for everything to reach a final state. */
const SETTLE_MS = 180_000;
const BACKUP_EVERY_MS = 15_000;
const DEPLOY_EVERY_MS = 45_000;

export type ChaosOptions = { seconds: number; seed: number; log: (line: string) => void };
export type ChaosReport = { seed: number; seconds: number; faults: string[]; kinds: Fault["kind"][]; rows: Row[]; table: string; failed: Row[] };

/**
 * The chaos run (issue 30, docs/fleet.md "The chaos run"): three nodes of
 * `npm start -- --nodes 3`'s kind; for `seconds`, one fault after another from
 * the seed's schedule (scripts/chaos/schedule.ts), while a load writes
 * acknowledged records through two apps to their disks, backs the disks up,
 * redeploys the apps and lets their cron jobs fire every minute. Then every
 * fault is healed, the run waits for every operation to end, and the checker
 * compares what was acknowledged, what the nodes ran and what the API says.
 */
export async function runChaos(options: ChaosOptions): Promise<ChaosReport> {
  const { log, seed } = options;
  const partitions = await Partitions.open();
  if ("reason" in partitions) throw new Error(`the chaos run cannot cut the network here: ${partitions.reason}`);
  const dir = await mkdtemp(join(tmpdir(), "svc-chaos-"));
  let stack: LocalStack | null = null;
  const stopped = new Set<number>();
  const apps: LedgerApp[] = [];
  // A run that failed keeps its stack's state and logs for whoever reads why.
  let keep = false;
  // The load runs until `ending`, the placement watch until `settled`: both set on the way out, whatever happened.
  let ending = false;
  let settled = false;
  let watch: WriterWatch | null = null;
  try {
    log(`chaos: seed ${seed}, ${options.seconds} s, state in ${dir}`);
    stack = await startLocalStack({
      port: 0,
      persistDir: join(dir, "persist"),
      stateDir: join(dir, "state"),
      secretsFile: join(dir, "secrets.env"),
      output: "files",
      workerLogs: true,
      nodes: 3,
      nodeCgroupRoot: partitions.cgroupRoot,
      workerVars: fleetClocks({ lostAfterSeconds: LOST_AFTER_S, graceSeconds: GRACE_S, leaseSeconds: LEASE_S }),
    });
    const live = stack;
    const api = new TimedApi(live);
    const names = live.nodes.map((node) => node.name);
    const home = join(dir, "home");

    // Two apps, their disks on the first two nodes (so a seed's faults meet the same disks every run), each deployed once.
    for (const [i, letter] of ["a", "b"].entries()) {
      const place = { others: live.nodes.filter((_, j) => j !== i).map((node) => node.id), operator: live.secrets.OPERATOR_TOKEN };
      apps.push(await makeLedgerApp(api, `${letter}${randomBytes(2).toString("hex")}`, place));
    }
    for (const app of apps) {
      const first = await deploy(live, app.name, app.source, home);
      if (first.code !== 0) throw new Error(`the first deploy of ${app.name} failed: ${first.tail}`);
    }
    log(`chaos: apps ${apps.map((app) => app.name).join(", ")} deployed; the chaos starts`);

    const writerWatch = new WriterWatch(new Map(apps.map((app) => [app.diskName, app.marker])));
    watch = writerWatch;
    writerWatch.start();
    const over = () => ending;
    const acks = new Map<string, Ack[]>(apps.map((app) => [app.id, []]));
    const notes = new Map<string, Note[]>();
    const deploys: { app: string; code: number | null; tail: string }[] = [];
    const backups: string[] = [];
    const writers = Promise.all(apps.map((app) => writeLedger(live.apiUrl, app, over, acks.get(app.id)!)));
    // Placement notes are read until the checker runs: a failover may come after the last fault.
    const placement = watchPlacement(api, apps, () => settled, notes);
    const load = [
      writers,
      (async () => {
        while (!over()) {
          for (const app of apps) {
            const made = await api.call<{ id: string }>("POST", `/v1/disks/${app.diskId}/backups`, { description: "chaos" });
            if (made.status === 201 || made.status === 202) backups.push(made.data.id);
          }
          await sleepUnless(BACKUP_EVERY_MS, over);
        }
      })(),
      (async () => {
        for (let n = 0; !over(); n++) {
          await sleepUnless(DEPLOY_EVERY_MS, over);
          if (over()) break;
          const app = apps[n % apps.length]!;
          deploys.push({ app: app.name, ...(await deploy(live, app.name, app.source, home)) });
        }
      })(),
      (async () => {
        // Calls that touch no particular node, for the API's p99 over the run.
        while (!over()) {
          await api.call("GET", "/v1/apps");
          await sleepUnless(1_000, over);
        }
      })(),
    ];

    // The faults, one at a time, each undone before the next.
    const applied: string[] = [];
    const kinds: Fault["kind"][] = [];
    const started = Date.now();
    const workerPort = Number(new URL(live.apiUrl).port);
    for (const { atMs, fault } of faultSchedule(seed, options.seconds * 1000, live.nodes.length, LONGEST_FAULT_MS)) {
      const wait = started + atMs - Date.now();
      if (wait > 0) await sleep(wait);
      const line = `${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s  ${describeFault(fault, names)}`;
      log(`chaos: ${line}`);
      applied.push(line);
      kinds.push(fault.kind);
      await inflict(live, partitions, workerPort, fault, stopped);
    }
    const left = started + options.seconds * 1000 - Date.now();
    if (left > 0) await sleep(left);
    ending = true;
    await Promise.all(load);
    log(`chaos: ${applied.length} faults over ${((Date.now() - started) / 1000).toFixed(0)} s; settling`);

    // Everything healed; every operation must now end, and every app serve its disk again.
    const open = await settle(api, apps, live);
    settled = true;
    await Promise.all([writerWatch.stop(), placement]);
    // What each disk holds now, read through its app (which settle saw serving; a late move may restart it).
    const ledgers = new Map<string, string>();
    const cronRuns = new Map<string, string>();
    for (const app of apps) {
      const ledger = await readThroughApp(live.apiUrl, app.name, "/ledger");
      if (ledger === null) open.push(`${app.name} did not answer GET /ledger for 60 s after the run settled`);
      ledgers.set(app.id, ledger ?? "");
      cronRuns.set(app.id, (await readThroughApp(live.apiUrl, app.name, "/cron-runs")) ?? "");
    }
    const unread = new Set(apps.filter((app) => !ledgers.get(app.id)).map((app) => app.id));
    const windows = apps.flatMap((app) => lossWindows(app.diskName, notes.get(app.diskId) ?? []));
    // A ledger that could not be read counts as unfinished, not as every write lost.
    const lost = apps.map((app) =>
      unread.has(app.id) ? { reported: [], unreported: [] } : lostWrites(acks.get(app.id)!, ledgers.get(app.id)!, windows.filter((w) => w.disk === app.diskName)),
    );
    const jobs = await nodeJobs(new Map(live.nodes.map((node) => [node.name, node.dataDir])));
    const twice = runsExecutedTwice(jobs);
    // A node's job still queued or running two minutes after it was made (the run's jobs take a second or two).
    for (const job of jobs) {
      if ((job.status === "queued" || job.status === "running") && Date.now() - Date.parse(job.createdAt) > 120_000) {
        open.push(`job ${job.id} (${job.labels.kind ?? "?"}) on ${job.node} is ${job.status} since ${job.createdAt}`);
      }
    }
    const cronExecuted = jobs.filter((job) => job.labels.kind === "cron" && job.startedAt !== null).length;
    const failures = apiFailures(api.calls);
    const unanswered = failures.filter((call) => call.status === 0).length;
    const unreported = lost.flatMap((l) => l.unreported);
    const acknowledged = apps.reduce((sum, app) => sum + (acks.get(app.id)?.length ?? 0), 0);
    const tried = (await writers).reduce((sum, w) => sum + w.tried, 0);
    const rows: Row[] = [
      { check: "faults", value: applied.length, mustBe: null, detail: tally(kinds) },
      { check: "writes acknowledged (of those tried)", value: `${acknowledged}/${tried}`, mustBe: null },
      {
        check: "acknowledged writes lost, as the placement notes say",
        value: lost.reduce((sum, l) => sum + l.reported.length, 0),
        mustBe: null,
        detail: windows.length === 0 ? "no failover moved a disk" : `${windows.length} failovers restored a disk from a backup`,
      },
      {
        check: "acknowledged writes lost beyond what they say",
        value: unreported.length,
        mustBe: 0,
        ...(unreported.length
          ? {
              detail: apps
                .map((app, i) => {
                  const held = ledgers.get(app.id)!.split("\n").filter(Boolean).map(Number);
                  const ackedSeqs = acks.get(app.id)!.map((a) => a.seq);
                  return `${app.name}: ${ackedSeqs.length} acknowledged (${ackedSeqs[0]}..${ackedSeqs.at(-1)}), its ledger holds ${held.length} (${held[0]}..${held.at(-1)}), lost beyond the notes ${lost[i]!.unreported.slice(0, 8).join(", ")}`;
                })
                .join("; "),
            }
          : {}),
      },
      {
        check: "cron runs executed (node jobs started)",
        value: cronExecuted,
        mustBe: null,
        detail: `lines on the disks now: ${[...cronRuns.values()].join("").split("\n").filter(Boolean).length}`,
      },
      { check: "cron runs executed twice", value: twice.length, mustBe: 0, ...(twice.length ? { detail: twice.slice(0, 5).join("; ") } : {}) },
      {
        check: "moments with two writers on one disk",
        value: writerWatch.moments.length,
        mustBe: 0,
        detail: writerWatch.moments.length
          ? writerWatch.moments
              .slice(0, 5)
              .map((m) => `${m.disk} on ${m.nodes.join(" and ")} (${m.appProcesses} app processes) at ${m.at}`)
              .join("; ")
          : `${writerWatch.samples} looks at /proc, a writer seen in ${writerWatch.seen}`,
      },
      { check: "operations not in a final state", value: open.length, mustBe: 0, ...(open.length ? { detail: open.slice(0, 5).join("; ") } : {}) },
      { check: "backups started", value: backups.length, mustBe: null },
      { check: "redeploys (succeeded / tried)", value: `${deploys.filter((d) => d.code === 0).length}/${deploys.length}`, mustBe: null },
      { check: "API calls", value: api.calls.length, mustBe: null },
      {
        check: "API 5xx or no answer (503 with Retry-After aside)",
        value: failures.length,
        mustBe: null,
        detail: `${unanswered} unanswered (the Worker restarting); ${api.calls.filter((c) => c.status === 503 && c.retryAfter).length} 503 with Retry-After`,
      },
      { check: "API p99 (ms)", value: Math.round(percentile(api.calls.map((call) => call.ms).sort((a, b) => a - b), 99)), mustBe: null },
    ];
    const failed = failedRows(rows);
    if (failed.length > 0) {
      keep = true;
      const said = apps.map((app) => `${app.diskName}: ${(notes.get(app.diskId) ?? []).map((n) => `[${new Date(n.seenAt).toISOString()}] ${n.text}`).join(" | ") || "no note"}`);
      rows.push({ check: "placement notes (the run failed)", value: "", mustBe: null, detail: `${said.join("; ")}; state and logs kept in ${dir}` });
    }
    const table = formatTable(rows);
    return { seed, seconds: options.seconds, faults: applied, kinds, rows, table, failed };
  } finally {
    ending = true;
    settled = true;
    await watch?.stop();
    for (const pid of stopped) process.kill(pid, "SIGCONT");
    await partitions.close();
    await stack?.stop();
    await Promise.all(apps.map(removeSource));
    if (!keep) await rm(dir, { recursive: true, force: true });
  }
}

/** Waits `ms`, or less once `over` says the load is done. */
async function sleepUnless(ms: number, over: () => boolean): Promise<void> {
  for (const until = Date.now() + ms; Date.now() < until && !over(); ) await sleep(Math.min(500, until - Date.now()));
}

/** "kill 3, stop 2, …": how many faults of each kind. */
function tally(kinds: string[]): string {
  const counts = new Map<string, number>();
  for (const kind of kinds) counts.set(kind, (counts.get(kind) ?? 0) + 1);
  return [...counts].map(([kind, n]) => `${kind} ${n}`).join(", ");
}

/** GET `path` of an app through the edge until it answers 200 (at most 60 s): its body, or null. */
async function readThroughApp(apiUrl: string, app: string, path: string): Promise<string | null> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; await sleep(1_000)) {
    const res = await edgeRequest(apiUrl, app, "GET", path, 10_000);
    if (res.status === 200) return res.body;
  }
  return null;
}

/** Does `fault` to the stack, waits its length, and undoes it. */
async function inflict(stack: LocalStack, partitions: Partitions, workerPort: number, fault: Fault, stopped: Set<number>): Promise<void> {
  if (fault.kind === "restart-api") return stack.restartApi();
  const node = stack.nodes[fault.node]!;
  switch (fault.kind) {
    case "kill":
      node.kill();
      await sleep(fault.forMs);
      return node.revive();
    case "stop": {
      const pid = node.pid();
      process.kill(pid, "SIGSTOP");
      stopped.add(pid);
      await sleep(fault.forMs);
      process.kill(pid, "SIGCONT");
      stopped.delete(pid);
      return;
    }
    case "partition":
      await partitions.cut(node, workerPort, fault.cut);
      await sleep(fault.forMs);
      return partitions.heal(node);
  }
}

/**
 * Waits until every node is ready, every disk available, every app serving,
 * and no deployment, backup or cron run is still under way, twice in a row;
 * answers what is not, after {@link SETTLE_MS}.
 */
async function settle(api: TimedApi, apps: LedgerApp[], stack: LocalStack): Promise<string[]> {
  const deadline = Date.now() + SETTLE_MS;
  // Settled is two clean looks in a row: a failover decided just after one look restarts its app.
  for (let clean = 0; ; ) {
    const open: string[] = [];
    const nodes = await api.call<{ name: string; state: string }[]>("GET", "/v1/operator/nodes", undefined, stack.secrets.OPERATOR_TOKEN);
    for (const node of nodes.status === 200 ? nodes.data : []) if (node.state !== "ready") open.push(`node ${node.name} is ${node.state}`);
    for (const app of apps) {
      const disk = await api.call<{ status: string }>("GET", `/v1/disks/${app.diskId}`);
      if (disk.data.status !== "available") open.push(`disk ${app.diskName} is ${disk.data.status ?? disk.status}`);
      const deployments = await api.call<{ id: string; status: string }[]>("GET", `/v1/apps/${app.id}/deployments`);
      for (const d of deployments.status === 200 ? deployments.data : []) {
        if (["queued", "building", "deploying"].includes(d.status)) open.push(`deployment ${d.id} of ${app.name} is ${d.status}`);
      }
      const backups = await api.call<{ id: string; status: string }[]>("GET", `/v1/disks/${app.diskId}/backups`);
      for (const b of backups.status === 200 ? backups.data : []) if (b.status === "creating") open.push(`backup ${b.id} of ${app.diskName} is creating`);
      const runs = await api.call<{ jobName: string; status: string; startedAt: string }[]>("GET", `/v1/crons/${app.cronId}/runs`);
      for (const r of runs.status === 200 ? runs.data : []) {
        if (r.status === "running" && Date.now() - Date.parse(r.startedAt) > 60_000) open.push(`cron run ${r.jobName} has run since ${r.startedAt}`);
      }
      const served = await edgeRequest(stack.apiUrl, app.name, "GET", "/healthz", 5_000);
      if (served.status !== 200) open.push(`${app.name} answers ${served.status || "nothing"}`);
    }
    clean = open.length === 0 ? clean + 1 : 0;
    if (clean === 2 || (open.length > 0 && Date.now() > deadline)) return open;
    await sleep(3_000);
  }
}
