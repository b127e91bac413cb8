import type { ProcessStatus } from "../../builder/src/protocol/processes";
import type { AppRow, Runtime } from "../db/schema";
import { configOf, type Env } from "../env";
import { getProcess } from "../lib/builder-client";
import { nodeRef } from "./fleet";

/** The AppRuntime object of an app that runs (one per app). */
export const appRuntimeStub = (env: Env, appId: string) => env.APP_RUNTIME.get(env.APP_RUNTIME.idFromName(appId));

/** Whether apps of this runtime run a process (everything but `static`, which the edge serves). */
export function runsProcess(runtime: Runtime): boolean {
  return runtime !== "static";
}

/** What the API shows of an app's process: the node's own account of it, or why there is none. */
export type ProcessView = Pick<ProcessStatus, "ready" | "restarts" | "lastExit" | "lastLines" | "startedAt" | "readyAt"> & {
  /** The supervisor's state, or `unknown` when its node cannot be asked right now. */
  state: ProcessStatus["state"] | "unknown";
};

/** The live process of an app that runs, asked of its node; null when nothing runs (static, stopped, never deployed). */
export async function processView(env: Env, app: AppRow): Promise<ProcessView | null> {
  if (!runsProcess(app.runtime) || !app.liveProcessId || !app.liveNode) return null;
  const node = await nodeRef(env, app.liveNode).catch(() => null);
  const found = node ? await getProcess(configOf(env), node, app.liveProcessId).catch(() => null) : null;
  if (!found?.ok) return { state: "unknown", ready: false, restarts: 0, lastExit: null, lastLines: [], startedAt: null, readyAt: null };
  const { state, ready, restarts, lastExit, lastLines, startedAt, readyAt } = found.value;
  return { state, ready, restarts, lastExit, lastLines, startedAt, readyAt };
}
