import { describe, expect, it } from "vitest";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { call, type ErrorJson, json, newAccount } from "./helpers";

type App = { id: string; name: string; instanceCount: number; instances?: unknown[]; memoryMb: number };
type Changed = { data: App; rollout: { applied: boolean; deploymentId: string | null; message: string } };

const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

async function newApp(key: string, body: Record<string, unknown>): Promise<App> {
  const res = await call("/v1/apps", { method: "POST", key, body: { name: uniqueName("inst"), ...body } });
  expect(res.status).toBe(201);
  return (await json<{ data: App }>(res)).data;
}

const scale = (key: string, app: string, instances: unknown) => call(`/v1/apps/${app}`, { method: "PATCH", key, body: { instances } });

async function refusal(res: Response): Promise<{ status: number; code: string; message: string }> {
  const body = await json<ErrorJson>(res);
  return { status: res.status, code: body.error.code, message: body.error.message };
}

describe("an app's instances (PATCH /v1/apps/{app} instances)", () => {
  it("sets the count without a new deployment; the app shows it, and its instances in the single-app view", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key, { runtime: "node", memoryMb: 256 });
    expect(app.instanceCount).toBe(1);
    const res = await scale(key, app.name, 3);
    expect(res.status).toBe(200);
    const changed = await json<Changed>(res);
    expect(changed.data.instanceCount).toBe(3);
    expect(changed.rollout).toEqual({ applied: true, deploymentId: null, message: `scaling ${app.name} to 3 instances` });
    // Nothing runs yet (never deployed): the list is empty, not missing.
    expect(changed.data.instances).toEqual([]);
    const again = await json<Changed>(await scale(key, app.name, 3));
    expect(again.rollout.message).toMatch(/nothing changed/);
    const listed = (await json<{ data: App[] }>(await call("/v1/apps", { key }))).data.find((a) => a.id === app.id)!;
    expect(listed.instanceCount).toBe(3);
    expect(listed.instances).toBeUndefined();
  });

  it("refuses what cannot be: a static site, not a whole number from 1, above the plan, past the plan's memory, or with a disk", async () => {
    const { adminKey: key } = await newAccount();
    const site = await newApp(key, { runtime: "static" });
    expect(await refusal(await scale(key, site.name, 2))).toMatchObject({ status: 409, code: "APP_IS_STATIC" });
    const app = await newApp(key, { runtime: "node", memoryMb: 256 });
    for (const bad of [0, -1, 1.5, "2", null, 101]) expect((await refusal(await scale(key, app.name, bad))).status).toBe(400);
    const max = PLAN_LIMITS.free.instances;
    const over = await refusal(await scale(key, app.name, max + 1));
    expect(over).toMatchObject({ status: 403, code: "PLAN_LIMIT_EXCEEDED" });
    expect(over.message).toContain(`at most ${max} instances (asked for ${max + 1}) on the free plan`);
    // Each instance reserves the app's memory: 3 × 2048 MB is past the free plan's 4096 MB.
    const big = await newApp(key, { runtime: "node", memoryMb: 2048 });
    const memory = await refusal(await scale(key, big.name, 3));
    expect(memory).toMatchObject({ status: 403, code: "PLAN_LIMIT_EXCEEDED" });
    expect(memory.message).toMatch(/3 instances of 2048 MB ask for 6144 MB/);
    // And a new app counts what the scaled ones reserve: 3 × 256 + 2048 + 1536 (this one) is past 4096, 1280 fits.
    expect((await json<Changed>(await scale(key, app.name, 3))).data.instanceCount).toBe(3);
    const tooMuch = await call("/v1/apps", { method: "POST", key, body: { name: uniqueName("inst"), runtime: "node", memoryMb: 1536 } });
    expect((await refusal(tooMuch)).code).toBe("PLAN_LIMIT_EXCEEDED");
    await newApp(key, { runtime: "node", memoryMb: 1280 });
    // One writer per disk: a scaled app takes no disk, an app with a disk does not scale.
    const disk = (await json<{ data: { id: string } }>(await call("/v1/disks", { method: "POST", key, body: { name: uniqueName("d"), sizeGb: 1 } }))).data;
    const attach = await refusal(await call(`/v1/disks/${disk.id}/attach`, { method: "POST", key, body: { app: app.name } }));
    expect(attach).toMatchObject({ status: 409, code: "APP_HAS_INSTANCES" });
    expect((await json<Changed>(await scale(key, app.name, 1))).data.instanceCount).toBe(1);
    expect((await call(`/v1/disks/${disk.id}/attach`, { method: "POST", key, body: { app: app.name } })).status).toBe(200);
    const withDisk = await refusal(await scale(key, app.name, 2));
    expect(withDisk).toMatchObject({ status: 409, code: "APP_HAS_DISK" });
    expect(withDisk.message).toMatch(/runs one instance/);
  });

  it("scales on load only within its bounds: validated, capped by the plan, refused with a disk, off with null", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key, { runtime: "node", memoryMb: 256 });
    const on = await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { autoscaling: { minInstances: 2, maxInstances: 3, targetConcurrency: 8 } } });
    expect(on.status).toBe(200);
    const changed = await json<Changed & { data: { autoscaling: unknown; scaleEvents: unknown[] } }>(on);
    // Turned on, the count moves into the bounds at once.
    expect(changed.data).toMatchObject({ instanceCount: 2, autoscaling: { minInstances: 2, maxInstances: 3, targetConcurrency: 8 }, scaleEvents: [] });
    expect(changed.rollout.message).toBe(`${app.name} scales on load between 2 and 3 instances, at 8 requests in flight each; it runs 2 instances now`);
    const defaults = await json<{ data: { autoscaling: unknown } }>(await call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { autoscaling: { maxInstances: 3 } } }));
    expect(defaults.data.autoscaling).toEqual({ minInstances: 1, maxInstances: 3, targetConcurrency: 10 });
    const outside = await refusal(await scale(key, app.name, 3 + 1));
    expect(outside).toMatchObject({ status: 400, code: "VALIDATION_ERROR" });
    expect(outside.message).toMatch(/scales on load between 1 and 3 instances/);
    const patch = (autoscaling: unknown) => call(`/v1/apps/${app.name}`, { method: "PATCH", key, body: { autoscaling } });
    for (const bad of [{ maxInstances: 0 }, { minInstances: 1 }, { maxInstances: 2, targetConcurrency: 0 }, { maxInstances: 2, extra: 1 }, { minInstances: 3, maxInstances: 2 }]) {
      expect((await refusal(await patch(bad))).status, JSON.stringify(bad)).toBe(400);
    }
    expect(await refusal(await patch({ maxInstances: PLAN_LIMITS.free.instances + 1 }))).toMatchObject({ status: 403, code: "PLAN_LIMIT_EXCEEDED" });
    const off = await json<{ data: { autoscaling: unknown; instanceCount: number } }>(await patch(null));
    expect(off.data).toMatchObject({ autoscaling: null, instanceCount: 2 });
    await scale(key, app.name, 1);
    const disk = (await json<{ data: { id: string } }>(await call("/v1/disks", { method: "POST", key, body: { name: uniqueName("d"), sizeGb: 1 } }))).data;
    expect((await call(`/v1/disks/${disk.id}/attach`, { method: "POST", key, body: { app: app.name } })).status).toBe(200);
    expect(await refusal(await patch({ maxInstances: 2 }))).toMatchObject({ status: 409, code: "APP_HAS_DISK" });
  });
});
