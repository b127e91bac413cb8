import type { Schemas } from "../../../openapi/types.js";
import { ApiClient, path } from "../api.js";
import { type BaseContext, defineCommand, type Group } from "../command.js";
import { ago, CliError, fields, table, when } from "../output.js";
import { durationSeconds, positiveInteger } from "../parse.js";

/** A builder node as `GET /v1/operator/nodes` lists it. */
type Node = Schemas["Node"];
type JoinToken = Schemas["JoinToken"];

const ACTIONS = ["list", "cordon", "uncordon", "drain", "lost", "failover", "remove", "cap", "token", "tokens", "revoke"] as const;
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

const capOptions = {
  "max-cores": { type: "string", value: "n|default", description: "token, cap: the most cores the node is believed to have" },
  "max-memory-mb": { type: "string", value: "n|default", description: "token, cap: the most memory (MiB) the node is believed to have" },
  "max-disk-gb": { type: "string", value: "n|default", description: "token, cap: the most disk (GiB) the node is believed to have" },
} as const;

const nodes = defineCommand({
  name: "nodes",
  summary: "The builder nodes of the fleet: list, cordon, uncordon, drain, lost, failover, remove, cap; join tokens (operator token)",
  description: `Needs SVC_OPERATOR_TOKEN (the deployment's OPERATOR_TOKEN). cordon: no new work is placed on the
node; uncordon: it takes work again; drain: move its disks (app stopped, final snapshot, restored on
another node, app started there) and its apps off it; lost: declare it lost now, as a missed heartbeat
deadline would (its apps start elsewhere); failover: declare it lost and restore its disks on other
nodes from their newest backups now, without the grace period; remove: forget an empty node;
cap: change the most it is believed to have (--max-cores, --max-memory-mb, --max-disk-gb; "default"
goes back to the fleet's NODE_MAX_*), whatever it reports.
token: mint a join token for new nodes (shown once; start a node with BUILDER_JOIN_TOKEN=<token>): one
join by default (--uses), valid for an hour (--ttl), with the caps the new nodes get; a token only
ever admits new nodes, never an existing one. tokens: list those still usable; revoke <id>: end one.`,
  rest: { name: "action [node]", description: `one of ${ACTIONS.join(", ")} (default list), then the node's id or name (a token's id for revoke)`, optional: true },
  options: {
    ...capOptions,
    uses: { type: "string", value: "n", description: "token: how many nodes it may admit (default 1, at most 100)" },
    ttl: { type: "string", value: "duration", description: "token: how long it stays valid, e.g. 15m, 1h, 7d (default 1h)" },
    note: { type: "string", value: "text", description: "token: what it is for, shown in the list" },
  },
  examples: [
    "svc admin nodes",
    "svc admin nodes cordon local-2",
    "svc admin nodes token --max-disk-gb 500 --note node-4",
    "svc admin nodes cap node-4 --max-disk-gb 1000",
    "svc admin nodes remove node_4f2…",
  ],
  async run(ctx) {
    const [word = "list", ref, ...extra] = ctx.rest;
    if (!(ACTIONS as readonly string[]).includes(word)) throw ctx.fail(`unknown action "${word}": use ${ACTIONS.join(", ")}`);
    const action = word as Action;
    if (extra.length > 0 || ((action === "token" || action === "tokens" || action === "list") && ref !== undefined)) {
      throw ctx.fail(`unexpected ${[...(action === "token" || action === "tokens" || action === "list" ? [ref] : []), ...extra].join(" ")}`);
    }
    /** A cap flag: a whole number, "default" (null: the fleet's default), or absent. */
    const cap = (flag: keyof typeof capOptions): number | null | undefined => {
      const value = ctx.opts[flag];
      if (value === undefined) return undefined;
      return value === "default" ? null : positiveInteger(value, `--${flag}`, ctx.fail);
    };
    const caps = { maxCores: cap("max-cores"), maxMemoryMb: cap("max-memory-mb"), maxDiskGb: cap("max-disk-gb") };
    const api = await operatorClient(ctx);
    if (action === "token") {
      const body = {
        ...Object.fromEntries(Object.entries(caps).filter(([, value]) => value !== undefined)),
        ...(ctx.opts.uses === undefined ? {} : { uses: positiveInteger(ctx.opts.uses, "--uses", ctx.fail) }),
        ...(ctx.opts.ttl === undefined ? {} : { ttlSeconds: durationSeconds(ctx.opts.ttl, "--ttl", ctx.fail) }),
        ...(ctx.opts.note === undefined ? {} : { note: ctx.opts.note }),
      };
      const minted = await api.json<{ data: JoinToken & { token: string } }>("POST", "/v1/operator/join-tokens", body, { what: "mint a join token" });
      const t = minted.data;
      ctx.out.result(
        t,
        `${fields([
          ["Token", t.token],
          ["Id", t.id],
          ["Joins", String(t.usesLeft)],
          ["Expires", when(t.expiresAt)],
          ["Caps", capsText(t)],
        ])}\nShown once. Start a new node with BUILDER_JOIN_TOKEN=<token> and BUILDER_CONTROL_URL (docs/fleet.md).`,
      );
      return;
    }
    if (action === "tokens") {
      const listed = await api.json<{ data: JoinToken[] }>("GET", "/v1/operator/join-tokens", undefined, { what: "list join tokens" });
      const human =
        listed.data.length === 0
          ? "No usable join token. Mint one with: svc admin nodes token"
          : table(listed.data, [
              ["ID", (t) => t.id],
              ["JOINS LEFT", (t) => String(t.usesLeft)],
              ["EXPIRES", (t) => when(t.expiresAt)],
              ["CAPS", (t) => capsText(t)],
              ["NOTE", (t) => t.note ?? "-"],
            ]);
      ctx.out.result(listed.data, human);
      return;
    }
    if (action === "revoke") {
      if (!ref) throw ctx.fail("name the token to revoke: svc admin nodes revoke <token id> (svc admin nodes tokens lists them)");
      await api.request("DELETE", path`/v1/operator/join-tokens/${ref}`, undefined, { what: `revoke join token ${ref}` });
      ctx.out.result({ id: ref, revoked: true }, `Revoked join token ${ref}; nodes it admitted stay members`);
      return;
    }
    const all = await api.json<{ data: Node[] }>("GET", "/v1/operator/nodes", undefined, { what: "list nodes" });
    if (action === "list") {
      const human =
        all.data.length === 0
          ? "No node has joined. Mint a join token with: svc admin nodes token"
          : table(all.data, [
              ["NAME", (n) => n.name],
              ["ID", (n) => n.id],
              ["STATE", (n) => (n.unreachable ? `${n.state}, unreachable ${ago(n.unreachable.since)}` : n.state)],
              ["ADDRESS", (n) => n.address],
              ["HEARTBEAT", (n) => ago(n.lastHeartbeatAt)],
              ["JOBS", (n) => String(n.capacity.runningJobs)],
              ["APPS", (n) => String(n.capacity.processes)],
              ["DISKS", (n) => String(n.disks.length)],
              ["DISK FREE", (n) => `${gib(n.capacity.diskFreeBytes)} of ${gib(n.capacity.diskTotalBytes)}${n.claimed ? ` (claims ${gib(n.claimed.diskTotalBytes)}: capped)` : ""}`],
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
    if (action === "cap") {
      const body = Object.fromEntries(Object.entries(caps).filter(([, value]) => value !== undefined));
      if (Object.keys(body).length === 0) throw ctx.fail("say which cap to change: --max-cores, --max-memory-mb or --max-disk-gb (a number, or default)");
      const changed = await api.json<{ data: Node }>("PATCH", path`/v1/operator/nodes/${node.id}`, body, { what: `cap node ${node.name}` });
      const c = changed.data.caps;
      ctx.out.result(changed.data, `Node ${changed.data.name} is believed to have at most ${c.cores} cores, ${c.memoryMb} MiB of memory and ${gib(c.diskBytes)} of disk`);
      return;
    }
    const changed = await api.json<{ data: Node }>("POST", path`/v1/operator/nodes/${node.id}/${action}`, {}, { what: `${action} node ${node.name}` });
    ctx.out.result(changed.data, `Node ${changed.data.name} is ${changed.data.state}`);
  },
});

function capsText(t: Pick<JoinToken, "maxCores" | "maxMemoryMb" | "maxDiskGb">): string {
  const parts = [
    t.maxCores !== null && `${t.maxCores} cores`,
    t.maxMemoryMb !== null && `${t.maxMemoryMb} MiB`,
    t.maxDiskGb !== null && `${t.maxDiskGb} GiB disk`,
  ].filter(Boolean);
  return parts.length > 0 ? parts.join(", ") : "fleet defaults";
}

export const admin: Group = { name: "admin", summary: "Operate the platform itself (the fleet of builder nodes)", commands: [nodes] };
