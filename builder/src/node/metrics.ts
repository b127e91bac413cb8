/**
 * What a node's apps use, reported to the control plane every 10 s
 * (BUILDER_METRICS_SECONDS; docs/metrics.md): each running process's CPU
 * seconds since the last report, the memory its cgroup is charged now and its
 * restarts since, and each disk's bytes and files. The control plane keeps
 * them per minute with the app's (and the disk's) other metrics, and takes a
 * process's numbers only from a node the app ran on, a disk's only from the
 * node holding it.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { DiskStore } from "../disks/store.js";
import { diskInodeLimit } from "../protocol/disks.js";
import type { NodeMetricsReport } from "../protocol/node.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { signRequest } from "../protocol/signing.js";

/** A disk measured by walking its tree waits this many times the walk's duration before the next. */
const WALK_BACKOFF = 20;

/** A running process's usage as the process manager reads it (processes/supervisor.ts). */
export type ProcessReading = { id: string; appId: string; instance: number; restarts: number; memoryLimitBytes: number; cpuSeconds: number | null; memoryBytes: number };

/**
 * Turns readings (CPU seconds and restarts counted since each instance, or
 * process, began) into what a report carries: the amounts since the last one.
 */
export class UsageDeltas {
  readonly #last = new Map<string, { instance: number; cpuSeconds: number; restarts: number }>();

  next(readings: ProcessReading[]): NodeMetricsReport["processes"] {
    const seen = new Set<string>();
    const samples: NodeMetricsReport["processes"] = [];
    for (const r of readings) {
      seen.add(r.id);
      const last = this.#last.get(r.id);
      const cpu = r.cpuSeconds ?? 0;
      // A new instance (a restart) counts its CPU from 0.
      const cpuSeconds = last && last.instance === r.instance ? Math.max(0, cpu - last.cpuSeconds) : cpu;
      const restarts = Math.max(0, r.restarts - (last?.restarts ?? 0));
      this.#last.set(r.id, { instance: r.instance, cpuSeconds: cpu, restarts: r.restarts });
      samples.push({ id: r.id, appId: r.appId, cpuSeconds, memoryBytes: Math.round(r.memoryBytes), memoryLimitBytes: r.memoryLimitBytes, restarts });
    }
    for (const id of this.#last.keys()) if (!seen.has(id)) this.#last.delete(id);
    return samples;
  }
}

/** Reports until `signal` aborts; a report that fails is dropped (the next one carries its CPU time). */
export async function reportMetrics(options: {
  controlUrl: string;
  credentials: NodeCredentials;
  intervalMs: number;
  processes: { usage(): ProcessReading[] };
  disks: DiskStore;
  signal: AbortSignal;
}): Promise<void> {
  const url = new URL("/internal/nodes/metrics", options.controlUrl);
  const deltas = new UsageDeltas();
  const nextWalk = new Map<string, number>();
  let failing = false;
  while (!options.signal.aborted) {
    await sleep(options.intervalMs, undefined, { signal: options.signal }).catch(() => undefined);
    if (options.signal.aborted) return;
    try {
      const disks: NodeMetricsReport["disks"] = [];
      for (const { id } of await options.disks.held()) {
        if ((nextWalk.get(id) ?? 0) > Date.now()) continue;
        const started = Date.now();
        const info = await options.disks.info(id);
        if (!info) continue;
        if (!options.disks.images) nextWalk.set(id, Date.now() + (Date.now() - started) * WALK_BACKOFF);
        disks.push({
          id,
          usedBytes: Math.round(info.usedBytes),
          usedInodes: Math.round(info.usedInodes ?? 0),
          sizeBytes: info.sizeBytes,
          inodeLimit: info.inodeLimit ?? diskInodeLimit(info.sizeBytes),
        });
      }
      const report: NodeMetricsReport = { processes: deltas.next(options.processes.usage()), disks };
      if (report.processes.length === 0 && report.disks.length === 0) continue;
      const body = JSON.stringify(report);
      const headers = await signRequest({ secret: options.credentials.key, node: options.credentials.node, method: "POST", path: url.pathname, body });
      const response = await fetch(url, {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: AbortSignal.any([options.signal, AbortSignal.timeout(Math.max(options.intervalMs, 5_000))]),
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 200)}`);
      if (failing) console.error("builder: metrics reach the control plane again");
      failing = false;
    } catch (error) {
      if (options.signal.aborted) return;
      if (!failing) console.error(`builder: metrics report failed (${error instanceof Error ? error.message : String(error)}); going on`);
      failing = true;
    }
  }
}
