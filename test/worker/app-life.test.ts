import { describe, expect, it } from "vitest";
import { appState } from "../../worker/services/apps";
import { call, type ErrorJson, json, newAccount } from "./helpers";

// What the API does with an app's configuration and status before any node is
// involved (issue 29). The rollouts themselves, which start processes, are in
// test/e2e/app-life.e2e.test.ts against a real node.

type App = { id: string; name: string; status: string; type: string | null; url: string | null; pendingChanges: string[]; memoryMb: number; startCommand: string | null; healthCheckPath: string | null };
type Rollout = { applied: boolean; deploymentId: string | null; message: string };

async function newNodeApp(key: string, memoryMb?: number): Promise<App> {
  const name = `life-${crypto.randomUUID().slice(0, 8)}`;
  const res = await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node", ...(memoryMb ? { memoryMb } : {}) } });
  expect(res.status).toBe(201);
  return (await json<{ data: App }>(res)).data;
}

describe("an app's status", () => {
  const base = { status: "running" as const, runtime: "node" as const, activeDeploymentId: null, processState: null, liveProcessId: null };
  it("comes from what runs, never from a wish", () => {
    expect(appState(base, { latest: null, type: null })).toBe("not_deployed");
    expect(appState(base, { latest: { status: "building" }, type: null })).toBe("deploying");
    expect(appState(base, { latest: { status: "failed" }, type: null })).toBe("failed");
    const live = { ...base, activeDeploymentId: "dep_a", liveProcessId: "prc_a", processState: "running" as const };
    expect(appState(live, { latest: { status: "ready" }, type: "web" })).toBe("running");
    // A later deploy that failed leaves the previous release serving: still running.
    expect(appState(live, { latest: { status: "failed" }, type: "web" })).toBe("running");
    expect(appState({ ...live, processState: "crash_loop" }, { latest: { status: "ready" }, type: "web" })).toBe("crash_loop");
    expect(appState({ ...live, liveProcessId: null, processState: "failed" }, { latest: { status: "ready" }, type: "web" })).toBe("failed");
    expect(appState({ ...live, status: "stopped" }, { latest: { status: "ready" }, type: "web" })).toBe("stopped");
    expect(appState({ ...base, runtime: "static" }, { latest: { status: "failed" }, type: null })).toBe("not_deployed");
    expect(appState({ ...base, runtime: "static", activeDeploymentId: "dep_s" }, { latest: { status: "building" }, type: null })).toBe("running");
  });

  it("is not_deployed for a new app, in its view and in the list", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newNodeApp(key);
    expect(app).toMatchObject({ status: "not_deployed", type: null, pendingChanges: [], startCommand: null, healthCheckPath: null });
    const list = (await json<{ data: App[] }>(await call("/v1/apps", { key }))).data;
    expect(list.map((a) => a.status)).toEqual(["not_deployed"]);
  });
});

describe("PATCH /v1/apps/{app}", () => {
  it("changes memory and start settings, says what changed, and refuses what cannot be", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newNodeApp(key);
    const res = await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { memoryMb: 512, startCommand: "node server.js", healthCheckPath: "/healthz" } });
    expect(res.status).toBe(200);
    const body = await json<{ data: App; rollout: Rollout }>(res);
    expect(body.data).toMatchObject({ memoryMb: 512, startCommand: "node server.js", healthCheckPath: "/healthz" });
    expect(body.rollout).toEqual({
      applied: true,
      deploymentId: null,
      message: `memory 512 MB, start command "node server.js", health check GET /healthz; ${app.name} has nothing deployed yet: its first deploy runs with it`,
    });
    const same = await json<{ rollout: Rollout }>(await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { memoryMb: 512 } }));
    expect(same.rollout.message).toBe(`nothing changed: ${app.name} already has these settings`);
    const back = await json<{ data: App }>(await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { startCommand: null, healthCheckPath: null } }));
    expect(back.data).toMatchObject({ startCommand: null, healthCheckPath: null });

    for (const bad of [{}, { memoryMb: 64 }, { memoryMb: "512" }, { healthCheckPath: "healthz" }, { healthCheckPath: "/a b" }, { startCommand: "" }, { startCommand: "a\0b" }, { color: "red" }]) {
      const refused = await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: bad });
      expect(refused.status, JSON.stringify(bad)).toBe(400);
      expect((await json<ErrorJson>(refused)).error.code).toBe("VALIDATION_ERROR");
    }
    const site = await json<{ data: App }>(await call("/v1/apps", { method: "POST", key, body: { name: `site-${app.name}`, runtime: "static" } }));
    const noProcess = await call(`/v1/apps/${site.data.name}`, { method: "PATCH", key, body: { startCommand: "node x.js" } });
    expect(noProcess.status).toBe(409);
    expect((await json<ErrorJson>(noProcess)).error.code).toBe("APP_IS_STATIC");
    expect((await call("/v1/apps/nope/apply", { method: "POST", key })).status).toBe(404);
  });

  it("holds an account's apps to its plan's memory, and changes nothing when refused", async () => {
    const { adminKey: key } = await newAccount("free");
    const a = await newNodeApp(key, 2048);
    await newNodeApp(key, 2048);
    const refused = await call(`/v1/apps/${a.name}`, { method: "PATCH", key, body: { memoryMb: 3072 } });
    expect(refused.status).toBe(403);
    expect((await json<ErrorJson>(refused)).error).toMatchObject({ code: "PLAN_LIMIT_EXCEEDED" });
    const after = (await json<{ data: App }>(await call(`/v1/apps/${a.name}`, { key }))).data;
    expect(after.memoryMb).toBe(2048);
    expect((await call(`/v1/apps/${a.name}`, { method: "PATCH", key, body: { memoryMb: 1024 } })).status).toBe(200);
  });
});

describe("changes made with apply=false", () => {
  it("wait as pendingChanges until apply, which rolls them out together", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newNodeApp(key);
    const first = await json<{ rollout: Rollout }>(
      await call(`/v1/apps/${app.name}/env?apply=false`, { method: "PATCH", key, body: { vars: { GREETING: "hi" } } }),
    );
    expect(first.rollout).toEqual({ applied: false, deploymentId: null, message: `GREETING set; not applied yet: \`svc apps apply ${app.name}\` rolls it out` });
    const second = await json<{ rollout: Rollout }>(await call(`/v1/apps/${app.name}?apply=false`, { method: "PATCH", key, body: { memoryMb: 768 } }));
    expect(second.rollout.message).toBe(`memory 768 MB; not applied yet: \`svc apps apply ${app.name}\` rolls it out with 1 other pending change`);
    const unset = await json<{ data: { rollout: Rollout } }>(await call(`/v1/apps/${app.name}/env/GREETING?apply=false`, { method: "DELETE", key }));
    expect(unset.data.rollout.applied).toBe(false);
    expect((await json<{ data: App }>(await call(`/v1/apps/${app.name}`, { key }))).data.pendingChanges).toEqual([
      "GREETING set",
      "memory 768 MB",
      "GREETING unset",
    ]);
    expect((await call(`/v1/apps/${app.name}?apply=maybe`, { method: "PATCH", key, body: { memoryMb: 512 } })).status).toBe(400);

    const applied = await json<{ data: App; rollout: Rollout }>(await call(`/v1/apps/${app.name}/apply`, { method: "POST", key }));
    expect(applied.rollout).toEqual({
      applied: true,
      deploymentId: null,
      message: `GREETING set, memory 768 MB, GREETING unset; ${app.name} has nothing deployed yet: its first deploy runs with it`,
    });
    expect(applied.data.pendingChanges).toEqual([]);
    const again = await json<{ rollout: Rollout }>(await call(`/v1/apps/${app.name}/apply`, { method: "POST", key }));
    expect(again.rollout.message).toBe(`${app.name} has no pending change: it runs its current configuration`);
  });
});

describe("GET /v1/apps/{app}/runtime-logs", () => {
  it("refuses a window it cannot read, and a static site", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newNodeApp(key);
    for (const query of ["since=yesterday", "since=10y", "lines=-1", "process=dep_x", "since=2026-13-45T00:00:00Z"]) {
      const res = await call(`/v1/apps/${app.name}/runtime-logs?${query}`, { key });
      expect(res.status, query).toBe(400);
    }
    for (const query of ["since=10m", "since=2026-11-01T00:00:00Z", "lines=50", "tail=100"]) {
      const res = await call(`/v1/apps/${app.name}/runtime-logs?${query}`, { key });
      expect(res.status, query).toBe(200);
      expect(await res.text()).toBe("");
    }
    await call("/v1/apps", { method: "POST", key, body: { name: `site-${app.name}`, runtime: "static" } });
    const site = await call(`/v1/apps/site-${app.name}/runtime-logs`, { key });
    expect((await json<ErrorJson>(site)).error.code).toBe("APP_IS_STATIC");
  });
});
