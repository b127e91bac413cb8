/**
 * Ships every app's runtime log off the node as it is written (docs/fleet.md,
 * "Logs that outlive their node"): every {@link SHIP_EVERY_MS}, the whole
 * lines each app's log on this node gained since its last shipment go to the
 * control plane (`POST /internal/app-logs`, signed by the node), which keeps
 * them per app. After a failover or a drain, `svc logs --runtime` reads what
 * the old node wrote from there.
 *
 * Bounded like the log itself: at most {@link LOG_SHIPMENT_MAX_BYTES} per app
 * per round; an app that prints faster than that (the log's own rate bound
 * allows 1 MiB/s) has the lines it printed in between kept on the node only,
 * and the shipment after the gap says so. A shipment the control plane did
 * not take is sent again next round. What an earlier run of the agent wrote
 * counts as shipped (that run shipped it, or it is on the node's disk).
 */
import { LOG_MAX_LINE_BYTES, LOG_SHIPMENT_MAX_BYTES, type NodeCredentials, signRequest } from "../protocol.js";
import type { AppLog, AppLogs } from "./app-log.js";

/** How often the logs' new lines are shipped. */
export const SHIP_EVERY_MS = 3_000;
/** Each request may wait this long for the control plane. */
const SHIP_DEADLINE_MS = 10_000;
/** A shipment's JSON stays under the control plane's body limit (1 MiB): escaped control bytes take six each. */
const BODY_MAX_BYTES = 900 * 1024;

export class LogShipper {
  readonly #controlUrl: string;
  readonly #credentials: NodeCredentials;
  readonly #logs: AppLogs;
  /** App id → the logical offset shipped up to. */
  readonly #shipped = new Map<string, number>();
  #timer: NodeJS.Timeout | null = null;
  #round: Promise<void> = Promise.resolve();
  #failing = false;

  constructor(options: { controlUrl: string; credentials: NodeCredentials; logs: AppLogs }) {
    this.#controlUrl = options.controlUrl;
    this.#credentials = options.credentials;
    this.#logs = options.logs;
  }

  start(): void {
    this.#timer = setInterval(() => {
      this.#round = this.#round.then(() => this.#shipAll());
    }, SHIP_EVERY_MS);
    this.#timer.unref();
  }

  /** Ships what is left, then stops (a clean shutdown). */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.#round;
    await this.#shipAll();
  }

  async #shipAll(): Promise<void> {
    for (const [appId, opening] of this.#logs.opened()) {
      const log = await opening.catch(() => null);
      if (log) await this.#ship(appId, log);
    }
  }

  async #ship(appId: string, log: AppLog): Promise<void> {
    if (!this.#shipped.has(appId)) this.#shipped.set(appId, log.openedAt);
    const shipped = this.#shipped.get(appId)!;
    if (log.end <= shipped) return;
    const behind = log.end - shipped;
    const from = behind > 4 * LOG_SHIPMENT_MAX_BYTES ? log.end - LOG_SHIPMENT_MAX_BYTES : shipped;
    const gap = from > shipped ? `${new Date().toISOString()} svc -/node ${from - shipped} bytes of this log were printed too fast to leave the node; they are on it\n` : "";
    let budget = LOG_SHIPMENT_MAX_BYTES - gap.length;
    let read = await log.linesFrom(from, budget);
    let body = JSON.stringify({ appId, text: gap + read.lines.toString("utf8") });
    while (Buffer.byteLength(body) > BODY_MAX_BYTES && budget > 2 * LOG_MAX_LINE_BYTES) {
      budget = Math.floor(budget / 2);
      read = await log.linesFrom(from, budget);
      body = JSON.stringify({ appId, text: gap + read.lines.toString("utf8") });
    }
    const { lines, next } = read;
    if (lines.length === 0) return;
    const path = "/internal/app-logs";
    try {
      const headers = await signRequest({ secret: this.#credentials.key, node: this.#credentials.node, method: "POST", path, body });
      const response = await fetch(new URL(path, this.#controlUrl), {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: AbortSignal.timeout(SHIP_DEADLINE_MS),
      });
      await response.body?.cancel();
      // Refused as it is (4xx): sending it again would be refused again; it stays on the node only.
      if (!response.ok && response.status < 500) console.error(`builder: the control plane refused ${lines.length} bytes of app ${appId}'s log (HTTP ${response.status}); they stay on this node`);
      else if (!response.ok) throw new Error(`HTTP ${response.status}`);
      this.#shipped.set(appId, next);
      this.#failing = false;
    } catch (error) {
      if (!this.#failing) console.error(`builder: shipping app logs failed (${error instanceof Error ? error.message : String(error)}); they are kept here and sent again`);
      this.#failing = true;
    }
  }
}
