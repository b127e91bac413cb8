import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startStack } from "../cli/svc.js";
import { runLoad } from "./load.js";

/**
 * The correctness half of issue 10's load run (bench/load-run.ts is the 32-client,
 * 60-second half): clients in three accounts create, list and delete keys,
 * apps, cron jobs and backups at once; no answer is a 5xx, no list shows
 * another account's row, and D1 ends holding exactly what the clients were told.
 */
describe("concurrent clients in three accounts", () => {
  let stack: LocalStack;
  beforeAll(async () => {
    stack = await startStack();
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
  });

  it("get no 5xx, see only their own account's rows, and leave D1 as they were told", async () => {
    const report = await runLoad(stack, { clients: 9, seconds: 12 });
    console.log(
      `load: ${report.requests} requests, ${report.ok} ok, ${report.refused} refused (4xx), ${report.rateLimited} rate limited, ${report.serverErrors} 5xx, ${report.transportErrors} transport errors`,
    );
    expect(report.serverErrorSamples).toEqual([]);
    expect(report.serverErrors).toBe(0);
    expect(report.transportErrors).toBe(0);
    expect(report.crossAccount).toEqual([]);
    expect(report.mismatches).toEqual([]);
    expect(report.ok).toBeGreaterThan(100);
  }, 240_000);
});
