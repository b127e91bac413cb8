import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LogShipper } from "../../builder/src/processes/log-shipper";
import { AppLogShipment, LOG_SHIPMENT_APP_BYTES } from "../../builder/src/protocol/processes";
import { HEADER_NODE, verifyRequest } from "../../builder/src/protocol/signing";

// The node's side of issue 30 point 5: what an app's log gains leaves the node in
// signed rounds, bounded per app, sent again when the control plane did not take it.
// The control plane here is a real HTTP server checking signatures as the Worker does.

const KEY = "a".repeat(64);
const NODE = "node_shipper0001";
const line = (text: string) => `2026-11-28T12:00:00.000Z out dep_a/prc_a ${text}\n`;

let answer = 204;
const received: AppLogShipment[] = [];
const server = createServer(async (request: IncomingMessage, response) => {
  let body = "";
  for await (const chunk of request) body += chunk;
  const headers = new Headers(Object.entries(request.headers).map(([name, value]) => [name, String(value)]));
  const verdict = await verifyRequest({ secret: KEY, method: request.method!, path: request.url!, body, headers });
  if (!verdict.ok || headers.get(HEADER_NODE) !== NODE || request.url !== "/internal/app-logs") {
    response.writeHead(401).end();
    return;
  }
  if (answer === 204) received.push(AppLogShipment.parse(JSON.parse(body)));
  response.writeHead(answer).end();
});
let shipper: LogShipper;

beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  shipper = new LogShipper({ controlUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, credentials: { key: KEY, node: NODE } });
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

/** One round now (stop ships what is left; the shipper can go on taking and shipping after it). */
async function round(status = 204): Promise<AppLogShipment["logs"]> {
  answer = status;
  received.length = 0;
  await shipper.stop();
  return received.flatMap((shipment) => shipment.logs);
}

describe("the node's log shipper", () => {
  it("ships every app's new lines in one signed round, and nothing when nothing was written", async () => {
    shipper.take("app_one", Buffer.from(line("a") + line("b")));
    shipper.take("app_two", Buffer.from(line("c")));
    shipper.take("app_one", Buffer.from(line("d")));
    expect(await round()).toEqual([
      { appId: "app_one", text: line("a") + line("b") + line("d") },
      { appId: "app_two", text: line("c") },
    ]);
    expect(await round()).toEqual([]);
  });

  it("ships at most its bound of an app's lines a round, whole lines, and says how much stayed on the node", async () => {
    const spam = Buffer.from(line("x".repeat(1000)).repeat(1024));
    shipper.take("app_spam", spam);
    const [shipped] = await round();
    const [notice, ...lines] = shipped!.text.trimEnd().split("\n");
    const kept = lines.length * line("x".repeat(1000)).length;
    expect(kept).toBeLessThanOrEqual(LOG_SHIPMENT_APP_BYTES);
    expect(kept).toBeGreaterThan(LOG_SHIPMENT_APP_BYTES - line("x".repeat(1000)).length);
    expect(new Set(lines)).toEqual(new Set([line("x".repeat(1000)).trimEnd()]));
    expect(notice).toMatch(new RegExp(`^\\S+ svc -/node ${spam.length - kept} bytes of this log were printed too fast to leave the node; they are kept on it only$`));
  });

  it("sends a round the control plane did not take (5xx, 401, 429) again, with what came since; a refused one (400) is not resent", async () => {
    shipper.take("app_retry", Buffer.from(line("first")));
    expect(await round(503)).toEqual([]);
    shipper.take("app_retry", Buffer.from(line("second")));
    // An isolate whose view of the fleet lags the node's join answers 401: the lines wait for the next round.
    expect(await round(401)).toEqual([]);
    shipper.take("app_retry", Buffer.from(line("third")));
    expect(await round()).toEqual([{ appId: "app_retry", text: line("first") + line("second") + line("third") }]);
    shipper.take("app_retry", Buffer.from(line("refused")));
    answer = 400;
    await shipper.stop();
    expect(await round()).toEqual([]);
  });
});
