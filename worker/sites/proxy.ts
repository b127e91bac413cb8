import { HEADER_APPS_DOMAIN, HEADER_PROXY_ERROR, MAX_PROXY_BODY_BYTES, signProxy } from "../../builder/src/protocol/processes";
import type { Config } from "../env";
import { type NodeRef, signingKey } from "../lib/builder-client";

/** An app that runs, as the edge knows it: the process serving it and its node (apps.live_*, the node from the fleet). */
export type ProcessTarget = { processId: string; node: NodeRef };

/**
 * Headers a client may not send on to an app: ours; hop-by-hop ones the fetch
 * to the node sets itself; `Expect` (the edge answers it: a 100 Continue is
 * not the app's answer); and every header that claims the client's address or
 * where the request was meant to go, which only the edge may say (a client's
 * `Forwarded`, `X-Real-IP`, `True-Client-IP`… would otherwise reach the app
 * as if a proxy had vouched for them).
 */
const DROPPED =
  /^(x-svc-|x-forwarded|cf-|forwarded$|via$|x-real-ip$|true-client-ip$|x-client-ip$|x-cluster-client-ip$|client-ip$|fastly-client-ip$|x-originating-ip$|x-remote-ip$|x-remote-addr$|x-proxyuser-ip$|wl-proxy-client-ip$|x-original-url$|x-rewrite-url$|x-original-host$|x-host$|connection$|keep-alive$|proxy-|te$|trailer$|transfer-encoding$|expect$)/i;

/**
 * The request for the node: `ANY /v1/proxy/<process>/<path>?<query>`, signed
 * (protocol/processes.ts, "Proxied traffic"), with the client's body streamed through
 * and X-Forwarded-* set by the edge alone (a client's own are dropped): the
 * client's address only where the edge knows it (CLIENT_IP_HEADER, set by
 * Cloudflare in production; locally a client could send any value there).
 */
async function forwarded(request: Request, config: Config, target: ProcessTarget): Promise<Request> {
  const url = new URL(request.url);
  const headers = new Headers();
  for (const [name, value] of request.headers) if (!DROPPED.test(name) || /^upgrade$/i.test(name)) headers.set(name, value);
  if (/^websocket$/i.test(request.headers.get("Upgrade") ?? "")) headers.set("Upgrade", "websocket");
  headers.set("X-Forwarded-Host", request.headers.get("Host") ?? url.host);
  headers.set("X-Forwarded-Proto", url.protocol.replace(/:$/, ""));
  const client = config.CLIENT_IP_HEADER ? request.headers.get(config.CLIENT_IP_HEADER) : null;
  if (client) headers.set("X-Forwarded-For", client);
  headers.set(HEADER_APPS_DOMAIN, config.APPS_DOMAIN.replace(/:\d+$/, ""));
  for (const [name, value] of Object.entries(await proxySignature(config, target))) headers.set(name, value);
  const bodyless = request.method === "GET" || request.method === "HEAD";
  return new Request(new URL(`/v1/proxy/${target.processId}${url.pathname}${url.search}`, target.node.address), {
    method: request.method,
    headers,
    body: bodyless ? null : request.body,
    redirect: "manual",
  });
}

/** The proxy headers of this second, per process on its node (the node's key and the HMAC are computed once a second). */
const signatures = new Map<string, { second: number; headers: Record<string, string> }>();
/** Entries kept at most (each one is a process this isolate proxied to within the last second or so). */
const MAX_SIGNATURES = 1_000;

async function proxySignature(config: Config, target: ProcessTarget): Promise<Record<string, string>> {
  const second = Math.floor(Date.now() / 1000);
  const key = `${target.node.id}/${target.processId}`;
  const known = signatures.get(key);
  if (known?.second === second) return known.headers;
  const headers = await signProxy(await signingKey(config, target.node.id), target.processId, second);
  if (signatures.size >= MAX_SIGNATURES) signatures.clear();
  signatures.set(key, { second, headers });
  return headers;
}

/** Requests this isolate has sent to each process and not yet had an answer's head for (least outstanding first). */
const outstanding = new Map<string, number>();
/** Processes whose node could not be reached or no longer had them, until when they are tried last (per isolate). */
const failing = new Map<string, number>();
/** How long a process that failed a request is tried after the others. */
const FAILING_MS = 5_000;
/** Entries kept at most (a flood of failures cannot grow the map without bound). */
const MAX_FAILING = 1_000;

/**
 * The app's processes in the order to try them: those whose node is lost
 * left out, then the fewest requests outstanding from this isolate first
 * (ties in random order), a process that just failed last.
 */
function balance(targets: ProcessTarget[], now = Date.now()): ProcessTarget[] {
  const usable = targets.filter((target) => target.node.sick?.state !== "lost");
  const late = (target: ProcessTarget) => ((failing.get(target.processId) ?? 0) > now ? 1 : 0);
  return usable
    .map((target) => ({ target, key: late(target) * 1e9 + (outstanding.get(target.processId) ?? 0) + Math.random() / 2 }))
    .sort((a, b) => a.key - b.key)
    .map((entry) => entry.target);
}

/**
 * Forwards one request of an app that runs to one of the processes serving
 * it (in {@link balance}'s order), and the answer back as it comes (streamed
 * responses, server-sent events and WebSocket upgrades pass through). A
 * request without a body whose process's node could not be reached, no
 * longer has the process (it was replaced and drained) or had no room for it
 * is tried on the next process; with none left, the edge asks for the app's
 * processes once more (`lookUpAgain`) and tries a new one. With none to try,
 * the answer is `starting()` (503 with Retry-After), never the node's 404.
 */
export async function proxyToProcess(
  request: Request,
  config: Config,
  targets: ProcessTarget[],
  starting: () => Response,
  lookUpAgain: () => Promise<ProcessTarget[]>,
): Promise<Response> {
  const length = Number(request.headers.get("Content-Length") ?? 0);
  if (length > MAX_PROXY_BODY_BYTES) return plain(413, `request bodies are limited to ${MAX_PROXY_BODY_BYTES} bytes`);
  const order = balance(targets);
  // A lost node is not waited for: its app is started elsewhere meanwhile. One merely unreachable (it missed a
  // call's deadline) is still tried: a node busy under an app's log spam can miss one, and its apps must not fail for it.
  if (order.length === 0) return plain(503, "The app's node is lost; the app is being started elsewhere; try again in a moment", { "Retry-After": "5" });
  const again = request.method === "GET" || request.method === "HEAD";
  const tried = new Set<string>();
  let response: Response | null = null;
  for (let next: ProcessTarget | undefined = order[0]; next; ) {
    tried.add(next.processId);
    await response?.body?.cancel();
    response = await send(request, config, next);
    if (!again || !retryable(response)) break;
    if (failing.size >= MAX_FAILING) failing.clear();
    failing.set(next.processId, Date.now() + FAILING_MS);
    next = order.find((target) => !tried.has(target.processId));
    // The processes this edge knew were all tried and the last is gone: the app's current ones (a deploy or a
    // restart replaced it). Not for a node merely unreachable or full: D1 would name the same processes.
    const gone = response.headers.get(HEADER_PROXY_ERROR) === "PROCESS_NOT_FOUND";
    if (!next && gone && tried.size === order.length) next = balance(await lookUpAgain()).find((target) => !tried.has(target.processId));
  }
  if (response!.headers.get(HEADER_PROXY_ERROR) === "PROCESS_NOT_FOUND") {
    await response!.body?.cancel();
    return starting();
  }
  if (response!.webSocket) return response!;
  const out = new Response(response!.body, response!);
  out.headers.delete(HEADER_PROXY_ERROR);
  out.headers.delete(HEADER_UNREACHABLE);
  // A body of unknown length is a stream (chunks, events): the edge's compressor would hold it back.
  if (!out.headers.has("Content-Length") && !out.headers.has("Content-Encoding") && response!.body) out.headers.set("Content-Encoding", "identity");
  return out;
}

/** An answer the app never saw: its node could not be reached, no longer had the process, or had no room for the request. */
function retryable(response: Response): boolean {
  if (response.headers.get(HEADER_UNREACHABLE) !== null) return true;
  const code = response.headers.get(HEADER_PROXY_ERROR);
  return code === "PROCESS_NOT_FOUND" || code === "UNAVAILABLE";
}

/** Marks the edge's own answer for a node it could not reach (never sent on to the client). */
const HEADER_UNREACHABLE = "X-Svc-Edge-Unreachable";

async function send(request: Request, config: Config, target: ProcessTarget): Promise<Response> {
  outstanding.set(target.processId, (outstanding.get(target.processId) ?? 0) + 1);
  try {
    return await fetch(await forwarded(request, config, target));
  } catch (err) {
    console.error(JSON.stringify({ event: "proxy.unreachable", node: target.node.id, error: err instanceof Error ? err.message : String(err) }));
    return plain(502, "The app's node could not be reached; try again in a moment", { [HEADER_UNREACHABLE]: "1" });
  } finally {
    const left = (outstanding.get(target.processId) ?? 1) - 1;
    if (left > 0) outstanding.set(target.processId, left);
    else outstanding.delete(target.processId);
  }
}

function plain(status: number, text: string, headers: Record<string, string> = {}): Response {
  return new Response(`${text}\n`, { status, headers: { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store", ...headers } });
}
