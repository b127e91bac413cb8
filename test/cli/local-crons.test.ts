import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { scheduleTriggers, wranglerCrons } from "../../scripts/local-crons.js";
import { ROOT } from "../../scripts/local-stack.js";

/**
 * Issue 14, point 6: `npm start` fires the Worker's cron triggers locally on
 * their schedule (test/cli/first-hour.test.ts shows the route they go through
 * reaching scheduled()). Here the clock is simulated: nothing fires between the
 * real times, so stacks started by tests are left alone.
 */
describe("the local cron triggers", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("reads the triggers of wrangler.toml", async () => {
    expect(wranglerCrons(await readFile(join(ROOT, "wrangler.toml"), "utf8"))).toEqual(["17 * * * *", "*/5 * * * *"]);
    expect(wranglerCrons("[triggers]\ncrons = ['0 * * * *']\n")).toEqual(["0 * * * *"]);
    expect(wranglerCrons("name = 'x'\n")).toEqual([]);
  });

  it("fires each trigger at its time, those due together together, and nothing after stop()", async () => {
    vi.useFakeTimers({ now: Date.parse("2026-11-23T12:14:30.000Z") });
    const fired: [string, string][] = [];
    const triggers = scheduleTriggers({
      crons: ["17 * * * *", "*/5 * * * *", "0 13 * * *"],
      fire: async (cron) => {
        fired.push([new Date(Date.now()).toISOString().slice(11, 19), cron]);
      },
    });
    await vi.advanceTimersByTimeAsync(29_000);
    expect(fired).toEqual([]);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(fired).toEqual([["12:15:00", "*/5 * * * *"]]);
    await vi.advanceTimersByTimeAsync(45 * 60_000); // to 13:00:00
    expect(fired.map(([at]) => at)).toEqual(["12:15:00", "12:17:00", "12:20:00", "12:25:00", "12:30:00", "12:35:00", "12:40:00", "12:45:00", "12:50:00", "12:55:00", "13:00:00", "13:00:00"]);
    expect(fired.slice(-2).map(([, cron]) => cron).sort()).toEqual(["*/5 * * * *", "0 13 * * *"]);
    triggers.stop();
    await vi.advanceTimersByTimeAsync(3_600_000);
    expect(fired).toHaveLength(12);
  });
});
