/**
 * Readiness checks of an app's instance, made by the node against the
 * sandbox's address on the run network: an HTTP GET of the health-check path
 * that must answer 2xx, or (no path) a TCP connection the port accepts.
 */
import { readFileSync } from "node:fs";
import { request } from "node:http";
import { connect } from "node:net";

/** One check's result: `answered` tells "the app said no" (an HTTP status) from "nothing listens yet". */
export type ProbeResult = { ok: true; detail: string } | { ok: false; answered: boolean; detail: string };

/** A single check, bounded by `timeoutMs`. */
export function probe(address: string, port: number, path: string | null, timeoutMs: number): Promise<ProbeResult> {
  return path === null ? probeTcp(address, port, timeoutMs) : probeHttp(address, port, path, timeoutMs);
}

function probeHttp(address: string, port: number, path: string, timeoutMs: number): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const req = request({
      host: address,
      port,
      path,
      method: "GET",
      agent: false,
      timeout: timeoutMs,
      headers: { "User-Agent": "svc-health-check", Accept: "*/*", Connection: "close" },
    });
    req.once("response", (response) => {
      response.resume();
      const status = response.statusCode ?? 0;
      const detail = `GET ${path} answered ${status}`;
      resolve(status >= 200 && status < 300 ? { ok: true, detail } : { ok: false, answered: true, detail });
      req.destroy();
    });
    req.once("timeout", () => {
      resolve({ ok: false, answered: false, detail: `GET ${path}: no answer within ${timeoutMs} ms` });
      req.destroy();
    });
    req.once("error", (error: NodeJS.ErrnoException) => {
      resolve({ ok: false, answered: false, detail: `GET ${path}: ${error.code ?? error.message}` });
    });
    req.end();
  });
}

function probeTcp(address: string, port: number, timeoutMs: number): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const socket = connect({ host: address, port, timeout: timeoutMs });
    socket.once("connect", () => {
      resolve({ ok: true, detail: `port ${port} accepts connections` });
      socket.destroy();
    });
    socket.once("timeout", () => {
      resolve({ ok: false, answered: false, detail: `port ${port}: no connection within ${timeoutMs} ms` });
      socket.destroy();
    });
    socket.once("error", (error: NodeJS.ErrnoException) => {
      resolve({ ok: false, answered: false, detail: `port ${port}: ${error.code ?? error.message}` });
    });
  });
}

/** A TCP socket an instance listens on, read from its network namespace. */
export type Listener = {
  /** `0.0.0.0`, `::`, `127.0.0.1`, `::1`, or a specific address. */
  address: string;
  port: number;
  /** Loopback only: nothing outside the sandbox reaches it. */
  loopback: boolean;
};

const LISTEN = "0A";

/**
 * The TCP sockets listening in the network namespace of process `pid` (any
 * process of the instance's sandbox), from /proc/<pid>/net/tcp and tcp6;
 * null when they cannot be read (the process is gone).
 */
export function listeners(pid: number): Listener[] | null {
  const found = new Map<string, Listener>();
  let readAny = false;
  for (const family of ["tcp", "tcp6"] as const) {
    let text: string;
    try {
      text = readFileSync(`/proc/${pid}/net/${family}`, "latin1");
      readAny = true;
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields.length < 4 || fields[3] !== LISTEN) continue;
      const [hexAddress, hexPort] = fields[1]!.split(":");
      const address = family === "tcp" ? ipv4(hexAddress!) : ipv6(hexAddress!);
      const port = Number.parseInt(hexPort!, 16);
      found.set(`${address}:${port}`, { address, port, loopback: address.startsWith("127.") || address === "::1" || address.startsWith("::ffff:127.") });
    }
  }
  return readAny ? [...found.values()] : null;
}

/** /proc's little-endian hex of an IPv4 address. */
function ipv4(hex: string): string {
  const value = Number.parseInt(hex, 16);
  return [0, 8, 16, 24].map((shift) => (value >>> shift) & 255).join(".");
}

/** /proc's hex of an IPv6 address (four little-endian 32-bit words), in short form where it matters here. */
function ipv6(hex: string): string {
  const bytes: number[] = [];
  for (let word = 0; word < 4; word++) {
    const value = Number.parseInt(hex.slice(word * 8, word * 8 + 8), 16);
    bytes.push(value & 255, (value >>> 8) & 255, (value >>> 16) & 255, (value >>> 24) & 255);
  }
  if (bytes.every((b) => b === 0)) return "::";
  if (bytes.slice(0, 15).every((b) => b === 0) && bytes[15] === 1) return "::1";
  if (bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 && bytes[11] === 255) return `::ffff:${bytes.slice(12).join(".")}`;
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  return groups.join(":");
}
