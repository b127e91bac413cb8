import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, type ErrorJson, json, keyWith, newAccount } from "./helpers";

async function keyCount(accountId: string): Promise<number> {
  const row = await env.DB.prepare("SELECT count(*) AS n FROM api_keys WHERE account_id = ?").bind(accountId).first<{ n: number }>();
  return row!.n;
}

describe("POST /v1/api-keys validation", () => {
  const cases: [string, unknown, string][] = [
    ["unknown scope", { name: "x", scopes: ["deploy", "root"] }, "scopes.1"],
    ["missing name", { scopes: ["deploy"] }, "name"],
    ["empty name", { name: "", scopes: ["deploy"] }, "name"],
    ["blank name", { name: "   ", scopes: ["deploy"] }, "name"],
    ["oversized name", { name: "n".repeat(101), scopes: ["deploy"] }, "name"],
    ["missing scopes", { name: "x" }, "scopes"],
    ["expiresAt in the past", { name: "x", scopes: ["deploy"], expiresAt: "2020-01-01T00:00:00Z" }, "expiresAt"],
    ["expiresAt not ISO 8601", { name: "x", scopes: ["deploy"], expiresAt: "next tuesday" }, "expiresAt"],
    ["expiresAt as a number", { name: "x", scopes: ["deploy"], expiresAt: 1893456000 }, "expiresAt"],
    ["unknown field", { name: "x", scopes: ["deploy"], expires_at: "2030-01-01T00:00:00Z" }, ""],
  ];
  for (const [label, body, field] of cases) {
    it(`rejects ${label} with 400 naming the field, storing nothing`, async () => {
      const { accountId, adminKey } = await newAccount();
      const res = await call("/v1/api-keys", { method: "POST", key: adminKey, body });
      expect(res.status).toBe(400);
      const err = await json<ErrorJson>(res);
      expect(err.error.code).toBe("VALIDATION_ERROR");
      expect(err.error.details?.length).toBeGreaterThan(0);
      if (field) expect(err.error.details!.map((d) => d.field)).toContain(field);
      expect(await keyCount(accountId)).toBe(1);
    });
  }

  it("rejects a non-JSON body with 400, storing nothing", async () => {
    const { accountId, adminKey } = await newAccount();
    for (const [body, contentType] of [
      ["{name: ci", "application/json"],
      ["name=ci&scopes=deploy", "application/x-www-form-urlencoded"],
      ["", "application/json"],
    ] as const) {
      const res = await call("/v1/api-keys", { method: "POST", key: adminKey, body, headers: { "Content-Type": contentType } });
      expect(res.status, `${contentType}: ${body}`).toBe(400);
      expect((await json<ErrorJson>(res)).error.code).toBe("VALIDATION_ERROR");
    }
    expect(await keyCount(accountId)).toBe(1);
  });

  it("rejects a body over 1 MB with 413", async () => {
    const { accountId, adminKey } = await newAccount();
    const res = await call("/v1/api-keys", {
      method: "POST",
      key: adminKey,
      body: { name: "big", scopes: ["deploy"], pad: "x".repeat(1_100_000) },
    });
    expect(res.status).toBe(413);
    expect((await json<ErrorJson>(res)).error.code).toBe("PAYLOAD_TOO_LARGE");
    expect(await keyCount(accountId)).toBe(1);
  });

  it("answers 404 KEY_NOT_FOUND for an unknown or already-deleted key, 400 for a malformed id", async () => {
    const { adminKey } = await newAccount();
    const missing = await call("/v1/api-keys/key_AAAAAAAAAAAAAAAAAAAAAAAA", { method: "DELETE", key: adminKey });
    expect(missing.status).toBe(404);
    expect((await json<ErrorJson>(missing)).error.code).toBe("KEY_NOT_FOUND");
    expect((await call("/v1/api-keys/not-an-id", { method: "DELETE", key: adminKey })).status).toBe(400);
  });

  it("rejects a key whose expiresAt has passed with 401", async () => {
    const { accountId } = await newAccount();
    const expired = await keyWith(accountId, ["admin"], Date.now() - 1000);
    const res = await call("/v1/api-keys", { key: expired });
    expect(res.status).toBe(401);
    expect((await json<ErrorJson>(res)).error.message).toContain("expired");
  });

  it("answers unknown routes with a JSON 404", async () => {
    const { adminKey } = await newAccount();
    const res = await call("/v1/nothing-here", { key: adminKey });
    expect(res.status).toBe(404);
    expect((await json<ErrorJson>(res)).error.code).toBe("NOT_FOUND");
  });
});
