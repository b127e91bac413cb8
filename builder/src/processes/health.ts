/**
 * Readiness checks of an app's instance, made by the node against the
 * sandbox's address on the run network: an HTTP GET of the health-check path
 * that must answer 2xx, or (no path) a TCP connection the port accepts.
 */
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
