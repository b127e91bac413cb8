import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, rmdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { apiFailures, lossWindows, lostWrites, nodeJobs, runsExecutedTwice } from "../../scripts/chaos/check.js";
import { faultSchedule } from "../../scripts/chaos/schedule.js";
import { WriterWatch } from "../../scripts/chaos/writers.js";

/** The chaos run's checker and writer watch (scripts/chaos), each shown a failure it must count. */
describe("the chaos run's checker", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("counts an acknowledged write as reported lost only inside a failover's window, from its backup's start to its note", () => {
    const at = Date.parse("2026-11-28T10:00:00.000Z");
    const notes = [
      { text: "node local-2 was lost at 2026-11-28T10:00:20.000Z; restored on node local-1 from the backup begun at 2026-11-28T10:00:10.000Z (bak_1); writes since it began may be lost", seenAt: at + 30_000 },
      // A move that did not happen loses nothing.
      { text: "node local-1 was lost at 2026-11-28T10:01:00.000Z; restored on node local-3 from the backup begun at 2026-11-28T10:00:50.000Z (bak_2); writes since it began may be lost — not done: no node", seenAt: at + 70_000 },
    ];
    const windows = lossWindows("d", notes);
    expect(windows).toEqual([{ disk: "d", from: at + 10_000, to: at + 30_000, note: notes[0]!.text }]);
    const acks = [
      { seq: 1, at: at + 5_000 },
      { seq: 2, at: at + 15_000 },
      { seq: 3, at: at + 40_000 },
      { seq: 4, at: at + 60_000 },
    ];
    // 2 was written after the backup began, before the failover: reported. 1 and 4 were not: lost beyond the report.
    expect(lostWrites(acks, "3\n", windows)).toEqual({ reported: [2], unreported: [1, 4] });
    expect(lostWrites(acks, "1\n2\n3\n4\n", windows)).toEqual({ reported: [], unreported: [] });
  });

  it("finds a cron run two nodes started, and not one queued on one and started on the other", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-chaos-check-"));
    dirs.push(dir);
    const job = async (node: string, id: string, key: string, startedAt: string | null) => {
      await mkdir(join(dir, node, "jobs", id), { recursive: true });
      // Labelled as the Worker labels a run; a run sent again after it was taken back has another key.
      const [cronId, jobName] = key.split("/");
      const status = { id, key, status: startedAt ? "succeeded" : "cancelled", startedAt, createdAt: "2026-11-28T10:00:00.000Z", labels: { kind: "cron", cronId, jobName } };
      await writeFile(join(dir, node, "jobs", id, "status.json"), JSON.stringify(status));
    };
    await job("local-1", "job_a", "cron_1/tick-1795000000", "2026-11-28T10:00:01.000Z");
    await job("local-2", "job_b", "cron_1/tick-1795000000/1", "2026-11-28T10:00:09.000Z");
    await job("local-1", "job_c", "cron_1/tick-1795000060", null);
    await job("local-3", "job_d", "cron_1/tick-1795000060", "2026-11-28T10:01:02.000Z");
    const jobs = await nodeJobs(new Map(["local-1", "local-2", "local-3"].map((node) => [node, join(dir, node)])));
    expect(jobs).toHaveLength(4);
    expect(runsExecutedTwice(jobs)).toEqual(["cron_1/tick-1795000000 on local-1/job_a, local-2/job_b"]);
  });

  it("counts a 5xx and a call without an answer as failures, and not a 503 that says when to come back", () => {
    const call = (status: number, retryAfter = false) => ({ method: "GET", path: "/v1/apps", status, ms: 5, retryAfter });
    expect(apiFailures([call(200), call(503, true), call(503), call(500), call(0), call(404)]).map((c) => c.status)).toEqual([503, 500, 0]);
  });

  it("draws the same schedule from the same seed, every kind of fault in each round", () => {
    const schedule = faultSchedule(13, 600_000, 3, 14_000);
    expect(faultSchedule(13, 600_000, 3, 14_000)).toEqual(schedule);
    expect(faultSchedule(14, 600_000, 3, 14_000)).not.toEqual(schedule);
    expect(new Set(schedule.slice(0, 5).map((p) => p.fault.kind))).toEqual(new Set(["kill", "stop", "partition", "restart-api"]));
    for (const { fault } of schedule) if ("forMs" in fault) expect(fault.forMs).toBeGreaterThanOrEqual(2_000);
  });

  const v2 = existsSync("/sys/fs/cgroup/cgroup.controllers") ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  it.skipIf(process.getuid?.() !== 0 || !existsSync(join(v2, "cgroup.procs")))(
    "sees two writers of one disk when two processes of its app run, or its marker runs in two nodes' cgroups; one for the app and its run on one node",
    async () => {
      const root = join(v2, `svc-chaos-check-${process.pid}`);
      const marker = `chaos-writer-check${process.pid}`;
      const children: ChildProcess[] = [];
      // A run's shell, or (app) a node process of the app, as its start command runs it.
      const writer = async (node: string, app = false) => {
        await mkdir(join(root, node), { recursive: true });
        const child = app
          ? spawn(process.execPath, ["-e", "setTimeout(() => {}, 30_000)", marker], { stdio: "ignore" })
          : spawn("/bin/sh", ["-c", `sleep 30; exit 0 # ${marker}`], { stdio: "ignore" });
        children.push(child);
        await writeFile(join(root, node, "cgroup.procs"), String(child.pid));
      };
      try {
        const watch = new WriterWatch(new Map([["data", marker]]));
        // The app and a run of its cron job on one node: one writer.
        await writer("local-1", true);
        await writer("local-1");
        await watch.sample();
        expect(watch.moments).toEqual([]);
        expect(watch.seen).toBe(1);
        // A second process of the app on the same node: two.
        await writer("local-1", true);
        await watch.sample();
        expect(watch.moments).toEqual([{ disk: "data", at: expect.any(String), nodes: ["local-1"], appProcesses: 2 }]);
        // A run on another node: two nodes.
        await writer("local-2");
        await watch.sample();
        expect(watch.moments.at(-1)).toEqual({ disk: "data", at: expect.any(String), nodes: ["local-1", "local-2"], appProcesses: 2 });
      } finally {
        for (const child of children) child.kill("SIGKILL");
        await Promise.all(children.map((child) => new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve(null) : child.on("exit", resolve)))));
        for (const node of ["local-1", "local-2"]) await rmdir(join(root, node)).catch(() => {});
        await rmdir(root).catch(() => {});
      }
    },
  );
});
