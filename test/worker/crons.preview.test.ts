import { describe, expect, it } from "vitest";
import { nextRuns } from "../../worker/lib/cron";
import { call, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";

type Preview = { data: { schedule: string; timezone: string; nextRuns: string[] } };

const preview = (key: string, schedule: string, timezone?: string) => {
  const query = new URLSearchParams({ schedule, ...(timezone === undefined ? {} : { timezone }) });
  return call(`/v1/crons/schedule-preview?${query}`, { key });
};

describe("GET /v1/crons/schedule-preview", () => {
  it("answers the next five runs in the given time zone, as create would arm them", async () => {
    const { adminKey: key } = await newAccount();
    const before = Date.now();
    const res = await preview(key, "30 6 * * 1-5", "Asia/Kolkata");
    expect(res.status).toBe(200);
    const { data } = await json<Preview>(res);
    expect(data.schedule).toBe("30 6 * * 1-5");
    expect(data.timezone).toBe("Asia/Kolkata");
    expect(data.nextRuns).toHaveLength(5);
    // 06:30 in Kolkata (UTC+05:30) is 01:00 UTC, on weekdays only.
    for (const run of data.nextRuns) {
      const at = new Date(run);
      expect([at.getUTCHours(), at.getUTCMinutes()]).toEqual([1, 0]);
      expect([1, 2, 3, 4, 5]).toContain(at.getUTCDay());
    }
    const expected = nextRuns("30 6 * * 1-5", "Asia/Kolkata", before, 5).map((t) => new Date(t).toISOString());
    expect(data.nextRuns).toEqual(expected);
  });

  it("reads the schedule in UTC when no time zone is given", async () => {
    const { adminKey: key } = await newAccount();
    const { data } = await json<Preview>(await preview(key, "0 3 * * *"));
    expect(data.timezone).toBe("UTC");
    expect(data.nextRuns.map((r) => r.slice(11))).toEqual(Array(5).fill("03:00:00.000Z"));
  });

  it("explains an invalid expression with 400 INVALID_CRON_EXPRESSION, as create does", async () => {
    const { adminKey: key } = await newAccount();
    for (const [schedule, says] of [
      ["* * *", "expected 5 space-separated fields"],
      ["0 24 * * *", "hour value 24 is out of range 0-23"],
      ["@daily", "expected 5 space-separated fields"],
    ] as const) {
      const res = await preview(key, schedule);
      expect(res.status).toBe(400);
      const { error } = await json<ErrorJson>(res);
      expect(error.code).toBe("INVALID_CRON_EXPRESSION");
      expect(error.message).toContain(says);
    }
  });

  it("refuses an unknown time zone with 400 VALIDATION_ERROR naming the field", async () => {
    const { adminKey: key } = await newAccount();
    const res = await preview(key, "0 3 * * *", "Mars/Olympus");
    expect(res.status).toBe(400);
    const { error } = await json<ErrorJson>(res);
    expect(error.code).toBe("VALIDATION_ERROR");
    expect(error.details?.map((d) => d.field)).toEqual(["query.timezone"]);
  });

  it("needs a key with the deploy scope", async () => {
    const { accountId } = await newAccount();
    const checks = await expectAuthEnforced("/v1/crons/schedule-preview?schedule=0+3+*+*+*", {}, "deploy", accountId);
    expect(checks.unauthenticated).toBe(401);
    expect(checks.garbage).toBe(401);
    expect(checks.wrongScope?.error.code).toBe("INSUFFICIENT_SCOPE");
  });
});
