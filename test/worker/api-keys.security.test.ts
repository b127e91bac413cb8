import { describe, expect, it } from "vitest";
import { call, type ErrorJson, expectAuthEnforced, json, keyWith, newAccount } from "./helpers";

describe("/v1/api-keys authorization", () => {
  it("rejects missing, malformed, unknown and checksum-broken keys with 401 UNAUTHORIZED", async () => {
    const { adminKey } = await newAccount();
    const flipped = `${adminKey.slice(0, -1)}${adminKey.endsWith("A") ? "B" : "A"}`;
    for (const header of [undefined, "Basic abc", `Bearer`, `Bearer ${flipped}`, `Bearer svc_${"a".repeat(46)}`, adminKey]) {
      const res = await call("/v1/api-keys", { headers: header ? { Authorization: header } : {} });
      expect(res.status, String(header)).toBe(401);
      expect(res.headers.get("WWW-Authenticate")).toContain("Bearer");
      expect((await json<ErrorJson>(res)).error.code).toBe("UNAUTHORIZED");
    }
  });

  it("gives a key without admin 403 INSUFFICIENT_SCOPE naming the scope, on create and delete", async () => {
    const { accountId, adminKey } = await newAccount();
    const target = await json<{ id: string }>(
      await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "t", scopes: ["db"] } }),
    );
    for (const [path, init] of [
      ["/v1/api-keys", { method: "POST", body: { name: "escalate", scopes: ["admin"] } }],
      [`/v1/api-keys/${target.id}`, { method: "DELETE" }],
      [`/v1/api-keys/${target.id}/roll`, { method: "POST" }],
    ] as const) {
      const checks = await expectAuthEnforced(path, init, "admin", accountId);
      expect(checks.unauthenticated).toBe(401);
      expect(checks.garbage).toBe(401);
      expect(checks.wrongScope?.error.code).toBe("INSUFFICIENT_SCOPE");
      expect(checks.wrongScope?.error.message).toContain('"admin"');
    }
    // Invalid body from a non-admin key still answers 403, not 400: scope is checked first.
    const deployKey = await keyWith(accountId, ["deploy"]);
    expect((await call("/v1/api-keys", { method: "POST", key: deployKey, body: { scopes: ["nope"] } })).status).toBe(403);
    // The target survived every attempt.
    expect((await json<{ id: string }[]>(await call("/v1/api-keys", { key: adminKey }))).map((k) => k.id)).toContain(target.id);
  });

  it("lets any valid key of the account list keys", async () => {
    const { accountId } = await newAccount();
    const res = await call("/v1/api-keys", { key: await keyWith(accountId, ["registry"]) });
    expect(res.status).toBe(200);
  });

  it("isolates accounts: A cannot delete or roll B's key (404) and never lists it", async () => {
    const a = await newAccount();
    const b = await newAccount();
    const bKey = await json<{ id: string; key: string }>(
      await call("/v1/api-keys", { method: "POST", key: b.adminKey, body: { name: "b-only", scopes: ["deploy"] } }),
    );
    const del = await call(`/v1/api-keys/${bKey.id}`, { method: "DELETE", key: a.adminKey });
    expect(del.status).toBe(404);
    expect((await json<ErrorJson>(del)).error.code).toBe("KEY_NOT_FOUND");
    expect((await call(`/v1/api-keys/${bKey.id}/roll`, { method: "POST", key: a.adminKey })).status).toBe(404);
    const aList = await json<{ id: string }[]>(await call("/v1/api-keys", { key: a.adminKey }));
    expect(aList.map((k) => k.id)).not.toContain(bKey.id);
    expect(aList).toHaveLength(1);
    expect((await call("/v1/api-keys", { key: bKey.key })).status).toBe(200);
  });
});
