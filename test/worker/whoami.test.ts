import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { createApp } from "../../worker/app";
import { countingD1 } from "../support/d1-count";
import { BASE, call, type ErrorJson, json, keyWith, newAccount } from "./helpers";

type WhoAmI = { keyId: string; keyName: string; accountId: string; scopes: string[] };

/** One request through the real app with a D1 binding that counts what it runs. */
async function counted(path: string, key: string) {
  const { db, counts } = countingD1(env.DB);
  const ctx = createExecutionContext();
  const res = await createApp().fetch(new Request(`${BASE}${path}`, { headers: { Authorization: `Bearer ${key}` } }), { ...env, DB: db }, ctx);
  await res.arrayBuffer();
  await waitOnExecutionContext(ctx);
  return { status: res.status, counts };
}

describe("GET /v1/whoami", () => {
  it("answers the calling key's id, name, account and scopes, for a key of any scope", async () => {
    const { accountId } = await newAccount();
    const key = await keyWith(accountId, ["registry"]);
    const listed = await json<{ id: string; name: string }[]>(await call("/v1/api-keys", { key }));
    const res = await call("/v1/whoami", { key });
    expect(res.status).toBe(200);
    const mine = listed.find((k) => k.name === "k-registry")!;
    expect(await json<WhoAmI>(res)).toEqual({ keyId: mine.id, keyName: "k-registry", accountId, scopes: ["registry"] });
  });

  it("refuses a missing key and a deleted key at once (401)", async () => {
    const { adminKey } = await newAccount();
    expect((await call("/v1/whoami")).status).toBe(401);
    const created = await json<{ id: string; key: string }>(await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "gone", scopes: ["deploy"] } }));
    expect((await call("/v1/whoami", { key: created.key })).status).toBe(200);
    expect((await call(`/v1/api-keys/${created.id}`, { method: "DELETE", key: adminKey })).status).toBe(204);
    const after = await call("/v1/whoami", { key: created.key });
    expect(after.status).toBe(401);
    expect((await json<ErrorJson>(after)).error.code).toBe("UNAUTHORIZED");
  });

  it("costs exactly one D1 read per request, through the unique index on the key's hash", async () => {
    const { accountId } = await newAccount();
    const key = await keyWith(accountId, ["deploy"]);
    // The first use of a key also records lastUsedAt (a write, off the response path, at most once a minute).
    const first = await counted("/v1/whoami", key);
    expect([first.status, first.counts.reads, first.counts.writes]).toEqual([200, 1, 1]);
    for (let i = 0; i < 3; i++) {
      const next = await counted("/v1/whoami", key);
      expect([next.status, next.counts.reads, next.counts.writes]).toEqual([200, 1, 0]);
    }
    const garbage = await counted("/v1/whoami", `svc_${"a".repeat(46)}`);
    expect([garbage.status, garbage.counts.reads]).toEqual([401, 0]); // a malformed key is refused before any read
    const [lookup] = first.counts.statements;
    const plan = await env.DB.prepare(`EXPLAIN QUERY PLAN ${lookup}`).bind("0".repeat(64)).all<{ detail: string }>();
    expect(plan.results.map((row) => row.detail).join("; ")).toMatch(/SEARCH api_keys USING INDEX api_keys_hash_idx \(hash=\?\)/);

    // bench/api-auth.ts's floor makes that very statement and no other, and exists only where the bench turns it on.
    const hash = [...new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key)))].map((b) => b.toString(16).padStart(2, "0")).join("");
    const { db, counts } = countingD1(env.DB);
    const floorPath = `${BASE}/__bench/key-read?hash=${hash}`;
    const floor = await createApp().fetch(new Request(floorPath), { ...env, DB: db, BENCH_FLOOR_ROUTES: "on" }, createExecutionContext());
    expect(await floor.json()).toEqual({ found: true });
    expect(counts.statements).toEqual([lookup]);
    const off = await createApp().fetch(new Request(floorPath), env, createExecutionContext());
    expect(off.headers.get("Content-Type")).not.toContain("application/json");
  });
});
