import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { appMetrics, cronMetrics, diskMetrics, MAX_PROCESSES_SHOWN, metricsStub } from "../../worker/services/metrics";

const MINUTE = 60_000;
const MIB = 1024 * 1024;

/** A subject of its own in the shared runtime: metrics objects are named by their subject's id. */
const subject = (kind: string) => `${kind}_${crypto.randomUUID().replaceAll("-", "")}`;

describe("usage metrics in their objects (durable-objects/app-metrics.ts)", () => {
  it("sums a process's CPU and keeps its most memory per minute; null where it did not run", async () => {
    const app = subject("app");
    const now = Date.now();
    const minute = now - (now % MINUTE);
    const stub = metricsStub(env, app);
    const sample = (cpuSeconds: number, memoryBytes: number, restarts = 0) => ({ id: "prc_a", cpuSeconds, memoryBytes, memoryLimitBytes: 256 * MIB, restarts });
    await stub.recordProcesses(minute - 2 * MINUTE + 1_000, [sample(1.5, 80 * MIB)]);
    await stub.recordProcesses(minute - 2 * MINUTE + 11_000, [sample(2.5, 90 * MIB, 1)]);
    await stub.recordProcesses(minute + 1_000, [sample(0.5, 70 * MIB)]);
    const { processes, stepSeconds } = await appMetrics(env, app, "1h", now);
    expect(stepSeconds).toBe(60);
    expect(processes).toHaveLength(1);
    const [process] = processes;
    expect(process!.memoryLimitBytes).toBe(256 * MIB);
    const byAt = new Map(process!.points.map((p) => [Date.parse(p.at), p]));
    expect(byAt.get(minute - 2 * MINUTE)).toEqual({ at: new Date(minute - 2 * MINUTE).toISOString(), cpuSeconds: 4, memoryBytes: 90 * MIB, restarts: 1 });
    expect(byAt.get(minute - MINUTE)).toMatchObject({ cpuSeconds: null, memoryBytes: null, restarts: 0 });
    expect(byAt.get(minute)).toMatchObject({ cpuSeconds: 0.5, memoryBytes: 70 * MIB });
  });

  it(`names at most ${MAX_PROCESSES_SHOWN} processes: those that ran most recently`, async () => {
    const app = subject("app");
    const now = Date.now();
    const start = now - (now % MINUTE) - 30 * MINUTE;
    const stub = metricsStub(env, app);
    // Process i runs in minute i alone: the newest are the highest numbers.
    for (let i = 0; i < MAX_PROCESSES_SHOWN + 5; i++) {
      await stub.recordProcesses(start + i * MINUTE, [{ id: `prc_${String(i).padStart(2, "0")}`, cpuSeconds: 1, memoryBytes: MIB, memoryLimitBytes: 128 * MIB, restarts: 0 }]);
    }
    const { processes } = await appMetrics(env, app, "1h", now);
    expect(processes.map((p) => p.id).sort()).toEqual(Array.from({ length: MAX_PROCESSES_SHOWN }, (_, i) => `prc_${String(i + 5).padStart(2, "0")}`));
  });

  it("keeps a disk's most use per minute, and says almost full once at its threshold, again only after it fell 5 points below", async () => {
    const disk = subject("disk");
    const stub = metricsStub(env, disk);
    const now = Date.now();
    const use = (usedBytes: number, usedInodes = 10) => ({ usedBytes, usedInodes, sizeBytes: 100 * MIB, inodeLimit: 1000 });
    expect(await stub.recordDisk(now, use(50 * MIB), 90)).toEqual({ crossed: null, percent: 50 });
    expect((await stub.recordDisk(now + 1, use(91 * MIB), 90)).crossed).toBe("full");
    expect((await stub.recordDisk(now + 2, use(95 * MIB), 90)).crossed).toBeNull();
    expect((await stub.recordDisk(now + 3, use(86 * MIB), 90)).crossed).toBeNull();
    expect((await stub.recordDisk(now + 4, use(84 * MIB), 90)).crossed).toBe("cleared");
    // Files count as bytes do.
    expect((await stub.recordDisk(now + 5, use(10 * MIB, 950), 90)).crossed).toBe("full");
    const metrics = await diskMetrics(env, disk, "1h", now + 10);
    expect(metrics).toMatchObject({ sizeBytes: 100 * MIB, inodeLimit: 1000 });
    expect(Math.max(...metrics.points.map((p) => p.usedBytes ?? 0))).toBe(95 * MIB);
    expect(Math.max(...metrics.points.map((p) => p.usedInodes ?? 0))).toBe(950);
  });

  it("counts a cron job's runs by outcome with their mean and longest durations", async () => {
    const cron = subject("cron");
    const stub = metricsStub(env, cron);
    const now = Date.now();
    await stub.recordRun(now, { durationMs: 1_000, ok: true });
    await stub.recordRun(now, { durationMs: 3_000, ok: false });
    await stub.recordRun(now, { durationMs: 2_000, ok: true });
    const { totals, points } = await cronMetrics(env, cron, "24h", now);
    expect(totals).toEqual({ runs: 3, succeeded: 2, failed: 1, meanDurationMs: 2_000, maxDurationMs: 3_000 });
    expect(points.filter((p) => p.runs > 0)).toHaveLength(1);
    await stub.drop();
    expect((await cronMetrics(env, cron, "24h", now)).totals.runs).toBe(0);
  });
});
