import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { stageLead } from "../../durable-objects/cron-job";
import { nextRuns } from "../../worker/lib/cron";
import { call, json, newAccount } from "./helpers";
import { deliverAlarm, logsOf, newApp, newCron, runs, stubOf, waitForRun } from "./cron-helpers";

const at = (isoTime: string) => Date.parse(isoTime);
const isoAll = (times: number[]) => times.map((t) => new Date(t).toISOString());

describe("next-run math", () => {
  it("*/15 * * * * runs on the quarter hours", () => {
    expect(isoAll(nextRuns("*/15 * * * *", "UTC", at("2026-11-21T10:07:30Z"), 3))).toEqual([
      "2026-11-21T10:15:00.000Z",
      "2026-11-21T10:30:00.000Z",
      "2026-11-21T10:45:00.000Z",
    ]);
    // Strictly after: a job due exactly now moves on to the next slot.
    expect(isoAll(nextRuns("*/15 * * * *", "UTC", at("2026-11-21T10:15:00Z"), 1))).toEqual(["2026-11-21T10:30:00.000Z"]);
  });

  it("0 9 * * 1-5 skips the weekend", () => {
    // 2026-11-20 is a Friday.
    expect(isoAll(nextRuns("0 9 * * 1-5", "UTC", at("2026-11-20T09:00:00Z"), 2))).toEqual([
      "2026-11-23T09:00:00.000Z",
      "2026-11-24T09:00:00.000Z",
    ]);
  });

  it("0 0 * * 7 is Sunday midnight, the same as 0 0 * * 0", () => {
    const sevens = nextRuns("0 0 * * 7", "UTC", at("2026-11-21T12:00:00Z"), 3);
    expect(isoAll(sevens)).toEqual(["2026-11-22T00:00:00.000Z", "2026-11-29T00:00:00.000Z", "2026-12-06T00:00:00.000Z"]);
    expect(nextRuns("0 0 * * 0", "UTC", at("2026-11-21T12:00:00Z"), 3)).toEqual(sevens);
  });

  it("follows the job's time zone across a DST change (Europe/Berlin, 2026-10-25)", () => {
    // 09:00 local is 07:00 UTC in summer time (CEST) and 08:00 UTC after the change to CET.
    expect(isoAll(nextRuns("0 9 * * *", "Europe/Berlin", at("2026-10-23T12:00:00Z"), 3))).toEqual([
      "2026-10-24T07:00:00.000Z",
      "2026-10-25T08:00:00.000Z",
      "2026-10-26T08:00:00.000Z",
    ]);
    // And into summer time (America/New_York, 2026-03-08): 12:00 EST is 17:00 UTC, 12:00 EDT is 16:00 UTC.
    expect(isoAll(nextRuns("0 12 * * *", "America/New_York", at("2026-03-06T18:00:00Z"), 3))).toEqual([
      "2026-03-07T17:00:00.000Z",
      "2026-03-08T16:00:00.000Z",
      "2026-03-09T16:00:00.000Z",
    ]);
  });

  it("a time skipped by spring-forward runs once that day, an hour later on the wall clock", () => {
    // America/New_York, 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist.
    const runs = isoAll(nextRuns("30 2 * * *", "America/New_York", at("2026-03-07T00:00:00Z"), 3));
    expect(runs).toEqual([
      "2026-03-07T07:30:00.000Z", // 02:30 EST
      "2026-03-08T07:30:00.000Z", // 03:30 EDT: once, not skipped
      "2026-03-09T06:30:00.000Z", // 02:30 EDT
    ]);
  });

  it("a time repeated by fall-back runs once, at its first occurrence; an every-hour job runs every real hour", () => {
    // America/New_York, 2026-11-01: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice.
    expect(isoAll(nextRuns("30 1 * * *", "America/New_York", at("2026-10-31T00:00:00Z"), 3))).toEqual([
      "2026-10-31T05:30:00.000Z",
      "2026-11-01T05:30:00.000Z", // 01:30 EDT; 01:30 EST (06:30Z) does not run again
      "2026-11-02T06:30:00.000Z",
    ]);
    expect(isoAll(nextRuns("0 * * * *", "America/New_York", at("2026-11-01T04:30:00Z"), 3))).toEqual([
      "2026-11-01T05:00:00.000Z", // 01:00 EDT
      "2026-11-01T06:00:00.000Z", // 01:00 EST: an hour later in real time
      "2026-11-01T07:00:00.000Z",
    ]);
  });

  it("day of month and day of week both restricted: either one matching is enough (Vixie cron, Kubernetes)", () => {
    const days = (schedule: string) =>
      nextRuns(schedule, "UTC", at("2026-12-01T00:00:00Z"), 5).map((t) => new Date(t).toISOString().slice(0, 10));
    // Fridays (4, 11, 18, 25) and the 13th (a Sunday).
    expect(days("0 0 13 * 5")).toEqual(["2026-12-04", "2026-12-11", "2026-12-13", "2026-12-18", "2026-12-25"]);
    // One of them `*`: the other alone decides.
    expect(days("0 0 13 * *")).toEqual(["2026-12-13", "2027-01-13", "2027-02-13", "2027-03-13", "2027-04-13"]);
    expect(days("0 0 * * 5")).toEqual(["2026-12-04", "2026-12-11", "2026-12-18", "2026-12-25", "2027-01-01"]);
  });

  it("a job created in a non-UTC zone is armed at that zone's local time", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, schedule: "30 6 * * *", command: "true", timezone: "Asia/Kolkata" });
    const alarm = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.getAlarm());
    // 06:30 in Kolkata (UTC+05:30, no DST) is 01:00 UTC; the alarm sends the run to its node ahead of it.
    const second = new Date(alarm! + stageLead(cron.id));
    expect([second.getUTCHours(), second.getUTCMinutes()]).toEqual([1, 0]);
  });
});

describe("CronJob alarm", () => {
  it("runs a due job once as <name>-<unix_seconds>, even when the alarm is delivered twice", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "echo scheduled" });
    const due = Math.floor(Date.now() / 1000) * 1000 - 1000;
    expect(await deliverAlarm(cron.id, due)).toBe(true);
    expect(await deliverAlarm(cron.id, due)).toBe(true);
    const list = await runs(key, cron.id);
    expect(list.map((r) => r.jobName)).toEqual([`${cron.name}-${due / 1000}`]);
    const run = await waitForRun(key, cron.id, list[0]!.jobName);
    expect(run.status).toBe("success");
    const detail = (await json<{ data: { lastRun: string; nextRun: string } }>(await call(`/v1/crons/${cron.id}`, { key }))).data;
    expect(Date.parse(detail.lastRun)).toBe(due);
    expect(Date.parse(detail.nextRun)).toBeGreaterThan(Date.now());
  });

  it("a late alarm runs once and re-arms at the next slot after now, not a catch-up burst", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    // Hourly, not every minute: the object's own alarm, which sends each slot's run ahead 10-30 s before it,
    // then fires in the last half minute of an hour only, not of every minute, so it rarely runs while the
    // late delivery below is under way (it reschedules over the time the test sets).
    const hour = 3_600_000;
    const cron = await newCron(key, { appId: app.id, schedule: "0 * * * *", command: "true" });
    // Three slots missed at least: a catch-up burst would run every one of them.
    const late = Math.floor(Date.now() / hour) * hour - 3 * hour;
    await deliverAlarm(cron.id, late);
    // Runs due by now (the next slot's may already be sent ahead to its node).
    const due = (await runs(key, cron.id)).filter((r) => Number(r.jobName.split("-").at(-1)) * 1000 <= Date.now());
    expect(due.map((r) => r.jobName)).toEqual([`${cron.name}-${late / 1000}`]);
    const alarm = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.getAlarm());
    expect(alarm).toBeGreaterThan(Date.now());
    // At the next slot after now (less the lead its run is sent ahead by), not at a missed one.
    expect(alarm).toBeLessThanOrEqual(Math.ceil((Date.now() + 1) / hour) * hour);
  });

  it("sends a run to its node ahead of its second: made ready there (queued, staged), started at the second, not before, once", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, schedule: "0 0 1 1 *", command: "echo ran" });
    const due = Math.ceil((Date.now() + 2_000) / 1000) * 1000;
    const jobName = `${cron.name}-${due / 1000}`;
    // The alarm 30 s (here 2-3 s) before the second sends the run; a repeated delivery sends nothing more.
    await deliverAlarm(cron.id, due);
    await deliverAlarm(cron.id, due);
    const staged = await runs(key, cron.id);
    expect(staged.map((r) => r.jobName)).toEqual([jobName]);
    expect(staged[0]).toMatchObject({ status: "running", phase: "queued", waiting: expect.stringContaining("staged on its node") });
    // Woken at its second for the record, then asked about.
    const alarm = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.getAlarm());
    expect(alarm).toBe(due);
    await new Promise((r) => setTimeout(r, due - Date.now() + 50));
    await runDurableObjectAlarm(stubOf(cron.id));
    const run = await waitForRun(key, cron.id, jobName);
    expect(run.status).toBe("success");
    expect(Date.parse(run.startedAt)).toBeGreaterThanOrEqual(due);
    const log = await logsOf(key, cron.id, jobName);
    const out = /^(\S+) out ran$/m.exec(log);
    expect(out, log).not.toBeNull();
    expect(Date.parse(out![1]!)).toBeGreaterThanOrEqual(due);
    expect((await runs(key, cron.id)).map((r) => r.jobName)).toEqual([jobName]);
    const detail = (await json<{ data: { lastRun: string } }>(await call(`/v1/crons/${cron.id}`, { key }))).data;
    expect(Date.parse(detail.lastRun)).toBe(due);
  });

  it("takes a run sent ahead back when the job changes, the app's environment changes, or the job is deleted before its second: it never starts", async () => {
    const { adminKey: key } = await newAccount();
    // One app per change: an app's change reaches every job of the app.
    const apps = [await newApp(key), await newApp(key), await newApp(key)];
    const changes: [string, (cronId: string) => Promise<unknown>][] = [
      ["the command changed", (id) => call(`/v1/crons/${id}`, { method: "PATCH", key, body: { command: "echo new" } })],
      ["an env var set", () => call(`/v1/apps/${apps[1]!.id}/env`, { method: "PATCH", key, body: { vars: { GREETING: "hi" } } })],
      ["the job deleted", (id) => call(`/v1/crons/${id}`, { method: "DELETE", key })],
    ];
    // One job per change, all due at the same second (each staged, then changed, before it).
    const due = Math.ceil((Date.now() + 5_000) / 1000) * 1000;
    const crons = [];
    for (const [i, [what]] of changes.entries()) {
      const cron = await newCron(key, { appId: apps[i]!.id, schedule: "0 0 1 1 *", command: "echo old" });
      await deliverAlarm(cron.id, due);
      expect((await runs(key, cron.id)).map((r) => r.phase), what).toEqual(["queued"]);
      crons.push(cron);
    }
    for (const [i, [what, change]] of changes.entries()) {
      const res = (await change(crons[i]!.id)) as Response;
      expect(res.status, what).toBeLessThan(300);
    }
    expect(Date.now()).toBeLessThan(due);
    await new Promise((r) => setTimeout(r, due - Date.now() + 1_000));
    for (const [i, [what]] of changes.entries()) {
      const cron = crons[i]!;
      if (what !== "the job deleted") {
        expect(await runs(key, cron.id), what).toEqual([]);
        await runDurableObjectAlarm(stubOf(cron.id));
        expect(await runs(key, cron.id), what).toEqual([]);
      }
      // Nothing is left sent for that second either.
      const sent = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.kv.get<number>("stagedFor"));
      expect(sent, what).toBeUndefined();
    }
  });

  it("a manual run under forbid takes back a run sent ahead for its second (whose second then decides again); under allow that run stays", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const due = Math.ceil((Date.now() + 5_000) / 1000) * 1000;
    const forbid = await newCron(key, { appId: app.id, command: "echo scheduled" });
    const allow = await newCron(key, { appId: app.id, command: "echo scheduled", concurrencyPolicy: "allow" });
    for (const cron of [forbid, allow]) await deliverAlarm(cron.id, due);
    for (const cron of [forbid, allow]) {
      const manual = await call(`/v1/crons/${cron.id}/run`, { method: "POST", key });
      expect(manual.status, await manual.clone().text()).toBe(202);
    }
    expect(Date.now()).toBeLessThan(due);
    const names = async (id: string) => (await runs(key, id)).map((r) => r.jobName.replace(/^manual-.*$/, "manual"));
    expect(await names(forbid.id)).toEqual(["manual"]);
    expect((await names(allow.id)).sort()).toEqual([`${allow.name}-${due / 1000}`, "manual"]);
  });

  it("skips a disabled job and a stopped app without recording a run, and arms no alarm for them (a stray delivery is all it costs)", async () => {
    const { adminKey: key } = await newAccount();
    const running = await newApp(key);
    const stopped = await newApp(key, "stopped");
    const disabled = await newCron(key, { appId: running.id, command: "true", enabled: false });
    const onStopped = await newCron(key, { appId: stopped.id, command: "true" });
    for (const cron of [disabled, onStopped]) {
      expect(await deliverAlarm(cron.id, Date.now() - 1000)).toBe(true);
      expect(await runs(key, cron.id)).toEqual([]);
      const alarm = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.getAlarm());
      expect(alarm).toBeNull();
    }
  });

  it("forbid skips a due run while one is running; allow starts another", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    for (const [policy, expected] of [
      ["forbid", 1],
      ["allow", 2],
    ] as const) {
      const cron = await newCron(key, { appId: app.id, command: "sleep 5", concurrencyPolicy: policy });
      const first = Math.floor(Date.now() / 1000) * 1000 - 2000;
      await deliverAlarm(cron.id, first);
      await deliverAlarm(cron.id, first + 1000);
      const list = await runs(key, cron.id);
      expect(list.length, policy).toBe(expected);
      for (const run of list) await call(`/v1/crons/${cron.id}/runs/${run.jobName}/cancel`, { method: "POST", key });
    }
  });

  it("replace cancels the running run when the next one is due", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "sleep 30", concurrencyPolicy: "replace" });
    const first = Math.floor(Date.now() / 1000) * 1000 - 2000;
    await deliverAlarm(cron.id, first);
    await deliverAlarm(cron.id, first + 1000);
    const list = await runs(key, cron.id);
    const old = list.find((r) => r.jobName.endsWith(String(first / 1000)))!;
    expect(old).toMatchObject({ status: "failed" });
    expect(old.error).toContain("replaced");
    await call(`/v1/crons/${cron.id}/runs/${cron.name}-${first / 1000 + 1}/cancel`, { method: "POST", key });
  });

  it("after delete, a stale alarm does nothing", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "true" });
    const stub = stubOf(cron.id);
    await call(`/v1/crons/${cron.id}`, { method: "DELETE", key });
    await runInDurableObject(stub, async (_i, state) => {
      await state.storage.put("scheduledFor", Date.now() - 1000);
      await state.storage.setAlarm(Date.now() + 60_000);
    });
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    const left = await runInDurableObject(stub, async (_i, state) => ({
      alarm: await state.storage.getAlarm(),
      keys: [...(await state.storage.list()).keys()],
    }));
    expect(left).toEqual({ alarm: null, keys: [] });
  });
});

describe("run history", () => {
  it("keeps the newest 100 runs in the job's object and removes older ones with their logs", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "true", concurrencyPolicy: "allow" });
    const base = Math.floor(Date.now() / 1000) - 100_000;
    await runInDurableObject(stubOf(cron.id), (_i, state) => {
      for (let i = 0; i < 100; i++) {
        const jobName = `${cron.name}-${base + i}`;
        state.storage.sql.exec(
          "INSERT INTO runs (job_name, trigger, status, scheduled_at, started_at, finished_at, log_key) VALUES (?, 'schedule', 'success', ?, ?, ?, ?)",
          jobName,
          (base + i) * 1000,
          (base + i) * 1000,
          (base + i) * 1000 + 10,
          `cron-logs/${cron.id}/${jobName}.log`,
        );
      }
    });
    await env.BUCKET.put(`cron-logs/${cron.id}/${cron.name}-${base}.log`, "oldest");
    const now = Math.floor(Date.now() / 1000) * 1000;
    for (let i = 0; i < 10; i++) await deliverAlarm(cron.id, now - 20_000 + i * 1000);
    const count = await runInDurableObject(stubOf(cron.id), (_i, state) => state.storage.sql.exec("SELECT count(*) AS n FROM runs").one().n);
    expect(count).toBe(100);
    expect((await runs(key, cron.id)).map((r) => r.jobName)).not.toContain(`${cron.name}-${base}`);
    expect(await env.BUCKET.head(`cron-logs/${cron.id}/${cron.name}-${base}.log`)).toBeNull();
    // None of it went through D1.
    const inD1 = await env.DB.prepare("SELECT count(*) AS n FROM cron_runs WHERE cron_id = ?").bind(cron.id).first<{ n: number }>();
    expect(inD1!.n).toBe(0);
  });

  it("an object from before objects owned their runs takes its job's runs over from D1 once, deleting them there", async () => {
    const { adminKey: key } = await newAccount();
    const app = await newApp(key);
    const cron = await newCron(key, { appId: app.id, command: "true", schedule: "0 0 1 1 *" });
    const at = (Math.floor(Date.now() / 1000) - 3600) * 1000;
    const jobName = `${cron.name}-${at / 1000}`;
    await env.DB.prepare(
      "INSERT INTO cron_runs (cron_id, job_name, trigger, status, scheduled_at, started_at, finished_at, exit_code) VALUES (?, ?, 'schedule', 'success', ?, ?, ?, 0)",
    )
      .bind(cron.id, jobName, at, at, at + 10)
      .run();
    // All such an object held was its job's id.
    await runInDurableObject(stubOf(cron.id), (_i, state) => {
      state.storage.kv.delete("job");
      state.storage.kv.delete("target");
      state.storage.kv.put("cronId", cron.id);
    });
    expect(await runDurableObjectAlarm(stubOf(cron.id))).toBe(true);
    expect(await runs(key, cron.id)).toEqual([expect.objectContaining({ jobName, status: "success", exitCode: 0 })]);
    const inD1 = await env.DB.prepare("SELECT count(*) AS n FROM cron_runs WHERE cron_id = ?").bind(cron.id).first<{ n: number }>();
    expect(inD1!.n).toBe(0);
    // And it carries on as a job of its own: the next run is armed.
    const detail = (await json<{ data: { nextRun: string } }>(await call(`/v1/crons/${cron.id}`, { key }))).data;
    expect(Date.parse(detail.nextRun)).toBeGreaterThan(Date.now());
  });
});
