import { type SQL, sql } from "drizzle-orm";
import type { ProcessStatus } from "../../builder/src/protocol/processes";
import { type AppRow, apps, type LiveInstance, type Runtime } from "../db/schema";
import { configOf, type Env } from "../env";
import { getProcess } from "../lib/builder-client";
import { fleet, nodeRef } from "./fleet";

/** The AppRuntime object of an app that runs (one per app). */
export const appRuntimeStub = (env: Env, appId: string) => env.APP_RUNTIME.get(env.APP_RUNTIME.idFromName(appId));

/** Whether apps of this runtime run a process (everything but `static`, which the edge serves). */
export function runsProcess(runtime: Runtime): boolean {
  return runtime !== "static";
}

/** Apps with a process serving them on `nodeId` (one of `apps.live_instances`). */
export function servedFrom(nodeId: string): SQL {
  return sql`exists (select 1 from json_each(${apps.liveInstances}) where json_extract(value, '$.node') = ${nodeId})`;
}

/** What the API shows of an app's process: the node's own account of it, or why there is none. */
export type ProcessView = Pick<ProcessStatus, "ready" | "restarts" | "lastExit" | "lastLines" | "startedAt" | "readyAt"> & {
  /** The supervisor's state, or `unknown` when its node cannot be asked right now. */
  state: ProcessStatus["state"] | "unknown";
};

/** One process serving the app, with where it runs and which release it runs. */
export type InstanceView = ProcessView & { id: string; node: string; nodeName: string; deploymentId: string | null };

/** The processes serving an app (its `live_instances`; a row from before instances: its live process). */
export function liveInstancesOf(app: Pick<AppRow, "liveInstances" | "liveProcessId" | "liveNode">): LiveInstance[] {
  if (app.liveInstances && app.liveInstances.length > 0) return app.liveInstances;
  return app.liveProcessId && app.liveNode ? [{ processId: app.liveProcessId, node: app.liveNode }] : [];
}

/** Every process serving an app that runs, each asked of its node at once; empty when none runs (static, stopped, never deployed). */
export async function instanceViews(env: Env, app: AppRow): Promise<InstanceView[]> {
  const live = runsProcess(app.runtime) ? liveInstancesOf(app) : [];
  // Nothing runs: no need to read the fleet for node names.
  if (live.length === 0) return [];
  const names = new Map((await fleet(env)).nodes.map((node) => [node.id, node.name]));
  return Promise.all(
    live.map(async ({ processId, node: nodeId }) => {
      const node = await nodeRef(env, nodeId).catch(() => null);
      const found = node ? await getProcess(configOf(env), node, processId).catch(() => null) : null;
      const where = { id: processId, node: nodeId, nodeName: names.get(nodeId) ?? nodeId };
      if (!found?.ok) return { ...where, deploymentId: null, state: "unknown", ready: false, restarts: 0, lastExit: null, lastLines: [], startedAt: null, readyAt: null };
      const { state, ready, restarts, lastExit, lastLines, startedAt, readyAt, labels } = found.value;
      return { ...where, deploymentId: labels.deploymentId ?? null, state, ready, restarts, lastExit, lastLines, startedAt, readyAt };
    }),
  );
}
