/**
 * Ships every app's runtime log off the node as it is written (docs/fleet.md,
 * "Logs that outlive their node"), so a failover or a drain does not take
 * the app's history with the node.
 *
 * Off the capture path: what an app's log appends is only kept by reference
 * here ({@link LogShipper.take}, the same buffers the log file gets), and
 * every {@link LOG_SHIP_EVERY_MS} one signed request carries what each app
 * gained to the control plane (`POST /internal/app-logs`). Bounded: at most
 * {@link LOG_SHIPMENT_APP_BYTES} per app per round; an app printing faster
 * keeps the rest on its node only, and the next shipment says how many bytes
 * that was. A round the control plane did not take is sent again with the
 * next one (what arrives meanwhile beyond the bound is counted, not kept):
 * the node's memory stays bounded while it cannot reach the control plane.
 */
import { type AppLogShipment, LOG_SHIP_EVERY_MS, LOG_SHIPMENT_APP_BYTES, LOG_SHIPMENT_APPS, LOG_SHIPMENT_BYTES } from "../protocol/processes.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { signRequest } from "../protocol/signing.js";

/** Each round's request may wait this long for the control plane. */
const SHIP_DEADLINE_MS = 10_000;
const PATH = "/internal/app-logs";

/** What one app's log gained since its last shipment. */
type Pending = { parts: Buffer[]; bytes: number; skipped: number };

export class LogShipper {
  readonly #controlUrl: string;
  readonly #credentials: NodeCredentials;
  #pending = new Map<string, Pending>();
  #timer: NodeJS.Timeout | null = null;
  #round: Promise<void> = Promise.resolve();
  #shipping = false;
  #failing = false;
  /** Apps whose log this process has shipped some of: the first shipment of each is said once in the builder's log. */
  readonly #shipped = new Set<string>();

  constructor(options: { controlUrl: string; credentials: NodeCredentials }) {
    this.#controlUrl = options.controlUrl;
    this.#credentials = options.credentials;
  }

  /** Records (whole lines, each ending in a newline) appended to `appId`'s log: kept for the next round, up to the bound. */
  take(appId: string, records: Buffer): void {
    let pending = this.#pending.get(appId);
    if (!pending) {
      pending = { parts: [], bytes: 0, skipped: 0 };
      this.#pending.set(appId, pending);
    }
    const room = LOG_SHIPMENT_APP_BYTES - pending.bytes;
    let kept = records;
    if (records.length > room) {
      // The whole lines that fit; the first line whole when nothing is kept yet (a line is at most 64 KiB).
      const last = room > 0 ? records.lastIndexOf(0x0a, room - 1) : -1;
      const cut = last !== -1 ? last + 1 : pending.bytes === 0 ? records.indexOf(0x0a) + 1 : 0;
      kept = records.subarray(0, cut);
      pending.skipped += records.length - cut;
    }
    if (kept.length === 0) return;
    pending.parts.push(kept);
    pending.bytes += kept.length;
  }

  start(): void {
    this.#timer = setInterval(() => {
      // A round still waiting for the control plane (up to its deadline) is not queued behind: the next takes all.
      if (this.#shipping) return;
      this.#shipping = true;
      this.#round = this.#ship().finally(() => {
        this.#shipping = false;
      });
    }, LOG_SHIP_EVERY_MS);
    this.#timer.unref();
  }

  /** Ships what is left, then stops (a clean shutdown). */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.#round;
    await this.#ship();
  }

  /** One round: what every app gained, in one signed request (apps past the request's bound wait for the next round). */
  async #ship(): Promise<void> {
    if (this.#pending.size === 0) return;
    const taken = new Map<string, Pending>();
    const logs: AppLogShipment["logs"] = [];
    let bytes = 0;
    for (const [appId, pending] of this.#pending) {
      const notice = pending.skipped > 0 ? `${new Date().toISOString()} svc -/node ${pending.skipped} bytes of this log were printed too fast to leave the node; they are kept on it only\n` : "";
      const text = notice + Buffer.concat(pending.parts, pending.bytes).toString("utf8");
      // Measured as it travels (JSON escapes a control byte into six).
      const size = Buffer.byteLength(JSON.stringify(text)) + appId.length + 20;
      if (bytes + size > LOG_SHIPMENT_BYTES && logs.length > 0) continue;
      taken.set(appId, pending);
      this.#pending.delete(appId);
      bytes += size;
      logs.push({ appId, text });
      if (logs.length === LOG_SHIPMENT_APPS) break;
    }
    if (logs.length === 0) return;
    const body = JSON.stringify({ logs } satisfies AppLogShipment);
    try {
      const headers = await signRequest({ secret: this.#credentials.key, node: this.#credentials.node, method: "POST", path: PATH, body });
      const response = await fetch(new URL(PATH, this.#controlUrl), {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: AbortSignal.timeout(SHIP_DEADLINE_MS),
      });
      await response.body?.cancel();
      // 401 too: an isolate's view of the fleet may lag a node's (re)join; kept for the next round, within the bound.
      if (response.status >= 500 || response.status === 401 || response.status === 429) throw new Error(`HTTP ${response.status}`);
      // Refused as it is (400, 413): sent again it would be refused again; the lines stay on this node only.
      if (!response.ok) console.error(`builder: the control plane refused a log shipment of ${bytes} bytes (HTTP ${response.status}); the lines stay on this node`);
      else {
        const first = logs.filter(({ appId }) => !this.#shipped.has(appId));
        for (const { appId } of first) this.#shipped.add(appId);
        if (first.length > 0) console.log(`builder: shipped the first lines of the runtime log of ${first.map(({ appId }) => appId).join(", ")}`);
      }
      this.#failing = false;
    } catch (error) {
      if (!this.#failing) console.error(`builder: shipping app logs failed (${error instanceof Error ? error.message : String(error)}); kept for the next round`);
      this.#failing = true;
      // Sent again next round, then what arrived since as far as the bound lets it.
      for (const [appId, pending] of taken) {
        const since = this.#pending.get(appId);
        this.#pending.set(appId, pending);
        if (!since) continue;
        pending.skipped += since.skipped;
        for (const part of since.parts) this.take(appId, part);
      }
    }
  }
}
