/**
 * The only way out of a build's sandbox: an HTTP proxy that reaches the package
 * registry (and the python package index, when the builder has one) and
 * nothing else (spec, static sites rule 7). Builds run in a network
 * namespace with nothing but loopback; a tiny forwarder inside the sandbox
 * (`FORWARDER_SOURCE`, started by the sandbox before the step's command) listens
 * on 127.0.0.1:{@link PROXY_PORT} there and relays every connection to this
 * proxy's unix socket, which is bind-mounted into the sandbox. Package managers
 * find it through the usual HTTP(S)_PROXY variables.
 *
 * The proxy answers `CONNECT host:port` only for the registry's host and port
 * (TLS then runs end to end between the package manager and the registry), and
 * plain-HTTP requests only for URLs under the registry's origin; anything else
 * gets 403 with a reason. Because it needs no privilege, builds install the same
 * way whether the builder runs as root or not.
 */
import { chmod, rm } from "node:fs/promises";
import { type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse, createServer, request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { connect } from "node:net";
import type { Duplex } from "node:stream";

/** Port the forwarder listens on inside each build sandbox. */
export const PROXY_PORT = 3128;
/** Where the sandbox sees the proxy's socket. */
export const SANDBOX_SOCKET_PATH = "/run/svc/registry.sock";
/** Registry used when the builder has no mirror configured (the package managers' default). */
const DEFAULT_REGISTRY = "https://registry.npmjs.org/";
/** yarn 1 lockfiles name this host; it serves the same packages as npm's. */
const YARN_REGISTRY = "https://registry.yarnpkg.com/";
/** PyPI's index pages link to files on this host. */
const PYPI_HOST = "pypi.org";
const PYPI_FILES = "https://files.pythonhosted.org/";

/**
 * The forwarder, run with `node -e` inside the sandbox: it prints one line once
 * it listens (the sandbox waits for it) and pipes each connection to the socket.
 */
export const FORWARDER_SOURCE = `const net=require("node:net");net.createServer((c)=>{const u=net.connect(${JSON.stringify(SANDBOX_SOCKET_PATH)});c.pipe(u).pipe(c);c.on("error",()=>u.destroy());u.on("error",()=>c.destroy())}).listen(${PROXY_PORT},"127.0.0.1",()=>{process.stdout.write("ready\\n")})`;

/** The variables a build step gets so npm, yarn and pnpm use the proxy. */
export const PROXY_ENV: Record<string, string> = Object.fromEntries(
  ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy", "npm_config_https_proxy"].map((name) => [
    name,
    `http://127.0.0.1:${PROXY_PORT}`,
  ]),
);

function hostPort(url: URL): string {
  return `${url.hostname}:${url.port || (url.protocol === "https:" ? "443" : "80")}`;
}

export class RegistryProxy {
  readonly socketPath: string;
  readonly #server: Server;
  readonly #origins: URL[];
  /** How many of the origins, first in the list, are the npm registry's. */
  readonly #npmOrigins: number;

  private constructor(socketPath: string, server: Server, origins: URL[], npmOrigins: number) {
    this.socketPath = socketPath;
    this.#server = server;
    this.#origins = origins;
    this.#npmOrigins = npmOrigins;
  }

  /**
   * Listens on `socketPath` (replacing a stale socket) for the registry
   * `registry` (null: the public npm registry) and, when given, the python
   * package index `pipIndex` (the builder's BUILDER_PIP_INDEX_URL): its whole
   * origin, since indexes link to their files elsewhere on their host (PyPI:
   * on files.pythonhosted.org, which comes with it).
   */
  static async open(socketPath: string, registry: string | null, pipIndex: string | null = null): Promise<RegistryProxy> {
    // yarn 1 lockfiles name the public registry's other host; it is the same registry, so it comes with it.
    const chosen = registry ?? DEFAULT_REGISTRY;
    const npm = [chosen, ...(new URL(chosen).host === new URL(DEFAULT_REGISTRY).host ? [YARN_REGISTRY] : [])];
    const pip = pipIndex === null ? [] : [new URL("/", pipIndex).href, ...(new URL(pipIndex).hostname === PYPI_HOST ? [PYPI_FILES] : [])];
    const origins = [...npm, ...pip].map((url) => new URL(url));
    const server = createServer();
    const proxy = new RegistryProxy(socketPath, server, origins, npm.length);
    server.on("connect", (req: IncomingMessage, socket: Duplex, head: Buffer) => proxy.#tunnel(req, socket, head));
    server.on("request", (req: IncomingMessage, res: ServerResponse) => proxy.#forward(req, res));
    await rm(socketPath, { force: true });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(socketPath, () => resolve());
    });
    // Sandboxed users connect to it; the directories around it decide who can reach it at all.
    await chmod(socketPath, 0o666);
    return proxy;
  }

  /** The registries (and package index) a build can reach, for the log. */
  get allowed(): string {
    return this.#origins.map((origin) => origin.origin).join(", ");
  }

  /** The npm registry's origins alone, for the log of a node install. */
  get npmAllowed(): string {
    return this.#origins
      .slice(0, this.#npmOrigins)
      .map((origin) => origin.origin)
      .join(", ");
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
    await rm(this.socketPath, { force: true });
  }

  #tunnel(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on("error", () => socket.destroy());
    const target = req.url ?? "";
    const allowed = this.#origins.some((origin) => origin.protocol === "https:" && hostPort(origin) === target);
    if (!allowed) {
      socket.end(`HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nbuilds may only reach the package registries (${this.allowed}), not ${target}\n`);
      return;
    }
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    const upstream = connect(port, host, () => {
      socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      upstream.pipe(socket).pipe(upstream);
    });
    upstream.on("error", (error) => {
      socket.end(`HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\nregistry unreachable: ${error.message}\n`);
    });
    socket.on("close", () => upstream.destroy());
  }

  #forward(req: IncomingMessage, res: ServerResponse): void {
    let url: URL;
    try {
      url = new URL(req.url ?? "");
    } catch {
      res.writeHead(400, { "Content-Type": "text/plain" }).end("absolute URL expected\n");
      return;
    }
    const origin = this.#origins.find((o) => o.origin === url.origin && url.pathname.startsWith(o.pathname));
    if (!origin) {
      res.writeHead(403, { "Content-Type": "text/plain" }).end(`builds may only reach the package registries (${this.allowed})\n`);
      return;
    }
    const send = url.protocol === "https:" ? httpsRequest : httpRequest;
    const headers: OutgoingHttpHeaders = { ...req.headers, host: url.host };
    delete headers["proxy-connection"];
    delete headers["proxy-authorization"];
    const upstream = send(url, { method: req.method, headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    upstream.on("error", (error) => {
      if (!res.headersSent) res.writeHead(502, { "Content-Type": "text/plain" });
      res.end(`registry unreachable: ${error.message}\n`);
    });
    req.pipe(upstream);
  }
}
