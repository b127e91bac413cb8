import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, type ErrorJson, json, newAccount } from "./helpers";

type App = {
  id: string;
  name: string;
  runtime: string;
  status: string;
  url: string;
  memoryMb: number;
  activeDeploymentId: string | null;
  disks: { id: string; name: string; mountPath: string }[];
  createdAt: string;
};
type Data<T> = { data: T };

const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

describe("/v1/apps lifecycle", () => {
  it("creates, lists, gets by id and name, stops, restarts and deletes an app", async () => {
    const { adminKey: key } = await newAccount();
    const name = uniqueName("site");
    const created = await call("/v1/apps", { method: "POST", key, body: { name, runtime: "static" } });
    expect(created.status).toBe(201);
    const app = (await json<Data<App>>(created)).data;
    expect(app).toMatchObject({ name, runtime: "static", status: "not_deployed", activeDeploymentId: null, disks: [], memoryMb: 1024 });
    expect(app.id).toMatch(/^app_[0-9A-Za-z]{24}$/);
    expect(app.url).toBe(`${env.APPS_URL_SCHEME}://${name}.${env.APPS_DOMAIN}`);

    const list = (await json<Data<App[]>>(await call("/v1/apps", { key }))).data;
    expect(list.map((a) => a.id)).toEqual([app.id]);
    expect((await json<Data<App>>(await call(`/v1/apps/${app.id}`, { key }))).data.name).toBe(name);
    expect((await json<Data<App>>(await call(`/v1/apps/${name}`, { key }))).data.id).toBe(app.id);

    const stopped = await call(`/v1/apps/${name}/stop`, { method: "POST", key });
    expect(stopped.status).toBe(200);
    expect((await json<Data<App>>(stopped)).data.status).toBe("stopped");
    expect((await json<Data<App>>(await call(`/v1/apps/${app.id}`, { key }))).data.status).toBe("stopped");
    const restarted = await call(`/v1/apps/${name}/restart`, { method: "POST", key });
    // Started again, but nothing was ever deployed: the status says so rather than "running".
    expect((await json<Data<App>>(restarted)).data.status).toBe("not_deployed");

    const deleted = await call(`/v1/apps/${name}`, { method: "DELETE", key });
    expect(deleted.status).toBe(200);
    expect(await json(deleted)).toEqual({ data: { id: app.id, deleted: true } });
    const gone = await call(`/v1/apps/${app.id}`, { key });
    expect(gone.status).toBe(404);
    expect(await json(gone)).toEqual({ error: { code: "APP_NOT_FOUND", message: "app not found" } });
  });

  it("accepts the runtimes that run and a memory limit", async () => {
    const { adminKey: key } = await newAccount();
    for (const runtime of ["node", "python", "custom"]) {
      const res = await call("/v1/apps", { method: "POST", key, body: { name: uniqueName(runtime), runtime, memoryMb: 1024 } });
      expect(res.status, runtime).toBe(201);
      expect((await json<Data<App>>(res)).data).toMatchObject({ runtime, memoryMb: 1024, process: null });
    }
  });

  it("refuses a runtime nothing can run, saying which ones are supported", async () => {
    const { adminKey: key } = await newAccount();
    for (const runtime of ["go", "ruby", "rust", "php", "elixir", "docker", "java"]) {
      const res = await call("/v1/apps", { method: "POST", key, body: { name: uniqueName("nope"), runtime } });
      expect(res.status, runtime).toBe(400);
      const body = await json<ErrorJson>(res);
      expect(body.error.code).toBe("VALIDATION_ERROR");
      expect(body.error.details?.[0]?.message).toMatch(new RegExp(`"${runtime}" is not supported: choose static .*, node, python, or custom`));
    }
  });
});

describe("/v1/apps/:app/env", () => {
  it("sets (merging), lists names without values, reveals on request, and unsets", async () => {
    const { adminKey: key } = await newAccount();
    const name = uniqueName("envs");
    await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } });
    const set1 = await call(`/v1/apps/${name}/env`, { method: "PATCH", key, body: { vars: { GREETING: "hello", TOKEN: "s3cr3t=x" } } });
    expect(set1.status).toBe(200);
    const set2 = await call(`/v1/apps/${name}/env`, { method: "PATCH", key, body: { vars: { GREETING: "bonjour", EMPTY: "" } } });
    const names = (await json<Data<{ name: string; value?: string; updatedAt: string }[]>>(set2)).data;
    expect(names.map((v) => v.name)).toEqual(["EMPTY", "GREETING", "TOKEN"]);
    expect(names.every((v) => v.value === undefined && !Number.isNaN(Date.parse(v.updatedAt)))).toBe(true);

    const hidden = (await json<Data<{ value?: string }[]>>(await call(`/v1/apps/${name}/env`, { key }))).data;
    expect(hidden.some((v) => "value" in v)).toBe(false);
    const revealed = (await json<Data<{ name: string; value: string }[]>>(await call(`/v1/apps/${name}/env?reveal=true`, { key }))).data;
    expect(Object.fromEntries(revealed.map((v) => [v.name, v.value]))).toEqual({ EMPTY: "", GREETING: "bonjour", TOKEN: "s3cr3t=x" });

    const unset = await call(`/v1/apps/${name}/env/TOKEN`, { method: "DELETE", key });
    expect(unset.status).toBe(200);
    expect(await json(unset)).toEqual({
      data: {
        name: "TOKEN",
        deleted: true,
        rollout: { applied: true, deploymentId: null, message: `TOKEN unset; ${name} has nothing deployed yet: its first deploy runs with it` },
      },
    });
    const again = await call(`/v1/apps/${name}/env/TOKEN`, { method: "DELETE", key });
    expect(again.status).toBe(404);
    expect((await json<{ error: { code: string } }>(again)).error.code).toBe("ENV_VAR_NOT_FOUND");
  });

  it("stores values encrypted: the column holds no plaintext", async () => {
    const { adminKey: key } = await newAccount();
    const name = uniqueName("crypt");
    const app = (await json<Data<App>>(await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } }))).data;
    const secret = "postgres://user:hunter2@db.internal:5432/prod";
    await call(`/v1/apps/${name}/env`, { method: "PATCH", key, body: { vars: { DATABASE_URL: secret } } });
    const row = await env.DB.prepare("SELECT * FROM env_vars WHERE app_id = ?").bind(app.id).first<Record<string, unknown>>();
    expect(row).not.toBeNull();
    for (const value of Object.values(row!)) {
      expect(String(value)).not.toContain("hunter2");
      expect(String(value)).not.toContain(btoa(secret).slice(0, 16));
    }
    expect(String(row!.value)).toMatch(/^v1\./);
  });

  it("deleting the app removes its env vars", async () => {
    const { adminKey: key } = await newAccount();
    const name = uniqueName("gone");
    const app = (await json<Data<App>>(await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } }))).data;
    await call(`/v1/apps/${name}/env`, { method: "PATCH", key, body: { vars: { A: "1" } } });
    await call(`/v1/apps/${name}`, { method: "DELETE", key });
    const left = await env.DB.prepare("SELECT count(*) AS n FROM env_vars WHERE app_id = ?").bind(app.id).first<{ n: number }>();
    expect(left!.n).toBe(0);
  });
});
