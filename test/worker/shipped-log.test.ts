import { env } from "cloudflare:workers";
import { runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { LOG_LIMIT_BYTES } from "../../builder/src/protocol/jobs";
import { signRequest } from "../../builder/src/protocol/signing";
import { ShippedLog } from "../../durable-objects/shipped-log";
import { LONE_BUILDER_ID } from "../../worker/lib/builder-client";
import { appRuntimeStub } from "../../worker/services/app-runtime";
import { call, json, newAccount } from "./helpers";

// An app's runtime log as its nodes ship it (issue 30 point 5): kept by the app's
// AppRuntime object, bounded, read newest first, with a line where the writing
// node changes. The shipping node itself is in test/builder/log-shipper.test.ts,
// a failover's history end to end in test/e2e/fleet.e2e.test.ts.

const line = (ms: number, text: string, process = "prc_a") => `${new Date(Date.UTC(2026, 10, 28, 12, 0, 0, ms)).toISOString()} out dep_a/${process} ${text}`;

describe("the shipped runtime log", () => {
  it("keeps the newest 10 MiB, cuts windows newest first, marks each move between nodes", async () => {
    await runInDurableObject(appRuntimeStub(env, `app_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`), (_instance, state) => {
      const log = new ShippedLog(state.storage);
      log.keep("node_a", `${line(1, "one")}\n${line(2, "two", "prc_b")}\n`);
      log.keep("node_a", `${line(3, "three")}\n`);
      log.keep("node_b", `${line(4, "four")}\n${line(5, "five")}\n`);
      const names = { node_a: "local-1", node_b: "local-2" };
      const all = log.history([], { tail: 65_536 }, names);
      expect(all.text.split("\n")).toEqual([
        line(1, "one"),
        line(2, "two", "prc_b"),
        line(3, "three"),
        `${line(4, "").slice(0, 24)} svc -/fleet the app moved from node local-1 to node local-2`,
        line(4, "four"),
        line(5, "five"),
        "",
      ]);
      expect(all.last).toEqual({ node: "node_b", time: line(5, "").slice(0, 24) });
      // The node the log lives on now gives its own lines: its shipments are left out.
      expect(log.history(["node_b"], { tail: 65_536 }, names)).toEqual({ text: `${line(1, "one")}\n${line(2, "two", "prc_b")}\n${line(3, "three")}\n`, last: { node: "node_a", time: line(3, "").slice(0, 24) } });
      expect(log.history([], { lines: 2 }, names).text).toBe(`${line(4, "four")}\n${line(5, "five")}\n`);
      expect(log.history([], { lines: 0 }, names)).toEqual({ text: "", last: null });
      expect(log.history([], { tail: line(5, "five").length + 1 }, names).text).toBe(`${line(5, "five")}\n`);
      expect(log.history([], { since: Date.UTC(2026, 10, 28, 12, 0, 0, 3) }, names).text.split("\n").filter((l) => l.includes(" out "))).toEqual([line(3, "three"), line(4, "four"), line(5, "five")]);
      expect(log.history([], { tail: 65_536, process: "prc_b" }, names).text).toBe(`${line(2, "two", "prc_b")}\n`);

      // Past the bound the oldest shipments go, whole: what is kept stays under it.
      const big = `${line(9, "x".repeat(60_000))}\n`.repeat(16);
      for (let i = 0; i < 12; i++) log.keep("node_b", big);
      const kept = state.storage.sql.exec<{ bytes: number }>("SELECT sum(bytes) AS bytes FROM shipped_log").one().bytes;
      expect(kept).toBeLessThanOrEqual(LOG_LIMIT_BYTES);
      expect(kept).toBeGreaterThan(LOG_LIMIT_BYTES - big.length);
      expect(log.history([], { tail: LOG_LIMIT_BYTES }, names).text).not.toContain(" one");
      log.drop();
      expect(log.history([], { tail: 65_536 }, names)).toEqual({ text: "", last: null });
    });
  });

  it("takes a node's shipment only for apps it ran, and the API gives it once that node is gone", async () => {
    const { adminKey: key } = await newAccount();
    const created = await call("/v1/apps", { method: "POST", key, body: { name: `ship-${crypto.randomUUID().slice(0, 8)}`, runtime: "node" } });
    const app = (await json<{ data: { id: string; name: string } }>(created)).data;
    const ship = async (text: string) => {
      const body = JSON.stringify({ logs: [{ appId: app.id, text }] });
      const headers = await signRequest({ secret: env.BUILDER_SECRET!, method: "POST", path: "/internal/app-logs", body });
      return call("/internal/app-logs", { method: "POST", body, headers: { ...headers, "Content-Type": "application/json" } });
    };
    const read = async () => (await call(`/v1/apps/${app.name}/runtime-logs`, { key })).text();
    // No process of the app ever ran on this node: accepted (a shipment is all or nothing), not kept.
    expect((await ship(`${line(1, "forged")}\n`)).status).toBe(204);
    expect(await read()).toBe("");
    // As launching a process there records it.
    await runInDurableObject(appRuntimeStub(env, app.id), (_instance, state) => state.storage.kv.put("logNode", LONE_BUILDER_ID));
    expect((await ship(`${line(2, "shipped")}\n`)).status).toBe(204);
    // The node that wrote it left the fleet (removed): the shipped lines are the log.
    await runInDurableObject(appRuntimeStub(env, app.id), (_instance, state) => state.storage.kv.put("logNode", "node_removed0000"));
    expect(await read()).toBe(`${line(2, "shipped")}\n`);
    const refused = await call("/internal/app-logs", { method: "POST", body: JSON.stringify({ logs: [{ appId: app.id, text: "x" }] }), headers: { "Content-Type": "application/json" } });
    expect(refused.status).toBe(401);
    // Deleting the app deletes what was shipped.
    expect((await call(`/v1/apps/${app.name}`, { method: "DELETE", key })).status).toBe(200);
    await runInDurableObject(appRuntimeStub(env, app.id), (_instance, state) => {
      expect(new ShippedLog(state.storage).history([], { tail: 65_536 }, {}).text).toBe("");
    });
  });
});
