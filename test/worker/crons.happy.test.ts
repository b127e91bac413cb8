import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { stageLead } from "../../durable-objects/cron-job";
import { call, json, newAccount } from "./helpers";
import { type Cron, newApp, newCron, stubOf } from "./cron-helpers";

async function armedAlarm(cronId: string): Promise<number | null> {
  return runInDurableObject(stubOf(cronId), (_i, state) => state.storage.getAlarm());
}

describe("/v1/crons", () => {
  it("takes a job's name wherever it takes its id, within the account only", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const created = (await json<{ data: Cron }>(
      await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: "nightly", schedule: "0 3 * * *", command: "echo hi", enabled: false } }),
    )).data;
    expect(created.enabled).toBe(false);
    const byName = (await json<{ data: Cron }>(await call("/v1/crons/nightly", { key }))).data;
    expect(byName.id).toBe(created.id);
    const patched = await call("/v1/crons/nightly", { method: "PATCH", key, body: { enabled: true } });
    expect((await json<{ data: Cron }>(patched)).data).toMatchObject({ id: created.id, enabled: true });
    expect((await call("/v1/crons/nightly/runs", { key })).status).toBe(200);
    // Another account's job of the same name is not this one's.
    const other = await newAccount();
    const missing = await call("/v1/crons/nightly", { key: other.adminKey });
    expect(missing.status).toBe(404);
    expect((await json<{ error: { code: string } }>(missing)).error.code).toBe("CRON_NOT_FOUND");
    expect((await call("/v1/crons/nightly", { method: "DELETE", key })).status).toBe(200);
    expect((await call(`/v1/crons/${created.id}`, { key })).status).toBe(404);
  });

  it("creates (201 {data}), lists, shows detail with nextRun/nextRuns, patches, and deletes", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const res = await call("/v1/crons", {
      method: "POST",
      key,
      body: { appId: app.id, name: "cleanup", schedule: "*/15 * * * *", command: "echo hi" },
    });
    expect(res.status).toBe(201);
    const created = (await json<{ data: Cron }>(res)).data;
    expect(created).toMatchObject({ appId: app.id, name: "cleanup", schedule: "*/15 * * * *", command: "echo hi", enabled: true });
    expect(created.id).toMatch(/^cron_[0-9A-Za-z]{24}$/);
    expect(Date.parse(created.createdAt)).not.toBeNaN();

    const list = (await json<{ data: Cron[] }>(await call("/v1/crons", { key }))).data;
    expect(list.map((c) => [c.id, c.name, c.schedule, c.enabled])).toEqual([[created.id, "cleanup", "*/15 * * * *", true]]);

    const detail = (await json<{ data: Cron }>(await call(`/v1/crons/${created.id}`, { key }))).data;
    expect(detail.lastRun).toBeNull();
    const next = Date.parse(detail.nextRun!);
    expect(new Date(next).getUTCMinutes() % 15).toBe(0);
    expect(new Date(next).getUTCSeconds()).toBe(0);
    expect(next).toBeGreaterThan(Date.now());
    expect(next - Date.now()).toBeLessThanOrEqual(15 * 60_000);
    expect(detail.nextRuns).toHaveLength(5);
    expect(Date.parse(detail.nextRuns![1]!) - Date.parse(detail.nextRuns![0]!)).toBe(15 * 60_000);
    // Armed to send the run to its node 10-30 s ahead of its second (the node makes the sandbox meanwhile); a job
    // created closer to its second than that is sent at once, and then woken at the second.
    const armed = await armedAlarm(created.id);
    const ahead = next - stageLead(created.id);
    expect(armed === ahead || (ahead <= Date.now() && armed !== null && armed <= next), `alarm ${armed}, next ${next}`).toBe(true);

    const patched = await call(`/v1/crons/${created.id}`, { method: "PATCH", key, body: { schedule: "0 0 * * 7" } });
    expect(patched.status).toBe(200);
    const after = (await json<{ data: Cron }>(patched)).data;
    expect(after).toMatchObject({ schedule: "0 0 * * 7", command: "echo hi", name: "cleanup", enabled: true });
    const sunday = new Date(after.nextRun!);
    expect([sunday.getUTCDay(), sunday.getUTCHours(), sunday.getUTCMinutes()]).toEqual([0, 0, 0]);
    expect(await armedAlarm(created.id)).toBe(sunday.getTime() - stageLead(created.id));

    const commandOnly = (await json<{ data: Cron }>(
      await call(`/v1/crons/${created.id}`, { method: "PATCH", key, body: { command: "echo bye" } }),
    )).data;
    expect(commandOnly).toMatchObject({ schedule: "0 0 * * 7", command: "echo bye" });

    const deleted = await call(`/v1/crons/${created.id}`, { method: "DELETE", key });
    expect(deleted.status).toBe(200);
    expect(await json(deleted)).toEqual({ data: { id: created.id, deleted: true } });
    expect((await call(`/v1/crons/${created.id}`, { key })).status).toBe(404);
    expect(await armedAlarm(created.id)).toBeNull();
    expect(await runDurableObjectAlarm(stubOf(created.id))).toBe(false);
  });

  it("arms `0 9 * * 1-5` at the next weekday 09:00 UTC", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, schedule: "0 9 * * 1-5", command: "true" });
    const expected = new Date();
    expected.setUTCHours(9, 0, 0, 0);
    while (expected.getTime() <= Date.now() || [0, 6].includes(expected.getUTCDay())) {
      expected.setUTCDate(expected.getUTCDate() + 1);
    }
    expect(await armedAlarm(cron.id)).toBe(expected.getTime() - stageLead(cron.id));
  });

  it("pausing (enabled:false) hides nextRun; resuming re-arms it", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "true" });
    const paused = (await json<{ data: Cron }>(await call(`/v1/crons/${cron.id}`, { method: "PATCH", key, body: { enabled: false } }))).data;
    expect(paused).toMatchObject({ enabled: false, nextRun: null, nextRuns: [] });
    const resumed = (await json<{ data: Cron }>(await call(`/v1/crons/${cron.id}`, { method: "PATCH", key, body: { enabled: true } }))).data;
    expect(resumed.nextRun).not.toBeNull();
  });

  it("a disabled job, or one of a stopped app, keeps no alarm: paused jobs wake nobody at their scheduled times", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    // Once a year: an every-minute job could fire (and keep an alarm to poll its run) while the test runs.
    const every = await newCron(key, { appId: app.id, name: "yearly", schedule: "0 0 1 1 *", command: "true" });
    expect(await armedAlarm(every.id)).not.toBeNull();
    await call(`/v1/crons/${every.id}`, { method: "PATCH", key, body: { enabled: false } });
    expect(await armedAlarm(every.id)).toBeNull();
    const created = (await json<{ data: Cron }>(
      await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: "born-paused", schedule: "* * * * *", command: "true", enabled: false } }),
    )).data;
    expect(await armedAlarm(created.id)).toBeNull();

    // Enabled again: armed for its next minute. The app stopped: disarmed; started: armed again.
    await call(`/v1/crons/${every.id}`, { method: "PATCH", key, body: { enabled: true } });
    const next = await armedAlarm(every.id);
    expect(next).toBe(Date.parse((await json<{ data: Cron }>(await call(`/v1/crons/${every.id}`, { key }))).data.nextRun!) - stageLead(every.id));
    expect((await call(`/v1/apps/${app.id}/stop`, { method: "POST", key })).status).toBe(200);
    expect(await armedAlarm(every.id)).toBeNull();
    expect((await call(`/v1/apps/${app.id}/restart`, { method: "POST", key })).status).toBe(200);
    expect(await armedAlarm(every.id)).not.toBeNull();
    expect(await armedAlarm(created.id)).toBeNull();
  });

  it("deleting the app deletes its cron jobs", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "true" });
    await call(`/v1/apps/${app.id}`, { method: "DELETE", key });
    expect((await call(`/v1/crons/${cron.id}`, { key })).status).toBe(404);
    const row = await env.DB.prepare("SELECT count(*) AS n FROM crons WHERE id = ?").bind(cron.id).first<{ n: number }>();
    expect(row!.n).toBe(0);
  });
});
