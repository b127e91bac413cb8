import { execFile, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { type AddressInfo, createServer as createNetServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { download } from "../../builder/src/jobs/download.js";

/** The builder's GET into large pieces, against real servers: node:http, raw sockets that answer by hand, and TLS. */
const PIECE = 1024 * 1024;
const payload = randomBytes(3 * PIECE + 12_345);
const servers: Server[] = [];

/** A server that answers every connection with `answer` (after reading the request's head). */
async function rawServer(answer: (socket: Socket) => void | Promise<void>): Promise<string> {
  const server = createNetServer((socket) => {
    socket.on("error", () => undefined);
    socket.once("data", () => void answer(socket));
  });
  servers.push(server);
  await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/archive.tar.gz?X-Amz-Signature=abc`;
}

async function collect(url: string, signal: AbortSignal): Promise<{ status: number; pieces: Buffer[] }> {
  const response = await download(new URL(url), { signal, pieceBytes: PIECE });
  const pieces: Buffer[] = [];
  for await (const piece of response.body) pieces.push(piece as Buffer);
  return { status: response.status, pieces };
}

const never = () => new AbortController().signal;

let nodeUrl: string;
const requests: { url: string; headers: Record<string, string | string[] | undefined> }[] = [];
beforeAll(async () => {
  const server = createHttpServer((request, response) => {
    requests.push({ url: request.url ?? "", headers: request.headers });
    if (request.url?.startsWith("/missing")) return response.writeHead(404, { "Content-Type": "application/xml" }).end("<Error>NoSuchKey</Error>");
    if (request.url?.startsWith("/chunked")) return response.writeHead(200).end(payload);
    response.writeHead(200, { "Content-Length": payload.length }).end(payload);
  });
  servers.push(server as unknown as Server);
  await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
  nodeUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => {
  for (const server of servers) server.close();
});

describe("download: framing", () => {
  it("delivers a Content-Length body whole, in pieces of the size asked for, and sends the path and query", async () => {
    const { status, pieces } = await collect(`${nodeUrl}/a/b.tar.gz?X-Amz-Expires=60&x=%2F`, never());
    expect(status).toBe(200);
    expect(Buffer.concat(pieces).equals(payload)).toBe(true);
    expect(pieces.slice(0, -1).every((piece) => piece.length === PIECE)).toBe(true);
    expect(pieces).toHaveLength(4);
    const sent = requests.at(-1)!;
    expect(sent.url).toBe("/a/b.tar.gz?X-Amz-Expires=60&x=%2F");
    expect(sent.headers.host).toBe(new URL(nodeUrl).host);
    expect(sent.headers["accept-encoding"]).toBe("identity");
  });

  it("finds a head that arrives split across many reads", async () => {
    const url = await rawServer(async (socket) => {
      for (const part of ["HTTP/1.1 200 OK\r\nConte", "nt-Length: 11\r", "\n\r", "\nhello", " world"]) {
        socket.write(part);
        await sleep(20);
      }
      socket.end();
    });
    const { pieces } = await collect(url, never());
    expect(Buffer.concat(pieces).toString()).toBe("hello world");
  });

  it("delivers a body framed by the connection's close", async () => {
    const url = await rawServer((socket) => {
      socket.write("HTTP/1.0 200 OK\r\nContent-Type: application/gzip\r\n\r\n");
      socket.end(payload);
    });
    const { pieces } = await collect(url, never());
    expect(Buffer.concat(pieces).equals(payload)).toBe(true);
  });

  it("stops at the announced length, whatever follows it", async () => {
    const url = await rawServer((socket) => {
      socket.write("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA BYTES");
    });
    const { pieces } = await collect(url, never());
    expect(Buffer.concat(pieces).toString()).toBe("hello");
  });

  it("delivers an empty body", async () => {
    const url = await rawServer((socket) => {
      socket.write("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    });
    const { pieces } = await collect(url, never());
    expect(Buffer.concat(pieces).length).toBe(0);
  });

  it("fails a body cut short of its Content-Length, saying how much is missing", async () => {
    const url = await rawServer((socket) => {
      socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${payload.length}\r\n\r\n`);
      socket.end(payload.subarray(0, PIECE + 100));
    });
    await expect(collect(url, never())).rejects.toThrow(`closed the connection ${payload.length - PIECE - 100} bytes before the body's end`);
  });

  it("answers a non-2xx status with its status, and refuses a chunked 2xx body by name", async () => {
    const missing = await download(new URL(`${nodeUrl}/missing`), { signal: never(), pieceBytes: PIECE });
    expect(missing.status).toBe(404);
    missing.body.destroy();
    await expect(collect(`${nodeUrl}/chunked`, never())).rejects.toThrow(/sent a chunked body/);
  });
});

describe("download: hostile or broken servers", () => {
  const cases: [string, string][] = [
    ["not HTTP", "SSH-2.0-OpenSSH_9.2\r\n\r\n"],
    ["HTTP/2 status line", "HTTP/2 200\r\n\r\n"],
    ["status without a code", "HTTP/1.1 OK\r\n\r\n"],
    ["header without a colon", "HTTP/1.1 200 OK\r\nContent-Length 5\r\n\r\nhello"],
    ["negative length", "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello"],
    ["length with a sign", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"],
    ["two different lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"],
    ["a length past 2^53", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"],
  ];
  for (const [name, head] of cases) {
    it(`refuses ${name}`, async () => {
      const url = await rawServer((socket) => {
        socket.end(head);
      });
      await expect(collect(url, never())).rejects.toThrow(/^bad response from 127\.0\.0\.1:\d+: /);
    });
  }

  it("refuses a head that never ends, after 64 KiB", async () => {
    let sent = 0;
    const url = await rawServer(async (socket) => {
      socket.write("HTTP/1.1 200 OK\r\n");
      while (!socket.destroyed && sent < 4 * PIECE) {
        socket.write(`X-Padding: ${"a".repeat(1000)}\r\n`);
        sent += 1014;
        await sleep(0);
      }
    });
    await expect(collect(url, never())).rejects.toThrow(/its head is over 65536 bytes/);
    expect(sent).toBeLessThan(PIECE);
  });

  it("fails when the server closes before answering, or refuses the connection", async () => {
    const url = await rawServer((socket) => {
      socket.end();
    });
    await expect(collect(url, never())).rejects.toThrow(/closed the connection before answering/);
    const closed = createNetServer();
    await new Promise<void>((ready) => closed.listen(0, "127.0.0.1", ready));
    const port = (closed.address() as AddressInfo).port;
    closed.close();
    await expect(collect(`http://127.0.0.1:${port}/x`, never())).rejects.toThrow(/ECONNREFUSED/);
    await expect(download(new URL("ftp://127.0.0.1/x"), { signal: never(), pieceBytes: PIECE })).rejects.toThrow(/cannot download a ftp: URL/);
  });
});

describe("download: flow", () => {
  it("stops reading while nobody consumes the body, and resumes when read", async () => {
    let written = 0;
    let drained = false;
    const url = await rawServer(async (socket) => {
      const total = 64 * PIECE;
      socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${total}\r\n\r\n`);
      const block = Buffer.alloc(PIECE, 7);
      while (written < total) {
        written += block.length;
        if (!socket.write(block)) await new Promise((ready) => socket.once("drain", ready));
      }
      drained = true;
    });
    const response = await download(new URL(url), { signal: never(), pieceBytes: PIECE });
    await sleep(300);
    // What sits unread is one piece in the body's buffer and what the kernel's socket buffers hold: far from the 64 MiB sent.
    expect(response.body.readableLength).toBeLessThanOrEqual(PIECE);
    expect(written).toBeLessThan(32 * PIECE);
    expect(drained).toBe(false);
    let received = 0;
    for await (const piece of response.body) received += (piece as Buffer).length;
    expect(received).toBe(64 * PIECE);
  });

  it("ends the transfer when the signal aborts, and rejects at once when it already has", async () => {
    const url = await rawServer((socket) => {
      socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${10 * PIECE}\r\n\r\n`);
      socket.write(Buffer.alloc(PIECE));
    });
    const controller = new AbortController();
    const response = await download(new URL(url), { signal: controller.signal, pieceBytes: PIECE });
    setTimeout(() => controller.abort(new Error("job cancelled")), 50);
    await expect(
      (async () => {
        for await (const _ of response.body);
      })(),
    ).rejects.toThrow("job cancelled");
    await expect(download(new URL(url), { signal: AbortSignal.abort(new Error("gone")), pieceBytes: PIECE })).rejects.toThrow("gone");
  });
});

describe("download: TLS", () => {
  let dir: string;
  let httpsUrl: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "svc-download-"));
    execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
      "-addext", "subjectAltName=DNS:localhost", "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem")], { stdio: "ignore" });
    const server = createHttpsServer({ key: await readFile(join(dir, "key.pem")), cert: await readFile(join(dir, "cert.pem")) }, (_request, response) =>
      response.writeHead(200, { "Content-Length": payload.length }).end(payload),
    );
    servers.push(server as unknown as Server);
    await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
    httpsUrl = `https://localhost:${(server.address() as AddressInfo).port}/archive.tar.gz`;
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it("checks the server's certificate: a self-signed one is refused", async () => {
    await expect(collect(httpsUrl, never())).rejects.toThrow(/self[- ]signed certificate/);
  });

  it("downloads over TLS from a server whose certificate it trusts", async () => {
    // The trust store is read once per process: a child process is given the test's certificate authority.
    const script = `const { download } = await import(${JSON.stringify(resolve("builder/src/jobs/download.ts"))});
      const response = await download(new URL(process.argv[1]), { signal: new AbortController().signal, pieceBytes: ${PIECE} });
      const hash = (await import("node:crypto")).createHash("sha256");
      let pieces = 0;
      for await (const piece of response.body) { hash.update(piece); pieces++; }
      console.log(response.status, pieces, hash.digest("hex"));`;
    const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, httpsUrl], {
      env: { ...process.env, NODE_EXTRA_CA_CERTS: join(dir, "cert.pem") },
    });
    const expected = (await import("node:crypto")).createHash("sha256").update(payload).digest("hex");
    expect(stdout.trim()).toBe(`200 4 ${expected}`);
  });
});
