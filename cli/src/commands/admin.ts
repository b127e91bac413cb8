import type { Schemas } from "../../../openapi/types.js";
import { ApiClient, path } from "../api.js";
import { type BaseContext, defineCommand, type Group } from "../command.js";
import { ago, table } from "../output.js";
import { CliError } from "../output.js";

/** A builder node as `GET /v1/operator/nodes` lists it. */
type Node = Schemas["Node"];

const ACTIONS = ["list", "cordon", "uncordon", "drain", "lost", "failover", "remove"] as const;
type Action = (typeof ACTIONS)[number];

/** The operator routes take the deployment's OPERATOR_TOKEN, never an API key. */
async function operatorClient(base: BaseContext): Promise<ApiClient> {
  const token = base.env.SVC_OPERATOR_TOKEN;
  if (!token) {
    throw new CliError("no operator token", ["the fleet is the operator's: these commands take the OPERATOR_TOKEN secret, not an API key"], "set SVC_OPERATOR_TOKEN (locally: OPERATOR_TOKEN in .dev.vars)");
  }
  const { apiUrl } = await base.config();
  return new ApiClient({ apiUrl, apiKey: token, keySource: "env", command: base.path });
}

const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(0)} GiB`;

const nodes = defineCommand({
  name: "nodes",
  summary: "The builder nodes of the fleet: list, cordon, uncordon, drain, lost, failover, remove (operator token)",
  description: `Needs SVC_OPERATOR_TOKEN (the deployment's OPERATOR_TOKEN). cordon: no new work is placed on the
node; uncordon: it takes work again; drain: move its disks (app stopped, final snapshot, restored on
another node, app started there) and its apps off it; lost: declare it lost now, as a missed heartbeat
deadline would (its apps start elsewhere); failover: declare it lost and restore its disks on other
nodes from their newest backups now, without the grace period; remove: forget an empty node.`,
  rest: { name: "action [node]", description: `one of ${ACTIONS.join(", ")} (default list), then the node's id or name`, optional: true },
  options: {},
  examples: ["svc admin nodes", "svc admin nodes cordon local-2", "svc admin nodes remove node_4f2…"],
  async run(ctx) {
    const [word = "list", ref, ...extra] = ctx.rest;
    if (!(ACTIONS as readonly string[]).includes(word)) throw ctx.fail(`unknown action "${word}": use ${ACTIONS.join(", ")}`);
    const action = word as Action;
    if (extra.length > 0) throw ctx.fail(`unexpected ${extra.join(" ")}`);
    const api = await operatorClient(ctx);
    const all = await api.json<{ data: Node[] }>("GET", "/v1/operator/nodes", undefined, { what: "list nodes" });
    if (action === "list") {
      const human =
        all.data.length === 0
          ? "No node has joined."
          : table(all.data, [
              ["NAME", (n) => n.name],
              ["ID", (n) => n.id],
              ["STATE", (n) => n.state],
              ["ADDRESS", (n) => n.address],
              ["HEARTBEAT", (n) => ago(n.lastHeartbeatAt)],
              ["JOBS", (n) => String(n.capacity.runningJobs)],
              ["APPS", (n) => String(n.capacity.processes)],
              ["DISKS", (n) => String(n.disks.length)],
              ["DISK FREE", (n) => `${gib(n.capacity.diskFreeBytes)} of ${gib(n.capacity.diskTotalBytes)}`],
              ["QUARANTINED", (n) => String(n.quarantined.length)],
              ["PID", (n) => (n.pid === null ? "-" : String(n.pid))],
            ]);
      ctx.out.result(all.data, human);
      return;
    }
    if (!ref) throw ctx.fail(`name the node to ${action}: svc admin nodes ${action} <node>`);
    const node = all.data.find((n) => n.id === ref || n.name === ref);
    if (!node) throw new CliError(`no node ${ref}`, [`nodes: ${all.data.map((n) => n.name).join(", ") || "none"}`], "svc admin nodes");
    if (action === "remove") {
      await api.request("DELETE", path`/v1/operator/nodes/${node.id}`, undefined, { what: `remove node ${node.name}` });
      ctx.out.result({ id: node.id, removed: true }, `Removed node ${node.name} (${node.id})`);
      return;
    }
    const changed = await api.json<{ data: Node }>("POST", path`/v1/operator/nodes/${node.id}/${action}`, {}, { what: `${action} node ${node.name}` });
    ctx.out.result(changed.data, `Node ${changed.data.name} is ${changed.data.state}`);
  },
});

export const admin: Group = { name: "admin", summary: "Operate the platform itself (the fleet of builder nodes)", commands: [nodes] };
