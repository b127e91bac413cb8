import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { isWellFormedSecret } from "../../worker/auth/secret";
import { call, json, newAccount } from "./helpers";

type Key = { id: string; name: string; key?: string; start: string; scopes: string[]; expiresAt: string | null; createdAt: string; lastUsedAt?: string | null };

describe("POST/GET/DELETE /v1/api-keys", () => {
  it("creates a deploy key (201 with key), lists it without key, deletes it (204), then rejects it (401)", async () => {
    const { adminKey } = await newAccount();
    const created = await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "ci", scopes: ["deploy"] } });
    expect(created.status).toBe(201);
    const key = await json<Key>(created);
    expect(key.id).toMatch(/^key_[0-9A-Za-z]{24}$/);
    expect(key.key).toMatch(/^svc_[0-9A-Za-z]{46}$/);
    expect(isWellFormedSecret(key.key!)).toBe(true);
    expect(key).toMatchObject({ name: "ci", scopes: ["deploy"], expiresAt: null, start: key.key!.slice(0, 10) });
    expect(key.createdAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

    const usedOnce = await call("/v1/api-keys", { key: key.key });
    expect(usedOnce.status).toBe(200);

    const list = await json<Key[]>(await call("/v1/api-keys", { key: adminKey }));
    const listed = list.find((k) => k.id === key.id);
    expect(listed).toBeDefined();
    expect(listed).not.toHaveProperty("key");
    expect(listed).toMatchObject({ name: "ci", start: key.start, scopes: ["deploy"], expiresAt: null });
    expect(listed).toHaveProperty("lastUsedAt");
    expect(JSON.stringify(list)).not.toContain(key.key);

    const deleted = await call(`/v1/api-keys/${key.id}`, { method: "DELETE", key: adminKey });
    expect(deleted.status).toBe(204);
    expect(await deleted.text()).toBe("");

    const after = await call("/v1/api-keys", { key: key.key });
    expect(after.status).toBe(401);
    expect((await json<{ error: { code: string } }>(after)).error.code).toBe("UNAUTHORIZED");
    expect((await json<Key[]>(await call("/v1/api-keys", { key: adminKey }))).map((k) => k.id)).not.toContain(key.id);
  });

  it("lets an admin key create keys with every scope and an expiry", async () => {
    const { adminKey } = await newAccount();
    const expiresAt = new Date(Date.now() + 86_400_000).toISOString();
    const res = await call("/v1/api-keys", {
      method: "POST",
      key: adminKey,
      body: { name: "all", scopes: ["deploy", "db", "registry", "admin"], expiresAt },
    });
    expect(res.status).toBe(201);
    expect(await json<Key>(res)).toMatchObject({ scopes: ["deploy", "db", "registry", "admin"], expiresAt });
  });

  it("records lastUsedAt off the request path", async () => {
    const { adminKey } = await newAccount();
    const before = Date.now();
    expect((await call("/v1/api-keys", { key: adminKey })).status).toBe(200);
    let lastUsedAt: string | null | undefined = null;
    for (let i = 0; i < 20 && !lastUsedAt; i++) {
      const list = await json<Key[]>(await call("/v1/api-keys", { key: adminKey }));
      lastUsedAt = list.find((k) => k.name === "admin")?.lastUsedAt;
    }
    expect(Date.parse(lastUsedAt ?? "")).toBeGreaterThanOrEqual(before - 1000);
  });

  it("stores no column containing the secret", async () => {
    const { adminKey } = await newAccount();
    const { id, key } = await json<Key>(
      await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "secret-check", scopes: ["db"] } }),
    );
    const row = await env.DB.prepare("SELECT * FROM api_keys WHERE id = ?").bind(id).first<Record<string, unknown>>();
    expect(row).not.toBeNull();
    const secretBody = key!.slice(10);
    for (const [column, value] of Object.entries(row!)) {
      expect(String(value), column).not.toContain(key!);
      expect(String(value), column).not.toContain(secretBody);
    }
    expect(row!.hash).toMatch(/^[0-9a-f]{64}$/);
  });
});

describe("POST /v1/api-keys/:id/roll", () => {
  it("issues a working new secret; the old one works during its grace period and stops after", async () => {
    const { adminKey } = await newAccount();
    const old = await json<Key>(
      await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "rolling", scopes: ["deploy"] } }),
    );
    const rolledRes = await call(`/v1/api-keys/${old.id}/roll`, {
      method: "POST",
      key: adminKey,
      body: { gracePeriodSeconds: 1 },
    });
    expect(rolledRes.status).toBe(201);
    const rolled = await json<Key & { previousKey: { id: string; expiresAt: string } }>(rolledRes);
    expect(rolled).toMatchObject({ name: "rolling", scopes: ["deploy"], previousKey: { id: old.id } });
    expect(rolled.key).not.toBe(old.key);
    expect((await call("/v1/api-keys", { key: rolled.key })).status).toBe(200);
    expect((await call("/v1/api-keys", { key: old.key })).status).toBe(200);
    await new Promise((r) => setTimeout(r, Date.parse(rolled.previousKey.expiresAt) - Date.now() + 50));
    expect((await call("/v1/api-keys", { key: old.key })).status).toBe(401);
    expect((await call("/v1/api-keys", { key: rolled.key })).status).toBe(200);
  });

  it("retires the old secret at once without a grace period", async () => {
    const { adminKey } = await newAccount();
    const old = await json<Key>(
      await call("/v1/api-keys", { method: "POST", key: adminKey, body: { name: "r0", scopes: ["db"] } }),
    );
    const rolled = await json<Key>(await call(`/v1/api-keys/${old.id}/roll`, { method: "POST", key: adminKey }));
    expect((await call("/v1/api-keys", { key: old.key })).status).toBe(401);
    expect((await call("/v1/api-keys", { key: rolled.key })).status).toBe(200);
  });
});
