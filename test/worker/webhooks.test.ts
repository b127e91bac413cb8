import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { configOf } from "../../worker/env";
import { MAX_WEBHOOKS, privateHost, targetProblem } from "../../worker/services/webhooks";
import { call, type ErrorJson, json, newAccount } from "./helpers";

type Webhook = { id: string; url: string; events: string[]; description: string | null; previousSecretExpiresAt: string | null; secret?: string };
type Delivery = { id: string; webhookId: string; event: string; status: string; attempts: number; payload: { type: string; data: Record<string, unknown> } };

const create = (key: string, body: unknown) => call("/v1/webhooks", { method: "POST", key, body });

describe("/v1/webhooks", () => {
  it("adds a webhook with a secret shown once; lists, shows, changes, rolls its secret and removes it", async () => {
    const { adminKey: key } = await newAccount();
    const res = await create(key, { url: "https://hooks.example.com/svc?token=abc", events: ["deploy.failed", "app.crash_loop", "deploy.failed"], description: "pager" });
    expect(res.status).toBe(201);
    const made = (await json<{ data: Webhook }>(res)).data;
    expect(made).toMatchObject({ url: "https://hooks.example.com/svc?token=abc", events: ["deploy.failed", "app.crash_loop"], description: "pager", previousSecretExpiresAt: null });
    expect(made.id).toMatch(/^whk_[0-9A-Za-z]{24}$/);
    // Standard Webhooks' secret form: whsec_ and base64 of 32 random bytes.
    expect(made.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    const listed = (await json<{ data: Webhook[] }>(await call("/v1/webhooks", { key }))).data;
    expect(listed.map((w) => w.id)).toEqual([made.id]);
    expect(listed[0]).not.toHaveProperty("secret");
    expect((await json<{ data: Webhook }>(await call(`/v1/webhooks/${made.id}`, { key }))).data).not.toHaveProperty("secret");
    const changed = await call(`/v1/webhooks/${made.id}`, { method: "PATCH", key, body: { events: ["cron.failed"], description: null } });
    expect((await json<{ data: Webhook }>(changed)).data).toMatchObject({ events: ["cron.failed"], description: null });
    const rolled = (await json<{ data: Webhook }>(await call(`/v1/webhooks/${made.id}/roll-secret`, { method: "POST", key }))).data;
    expect(rolled.secret).toMatch(/^whsec_/);
    expect(rolled.secret).not.toBe(made.secret);
    expect(Date.parse(rolled.previousSecretExpiresAt!) - Date.now()).toBeGreaterThan(23 * 3600_000);
    const removed = await call(`/v1/webhooks/${made.id}`, { method: "DELETE", key });
    expect((await json<{ data: unknown }>(removed)).data).toEqual({ id: made.id, deleted: true });
    expect((await call(`/v1/webhooks/${made.id}`, { key })).status).toBe(404);
  });

  it("queues a test event as a pending delivery, listed with its exact payload", async () => {
    const { adminKey: key } = await newAccount();
    const made = (await json<{ data: Webhook }>(await create(key, { url: "https://hooks.example.com/svc", events: ["deploy.failed"] }))).data;
    const test = await call(`/v1/webhooks/${made.id}/test`, { method: "POST", key });
    expect(test.status).toBe(202);
    const delivery = (await json<{ data: Delivery }>(test)).data;
    expect(delivery).toMatchObject({ webhookId: made.id, event: "webhook.test", attempts: 0, payload: { type: "webhook.test", data: { webhookId: made.id } } });
    expect(delivery.id).toMatch(/^msg_[0-9A-Za-z]{24}$/);
    const deliveries = (await json<{ data: Delivery[] }>(await call(`/v1/webhooks/${made.id}/deliveries`, { key }))).data;
    expect(deliveries.map((d) => d.id)).toContain(delivery.id);
  });

  it("refuses bad input with 400 and stores nothing; another account's webhook is 404; at most 20 per account", async () => {
    const { adminKey: key } = await newAccount();
    for (const body of [
      { url: "not a url", events: ["deploy.failed"] },
      { url: "ftp://example.com/x", events: ["deploy.failed"] },
      { url: "https://user:pass@example.com/x", events: ["deploy.failed"] },
      { url: "https://example.com/x", events: [] },
      { url: "https://example.com/x", events: ["deploy.exploded"] },
      { url: "https://example.com/x" },
      { url: `https://example.com/${"a".repeat(2050)}`, events: ["deploy.failed"] },
      { url: "https://example.com/x", events: ["deploy.failed"], secret: "mine" },
    ]) {
      const res = await create(key, body);
      expect(res.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect((await json<ErrorJson>(res)).error.code).toBe("VALIDATION_ERROR");
    }
    expect((await json<{ data: Webhook[] }>(await call("/v1/webhooks", { key }))).data).toEqual([]);
    const { adminKey: other } = await newAccount();
    const theirs = (await json<{ data: Webhook }>(await create(other, { url: "https://example.com/x", events: ["deploy.failed"] }))).data;
    for (const [method, path] of [
      ["GET", ""],
      ["PATCH", ""],
      ["DELETE", ""],
      ["POST", "/test"],
      ["POST", "/roll-secret"],
      ["GET", "/deliveries"],
    ] as const) {
      const res = await call(`/v1/webhooks/${theirs.id}${path}`, { method, key, ...(method === "PATCH" ? { body: { description: "x" } } : {}) });
      expect(res.status, `${method} ${path}`).toBe(404);
    }
    for (let i = 0; i < MAX_WEBHOOKS; i++) expect((await create(key, { url: `https://example.com/${i}`, events: ["deploy.failed"] })).status).toBe(201);
    const over = await create(key, { url: "https://example.com/over", events: ["deploy.failed"] });
    expect(over.status).toBe(403);
    expect((await json<ErrorJson>(over)).error.code).toBe("PLAN_LIMIT_EXCEEDED");
  });

  it("refuses private, loopback and link-local targets however they are written, where private targets are refused (production)", () => {
    const production = { ...configOf(env), WEBHOOK_PRIVATE_TARGETS: "refuse" as const };
    for (const url of [
      "https://127.0.0.1/x",
      "https://2130706433/x",
      "https://0x7f.0.0.1/x",
      "https://127.1/x",
      "https://10.1.2.3/x",
      "https://172.16.0.1/x",
      "https://192.168.1.1/x",
      "https://169.254.169.254/latest/meta-data",
      "https://100.64.0.1/x",
      "https://0.0.0.0/x",
      "https://[::1]/x",
      "https://[::ffff:127.0.0.1]/x",
      "https://[fd00::1]/x",
      "https://[fe80::1]/x",
      "https://localhost/x",
      "https://api.localhost/x",
      "https://printer.local/x",
      "https://metadata.google.internal/x",
    ]) {
      expect(targetProblem(production, url), url).toMatch(/private, loopback or link-local/);
    }
    expect(targetProblem(production, "http://hooks.example.com/x")).toBe("must be an https URL");
    for (const url of ["https://hooks.example.com/x", "https://8.8.8.8/x", "https://[2606:4700::1111]/x"]) expect(targetProblem(production, url), url).toBeNull();
    // A local stack allows them (its receivers run on this machine).
    expect(targetProblem({ ...production, WEBHOOK_PRIVATE_TARGETS: "allow" }, "http://127.0.0.1:9999/x")).toBeNull();
    expect(privateHost("[::ffff:7f00:1]")).toBe(true);
    expect(privateHost("example.com")).toBe(false);
  });
});
