import type { Config } from "../env";

/**
 * Where work runs: the one place the control plane decides it (DESIGN §10).
 * Nodes never choose. Everything that touches a disk goes to the node that
 * holds the disk; stateless work (builds, runs and processes of apps without
 * a disk) goes to the least loaded ready node.
 *
 * Today the data plane is the one builder at BUILDER_URL, so every answer is
 * that node; the fleet (issue 19) makes this function choose among nodes
 * registered in D1, without its callers changing.
 */
export type Placement = { node: string };

/** The node an app's process runs on: its disk's node when it has one, else the least loaded. */
export function placeProcess(config: Config, _app: { diskId: string | null }): Placement {
  return { node: config.BUILDER_URL };
}
