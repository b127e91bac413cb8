/**
 * The node's half of an app's traffic: `ANY /v1/proxy/<processId>/<path>`,
 * which the Worker forwards `<app>.<APPS_DOMAIN>` requests to, passed on to
 * the process's sandbox at `<address>:<port>` on the run network (nothing else
 * reaches that port: see network.ts).
 *
 * - Authenticated by the proxy headers (protocol/processes.ts, verifyProxy): the body is
 *   the visitor's, streamed, so it is not signed. A signature already verified
 *   for the same process and second is recognised by a constant-time compare
 *   with the remembered one, so a busy app costs one HMAC per second, not one
 *   per request.
 * - Streamed both ways, never buffered: request bodies (at most
 *   MAX_PROXY_BODY_BYTES, else 413) flow to the app as they arrive; a response
 *   without a length (chunked, server-sent events) has its headers sent at
 *   once and each chunk passed on as it comes. No compression is added.
 * - `Host` becomes the app's own host (X-Forwarded-Host); X-Forwarded-For,
 *   -Proto and -Host pass as the Worker set them; every `X-Svc-*` header and
 *   every hop-by-hop header (and those named in `Connection`) is dropped,
 *   both ways.
 * - One keep-alive agent per instance: connections to the app are reused
 *   (the throughput target is half of connecting to the app directly, or better).
 * - A WebSocket (any `Connection: Upgrade`) is a byte stream both ways after
 *   the request head is written to a fresh connection to the app.
 *
 * - A cookie the app sets for the apps domain, a parent of it, or another
 *   app's host (`Set-Cookie: …; Domain=…`) is dropped, with a line in the
 *   app's runtime log: every app's visitors would send it (the apps domain is
 *   not on the Public Suffix List locally). A cookie without Domain, or for the
 *   request's own host, passes.
 * - Fair shares ({@link NODE_SHARE}): one process, and one account over all
 *   its processes here, has at most so many requests in flight and WebSockets
 *   open; past them the node answers 503 with Retry-After at once, so one
 *   account's flood cannot take every connection of the node.
 *
 * Answers of its own, as JSON errors (BuilderError): 401 bad signature, 404
 * PROCESS_NOT_FOUND (unknown or stopped process: the edge looks the app's
 * process up again), 503 UNAVAILABLE (not ready within a few seconds, failed,
 * a worker, or past its share), 502 UNAVAILABLE (the app did not answer), 413
 * PAYLOAD_TOO_LARGE. A request for an instance that dies under it (a
 * connection refused before its body went out) waits for the restart like
 * one that arrived during it.
 */
import { timingSafeEqual } from "node:crypto";
import { type ClientRequest, type IncomingMessage, type OutgoingHttpHeaders, STATUS_CODES, type ServerResponse, request as httpRequest } from "node:http";
import { type Socket, connect } from "node:net";
import type { Duplex } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { HEADER_APPS_DOMAIN, HEADER_PROXY_ERROR, HEADER_PROXY_SIGNATURE, HEADER_PROXY_TIMESTAMP, MAX_PROXY_BODY_BYTES, type ProcessState, verifyProxy } from "../protocol/processes.js";
import type { BuilderError, BuilderErrorCode } from "../protocol/shared.js";
import { SIGNATURE_WINDOW_SECONDS } from "../protocol/signing.js";
import type { Route } from "./supervisor.js";

/** Path prefix of proxied traffic. */
export const PROXY_PREFIX = "/v1/proxy/";
/** How long a request for a process that is (re)starting waits for it to become ready. */
export const PROXY_READY_WAIT_MS = 5_000;
const VERIFIED_CACHE_LIMIT = 10_000;
const PROXY_TIMESTAMP = HEADER_PROXY_TIMESTAMP.toLowerCase();
const PROXY_SIGNATURE = HEADER_PROXY_SIGNATURE.toLowerCase();
const SIGNATURE_HEX = /^[0-9a-fA-F]{64}$/;
/** Answers up to this size (with a length) are gathered and sent in one write. */
const SMALL_BODY_BYTES = 16 * 1024;
/** Attempts of one request at most (connections refused while an instance dies, stale kept-alive connections). */
const MAX_ATTEMPTS = 20;
/** Between attempts at an instance that refused a connection but is not yet known to be gone. */
const RETRY_PAUSE_MS = 25;

/** Headers that describe one connection, not the message: never forwarded (RFC 9110 §7.6.1), plus Expect, which the node answers itself. */
export const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "expect",
  "http2-settings",
]);

/** What one process, and one account over its processes on this node, may have at once. */
export const NODE_SHARE = {
  requestsPerProcess: 512,
  requestsPerTenant: 1_024,
  upgradesPerProcess: 500,
  upgradesPerTenant: 1_000,
  retryAfterSeconds: 1,
} as const;

const APPS_DOMAIN = HEADER_APPS_DOMAIN.toLowerCase();

/** What the proxy needs of a process. */
export interface ProxiedProcess {
  readonly id: string;
  readonly spec: { tenant: string };
  route(): Route;
  status(): { state: ProcessState };
  /** Writes a line about the process into its app's runtime log. */
  note(text: string): void;
}

/** What the proxy needs from the node. */
export interface ProxyOptions {
  secret: string;
  /** The process with this id, or undefined when the node has none. */
  lookup(id: string): ProxiedProcess | undefined;
}

/** `/v1/proxy/<id>/<rest>?<query>` → the id and the path to send the app (`/<rest>?<query>`); null when malformed. */
export function parseProxyPath(url: string): { id: string; path: string } | null {
  if (!url.startsWith(PROXY_PREFIX)) return null;
  const rest = url.slice(PROXY_PREFIX.length);
  const end = rest.search(/[/?]/);
  const id = end === -1 ? rest : rest.slice(0, end);
  if (id === "" || !/^[A-Za-z0-9_]{1,64}$/.test(id)) return null;
  const tail = end === -1 ? "" : rest.slice(end);
  return { id, path: tail.startsWith("/") ? tail : `/${tail}` };
}

/**
 * The visitor's headers as the app gets them (a flat [name, value, …] list,
 * case and repeats kept): X-Svc-* and hop-by-hop headers gone, Host set to
 * X-Forwarded-Host (else kept), and for an upgrade its Connection/Upgrade.
 */
export function forwardedRequestHeaders(raw: string[], upgrade: boolean): string[] {
  const named = connectionTokens(raw);
  const out: string[] = [];
  let host: string | null = null;
  let forwardedHost: string | null = null;
  let upgradeTo: string | null = null;
  let chunked = false;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!;
    const value = raw[i + 1]!;
    const lower = name.toLowerCase();
    if (lower.startsWith("x-svc-")) continue;
    if (lower === "host") {
      host ??= value;
      continue;
    }
    if (lower === "x-forwarded-host") forwardedHost ??= value;
    if (lower === "upgrade") upgradeTo ??= value;
    if (lower === "transfer-encoding") chunked ||= /chunked/i.test(value);
    if (HOP_BY_HOP.has(lower) || named.has(lower)) continue;
    out.push(name, value);
  }
  const effectiveHost = forwardedHost ?? host;
  if (effectiveHost !== null) out.unshift("Host", effectiveHost);
  if (upgrade && upgradeTo !== null) out.push("Connection", "Upgrade", "Upgrade", upgradeTo);
  // The body keeps its framing: a length is forwarded as it is, a chunked body is re-chunked.
  if (chunked && !upgrade) out.push("Transfer-Encoding", "chunked");
  return out;
}

/**
 * The app's response headers as the visitor gets them: hop-by-hop and X-Svc-*
 * headers gone, and every Set-Cookie that `cookies` refuses (it is told why).
 */
export function forwardedResponseHeaders(raw: string[], cookies?: { appsDomain: string | null; host: string | null; refused(why: string): void }): string[] {
  const named = connectionTokens(raw);
  const out: string[] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (HOP_BY_HOP.has(lower) || named.has(lower) || lower.startsWith("x-svc-")) continue;
    if (cookies && lower === "set-cookie") {
      const why = cookieDomainProblem(raw[i + 1]!, cookies.appsDomain, cookies.host);
      if (why) {
        cookies.refused(why);
        continue;
      }
    }
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

/**
 * Why a Set-Cookie must not reach the visitor, or null when it may: a
 * `Domain` naming the apps domain or a parent of it (every app's visitors
 * would send the cookie), another app's host, or a bare suffix. A cookie
 * without Domain (host-only), or for the request's own host or a custom
 * domain's own parent, passes.
 */
export function cookieDomainProblem(setCookie: string, appsDomain: string | null, host: string | null): string | null {
  let domain: string | null = null;
  for (const attribute of setCookie.split(";").slice(1)) {
    const equals = attribute.indexOf("=");
    if (equals === -1 || attribute.slice(0, equals).trim().toLowerCase() !== "domain") continue;
    // The last Domain attribute wins (RFC 6265 §5.3); a leading dot is ignored.
    domain = attribute.slice(equals + 1).trim().replace(/^\./, "").toLowerCase();
  }
  if (domain === null || domain === "") return null;
  const name = setCookie.slice(0, Math.max(0, setCookie.indexOf("="))).trim().slice(0, 100);
  const ownHost = host?.toLowerCase().replace(/:\d+$/, "") ?? null;
  const apps = appsDomain?.toLowerCase() ?? null;
  if (domain === ownHost) return null;
  const why = (what: string) => `dropped the app's cookie "${name}": its Domain=${domain} ${what}; set it without Domain (it then belongs to ${ownHost ?? "the app's host"} alone)`;
  if (!domain.includes(".")) return why("is a top-level name every site shares");
  if (apps !== null && (domain === apps || apps.endsWith(`.${domain}`))) return why("would reach the visitors of every app on this platform");
  if (apps !== null && domain.endsWith(`.${apps}`)) return why("is another app's host");
  if (ownHost !== null && !ownHost.endsWith(`.${domain}`)) return why("does not cover the app's host, so browsers would refuse it anyway");
  return null;
}

/** Header names listed in Connection (themselves hop-by-hop). */
function connectionTokens(raw: string[]): Set<string> {
  const tokens = new Set<string>();
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() !== "connection") continue;
    for (const token of raw[i + 1]!.split(",")) tokens.add(token.trim().toLowerCase());
  }
  return tokens;
}

/** The JSON body of the node's own answers. */
export function errorBody(code: BuilderErrorCode, message: string): string {
  const body: BuilderError = { error: { code, message } };
  return JSON.stringify(body);
}

function sendError(response: ServerResponse, status: number, code: BuilderErrorCode, message: string): void {
  if (response.headersSent) {
    response.destroy();
    return;
  }
  const text = errorBody(code, message);
  response.writeHead(status, {
    "Content-Type": "application/json; charset=utf-8",
    "Content-Length": Buffer.byteLength(text),
    "Cache-Control": "no-store",
    [HEADER_PROXY_ERROR]: code,
  });
  response.end(text);
}

/** An error answer written straight to an upgrade's socket (there is no ServerResponse there). */
function rawError(socket: Duplex, status: number, code: BuilderErrorCode, message: string, retry = false): void {
  const text = errorBody(code, message);
  const retryAfter = retry ? `Retry-After: ${NODE_SHARE.retryAfterSeconds}\r\n` : "";
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ""}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(text)}\r\n${retryAfter}${HEADER_PROXY_ERROR}: ${code}\r\nConnection: close\r\n\r\n${text}`,
  );
}

/** Counts held per process and per tenant, each bounded. */
class Shares {
  readonly #byProcess = new Map<string, number>();
  readonly #byTenant = new Map<string, number>();

  constructor(
    readonly perProcess: number,
    readonly perTenant: number,
  ) {}

  /** Takes one for `id` of `tenant`: the function that gives it back, or which holder is full ("the app has 512"). */
  take(id: string, tenant: string): (() => void) | string {
    const held = this.#byProcess.get(id) ?? 0;
    const tenantHeld = this.#byTenant.get(tenant) ?? 0;
    if (held >= this.perProcess) return `the app has ${held}`;
    if (tenantHeld >= this.perTenant) return `the app's account has ${tenantHeld}`;
    this.#byProcess.set(id, held + 1);
    this.#byTenant.set(tenant, tenantHeld + 1);
    let given = false;
    return () => {
      if (given) return;
      given = true;
      const left = (this.#byProcess.get(id) ?? 1) - 1;
      if (left > 0) this.#byProcess.set(id, left);
      else this.#byProcess.delete(id);
      const tenantLeft = (this.#byTenant.get(tenant) ?? 1) - 1;
      if (tenantLeft > 0) this.#byTenant.set(tenant, tenantLeft);
      else this.#byTenant.delete(tenant);
    };
  }
}

/** Where a request for a process goes, after waiting a little for one that is (re)starting. */
type Resolution = { ok: true; route: ReadyRoute } | { ok: false; status: number; code: BuilderErrorCode; message: string };

type ReadyRoute = Extract<Route, { kind: "ready" }>;

/** One proxied request on its way, across attempts. */
interface Exchange {
  request: IncomingMessage;
  response: ServerResponse;
  id: string;
  path: string;
  hasBody: boolean;
  /** Once the body started flowing to an attempt, no other attempt is possible. */
  bodySent: boolean;
  attempts: number;
  /** Until when it may wait for a ready instance. */
  deadline: number;
  /** The domain apps are served under ({@link HEADER_APPS_DOMAIN}), for the cookies the app sets. */
  appsDomain: string | null;
}

export class AppProxy {
  readonly #options: ProxyOptions;
  /** `<id>\n<timestamp>` → the signature verified for it, and until when it may be used. */
  readonly #verified = new Map<string, { signature: Buffer; until: number }>();
  /** Requests in flight and WebSockets open, per process and per tenant ({@link NODE_SHARE}). */
  readonly #requests = new Shares(NODE_SHARE.requestsPerProcess, NODE_SHARE.requestsPerTenant);
  readonly #upgrades = new Shares(NODE_SHARE.upgradesPerProcess, NODE_SHARE.upgradesPerTenant);

  constructor(options: ProxyOptions) {
    this.#options = options;
  }

  /**
   * Proxies one request (the builder's own body reading and signing are not
   * involved). The common case (a signature already seen, a ready process)
   * runs without a single await.
   */
  handle(request: IncomingMessage, response: ServerResponse) {
    const target = parseProxyPath(request.url ?? "");
    if (!target) return sendError(response, 404, "PROCESS_NOT_FOUND", "proxied paths are /v1/proxy/<processId>/<path>");
    const known = this.#knownSignature(target.id, request);
    if (known === false) return sendError(response, 401, "UNAUTHORIZED", "missing or invalid proxy signature");
    if (known === true) return this.#admit(target, request, response);
    this.#verify(target.id, request).then(
      (valid) => (valid ? this.#admit(target, request, response) : sendError(response, 401, "UNAUTHORIZED", "missing or invalid proxy signature")),
      () => sendError(response, 500, "INTERNAL", "internal error"),
    );
  }

  /**
   * A request the node's native proxy authenticated and rewrote, then found
   * the process's instance gone (native-proxy.ts): its path is already the
   * app's, its `X-Svc-*` headers are gone (the apps domain comes with it).
   * It waits for the next instance as any request does.
   */
  handleHeld(held: { id: string; appsDomain: string | null }, request: IncomingMessage, response: ServerResponse): void {
    const path = request.url ?? "/";
    this.#admit({ id: held.id, path: path.startsWith("/") ? path : `/${path}` }, request, response, held.appsDomain);
  }

  /** Passes a WebSocket (or any upgrade) through: the request head to a new connection to the app, then bytes both ways. */
  upgrade(request: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on("error", () => socket.destroy());
    void this.#upgrade(request, socket, head).catch(() => socket.destroy());
  }

  async #upgrade(request: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const target = parseProxyPath(request.url ?? "");
    if (!target) return rawError(socket, 404, "NOT_FOUND", "only proxied paths (/v1/proxy/<processId>/<path>) can be upgraded");
    const valid = this.#knownSignature(target.id, request) ?? (await this.#verify(target.id, request));
    if (!valid) return rawError(socket, 401, "UNAUTHORIZED", "missing or invalid proxy signature");
    const resolved = await this.#resolve(target.id);
    if (!resolved.ok) return rawError(socket, resolved.status, resolved.code, resolved.message);
    const { route } = resolved;
    const tenant = this.#options.lookup(target.id)?.spec.tenant ?? "";
    const share = this.#upgrades.take(target.id, tenant);
    if (typeof share === "string") return rawError(socket, 503, "UNAVAILABLE", `${share} WebSockets open, as many as it may; retry in a moment`, true);
    const upstream = connect({ host: route.address, port: route.port });
    let connected = false;
    const client = socket as Socket;
    route.upgrades.add(client);
    const teardown = () => {
      share();
      route.upgrades.delete(client);
      upstream.destroy();
      socket.destroy();
    };
    upstream.once("connect", () => {
      connected = true;
      upstream.setNoDelay(true);
      client.setNoDelay?.(true);
      const headers = forwardedRequestHeaders(request.rawHeaders, true);
      let text = `${request.method ?? "GET"} ${target.path} HTTP/1.1\r\n`;
      for (let i = 0; i + 1 < headers.length; i += 2) text += `${headers[i]}: ${headers[i + 1]}\r\n`;
      upstream.write(`${text}\r\n`);
      if (head.length > 0) upstream.write(head);
      socket.pipe(upstream);
      upstream.pipe(socket);
    });
    upstream.on("error", (error: NodeJS.ErrnoException) => {
      if (!connected) {
        share();
        route.upgrades.delete(client);
        rawError(socket, 502, "UNAVAILABLE", `the app's process ${target.id} could not be reached: ${error.code ?? error.message}`);
      } else {
        teardown();
      }
    });
    upstream.on("close", () => {
      if (connected) teardown();
    });
    socket.on("close", teardown);
  }

  #admit(target: { id: string; path: string }, request: IncomingMessage, response: ServerResponse, appsDomain: string | string[] | null | undefined = request.headers[APPS_DOMAIN]) {
    if (Number(request.headers["content-length"] ?? 0) > MAX_PROXY_BODY_BYTES) {
      response.setHeader("Connection", "close");
      response.once("finish", () => request.destroy());
      return sendError(response, 413, "PAYLOAD_TOO_LARGE", `request body exceeds ${MAX_PROXY_BODY_BYTES} bytes`);
    }
    const process = this.#options.lookup(target.id);
    const share = this.#requests.take(target.id, process?.spec.tenant ?? "");
    if (typeof share === "string") {
      response.setHeader("Retry-After", String(NODE_SHARE.retryAfterSeconds));
      return sendError(response, 503, "UNAVAILABLE", `${share} requests in flight, as many as it may; retry in a moment`);
    }
    response.once("close", share);
    const hasBody = request.headers["transfer-encoding"] !== undefined || Number(request.headers["content-length"] ?? 0) > 0;
    const exchange: Exchange = {
      request,
      response,
      ...target,
      hasBody,
      bodySent: false,
      attempts: 0,
      deadline: Date.now() + PROXY_READY_WAIT_MS,
      appsDomain: typeof appsDomain === "string" ? appsDomain : null,
    };
    this.#dispatch(exchange, null);
  }

  /**
   * Sends the exchange to the process's ready instance, or waits (up to its
   * deadline) for one: a process (re)starting, or an instance that just
   * refused a connection (it died; its supervisor is about to notice).
   */
  #dispatch(exchange: Exchange, failed: ReadyRoute | null) {
    const { id, response } = exchange;
    const process = this.#options.lookup(id);
    if (!process) return sendError(response, 404, "PROCESS_NOT_FOUND", `no process ${id} on this node`);
    const route = process.route();
    if (route.kind === "ready" && route.agent !== failed?.agent) return this.#send(exchange, route);
    if (route.kind === "gone") return sendError(response, 404, "PROCESS_NOT_FOUND", `process ${id} is stopped`);
    if (route.kind === "unavailable") return sendError(response, 503, "UNAVAILABLE", `process ${id}: ${route.message}`);
    const left = exchange.deadline - Date.now();
    if (left <= 0 || response.destroyed) {
      const state = process.status().state;
      if (failed) return sendError(response, 502, "UNAVAILABLE", `the app's process ${id} did not answer (${state})`);
      return sendError(response, 503, "UNAVAILABLE", `process ${id} is not ready (${state}) after ${PROXY_READY_WAIT_MS / 1000} s; retry shortly`);
    }
    const timeout = new AbortController();
    const changed = route.kind === "wait" ? route.changed : sleep(RETRY_PAUSE_MS);
    void Promise.race([changed, sleep(left, undefined, { signal: timeout.signal }).catch(() => undefined)]).then(() => {
      timeout.abort();
      this.#dispatch(exchange, failed);
    });
  }

  /** One attempt: the request to the app, its answer back; a connection refused before the body went out is tried again. */
  #send(exchange: Exchange, route: ReadyRoute): void {
    const { request, response, id } = exchange;
    exchange.attempts++;
    const leave = route.track();
    const upstream = httpRequest({
      host: route.address,
      port: route.port,
      method: request.method,
      path: exchange.path,
      headers: forwardedRequestHeaders(request.rawHeaders, false) as unknown as OutgoingHttpHeaders,
      setHost: false,
      agent: route.agent,
    });
    let answered = false;
    // The visitor went away, or the answer is complete: the request is over.
    const onClose = () => {
      leave();
      if (!response.writableFinished) upstream.destroy();
    };
    response.once("close", onClose);
    upstream.once("response", (answer) => {
      answered = true;
      const status = answer.statusCode ?? 502;
      const cookies = {
        appsDomain: exchange.appsDomain,
        host: typeof request.headers["x-forwarded-host"] === "string" ? request.headers["x-forwarded-host"] : (request.headers.host ?? null),
        refused: (why: string) => this.#options.lookup(id)?.note(why),
      };
      const headers = forwardedResponseHeaders(answer.rawHeaders, cookies) as unknown as OutgoingHttpHeaders;
      answer.once("error", () => response.destroy());
      const length = answer.headers["content-length"];
      if (length !== undefined && Number(length) <= SMALL_BODY_BYTES) {
        // A small answer goes out in one write, head and body together.
        const chunks: Buffer[] = [];
        answer.on("data", (chunk: Buffer) => chunks.push(chunk));
        answer.once("end", () => {
          response.writeHead(status, answer.statusMessage, headers);
          response.end(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks));
        });
        return;
      }
      response.writeHead(status, answer.statusMessage, headers);
      // A response without a length is a stream (chunked, server-sent events): its head goes out now.
      if (length === undefined) response.flushHeaders();
      answer.pipe(response);
    });
    upstream.on("error", (error: NodeJS.ErrnoException) => {
      if (answered) return response.destroy();
      response.off("close", onClose);
      leave();
      if (!exchange.bodySent && !response.destroyed && exchange.attempts < MAX_ATTEMPTS) {
        // A kept-alive connection the app had just closed: again at once. Anything else: the instance is going away.
        const stale = upstream.reusedSocket && error.code === "ECONNRESET" && exchange.attempts < 2;
        return this.#dispatch(exchange, stale ? null : route);
      }
      sendError(response, 502, "UNAVAILABLE", `the app's process ${id} did not answer: ${error.code ?? error.message}`);
    });
    if (!exchange.hasBody) {
      upstream.end();
      return;
    }
    // The body flows once the connection stands, so a refused connection can still be retried.
    upstream.once("socket", (socket: Socket) => {
      if (socket.connecting) socket.once("connect", () => this.#sendBody(exchange, upstream));
      else this.#sendBody(exchange, upstream);
    });
  }

  #sendBody(exchange: Exchange, upstream: ClientRequest): void {
    const { request, response } = exchange;
    if (upstream.destroyed) return;
    exchange.bodySent = true;
    let received = 0;
    request.on("data", (chunk: Buffer) => {
      received += chunk.length;
      if (received <= MAX_PROXY_BODY_BYTES) return;
      request.unpipe(upstream);
      upstream.destroy();
      response.setHeader("Connection", "close");
      response.once("finish", () => request.destroy());
      sendError(response, 413, "PAYLOAD_TOO_LARGE", `request body exceeds ${MAX_PROXY_BODY_BYTES} bytes`);
    });
    request.pipe(upstream);
  }

  /** The ready route of a process for an upgrade, waiting up to {@link PROXY_READY_WAIT_MS} for one that is (re)starting. */
  async #resolve(id: string): Promise<Resolution> {
    const deadline = Date.now() + PROXY_READY_WAIT_MS;
    for (;;) {
      const process = this.#options.lookup(id);
      if (!process) return { ok: false, status: 404, code: "PROCESS_NOT_FOUND", message: `no process ${id} on this node` };
      const route = process.route();
      if (route.kind === "ready") return { ok: true, route };
      if (route.kind === "gone") return { ok: false, status: 404, code: "PROCESS_NOT_FOUND", message: `process ${id} is stopped` };
      if (route.kind === "unavailable") return { ok: false, status: 503, code: "UNAVAILABLE", message: `process ${id}: ${route.message}` };
      const left = deadline - Date.now();
      if (left <= 0) {
        const message = `process ${id} is not ready (${process.status().state}) after ${PROXY_READY_WAIT_MS / 1000} s; retry shortly`;
        return { ok: false, status: 503, code: "UNAVAILABLE", message };
      }
      const timeout = new AbortController();
      await Promise.race([route.changed, sleep(left, undefined, { signal: timeout.signal }).catch(() => undefined)]);
      timeout.abort();
    }
  }

  /**
   * The fast half of verifyProxy: true or false when this process and second
   * were seen before (a constant-time compare with the signature verified
   * then), null when the signature must be verified ({@link #verify}).
   */
  #knownSignature(id: string, request: IncomingMessage): boolean | null {
    const timestamp = request.headers[PROXY_TIMESTAMP];
    const signature = request.headers[PROXY_SIGNATURE];
    if (typeof timestamp !== "string" || typeof signature !== "string" || !SIGNATURE_HEX.test(signature)) return false;
    const known = this.#verified.get(`${id}\n${timestamp}`);
    if (!known) return null;
    const now = Date.now() / 1000;
    if (now > known.until || Math.abs(now - Number(timestamp)) > SIGNATURE_WINDOW_SECONDS) return null;
    return timingSafeEqual(Buffer.from(signature, "hex"), known.signature);
  }

  /** verifyProxy itself; a valid signature is remembered for its process and second. */
  async #verify(id: string, request: IncomingMessage): Promise<boolean> {
    const headers = { get: (name: string) => (request.headers[name.toLowerCase()] as string | undefined) ?? null };
    if (!(await verifyProxy(this.#options.secret, id, headers))) return false;
    const timestamp = request.headers[PROXY_TIMESTAMP] as string;
    const now = Date.now() / 1000;
    if (this.#verified.size >= VERIFIED_CACHE_LIMIT) {
      for (const [entry, { until }] of this.#verified) if (until < now) this.#verified.delete(entry);
      if (this.#verified.size >= VERIFIED_CACHE_LIMIT) this.#verified.clear();
    }
    const signature = Buffer.from(request.headers[PROXY_SIGNATURE] as string, "hex");
    this.#verified.set(`${id}\n${timestamp}`, { signature, until: Number(timestamp) + SIGNATURE_WINDOW_SECONDS });
    return true;
  }
}
