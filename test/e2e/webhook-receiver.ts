import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export type Received = { at: number; headers: Record<string, string>; body: string; event: { type: string; timestamp: string; data: Record<string, unknown> } };

/** A webhook receiver on this machine: every POST kept with its headers and raw body; it can go down and come back on its port. */
export class Receiver {
  readonly got: Received[] = [];
  #server: Server | null = null;
  port = 0;

  async start(port = 0): Promise<void> {
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString("utf8");
        const headers = Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, String(v)]));
        this.got.push({ at: Date.now(), headers, body, event: JSON.parse(body) as Received["event"] });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => this.#server!.listen(port, "127.0.0.1", resolve));
    this.port = (this.#server.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
  }

  of(type: string): Received[] {
    return this.got.filter((r) => r.event.type === type);
  }
}

/** Standard Webhooks' check, by hand: HMAC-SHA256 of `id.timestamp.body` with the secret's bytes, one of the `v1,` signatures. */
export function signedBy(secret: string, received: Received): boolean {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = createHmac("sha256", key).update(`${received.headers["webhook-id"]}.${received.headers["webhook-timestamp"]}.${received.body}`).digest();
  return received.headers["webhook-signature"]!.split(" ").some((part) => {
    const [version, signature] = part.split(",");
    const given = Buffer.from(signature ?? "", "base64");
    return version === "v1" && given.length === expected.length && timingSafeEqual(given, expected);
  });
}
