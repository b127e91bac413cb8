import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";

type Created = { data: { deployment: { id: string; status: string; url: string }; uploadUrl: string; expiresAt: string } };

async function setup() {
  const account = await newAccount();
  const name = `dep-${crypto.randomUUID().slice(0, 8)}`;
  await call("/v1/apps", { method: "POST", key: account.adminKey, body: { name, runtime: "static" } });
  return { ...account, key: account.adminKey, app: name };
}

describe("/v1/apps/:app/deployments", () => {
  it("creates a deployment with an upload URL signed for the exact size; 413 above 100 MB", async () => {
    const { key, app } = await setup();
    const res = await call(`/v1/apps/${app}/deployments`, { method: "POST", key, body: { sizeBytes: 5 } });
    expect(res.status).toBe(201);
    const created = await json<Created>(res);
    expect(created.data.deployment).toMatchObject({ status: "queued" });
    expect(created.data.deployment.id).toMatch(/^dep_/);
    expect(new URL(created.data.uploadUrl).searchParams.get("X-Amz-SignedHeaders")).toContain("content-length");
    const wrongSize = await exports.default.fetch(new Request(created.data.uploadUrl, { method: "PUT", body: "123456" }));
    expect(wrongSize.status).toBe(403);

    const big = await call(`/v1/apps/${app}/deployments`, { method: "POST", key, body: { sizeBytes: 100_000_001 } });
    expect(big.status).toBe(413);
    expect((await json<ErrorJson>(big)).error.code).toBe("PAYLOAD_TOO_LARGE");
  });

  it("refuses to start before the source is uploaded (409), starts after (202 building)", async () => {
    const { key, app } = await setup();
    const created = await json<Created>(await call(`/v1/apps/${app}/deployments`, { method: "POST", key, body: { sizeBytes: 5 } }));
    const id = created.data.deployment.id;
    const early = await call(`/v1/apps/${app}/deployments/${id}/start`, { method: "POST", key });
    expect(early.status).toBe(409);
    expect((await json<ErrorJson>(early)).error.code).toBe("UPLOAD_INCOMPLETE");
    const put = await exports.default.fetch(new Request(created.data.uploadUrl, { method: "PUT", body: "12345" }));
    expect(put.status).toBe(200);
    const started = await call(`/v1/apps/${app}/deployments/${id}/start`, { method: "POST", key });
    expect(started.status).toBe(202);
    expect(["building", "failed"]).toContain((await json<{ data: { status: string } }>(started)).data.status);
    const list = await json<{ data: { id: string }[] }>(await call(`/v1/apps/${app}/deployments`, { key }));
    expect(list.data.map((d) => d.id)).toEqual([id]);
  });

  it("refuses to activate a deployment that is not ready (409); unknown ids are 404", async () => {
    const { key, app } = await setup();
    const created = await json<Created>(await call(`/v1/apps/${app}/deployments`, { method: "POST", key, body: { sizeBytes: 5 } }));
    const res = await call(`/v1/apps/${app}/deployments/${created.data.deployment.id}/activate`, { method: "POST", key });
    expect(res.status).toBe(409);
    expect((await json<ErrorJson>(res)).error.code).toBe("DEPLOYMENT_NOT_READY");
    const missing = await call(`/v1/apps/${app}/deployments/dep_AAAAAAAAAAAAAAAAAAAAAAAA`, { key });
    expect((await json<ErrorJson>(missing)).error.code).toBe("DEPLOYMENT_NOT_FOUND");
  });

  it("enforces key, deploy scope and account on every route", async () => {
    const a = await setup();
    const b = await setup();
    const created = await json<Created>(await call(`/v1/apps/${a.app}/deployments`, { method: "POST", key: a.key, body: { sizeBytes: 5 } }));
    const id = created.data.deployment.id;
    const routes: [string, { method?: string; body?: unknown }][] = [
      [`/v1/apps/${a.app}/deployments`, { method: "POST", body: { sizeBytes: 5 } }],
      [`/v1/apps/${a.app}/deployments`, {}],
      [`/v1/apps/${a.app}/deployments/${id}`, {}],
      [`/v1/apps/${a.app}/deployments/${id}/start`, { method: "POST" }],
      [`/v1/apps/${a.app}/deployments/${id}/logs`, {}],
      [`/v1/apps/${a.app}/deployments/${id}/activate`, { method: "POST" }],
      [`/v1/apps/${a.app}/deployments/${id}/cancel`, { method: "POST" }],
      [`/v1/apps/${a.app}/logs`, {}],
    ];
    for (const [path, init] of routes) {
      const checks = await expectAuthEnforced(path, init, "deploy", a.accountId);
      expect([checks.unauthenticated, checks.garbage, checks.wrongScope?.error.code], path).toEqual([401, 401, "INSUFFICIENT_SCOPE"]);
      const foreign = await call(path, { ...init, key: b.key });
      expect(foreign.status, path).toBe(404);
    }
    const row = await env.DB.prepare("SELECT status FROM deployments WHERE id = ?").bind(id).first<{ status: string }>();
    expect(row!.status).toBe("queued");
  });
});
