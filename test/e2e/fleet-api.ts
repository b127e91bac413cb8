import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { LocalNode, LocalStack } from "../../scripts/local-stack.js";

export type Json = Record<string, unknown>;
export type NodeView = {
  id: string;
  name: string;
  state: string;
  disks: string[];
  quarantined: { diskId: string; name: string }[];
  unreachable: { since: string; reason: string } | null;
};
export type DiskView = { id: string; name: string; status: string; placement: string | null };
export type Run = { jobName: string; status: string; error: string | null };

/** Waits until `probe` answers something truthy (errors count as not yet), or fails naming `what`. */
export async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe().catch(() => null);
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

/**
 * The API calls the fleet suites make against a stack of several nodes
 * (`npm start -- --nodes 3`'s kind), as its admin (or another key).
 */
export function fleetApi(stack: LocalStack & { stateDir: string }) {
  /** One API call: its status, its `data` (or the whole body when there is none) and its headers. */
  const call = async <T = Json>(method: string, path: string, body?: unknown, token = stack.adminKey): Promise<{ status: number; data: T; headers: Headers }> => {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed: { data?: T } = {};
    try {
      parsed = text ? (JSON.parse(text) as { data?: T }) : {};
    } catch {
      throw new Error(`${method} ${path}: ${res.status} ${text}`);
    }
    return { status: res.status, data: (parsed.data ?? parsed) as T, headers: res.headers };
  };
  const ok = async <T = Json>(method: string, path: string, body?: unknown, token?: string): Promise<T> => {
    const res = await call<T>(method, path, body, token);
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.data)}`);
    return res.data;
  };
  const operator = () => stack.secrets.OPERATOR_TOKEN;
  /** Starts a manual run; with `wait`, resolves to its end and its log. */
  const run = async (cronId: string, wait = true, token?: string): Promise<Run & { log: string }> => {
    // A client told to wait (the account's queue is full, the key's rate, or no node answering now) waits and asks again.
    let attempt = await call<Run>("POST", `/v1/crons/${cronId}/run`, {}, token);
    for (let tries = 0; (attempt.status === 429 || attempt.status === 503) && tries < 120; tries++) {
      await sleep(500);
      attempt = await call<Run>("POST", `/v1/crons/${cronId}/run`, {}, token);
    }
    if (attempt.status >= 300) throw new Error(`POST /v1/crons/${cronId}/run: ${attempt.status} ${JSON.stringify(attempt.data)}`);
    const started = attempt.data;
    if (!wait) return { ...started, log: "" };
    const ended = await until(`run ${started.jobName}`, async () => {
      const runs = await ok<Run[]>("GET", `/v1/crons/${cronId}/runs`, undefined, token);
      const found = runs.find((r) => r.jobName === started.jobName);
      return found && found.status !== "running" ? found : null;
    });
    const res = await fetch(`${stack.apiUrl}/v1/crons/${cronId}/runs/${started.jobName}/logs`, { headers: { Authorization: `Bearer ${token ?? stack.adminKey}` } });
    return { ...ended, log: await res.text() };
  };
  return {
    call,
    ok,
    operator,
    run,
    nodesNow: () => ok<NodeView[]>("GET", "/v1/operator/nodes", undefined, operator()),
    /** The node whose data directory holds the disk's copy. */
    holder: (diskId: string): LocalNode | undefined => stack.nodes.find((node) => existsSync(join(node.dataDir, "disks", diskId, "disk.json"))),
    newApp: (name: string, runtime = "static", token?: string) => ok<{ id: string }>("POST", "/v1/apps", { name, runtime, memoryMb: 256 }, token),
    newCron: (appId: string, name: string, command: string, token?: string) =>
      ok<{ id: string }>("POST", "/v1/crons", { appId, name, schedule: "0 0 1 1 *", command, concurrencyPolicy: "allow", timeoutSeconds: 300 }, token),
    jobsOn: async (node: LocalNode) => (await readdir(join(node.dataDir, "jobs")).catch(() => [])).length,
    diskInfo: (name: string) => ok<DiskView>("GET", `/v1/disks/${name}`),
    /** The Worker's log lines about the fleet, disks, apps, nodes and errors (for a failed test). */
    showLog: async () => {
      const log = await readFile(join(stack.stateDir, "wrangler.log"), "utf8").catch(() => "");
      const lines = log.split("\n").filter((l) => /fleet|disk\.|node\.|app\.|error|Error|restart|crash|exited/i.test(l));
      console.log(`wrangler.log (fleet, disk, app, node, error and restart lines):\n${lines.slice(-80).join("\n")}`);
      // What each node said of shipping its apps' logs and of its callbacks (a log that did not outlive its node).
      for (const node of stack.nodes) {
        const text = node.logFile ? await readFile(node.logFile, "utf8").catch(() => "") : "";
        const said = text.split("\n").filter((l) => /log shipment|shipping app logs|shipped the first lines|callback|failed|error|native proxy/i.test(l));
        console.log(`${node.name}'s log (shipping, callback, error and native proxy lines):\n${said.slice(-30).join("\n")}`);
      }
    },
  };
}
