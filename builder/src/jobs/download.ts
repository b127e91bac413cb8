/**
 * A GET whose body arrives in large pieces the socket reads straight into.
 *
 * Why not node:http or fetch: both hand the body over in the socket's 64 KiB
 * reads, each a fresh buffer through the stream machinery, and that is most
 * of what receiving costs. A 250 MiB body over loopback took 0.20 CPU-s with
 * node:http and 0.04 with the socket reading into caller-supplied buffers
 * (`onread`), 0.35 and 0.17 over TLS; a restore runs on a node whose cores
 * the extraction already fills, so that is time off the restore. Neither
 * node:http nor undici can read into a caller's buffers, so the response's
 * head is parsed here: the status line and the two framing headers, bounded
 * in size. The body must be framed by Content-Length or by the connection's
 * close; a chunked body is refused by name (object storage never sends one).
 * No redirects are followed, no compression is asked for, TLS checks the
 * certificate as https does.
 */
import { connect as netConnect, type Socket } from "node:net";
import { Readable } from "node:stream";
import { connect as tlsConnect } from "node:tls";

/** A response head this long without its end is refused. */
const HEAD_LIMIT_BYTES = 64 * 1024;

/** Anything that ended a download: the connection, TLS, or the server's answer. */
export class DownloadError extends Error {}

/** A response: its status, its announced length, and its body in pieces of `pieceBytes` (the last may be shorter). */
export interface Download {
  status: number;
  contentLength: number | null;
  body: Readable;
}

/**
 * GETs `url` over HTTP/1.1; resolves once the response's head has arrived.
 * Connection, TLS and protocol failures reject, or end the body, with a
 * {@link DownloadError}; an abort with the signal's reason.
 */
export function download(url: URL, options: { signal: AbortSignal; pieceBytes: number }): Promise<Download> {
  const { signal, pieceBytes } = options;
  if (url.protocol !== "http:" && url.protocol !== "https:") return Promise.reject(new DownloadError(`cannot download a ${url.protocol} URL`));
  if (signal.aborted) return Promise.reject(signal.reason);
  const host = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
  const secure = url.protocol === "https:";
  const port = Number(url.port || (secure ? 443 : 80));

  return new Promise((resolve, reject) => {
    let piece = Buffer.allocUnsafe(pieceBytes);
    let filled = 0;
    let response: Download | null = null;
    /** Body bytes still to come (null: until the connection closes). */
    let remaining: number | null = null;

    const body = new Readable({
      // Returning false from onread stops the socket's reads; read(0) starts them again.
      read: () => socket.read(0),
      destroy: (error, done) => {
        socket.destroy();
        done(error);
      },
    });
    const fail = (error: Error) => {
      socket.destroy();
      if (response === null) reject(error);
      else body.destroy(error);
    };
    const deliver = (): boolean => {
      const full = piece.subarray(0, filled);
      piece = Buffer.allocUnsafe(pieceBytes);
      filled = 0;
      return body.push(full);
    };
    const onHead = (end: number) => {
      const parsed = parseHead(piece.toString("latin1", 0, end));
      if (typeof parsed === "string") return fail(new DownloadError(`bad response from ${url.host}: ${parsed}`));
      const ok = parsed.status >= 200 && parsed.status <= 299;
      if (ok && parsed.chunked) return fail(new DownloadError(`${url.host} sent a chunked body; a download needs a Content-Length or the connection's close`));
      piece.copyWithin(0, end + 4, filled);
      filled -= end + 4;
      remaining = parsed.contentLength;
      response = { status: parsed.status, contentLength: parsed.contentLength, body };
      resolve(response);
    };
    const onRead = (length: number): boolean => {
      if (response === null) {
        const from = Math.max(0, filled - 3);
        filled += length;
        const end = piece.subarray(0, filled).indexOf("\r\n\r\n", from, "latin1");
        if (end === -1) {
          if (filled < Math.min(HEAD_LIMIT_BYTES, pieceBytes)) return true;
          fail(new DownloadError(`bad response from ${url.host}: its head is over ${HEAD_LIMIT_BYTES} bytes`));
          return false;
        }
        onHead(end);
        if (response === null) return false;
      } else {
        filled += length;
      }
      if (remaining !== null && filled >= remaining) {
        // Anything past the announced length is not the body.
        filled = remaining;
        remaining = 0;
        if (filled > 0) body.push(piece.subarray(0, filled));
        body.push(null);
        socket.destroy();
        return false;
      }
      if (filled < pieceBytes) return true;
      if (remaining !== null) remaining -= filled;
      return deliver();
    };

    const connection = { host, port, onread: { buffer: () => piece.subarray(filled), callback: onRead } };
    const socket: Socket = secure
      ? tlsConnect({ ...connection, servername: isIp(host) ? undefined : host })
      : netConnect(connection);
    socket.once(secure ? "secureConnect" : "connect", () => {
      socket.write(`GET ${url.pathname}${url.search} HTTP/1.1\r\nHost: ${url.host}\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n`);
    });
    socket.on("end", () => {
      if (response === null) return fail(new DownloadError(`${url.host} closed the connection before answering`));
      if (remaining === 0) return;
      if (remaining !== null) return fail(new DownloadError(`${url.host} closed the connection ${remaining - filled} bytes before the body's end`));
      if (filled > 0) deliver();
      body.push(null);
    });
    socket.on("error", (error) => fail(new DownloadError(error.message, { cause: error })));
    const abort = () => fail(signal.reason instanceof Error ? signal.reason : new DownloadError("aborted"));
    signal.addEventListener("abort", abort, { once: true });
    socket.once("close", () => signal.removeEventListener("abort", abort));
  });
}

/** Status and framing of a response head (without its final blank line), or what is wrong with it. */
function parseHead(head: string): { status: number; contentLength: number | null; chunked: boolean } | string {
  const [statusLine = "", ...lines] = head.split("\r\n");
  const status = /^HTTP\/1\.[01] (\d{3})(?: |$)/.exec(statusLine);
  if (!status) return `not an HTTP/1.1 status line: ${JSON.stringify(statusLine.slice(0, 80))}`;
  let contentLength: number | null = null;
  let chunked = false;
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon <= 0) return `not a header line: ${JSON.stringify(line.slice(0, 80))}`;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    if (name === "content-length") {
      if (!/^\d{1,15}$/.test(value) || (contentLength !== null && contentLength !== Number(value))) return `bad Content-Length ${JSON.stringify(value)}`;
      contentLength = Number(value);
    } else if (name === "transfer-encoding" && value.toLowerCase() !== "identity") {
      chunked = true;
    }
  }
  return { status: Number(status[1]), contentLength, chunked };
}

function isIp(host: string): boolean {
  return /^[\d.]+$/.test(host) || host.includes(":");
}
