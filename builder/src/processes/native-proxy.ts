/**
 * The node's fast path for apps' traffic (issue 33.1): HAProxy in front of
 * the builder's port, started and supervised here, driven through its runtime
 * API, so its configuration changes without a reload and without dropping a
 * connection.
 *
 * HAProxy answers a proxied request itself only when everything about it is
 * settled in advance; anything else goes, untouched, to the builder's own
 * HTTP server (the Node proxy, proxy.ts, and the rest of the API):
 *
 * - Authenticated by a map of the signatures the edge may send now: for each
 *   process that takes traffic, `<id>/<second>/<hex HMAC>` for the seconds
 *   around now ({@link TOKEN_SECONDS}), rolled every second. A signature of
 *   another second (a skewed clock), a wrong one or a missing one is a miss,
 *   and the Node proxy verifies it the full way (401 when it is bad).
 * - Routed by a map of `<id>` → `<slot>|<tenant>`: one backend ("slot") per
 *   process taking traffic, whose one server is the ready instance's address
 *   on the run network, changed in place when the instance changes. A
 *   stopping process's requests go to its successor's slot (the manager's
 *   lookup), as in the Node proxy.
 * - Only plain requests: an upgrade (WebSockets), a chunked body, `Expect`,
 *   or a body announced over {@link MAX_PROXY_BODY_BYTES} goes to the Node
 *   proxy, which handles them as before (its shares of WebSockets, the 413).
 * - As the Node proxy does: the path without `/v1/proxy/<id>`, `Host` from
 *   X-Forwarded-Host, every `X-Svc-*` and hop-by-hop header dropped both
 *   ways, cookies for other apps' hosts dropped (a Lua action, {@link COOKIES_LUA},
 *   its line in the app's runtime log from HAProxy's log), the fair shares
 *   ({@link NODE_SHARE}: stick tables count requests in flight per process
 *   and per account, 503 with Retry-After past them), streamed both ways.
 * - A process not ready (starting, restarting, stopping, failed, gone) has no
 *   route: the Node proxy holds or refuses its requests as before. A request
 *   already at a slot whose instance just died (refused, or its kept-alive
 *   connection closed) marks the slot's server down at once and goes to the
 *   slot's backup: the builder, over the PROXY protocol, whose header carries
 *   the process's id and the apps domain (the request itself is already
 *   rewritten). The Node proxy holds it until the next instance is ready,
 *   as any request. The slot's server moves to that instance and is up again.
 * - A stop waits for the slot's requests in flight ({@link NativeProxy.idle}).
 *
 * HAProxy runs as nobody under a root builder (it reads hostile apps'
 * answers), dies with the builder (setpriv's parent-death signal) and is
 * started again when it exits on its own, with the maps and slots as they
 * are then; after {@link MAX_FAILURES} failures in a row the builder serves
 * its port itself.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, chown, mkdir, rm, writeFile } from "node:fs/promises";
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from "node:http";
import { connect, createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { HEADER_PROXY_ERROR, HEADER_PROXY_SIGNATURE, MAX_PROXY_BODY_BYTES, signProxy } from "../protocol/processes.js";
import type { BuilderErrorCode } from "../protocol/shared.js";
import type { ProcessTraffic } from "./manager.js";
import { errorBody, HOP_BY_HOP, NODE_SHARE, PROXY_PREFIX, PROXY_READY_WAIT_MS, type ProxiedProcess } from "./proxy.js";

/** Backends made at startup: processes taking traffic on this node at once (a node has 253 run network namespaces). */
export const NATIVE_SLOTS = 256;
/** Signatures of the seconds from now − this to now + this are in the map. */
const TOKEN_SECONDS = 2;
/** A slot's connection timeout. */
const SLOT_CONNECT_MS = 1_000;
/** PROXY protocol v2: its signature, and the type of the TLV carrying HAProxy's unique id. */
const PROXY_V2_SIGNATURE = Buffer.from("\r\n\r\n\0\r\nQUIT\n", "binary");
const PP2_TYPE_UNIQUE_ID = 0x05;
/** Starting HAProxy: how long it gets to accept on its port. */
const START_TIMEOUT_MS = 10_000;
/** After HAProxy exited on its own: the first pause before starting it again (doubling up to 5 s). */
const RESTART_PAUSE_MS = 100;
/** A run of HAProxy this long is a good one: the failures before it are forgotten. */
const STABLE_MS = 10_000;
/** Failures in a row after which the builder gives its port up to itself. */
const MAX_FAILURES = 3;
/** How long one line of runtime API commands may take. */
const CLI_TIMEOUT_MS = 5_000;
/** How long a caller of `sync` waits at most for HAProxy to route as the processes are now. */
const SYNC_WAIT_MS = 1_000;
/** One line of runtime API commands stays under HAProxy's buffer (16 KiB). */
const CLI_LINE_BYTES = 8_000;
const SETPRIV = "/usr/bin/setpriv";
/** The user and group HAProxy runs as under a root builder. */
const NOBODY = 65534;

/** What the fast path needs of the node's processes (manager.ts). */
export interface NativeProcesses {
  /** The processes not yet stopped or failed. */
  running(): { id: string }[];
  /** What a request for `id` reaches (a stopping process's successor while that is ready). */
  lookup(id: string): ProxiedProcess | undefined;
  /** From then on, tells the fast path of every change of a route. */
  attachTraffic(traffic: ProcessTraffic): void;
}

export interface NativeProxyOptions {
  /** Its own directory: configuration, maps, runtime socket. */
  dir: string;
  binary: string;
  /** Where HAProxy listens: the builder's address. */
  listen: { host: string; port: number };
  /** The builder's own HTTP server, on the loopback. */
  fallbackPort: number;
  /** The key the edge signs proxied requests with (a node joining a fleet gets it after HAProxy started). */
  secret: () => string;
  /** Takes a request HAProxy found no instance for (the Node proxy's handleHeld). */
  hold: (held: Held, request: IncomingMessage, response: ServerResponse) => void;
  /** HAProxy kept failing and is given up: the builder must listen on the port itself. */
  abandoned: () => void;
}

/** What comes with a held request: the process asked for, and the apps domain (its `X-Svc-*` headers are gone). */
export interface Held {
  id: string;
  appsDomain: string | null;
}

/** A backend of its own for one process. */
interface Slot {
  name: string;
  /** The process it serves. */
  process: string;
  address: string;
  port: number;
  /** The instance its server is (its keep-alive agent stands for it). */
  instance: object;
}

/** A line of the tokens map: `<id>/<second>/<signature>` and the id, from the signature of `<id>/<second>`. */
const tokenEntry = (key: string, signature: string) => `${key}/${signature} ${key.slice(0, key.indexOf("/"))}`;

/** The node's own JSON error body, quoted for HAProxy's configuration. */
const jsonError = (code: BuilderErrorCode, message: string) => JSON.stringify(errorBody(code, message));

/**
 * Drops an app's Set-Cookie whose Domain reaches beyond its own host: the
 * rules of cookieDomainProblem (proxy.ts), which the builder test
 * `processes.native` holds to the same answers. The reasons go to HAProxy's
 * log (txn.note), and from there to the app's runtime log.
 */
const COOKIES_LUA = String.raw`
local function ends_with(text, suffix)
  return suffix == "" or text:sub(-#suffix) == suffix
end

local function problem(cookie, apps, host)
  local domain = nil
  local first = true
  for attribute in (cookie .. ";"):gmatch("([^;]*);") do
    if first then
      first = false
    else
      local name, value = attribute:match("^%s*([^=]-)%s*=(.*)$")
      if name ~= nil and name:lower() == "domain" then
        domain = value:match("^%s*(.-)%s*$"):gsub("^%.", ""):lower()
      end
    end
  end
  if domain == nil or domain == "" then return nil end
  local equals = cookie:find("=", 1, true) or 1
  local name = cookie:sub(1, equals - 1):match("^%s*(.-)%s*$"):sub(1, 100)
  local own = host and host:lower():gsub(":%d+$", "") or nil
  local apps_domain = apps and apps:lower() or nil
  if domain == own then return nil end
  local function why(what)
    return 'dropped the app\'s cookie "' .. name .. '": its Domain=' .. domain .. " " .. what ..
      "; set it without Domain (it then belongs to " .. (own or "the app's host") .. " alone)"
  end
  if not domain:find(".", 1, true) then return why("is a top-level name every site shares") end
  if apps_domain ~= nil and (domain == apps_domain or ends_with(apps_domain, "." .. domain)) then
    return why("would reach the visitors of every app on this platform")
  end
  if apps_domain ~= nil and ends_with(domain, "." .. apps_domain) then return why("is another app's host") end
  if own ~= nil and not ends_with(own, "." .. domain) then
    return why("does not cover the app's host, so browsers would refuse it anyway")
  end
  return nil
end

core.register_action("svc_cookies", { "http-res" }, function(txn)
  local cookies = txn.http:res_get_headers()["set-cookie"]
  if cookies == nil then return end
  local apps = txn:get_var("txn.apps")
  local host = txn:get_var("txn.host")
  local kept, notes = {}, {}
  local i = 0
  while cookies[i] ~= nil do
    local why = problem(cookies[i], apps, host)
    if why == nil then kept[#kept + 1] = cookies[i] else notes[#notes + 1] = why end
    i = i + 1
  end
  if #notes == 0 then return end
  txn.http:res_del_header("set-cookie")
  for _, cookie in ipairs(kept) do txn.http:res_add_header("set-cookie", cookie) end
  txn:set_var("txn.note", table.concat(notes, "\n"))
end)
`;

/** The Node proxy's hop-by-hop headers but those HAProxy handles itself (Connection) or never takes (Upgrade, Transfer-Encoding and Expect go to the Node proxy). */
const DROPPED_HOP_BY_HOP = [...HOP_BY_HOP].filter((name) => !["connection", "upgrade", "transfer-encoding", "expect"].includes(name));

/** The whole configuration; slots as they are now (a restart keeps them). */
function configuration(options: NativeProxyOptions, port: number, slots: Iterable<Slot>, files: { socket: string; hold: string; lua: string; tokens: string; routes: string }): string {
  const byName = new Map([...slots].map((slot) => [slot.name, slot]));
  const unavailable = (message: string) => `content-type "application/json; charset=utf-8" string ${jsonError("UNAVAILABLE", message)} hdr ${HEADER_PROXY_ERROR} UNAVAILABLE`;
  const full = (holder: string, held: number) =>
    `http-request return status 503 content-type "application/json; charset=utf-8" string ${jsonError("UNAVAILABLE", `${holder} has ${held} requests in flight, as many as it may; retry in a moment`)} hdr Retry-After ${NODE_SHARE.retryAfterSeconds} hdr ${HEADER_PROXY_ERROR} UNAVAILABLE`;
  const lines = [
    "global",
    "  nbthread 1",
    `  stats socket ${files.socket} mode 600 level admin`,
    `  lua-load ${files.lua}`,
    "  log stdout len 65535 format raw daemon",
    "",
    "defaults base",
    "  mode http",
    // Each piece of a stream (server-sent events, a followed log) goes out as it comes.
    "  option http-no-delay",
    "  log global",
    '  log-format "svc-note %[var(txn.slot)] %[var(txn.note),base64]"',
    "  maxconn 8000",
    "  timeout connect 5s",
    "  timeout client 24h",
    "  timeout server 24h",
    "  timeout tunnel 24h",
    "  timeout client-fin 5s",
    "  timeout http-request 60s",
    "  timeout http-keep-alive 60s",
    "",
    "defaults slots from base",
    `  timeout connect ${SLOT_CONNECT_MS}ms`,
    // An attempt at a dead instance marks its server down (observe), the next goes to the backup: the builder.
    "  retries 3",
    "  option redispatch 1",
    "  retry-on conn-failure empty-response",
    "  http-response del-header x-svc- -m beg",
    ...DROPPED_HOP_BY_HOP.map((name) => `  http-response del-header ${name}`),
    "  http-response lua.svc_cookies if { res.hdr(set-cookie) -m sub -i domain }",
    "  http-response set-log-level info if { var(txn.note) -m found }",
    `  http-error status 502 ${unavailable("the app's process answered something that is not HTTP")}`,
    `  http-error status 503 ${unavailable(`the app's process did not answer within ${PROXY_READY_WAIT_MS / 1000} s`)}`,
    `  http-error status 504 ${unavailable("the app's process did not answer in time")}`,
    "",
    "frontend node from base",
    // What a held request's PROXY header says (only the slots' backup server sends it).
    '  unique-id-format "%[var(txn.id)] %[var(txn.apps)]"',
    `  bind ${options.listen.host.includes(":") ? `[${options.listen.host}]` : options.listen.host}:${port}`,
    "  http-request set-log-level silent",
    `  acl proxied path_beg ${PROXY_PREFIX}`,
    "  acl plain req.hdr_cnt(transfer-encoding) eq 0",
    "  acl plain_upgrade req.hdr_cnt(upgrade) eq 0",
    "  acl plain_expect req.hdr_cnt(expect) eq 0",
    "  acl one_signature req.hdr_cnt(x-svc-proxy-signature) eq 1",
    "  acl one_timestamp req.hdr_cnt(x-svc-proxy-timestamp) eq 1",
    `  acl oversize req.hdr_val(content-length) gt ${MAX_PROXY_BODY_BYTES}`,
    // The builder would refuse it too, then close: HAProxy answers at once, and closes (the body is never read).
    `  http-request return status 413 content-type "application/json; charset=utf-8" string ${jsonError("PAYLOAD_TOO_LARGE", `request body exceeds ${MAX_PROXY_BODY_BYTES} bytes`)} hdr ${HEADER_PROXY_ERROR} PAYLOAD_TOO_LARGE if proxied oversize`,
    "  http-request set-var(txn.id) path,field(4,/) if proxied plain plain_upgrade plain_expect one_signature one_timestamp",
    "  http-request set-var(txn.ts) req.fhdr(x-svc-proxy-timestamp) if { var(txn.id) -m found }",
    "  http-request set-var(txn.sig) req.fhdr(x-svc-proxy-signature),lower if { var(txn.id) -m found }",
    `  http-request set-var(txn.route) var(txn.id),concat(/,txn.ts,/),concat(,txn.sig,),map(${files.tokens}),map(${files.routes}) if { var(txn.id) -m found }`,
    "  acl fast var(txn.route) -m found",
    "  http-request set-var(txn.slot) var(txn.route),field(1,|) if fast",
    "  http-request set-var(txn.tenant) var(txn.route),field(2,|) if fast",
    "  http-request track-sc0 var(txn.slot) table shares_process if fast",
    "  http-request track-sc1 var(txn.tenant) table shares_tenant if fast",
    `  ${full("the app", NODE_SHARE.requestsPerProcess)} if fast { sc0_conn_cur gt ${NODE_SHARE.requestsPerProcess} }`,
    `  ${full("the app's account", NODE_SHARE.requestsPerTenant)} if fast { sc1_conn_cur gt ${NODE_SHARE.requestsPerTenant} }`,
    "  http-request set-var(txn.apps) req.fhdr(x-svc-apps-domain) if fast",
    "  http-request set-var(txn.host) req.fhdr(host,1) if fast",
    "  http-request set-var(txn.host) req.fhdr(x-forwarded-host,1) if fast { req.hdr_cnt(x-forwarded-host) gt 0 }",
    "  http-request set-header host %[var(txn.host)] if fast { var(txn.host) -m found }",
    "  http-request set-path %[path,regsub(^/v1/proxy/[^/]+/?,/)] if fast",
    "  http-request del-header x-svc- -m beg if fast",
    ...DROPPED_HOP_BY_HOP.map((name) => `  http-request del-header ${name} if fast`),
    // The builder closes the connection after refusing an upgrade: so does HAProxy.
    "  http-request set-var(txn.upgrade) bool(true) if !plain_upgrade",
    "  http-after-response set-header connection close if { var(txn.upgrade) -m found } !{ status 101 }",
    "  use_backend %[var(txn.slot)] if fast",
    "  default_backend node",
    "",
    "backend node from base",
    "  retries 3",
    "  retry-on conn-failure empty-response",
    `  server node 127.0.0.1:${options.fallbackPort}`,
    "",
    "backend shares_process from base",
    `  stick-table type string len 32 size ${NATIVE_SLOTS * 2} store conn_cur`,
    "backend shares_tenant from base",
    "  stick-table type string len 64 size 10k store conn_cur",
    "",
  ];
  for (let n = 0; n < NATIVE_SLOTS; n++) {
    const slot = byName.get(`s${n}`);
    const app = slot ? `${slot.address}:${slot.port}` : "127.0.0.1:1 disabled";
    lines.push(
      `backend s${n} from slots`,
      `  server app ${app} check inter 1h observe layer4 error-limit 1 on-error mark-down`,
      `  server hold ${files.hold} backup send-proxy-v2 proxy-v2-options unique-id`,
    );
  }
  return `${lines.join("\n")}\n`;
}

/** A free TCP port on `host` (HAProxy is given a port, not a socket). */
async function freePort(host: string): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once("error", reject);
    probe.listen(0, host, resolve);
  });
  const { port } = probe.address() as { port: number };
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

/** Resolves once `host:port` accepts a connection, false when `until` passed first. */
async function accepting(host: string, port: number, until: number, alive: () => boolean): Promise<boolean> {
  while (Date.now() < until && alive()) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect({ host, port });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (open) return true;
    await sleep(20);
  }
  return false;
}

/**
 * Reads a PROXY protocol v2 header off a connection from HAProxy's slots'
 * backup server: its unique-id TLV, `<process id> <apps domain>`. The bytes
 * after the header are put back for the HTTP server.
 */
function readProxyHeader(socket: Socket): Promise<Held> {
  return new Promise((resolve, reject) => {
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (buffered.length < 16) return;
      if (!buffered.subarray(0, 12).equals(PROXY_V2_SIGNATURE)) return fail();
      const end = 16 + buffered.readUInt16BE(14);
      if (buffered.length < end) return;
      socket.off("data", onData);
      socket.pause();
      const family = buffered[13]! >> 4;
      let at = 16 + (family === 1 ? 12 : family === 2 ? 36 : 0);
      let unique: string | null = null;
      while (at + 3 <= end) {
        const type = buffered[at]!;
        const length = buffered.readUInt16BE(at + 1);
        if (type === PP2_TYPE_UNIQUE_ID) unique = buffered.subarray(at + 3, at + 3 + length).toString("utf8");
        at += 3 + length;
      }
      const [id, appsDomain] = (unique ?? "").split(" ");
      if (!id) return fail();
      if (buffered.length > end) socket.unshift(buffered.subarray(end));
      resolve({ id, appsDomain: appsDomain || null });
    };
    const fail = () => {
      socket.off("data", onData);
      reject(new Error("not a PROXY protocol v2 header with a unique id"));
    };
    socket.on("data", onData);
  });
}

export class NativeProxy {
  readonly #options: NativeProxyOptions;
  readonly #files: { config: string; socket: string; hold: string; lua: string; tokens: string; routes: string };
  /** Where it listens (BUILDER_PORT=0: the port picked). */
  readonly port: number;
  #child: ChildProcess | null = null;
  #closing = false;
  #restartPause = RESTART_PAUSE_MS;
  #failures = 0;
  /** By process id. */
  readonly #slots = new Map<string, Slot>();
  readonly #free: string[] = [];
  /** What the routes map holds: requested id → `<slot>|<tenant>`. */
  #routes = new Map<string, string>();
  /** What the tokens map holds, by `<id>/<second>`: the signature (its key there is `<id>/<second>/<signature>`, its value the id). */
  #tokens = new Map<string, string>();
  #applying: Promise<void> = Promise.resolve();
  #dirty = false;
  #rearm = false;
  #tick: NodeJS.Timeout | undefined;
  #slotsOutSaid = false;
  /**
   * The slots' backup server: the builder, over the PROXY protocol, on a unix
   * socket only HAProxy's user and root reach (what comes there skips the
   * signature: HAProxy checked it).
   */
  readonly #hold: Server;
  #processes: NativeProcesses | null = null;

  private constructor(options: NativeProxyOptions, port: number) {
    this.#options = options;
    this.port = port;
    this.#files = {
      config: join(options.dir, "haproxy.cfg"),
      socket: join(options.dir, "haproxy.sock"),
      hold: join(options.dir, "hold.sock"),
      lua: join(options.dir, "cookies.lua"),
      tokens: join(options.dir, "tokens.map"),
      routes: join(options.dir, "routes.map"),
    };
    for (let n = NATIVE_SLOTS - 1; n >= 0; n--) this.#free.push(`s${n}`);
    const held = new WeakMap<Socket, Held>();
    const http = createHttpServer((request, response) => {
      const what = held.get(request.socket);
      if (what) options.hold(what, request, response);
      else response.writeHead(400).end();
    });
    http.keepAliveTimeout = 120_000;
    this.#hold = createServer((socket) => {
      socket.on("error", () => socket.destroy());
      readProxyHeader(socket).then(
        (what) => {
          held.set(socket, what);
          http.emit("connection", socket);
          socket.resume();
        },
        () => socket.destroy(),
      );
    });
  }

  /** Starts HAProxy on the builder's address; throws (with HAProxy's own words) when it cannot. */
  static async start(options: NativeProxyOptions): Promise<NativeProxy> {
    if (!existsSync(options.binary)) throw new Error(`${options.binary} is not installed`);
    if (!existsSync(SETPRIV)) throw new Error(`${SETPRIV} (util-linux) is not installed`);
    await rm(options.dir, { recursive: true, force: true });
    await mkdir(options.dir, { recursive: true, mode: 0o700 });
    const port = options.listen.port === 0 ? await freePort(options.listen.host) : options.listen.port;
    const proxy = new NativeProxy(options, port);
    await new Promise<void>((resolve, reject) => {
      proxy.#hold.once("error", reject);
      proxy.#hold.listen(proxy.#files.hold, resolve);
    });
    await chmod(proxy.#files.hold, 0o600);
    try {
      await proxy.#launch();
    } catch (error) {
      proxy.#hold.close();
      throw error;
    }
    proxy.#scheduleTick();
    return proxy;
  }

  /** Serves the processes' traffic from now on. */
  attach(processes: NativeProcesses): void {
    this.#processes = processes;
    processes.attachTraffic(this);
  }

  /**
   * Brings the maps and slots up to date with the processes (coalesced;
   * called on every change of a route); resolves once HAProxy routes that
   * way, or after {@link SYNC_WAIT_MS} (it is being started again, or stalls).
   */
  sync(): Promise<void> {
    this.#sync(false);
    return Promise.race([this.#applying, sleep(SYNC_WAIT_MS, undefined, { ref: false })]);
  }

  /** `rearm`: also every routed slot's server up (one a passing error marked down while its instance lives). */
  #sync(rearm: boolean): void {
    this.#dirty = true;
    this.#rearm ||= rearm;
    this.#applying = this.#applying.then(async () => {
      if (!this.#dirty || this.#closing) return;
      this.#dirty = false;
      const rearm = this.#rearm;
      this.#rearm = false;
      await this.#apply(rearm).catch((error: unknown) => console.error(`builder native proxy: ${error instanceof Error ? error.message : String(error)}`));
    });
  }

  /**
   * Waits until no request is in flight at the process's slot (its route is
   * gone by then, so none starts), or `until`: how many were left.
   */
  async idle(processId: string, until: number): Promise<number> {
    this.#sync(false);
    await Promise.race([this.#applying, sleep(Math.max(0, until - Date.now()))]);
    const slot = this.#slots.get(processId);
    if (!slot) return 0;
    for (;;) {
      const held = await this.#inFlight(slot.name).catch(() => 0);
      if (held === 0 || Date.now() >= until) return held;
      await sleep(Math.min(25, Math.max(1, until - Date.now())));
    }
  }

  /** Ends HAProxy (the builder is going away). */
  async close(): Promise<void> {
    this.#closing = true;
    clearTimeout(this.#tick);
    this.#hold.close();
    const child = this.#child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await Promise.race([exited, sleep(3_000)]);
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }

  async #launch(): Promise<void> {
    const options = this.#options;
    // It parses what hostile apps answer: with a root builder it runs as nobody (its port is not a privileged one).
    const unprivileged = process.getuid?.() === 0 && this.port >= 1024;
    const files: [string, string][] = [
      [this.#files.config, configuration(options, this.port, this.#slots.values(), this.#files)],
      [this.#files.lua, COOKIES_LUA],
      [this.#files.tokens, [...this.#tokens].map(([key, signature]) => `${tokenEntry(key, signature)}\n`).join("")],
      [this.#files.routes, [...this.#routes].map(([id, value]) => `${id} ${value}\n`).join("")],
    ];
    for (const [path, text] of files) {
      await writeFile(path, text, { mode: 0o600 });
      if (unprivileged) await chown(path, NOBODY, NOBODY);
    }
    if (unprivileged) for (const path of [options.dir, this.#files.hold]) await chown(path, NOBODY, NOBODY);
    // It must not outlive the builder (it would keep the port): the kernel ends it with its parent. A change of
    // user clears that, so the second setpriv, already nobody, asks for it.
    const haproxy = ["--pdeathsig", "KILL", "--", options.binary, "-db", "-f", this.#files.config];
    const args = unprivileged ? ["--reuid", String(NOBODY), "--regid", String(NOBODY), "--clear-groups", "--", SETPRIV, ...haproxy] : haproxy;
    const child = spawn(SETPRIV, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.#child = child;
    // What it says of itself (alerts, warnings) goes to the builder's log; its last lines explain an end.
    let said = "";
    createInterface({ input: child.stderr! }).on("line", (line) => {
      if (line.trim() === "") return;
      console.error(`builder native proxy: HAProxy: ${line}`);
      said = `${said}${line}\n`.slice(-4_000);
    });
    createInterface({ input: child.stdout! }).on("line", (line) => this.#logged(line));
    const started = Date.now();
    const ready = await accepting(options.listen.host, this.port, started + START_TIMEOUT_MS, () => child.exitCode === null && child.signalCode === null);
    if (!ready) {
      child.kill("SIGKILL");
      throw new Error(`HAProxy did not start: ${said.trim().split("\n").slice(-3).join(" / ") || "no answer on its port"}`);
    }
    const running = Date.now();
    child.once("exit", (code, signal) => {
      if (this.#closing) return;
      console.error(`builder native proxy: HAProxy exited (${signal ?? `code ${code}`}): ${said.trim().split("\n").slice(-2).join(" / ")}; starting it again`);
      void this.#relaunch(Date.now() - running);
    });
    // Whatever changed while it started.
    this.#sync(false);
  }

  /**
   * Starts HAProxy again after it exited on its own. Once it failed to start,
   * or died within {@link STABLE_MS} of starting, {@link MAX_FAILURES} times in
   * a row, the builder serves its port itself (`abandoned`).
   */
  async #relaunch(ranMs: number): Promise<void> {
    this.#failures = ranMs >= STABLE_MS ? 0 : this.#failures + 1;
    if (this.#failures >= MAX_FAILURES) return this.#abandon(`HAProxy failed ${MAX_FAILURES} times in a row`);
    await sleep(this.#restartPause);
    this.#restartPause = ranMs >= STABLE_MS ? RESTART_PAUSE_MS : Math.min(this.#restartPause * 2, 5_000);
    // The maps and slots are written as they are now; changes wait for it.
    const relaunched = this.#applying.then(() => (this.#closing ? undefined : this.#launch()));
    this.#applying = relaunched.catch((error: unknown) => {
      console.error(`builder native proxy: ${error instanceof Error ? error.message : String(error)}`);
      if (!this.#closing) void this.#relaunch(0);
    });
    await this.#applying;
  }

  #abandon(why: string): void {
    this.#closing = true;
    clearTimeout(this.#tick);
    this.#hold.close();
    console.error(`builder native proxy: ${why}; the builder serves its port itself from now on (apps' traffic through the Node proxy)`);
    this.#options.abandoned();
  }

  /** Every second, just after it begins: the signatures of the new second in, the old ones out. */
  #scheduleTick(): void {
    this.#tick = setTimeout(
      () => {
        this.#sync(true);
        this.#scheduleTick();
      },
      1_005 - (Date.now() % 1_000),
    );
    this.#tick.unref();
  }

  /** A line of HAProxy's log: a note for an app's runtime log (a cookie it dropped). */
  #logged(line: string): void {
    const match = /^svc-note (s\d+) ([A-Za-z0-9+/=]+)$/.exec(line);
    if (!match) return;
    const slot = [...this.#slots.values()].find((candidate) => candidate.name === match[1]);
    const process = slot && this.#processes?.lookup(slot.process);
    if (!process) return;
    for (const text of Buffer.from(match[2]!, "base64").toString("utf8").split("\n")) if (text !== "") process.note(text);
  }

  /** One round: slots, signatures and routes as the processes are now, in the order that never routes to a slot not set. */
  async #apply(rearm: boolean): Promise<void> {
    const processes = this.#processes;
    if (!processes) return;
    const live = new Set(processes.running().map((process) => process.id));
    const slotCommands: string[] = [];
    const routes = new Map<string, string>();
    for (const id of live) {
      const target = processes.lookup(id);
      const route = target?.route();
      if (!target || route?.kind !== "ready") continue;
      const slot = this.#slotFor(target.id, route, slotCommands);
      if (!slot) continue;
      routes.set(id, `${slot.name}|${target.spec.tenant}`);
      if (rearm && target.id === id) slotCommands.push(`set server ${slot.name}/app health up`);
    }
    const now = Math.floor(Date.now() / 1000);
    const tokens = new Map<string, string>();
    for (const id of routes.keys()) {
      for (let second = now - TOKEN_SECONDS; second <= now + TOKEN_SECONDS; second++) {
        const key = `${id}/${second}`;
        tokens.set(key, this.#tokens.get(key) ?? (await signProxy(this.#options.secret(), id, second))[HEADER_PROXY_SIGNATURE]!);
      }
    }
    const { tokens: tokenMap, routes: routeMap } = this.#files;
    const commands = [...slotCommands];
    for (const [key, signature] of tokens) if (!this.#tokens.has(key)) commands.push(`add map ${tokenMap} ${tokenEntry(key, signature)}`);
    for (const [id, value] of routes) {
      const held = this.#routes.get(id);
      if (held !== value) commands.push(held === undefined ? `add map ${routeMap} ${id} ${value}` : `set map ${routeMap} ${id} ${value}`);
    }
    for (const id of this.#routes.keys()) if (!routes.has(id)) commands.push(`del map ${routeMap} ${id}`);
    for (const [key, signature] of this.#tokens) if (!tokens.has(key)) commands.push(`del map ${tokenMap} ${key}/${signature}`);
    // A slot whose process ended is emptied: what is still connected there is cut.
    for (const [processId, slot] of this.#slots) {
      if (live.has(processId)) continue;
      commands.push(`set server ${slot.name}/app state maint`, `shutdown sessions server ${slot.name}/app`);
      this.#slots.delete(processId);
      this.#free.push(slot.name);
    }
    this.#routes = routes;
    this.#tokens = tokens;
    if (commands.length > 0) await this.#cli(commands);
  }

  /**
   * The process's slot, its server at the ready instance (taken, or moved
   * there, and up: a dead instance's last request marked it down), or null
   * when every slot is taken.
   */
  #slotFor(processId: string, route: { address: string; port: number; agent: object }, commands: string[]): Slot | null {
    const { address, port, agent } = route;
    const held = this.#slots.get(processId);
    if (held) {
      if (held.instance !== agent || held.address !== address || held.port !== port) {
        commands.push(`set server ${held.name}/app addr ${address} port ${port}`, `set server ${held.name}/app health up`);
        Object.assign(held, { address, port, instance: agent });
      }
      return held;
    }
    const name = this.#free.pop();
    if (name === undefined) {
      if (!this.#slotsOutSaid) console.error(`builder native proxy: all ${NATIVE_SLOTS} slots are taken; further processes are served by the Node proxy`);
      this.#slotsOutSaid = true;
      return null;
    }
    const slot = { name, process: processId, address, port, instance: agent };
    this.#slots.set(processId, slot);
    commands.push(`set server ${name}/app addr ${address} port ${port}`, `set server ${name}/app state ready`, `set server ${name}/app health up`);
    return slot;
  }

  /** Requests at a slot now (its server's current sessions and queue). */
  async #inFlight(slot: string): Promise<number> {
    const stats = await this.#cli([`show stat ${slot} 4 -1`]);
    const row = stats.split("\n").find((line) => line.startsWith(`${slot},app,`));
    if (!row) return 0;
    const fields = row.split(",");
    return Number(fields[2] ?? 0) + Number(fields[4] ?? 0);
  }

  /** Runs commands through the runtime API, as few lines as fit; what HAProxy answered. */
  async #cli(commands: string[]): Promise<string> {
    const lines: string[] = [];
    let line = "";
    for (const command of commands) {
      if (line !== "" && line.length + command.length + 1 > CLI_LINE_BYTES) {
        lines.push(line);
        line = "";
      }
      line = line === "" ? command : `${line};${command}`;
    }
    if (line !== "") lines.push(line);
    let answer = "";
    for (const text of lines) answer += await this.#cliLine(text);
    const problems = answer.split("\n").filter((said) => said.trim() !== "" && !/^(# |s\d+,|New |No need to change|.*changed from)/.test(said));
    if (problems.length > 0 && !commands[0]!.startsWith("show ")) console.error(`builder native proxy: HAProxy said: ${problems.slice(0, 3).join(" / ")}`);
    return answer;
  }

  /** One line of commands; HAProxy closes the connection once it answered (a stalled answer is given up after CLI_TIMEOUT_MS). */
  #cliLine(text: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const socket = connect(this.#files.socket);
      let answer = "";
      socket.setEncoding("utf8");
      socket.setTimeout(CLI_TIMEOUT_MS, () => socket.destroy(new Error(`HAProxy's runtime API did not answer within ${CLI_TIMEOUT_MS / 1000} s`)));
      socket.on("data", (chunk: string) => {
        answer += chunk;
      });
      socket.once("error", reject);
      socket.once("close", (failed) => {
        if (!failed) resolve(answer);
      });
      socket.end(`${text}\n`);
    });
  }
}
