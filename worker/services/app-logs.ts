import { LOG_LIMIT_BYTES, parseAppLogLine } from "../../builder/src/protocol";
import type { Env } from "../env";

/**
 * Runtime logs shipped off the nodes as they are written
 * (builder/src/processes/log-shipper.ts), kept per app in R2 so the log
 * outlives the node that wrote it: `app-logs/<app>/<ms>-<node>-<n>`, one
 * object per shipment, oldest dropped past {@link LOG_LIMIT_BYTES} per app
 * (what a node keeps of an app's log, too). The live node's own log stays
 * where lines are read first (it has them all, at once); what other nodes
 * wrote comes from here (docs/fleet.md, "Logs that outlive their node").
 */

const PREFIX = "app-logs/";
let sequence = 0;

/** Which part of the history to give: as the node's window (`since` ms, the last `lines`, the last `tail` bytes), one process's lines. */
export type HistoryWindow = ({ since: number } | { lines: number } | { tail: number }) & { process?: string };

/** Keeps a shipment of `appId`'s runtime log from `nodeId`, then drops the oldest past the bound. */
export async function keepShipped(env: Env, appId: string, nodeId: string, text: string, now = Date.now()): Promise<void> {
  sequence = (sequence + 1) % 1_000_000;
  const key = `${PREFIX}${appId}/${String(now).padStart(13, "0")}-${nodeId}-${String(sequence).padStart(6, "0")}`;
  await env.BUCKET.put(key, text, { httpMetadata: { contentType: "text/plain; charset=utf-8" } });
  const objects = await shipments(env, appId);
  let total = objects.reduce((sum, object) => sum + object.size, 0);
  const drop: string[] = [];
  for (const object of objects) {
    if (total <= LOG_LIMIT_BYTES) break;
    drop.push(object.key);
    total -= object.size;
  }
  if (drop.length > 0) await env.BUCKET.delete(drop);
}

/** Deletes an app's shipped log (the app is gone). */
export async function dropShipped(env: Env, appId: string): Promise<void> {
  const objects = await shipments(env, appId);
  for (let i = 0; i < objects.length; i += 1000) await env.BUCKET.delete(objects.slice(i, i + 1000).map((object) => object.key));
}

/**
 * The lines nodes other than `exceptNode` shipped (all of them when null:
 * the app's node is not answering), oldest first, with a `svc` line where
 * the writing node changes, cut to `window`; `nodeName` names nodes in those
 * lines. Also which node wrote the last of them (null: none).
 */
export async function shippedHistory(
  env: Env,
  appId: string,
  exceptNode: string | null,
  window: HistoryWindow,
  nodeName: (id: string) => string,
): Promise<{ text: string; lastNode: string | null }> {
  const objects = (await shipments(env, appId)).filter((object) => nodeOf(object.key) !== exceptNode);
  const lines: string[] = [];
  let lastNode: string | null = null;
  for (const object of objects) {
    const body = await env.BUCKET.get(object.key);
    if (!body) continue;
    const node = nodeOf(object.key);
    const chunk = (await body.text()).split("\n").filter((line) => line !== "");
    if (lastNode !== null && node !== lastNode && chunk[0]) {
      lines.push(`${chunk[0].slice(0, 24)} svc -/fleet the app moved from node ${nodeName(lastNode)} to node ${nodeName(node)}`);
    }
    lastNode = node;
    for (const line of chunk) if (!window.process || parseAppLogLine(line)?.process === window.process) lines.push(line);
  }
  return { text: windowed(lines, window), lastNode };
}

function windowed(lines: string[], window: HistoryWindow): string {
  let kept = lines;
  if ("since" in window) kept = lines.filter((line) => Date.parse(line.slice(0, 24)) >= window.since);
  else if ("lines" in window) kept = window.lines === 0 ? [] : lines.slice(-window.lines);
  else {
    let bytes = 0;
    let first = lines.length;
    while (first > 0 && bytes + lines[first - 1]!.length + 1 <= window.tail) bytes += lines[--first]!.length + 1;
    kept = lines.slice(first);
  }
  return kept.map((line) => `${line}\n`).join("");
}

function nodeOf(key: string): string {
  return key.slice(key.lastIndexOf("/") + 1).split("-")[1] ?? "";
}

async function shipments(env: Env, appId: string): Promise<{ key: string; size: number }[]> {
  const objects: { key: string; size: number }[] = [];
  let cursor: string | undefined;
  do {
    const page = await env.BUCKET.list({ prefix: `${PREFIX}${appId}/`, ...(cursor ? { cursor } : {}) });
    for (const object of page.objects) objects.push({ key: object.key, size: object.size });
    cursor = page.truncated ? page.cursor : undefined;
  } while (cursor);
  return objects.sort((a, b) => (a.key < b.key ? -1 : 1));
}
