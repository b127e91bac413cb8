import { and, eq, inArray } from "drizzle-orm";
import type { NodeMetricsReport } from "../../builder/src/protocol/node";
import type { Db } from "../db/client";
import { disks } from "../db/schema";
import type { Env } from "../env";
import { metricsStub } from "./metrics";
import { emit } from "./webhooks";

/** D1 binds at most 100 parameters per statement. */
const CHUNK = 90;

/**
 * Keeps the use of the disks a node measured (node/metrics.ts), each only if
 * that node holds it, and sends `disk.almost_full` to the disk's account the
 * moment one reaches its `alertAtPercent` (once; again after it fell 5 points
 * below).
 */
export async function recordDiskUsage(env: Env, db: Db, node: string, at: number, samples: NodeMetricsReport["disks"]): Promise<void> {
  for (let i = 0; i < samples.length; i += CHUNK) {
    const chunk = samples.slice(i, i + CHUNK);
    const held = await db
      .select({ id: disks.id, accountId: disks.accountId, name: disks.name, appId: disks.appId, alertAtPercent: disks.alertAtPercent })
      .from(disks)
      .where(and(inArray(disks.id, chunk.map((s) => s.id)), eq(disks.nodeId, node)));
    await Promise.all(
      held.map(async (disk) => {
        const sample = chunk.find((s) => s.id === disk.id)!;
        const { crossed, percent } = await metricsStub(env, disk.id).recordDisk(at, sample, disk.alertAtPercent);
        if (crossed !== "full") return;
        console.log(JSON.stringify({ event: "disk.almost_full", disk: disk.id, percent }));
        await emit(env, disk.accountId, "disk.almost_full", {
          disk: { id: disk.id, name: disk.name, appId: disk.appId },
          usedBytes: sample.usedBytes,
          sizeBytes: sample.sizeBytes,
          usedInodes: sample.usedInodes,
          inodeLimit: sample.inodeLimit,
          percent: Math.round(percent * 10) / 10,
          alertAtPercent: disk.alertAtPercent,
        });
      }),
    );
  }
}
