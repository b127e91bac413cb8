import { describe, expect, it } from "vitest";
import { call, type ErrorJson, json } from "./helpers";

const operator = { Authorization: "Bearer test-operator-token" };

describe("POST /v1/accounts", () => {
  it("creates an account with a working admin key when the operator token is presented", async () => {
    const res = await call("/v1/accounts", { method: "POST", headers: operator, body: { name: "acme", plan: "pro" } });
    expect(res.status).toBe(201);
    const body = await json<{ account: { id: string; plan: string }; apiKey: { key: string; scopes: string[] } }>(res);
    expect(body.account.id).toMatch(/^acct_/);
    expect(body.account.plan).toBe("pro");
    expect(body.apiKey.scopes).toContain("admin");
    expect((await call("/v1/api-keys", { key: body.apiKey.key })).status).toBe(200);
  });

  it("refuses a missing or wrong operator token with 401", async () => {
    for (const headers of [{}, { Authorization: "Bearer wrong-token-wrong-token" }] as Record<string, string>[]) {
      const res = await call("/v1/accounts", { method: "POST", headers, body: { name: "x" } });
      expect(res.status).toBe(401);
      expect((await json<ErrorJson>(res)).error.code).toBe("UNAUTHORIZED");
    }
  });

  it("rejects an unknown plan with 400", async () => {
    const res = await call("/v1/accounts", { method: "POST", headers: operator, body: { name: "x", plan: "gold" } });
    expect(res.status).toBe(400);
  });
});
