/**
 * Issue 32's outage figure: a webhook receiver that is down for OUTAGE_S
 * seconds (default 300) gets every event sent meanwhile once it is back, each
 * exactly as signed. One local stack: a webhook on a receiver on this machine,
 * the receiver stopped, three test events and two failed cron runs (two
 * `cron.failed`) queued while it is down, the receiver started again on the
 * same port after the outage. Prints how many arrived, how long after the
 * receiver came back (the retry schedule decides: 5 s, 10 s, 30 s, 1 min,
 * 5 min … hourly), and whether each verifies with the Standard Webhooks
 * reference library; exits 1 unless all did.
 *
 *     npx tsx bench/webhook-outage.ts        (OUTAGE_S=300)
 */
import { setTimeout as sleep } from "node:timers/promises";
import { Webhook } from "standardwebhooks";
import { Receiver } from "../test/e2e/webhook-receiver";
import { benchStack } from "./load";

const OUTAGE_S = Number(process.env.OUTAGE_S ?? 300);
const WAIT_AFTER_S = 15 * 60;

const stack = await benchStack();
const receiver = new Receiver();
try {
  const call = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${stack.adminKey}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return (JSON.parse(text) as { data: T }).data;
  };
  await receiver.start();
  const port = receiver.port;
  const hook = await call<{ id: string; secret: string }>("POST", "/v1/webhooks", { url: `http://127.0.0.1:${port}/outage`, events: ["cron.failed"] });
  const app = await call<{ id: string }>("POST", "/v1/apps", { name: "outage", runtime: "static" });
  const cron = await call<{ id: string }>("POST", "/v1/crons", { appId: app.id, name: "fails", schedule: "0 0 1 1 *", command: "exit 1" });

  await receiver.stop();
  const downAt = Date.now();
  for (let i = 0; i < 3; i++) await call("POST", `/v1/webhooks/${hook.id}/test`);
  for (let i = 0; i < 2; i++) {
    const run = await call<{ jobName: string }>("POST", `/v1/crons/${cron.id}/run`, {});
    for (;;) {
      const runs = await call<{ jobName: string; status: string }[]>("GET", `/v1/crons/${cron.id}/runs`);
      if (runs.find((r) => r.jobName === run.jobName)?.status === "failed") break;
      await sleep(500);
    }
  }
  const queued = 5;
  console.error(`receiver down; ${queued} events queued; waiting ${OUTAGE_S} s`);
  await sleep(Math.max(0, downAt + OUTAGE_S * 1000 - Date.now()));
  await receiver.start(port);
  const upAt = Date.now();
  while (receiver.got.length < queued && Date.now() - upAt < WAIT_AFTER_S * 1000) await sleep(500);

  const verifier = new Webhook(hook.secret);
  const verified = receiver.got.filter((r) => {
    try {
      verifier.verify(r.body, r.headers);
      return true;
    } catch {
      return false;
    }
  });
  const ids = new Set(receiver.got.map((r) => r.headers["webhook-id"]));
  const after = receiver.got.map((r) => (r.at - upAt) / 1000).sort((a, b) => a - b);
  const deliveries = await call<{ event: string; status: string; attempts: number }[]>("GET", `/v1/webhooks/${hook.id}/deliveries`);
  console.log(`bench/webhook-outage: receiver down ${OUTAGE_S} s, ${queued} events queued meanwhile (3 webhook.test, 2 cron.failed)`);
  console.log(`  arrived after it came back: ${ids.size}/${queued} distinct (${receiver.got.length} requests), verified with the reference library: ${verified.length}/${receiver.got.length}`);
  if (after.length > 0) console.log(`  first ${after[0]!.toFixed(1)} s, last ${after.at(-1)!.toFixed(1)} s after the receiver was back`);
  console.log(`  delivery log: ${deliveries.map((d) => `${d.event} ${d.status} after ${d.attempts} attempts`).join("; ")}`);
  if (ids.size !== queued || verified.length !== receiver.got.length) process.exitCode = 1;
} finally {
  await receiver.stop();
  await stack.stop();
}
