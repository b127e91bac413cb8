import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";
import { newApp, newCron } from "./cron-helpers";

async function cronCount(accountId: string): Promise<number> {
  return (await env.DB.prepare("SELECT count(*) AS n FROM crons WHERE account_id = ?").bind(accountId).first<{ n: number }>())!.n;
}

describe("/v1/crons validation", () => {
  const invalid = [
    "* * * * * *",
    "@daily",
    "60 * * * *",
    "",
    "   ",
    "garbage",
    "* * *",
    "0 24 * * *",
    "0 0 0 * *",
    "0 0 32 * *",
    "0 0 * 13 *",
    "0 0 * * 8",
    "*/0 * * * *",
    "5-1 * * * *",
    "0 0 L * *",
    "0 0 ? * *",
    "0 0 * * 1#2",
    "0 0 * foo *",
    // Five valid fields that no date ever matches.
    "0 0 30 2 *",
    "0 0 31 4,6 *",
  ];
  for (const schedule of invalid) {
    it(`refuses ${JSON.stringify(schedule)} with 400 INVALID_CRON_EXPRESSION on create and update, storing nothing`, async () => {
      const { accountId, adminKey: key } = await newAccount();
      const app = await newApp(key);
      const res = await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: "bad", schedule, command: "true" } });
      expect(res.status).toBe(400);
      const err = (await json<ErrorJson>(res)).error;
      expect(err.code).toBe("INVALID_CRON_EXPRESSION");
      expect(err.message.startsWith("invalid cron expression")).toBe(true);
      expect(await cronCount(accountId)).toBe(0);

      const cron = await newCron(key, { appId: app.id, command: "true", schedule: "0 * * * *" });
      const patch = await call(`/v1/crons/${cron.id}`, { method: "PATCH", key, body: { schedule } });
      expect(patch.status).toBe(400);
      expect((await json<ErrorJson>(patch)).error.code).toBe("INVALID_CRON_EXPRESSION");
      const detail = (await json<{ data: { schedule: string } }>(await call(`/v1/crons/${cron.id}`, { key }))).data;
      expect(detail.schedule).toBe("0 * * * *");
    });
  }

  it("says why a schedule that can never fire is refused", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const res = await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: "never", schedule: "0 0 30 2 *", command: "true" } });
    expect((await json<ErrorJson>(res)).error).toMatchObject({
      code: "INVALID_CRON_EXPRESSION",
      message: 'invalid cron expression: it never fires: no date has day of month "30" in month "2" (e.g. 30 2 is February 30th)',
    });
    // February 29th exists (in leap years): accepted.
    const leap = await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: "leap", schedule: "0 0 29 2 *", command: "true" } });
    expect(leap.status).toBe(201);
  });

  it("accepts lists, ranges, steps, stepped ranges and month/day names", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    for (const schedule of ["*/15 * * * *", "0 9 * * 1-5", "0 0 * * 7", "0 0 * * 0", "1,31 1-5/2 1 jan-mar MON-FRI", "30 4 1,15 * 5", "0 12 * DEC sun"]) {
      const res = await call("/v1/crons", { method: "POST", key, body: { appId: app.id, name: `ok-${crypto.randomUUID().slice(0, 6)}`, schedule, command: "true" } });
      expect(res.status, schedule).toBe(201);
    }
  });

  it("requires all four create fields", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const app = await newApp(key);
    const full = { appId: app.id, name: "job", schedule: "* * * * *", command: "true" };
    for (const field of Object.keys(full)) {
      const body: Record<string, string> = { ...full };
      delete body[field];
      const res = await call("/v1/crons", { method: "POST", key, body });
      expect(res.status, field).toBe(400);
      expect((await json<ErrorJson>(res)).error.details?.map((d) => d.field)).toContain(field);
    }
    const empty = await call("/v1/crons", { method: "POST", key, body: { ...full, command: "" } });
    expect(empty.status).toBe(400);
    expect(await cronCount(accountId)).toBe(0);
  });

  it("answers 404 `app not found` for an unknown or foreign appId, storing nothing", async () => {
    const a = await newAccount();
    const b = await newAccount();
    const foreign = await newApp(b.adminKey);
    for (const appId of ["app_AAAAAAAAAAAAAAAAAAAAAAAA", foreign.id, foreign.name]) {
      const res = await call("/v1/crons", { method: "POST", key: a.adminKey, body: { appId, name: "x", schedule: "* * * * *", command: "true" } });
      expect(res.status).toBe(404);
      expect((await json<ErrorJson>(res)).error).toEqual({ code: "APP_NOT_FOUND", message: "app not found" });
    }
    expect(await cronCount(a.accountId)).toBe(0);
  });

  it("rejects unknown time zones, policies and timeouts; refuses duplicate names", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const base = { appId: app.id, name: "tz", schedule: "* * * * *", command: "true" };
    for (const extra of [{ timezone: "Mars/Olympus" }, { concurrencyPolicy: "sometimes" }, { timeoutSeconds: 0 }, { timeoutSeconds: 43_201 }]) {
      expect((await call("/v1/crons", { method: "POST", key, body: { ...base, ...extra } })).status, JSON.stringify(extra)).toBe(400);
    }
    expect((await call("/v1/crons", { method: "POST", key, body: base })).status).toBe(201);
    const dup = await call("/v1/crons", { method: "POST", key, body: base });
    expect(dup.status).toBe(409);
    expect((await json<ErrorJson>(dup)).error.code).toBe("NAME_TAKEN");
  });

  it("answers 404 CRON_NOT_FOUND for another account's job, and enforces key and scope on every route", async () => {
    const a = await newAccount();
    const b = await newAccount();
    const cron = await newCron(a.adminKey, { appId: (await newApp(a.adminKey)).id, command: "true" });
    const routes: [string, { method?: string; body?: unknown }][] = [
      [`/v1/crons/${cron.id}`, {}],
      [`/v1/crons/${cron.id}`, { method: "PATCH", body: { command: "x" } }],
      [`/v1/crons/${cron.id}/run`, { method: "POST" }],
      [`/v1/crons/${cron.id}/runs`, {}],
      [`/v1/crons/${cron.id}/runs/x-1/logs`, {}],
      [`/v1/crons/${cron.id}/runs/x-1/cancel`, { method: "POST" }],
      [`/v1/crons/${cron.id}`, { method: "DELETE" }],
    ];
    for (const [path, init] of routes) {
      const res = await call(path, { ...init, key: b.adminKey });
      expect(res.status, `${init.method ?? "GET"} ${path}`).toBe(404);
      expect((await json<ErrorJson>(res)).error.code).toBe("CRON_NOT_FOUND");
      const checks = await expectAuthEnforced(path, init, "deploy", a.accountId);
      expect([checks.unauthenticated, checks.garbage, checks.wrongScope?.error.code]).toEqual([401, 401, "INSUFFICIENT_SCOPE"]);
    }
    expect((await json<{ data: unknown[] }>(await call("/v1/crons", { key: b.adminKey }))).data).toEqual([]);
    expect((await call(`/v1/crons/${cron.id}`, { key: a.adminKey })).status).toBe(200);
  });
});
