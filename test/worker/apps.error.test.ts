import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, type ErrorJson, json, newAccount } from "./helpers";

const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

describe("/v1/apps errors", () => {
  it("answers an unknown app with 404 `app not found` on every route", async () => {
    const { adminKey: key } = await newAccount();
    for (const [method, path, body] of [
      ["GET", "/v1/apps/nope", undefined],
      ["POST", "/v1/apps/nope/stop", undefined],
      ["POST", "/v1/apps/nope/restart", undefined],
      ["DELETE", "/v1/apps/nope", undefined],
      ["GET", "/v1/apps/app_AAAAAAAAAAAAAAAAAAAAAAAA/env", undefined],
      ["PATCH", "/v1/apps/nope/env", { vars: { A: "1" } }],
    ] as const) {
      const res = await call(path, { method, key, body });
      expect(res.status, `${method} ${path}`).toBe(404);
      expect((await json<ErrorJson>(res)).error).toEqual({ code: "APP_NOT_FOUND", message: "app not found" });
    }
  });

  it("refuses a duplicate name with 409 NAME_TAKEN, even across accounts", async () => {
    const a = await newAccount();
    const b = await newAccount();
    const name = uniqueName("taken");
    expect((await call("/v1/apps", { method: "POST", key: a.adminKey, body: { name, runtime: "static" } })).status).toBe(201);
    for (const key of [a.adminKey, b.adminKey]) {
      const res = await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } });
      expect(res.status).toBe(409);
      expect((await json<ErrorJson>(res)).error.code).toBe("NAME_TAKEN");
    }
  });

  it("rejects invalid names, runtimes and memory with 400 naming the field, storing nothing", async () => {
    const { accountId, adminKey: key } = await newAccount();
    for (const [body, field] of [
      [{ name: "My_Site", runtime: "static" }, "name"],
      [{ name: "-lead", runtime: "static" }, "name"],
      [{ name: "trail-", runtime: "static" }, "name"],
      [{ name: "a".repeat(53), runtime: "static" }, "name"],
      [{ name: "", runtime: "static" }, "name"],
      [{ name: "ok-name", runtime: "cobol" }, "runtime"],
      [{ name: "ok-name" }, "runtime"],
      [{ name: "ok-name", runtime: "node", memoryMb: 64 }, "memoryMb"],
      [{ name: "ok-name", runtime: "node", memoryMb: "lots" }, "memoryMb"],
    ] as const) {
      const res = await call("/v1/apps", { method: "POST", key, body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((await json<ErrorJson>(res)).error.details?.map((d) => d.field)).toContain(field);
    }
    const count = await env.DB.prepare("SELECT count(*) AS n FROM apps WHERE account_id = ?").bind(accountId).first<{ n: number }>();
    expect(count!.n).toBe(0);
  });

  it("rejects bad env var names and reserved prefixes without writing any variable", async () => {
    const { adminKey: key } = await newAccount();
    const name = uniqueName("envbad");
    await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } });
    for (const vars of [{ "1ABC": "x" }, { "A-B": "x" }, { SVC_DISK_PATH: "x" }, {}, { OK: "x", "BAD NAME": "y" }]) {
      const res = await call(`/v1/apps/${name}/env`, { method: "PATCH", key, body: { vars } });
      expect(res.status, JSON.stringify(vars)).toBe(400);
    }
    const list = await json<{ data: unknown[] }>(await call(`/v1/apps/${name}/env`, { key }));
    expect(list.data).toEqual([]);
  });
});
