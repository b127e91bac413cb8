import { describe, expect, it } from "vitest";
import { call, expectAuthEnforced, json, newAccount } from "./helpers";

const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

describe("/v1/apps and /v1/disks authorization", () => {
  it("requires a key (401) with the deploy scope (403) on every route", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const app = uniqueName("sec");
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "static" } });
    const routes: [string, { method?: string; body?: unknown }][] = [
      ["/v1/apps", { method: "POST", body: { name: uniqueName("x"), runtime: "static" } }],
      ["/v1/apps", {}],
      [`/v1/apps/${app}`, {}],
      [`/v1/apps/${app}/stop`, { method: "POST" }],
      [`/v1/apps/${app}/restart`, { method: "POST" }],
      [`/v1/apps/${app}`, { method: "DELETE" }],
      [`/v1/apps/${app}/env`, {}],
      [`/v1/apps/${app}/env`, { method: "PATCH", body: { vars: { A: "1" } } }],
      [`/v1/apps/${app}/env/A`, { method: "DELETE" }],
      ["/v1/disks", { method: "POST", body: { name: "d", sizeGb: 1 } }],
      ["/v1/disks", {}],
      ["/v1/disks/d", {}],
      ["/v1/disks/d/attach", { method: "POST", body: { app } }],
      ["/v1/disks/d/detach", { method: "POST" }],
      ["/v1/disks/d", { method: "DELETE" }],
    ];
    for (const [path, init] of routes) {
      const checks = await expectAuthEnforced(path, init, "deploy", accountId);
      expect(checks.unauthenticated, `${init.method ?? "GET"} ${path}`).toBe(401);
      expect(checks.garbage).toBe(401);
      expect(checks.wrongScope?.error.code, `${init.method ?? "GET"} ${path}`).toBe("INSUFFICIENT_SCOPE");
      expect(checks.wrongScope?.error.message).toContain('"deploy"');
    }
    // The app survived every unauthorized attempt.
    expect((await call(`/v1/apps/${app}`, { key })).status).toBe(200);
  });

  it("hides another account's apps and disks (404, never listed)", async () => {
    const a = await newAccount();
    const b = await newAccount();
    const appName = uniqueName("mine");
    const app = (await json<{ data: { id: string } }>(
      await call("/v1/apps", { method: "POST", key: a.adminKey, body: { name: appName, runtime: "static" } }),
    )).data;
    const disk = (await json<{ data: { id: string } }>(
      await call("/v1/disks", { method: "POST", key: a.adminKey, body: { name: "private", sizeGb: 1 } }),
    )).data;
    for (const [method, path, body] of [
      ["GET", `/v1/apps/${app.id}`, undefined],
      ["GET", `/v1/apps/${appName}`, undefined],
      ["POST", `/v1/apps/${app.id}/stop`, undefined],
      ["DELETE", `/v1/apps/${app.id}`, undefined],
      ["PATCH", `/v1/apps/${app.id}/env`, { vars: { X: "1" } }],
      ["GET", `/v1/disks/${disk.id}`, undefined],
      ["POST", `/v1/disks/${disk.id}/detach`, undefined],
      ["DELETE", `/v1/disks/${disk.id}`, undefined],
    ] as const) {
      const res = await call(path, { method, key: b.adminKey, body });
      expect(res.status, `${method} ${path}`).toBe(404);
    }
    // B cannot attach A's disk to its own app, nor its own disk to A's app.
    const bApp = uniqueName("theirs");
    await call("/v1/apps", { method: "POST", key: b.adminKey, body: { name: bApp, runtime: "node" } });
    expect((await call(`/v1/disks/${disk.id}/attach`, { method: "POST", key: b.adminKey, body: { app: bApp } })).status).toBe(404);
    expect((await json<{ data: unknown[] }>(await call("/v1/apps", { key: b.adminKey }))).data).toHaveLength(1);
    expect((await json<{ data: unknown[] }>(await call("/v1/disks", { key: b.adminKey }))).data).toHaveLength(0);
    await call(`/v1/disks/${disk.id}`, { method: "DELETE", key: a.adminKey });
  });
});
