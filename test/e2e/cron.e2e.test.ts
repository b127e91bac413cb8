import { randomBytes } from "node:crypto";
import { readFile, readdir } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";

type Run = { jobName: string; status: string; trigger: string };

/** How long a `* * * * *` job may take to fire and finish: the rest of this minute, plus the run. */
const FIRE_WITHIN_MS = 75_000;
const POLL_MS = 3000;

/**
 * The acceptance point of issue 4: with the stack `npm start` runs, a job
 * scheduled every minute fires on its own (no manual trigger), and its run
 * and log are visible through the CLI.
 */
describe("a cron job fires on its schedule", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const app = `tick-${randomBytes(3).toString("hex")}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "e2e-cron", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    const created = await svc(["apps", "create", "--name", app, "--runtime", "static"], env);
    if (created.code !== 0) throw new Error(`apps create: ${created.stderr}`);
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
  });

  it(
    "`* * * * *` runs within the next minute, and its run and log appear through the CLI",
    async () => {
      const created = await svc(["cron", "create", app, "--name", "tick", "--schedule", "* * * * *", "--command", "echo tick-$(date +%s)", "--json"], env);
      expect(created.stderr).toBe("");
      expect(created.code).toBe(0);
      const { id } = JSON.parse(created.stdout) as { id: string };

      const deadline = Date.now() + FIRE_WITHIN_MS;
      let fired: Run | undefined;
      let seen: Run[] = [];
      while (!fired && Date.now() < deadline) {
        await sleep(POLL_MS);
        const runs = await svc(["cron", "runs", id, "--json"], env);
        expect(runs.code).toBe(0);
        seen = JSON.parse(runs.stdout) as Run[];
        fired = seen.find((r) => r.trigger === "schedule" && r.status === "success");
      }
      expect(fired, `no successful scheduled run within ${FIRE_WITHIN_MS / 1000} s; runs: ${JSON.stringify(seen)}`).toBeDefined();
      const unix = Number(/^tick-(\d+)$/.exec(fired!.jobName)?.[1]);
      expect(unix % 60).toBe(0);
      expect(seen.every((r) => r.trigger === "schedule")).toBe(true);

      const logs = await svc(["cron", "logs", id, fired!.jobName], env);
      expect(logs.code).toBe(0);
      expect(logs.stdout).toMatch(/^\S+ out tick-\d{10}$/m);

      const info = await svc(["cron", "info", id, "--json"], env);
      const detail = JSON.parse(info.stdout) as { lastRun: string; nextRun: string };
      expect(Date.parse(detail.lastRun) / 1000).toBeGreaterThanOrEqual(unix);
      expect(Date.parse(detail.nextRun)).toBeGreaterThan(unix * 1000);
    },
    FIRE_WITHIN_MS + 25_000,
  );

  it("a run past its timeout is failed and its processes, children included, are gone", async () => {
    // A sleep no other process runs (unique argument): the host's /proc then tells whether it outlived the run.
    const sleeper = `sleep 60.${Date.now()}`;
    const created = await svc(
      ["cron", "create", app, "--name", "sleeper", "--schedule", "0 0 1 1 *", "--timeout", "1s", "--command", `${sleeper} & setsid ${sleeper} & echo started; wait`, "--json"],
      env,
    );
    expect(created.code).toBe(0);
    const { id } = JSON.parse(created.stdout) as { id: string };
    const run = await svc(["cron", "run", id, "--wait"], env);
    expect(run.code).toBe(1);
    const runs = JSON.parse((await svc(["cron", "runs", id, "--json"], env)).stdout) as (Run & { error: string })[];
    expect(runs[0]).toMatchObject({ status: "failed" });
    expect(runs[0]!.error).toContain("timed out");
    const logs = (await svc(["cron", "logs", id, runs[0]!.jobName], env)).stdout;
    expect(logs).toMatch(/ out started$/m);
    const survivors = [];
    for (const pid of (await readdir("/proc")).filter((name) => /^\d+$/.test(name))) {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
      if (cmdline.split("\0").filter(Boolean).join(" ") === sleeper) survivors.push(pid);
    }
    expect(survivors).toEqual([]);
  }, 60_000);
});
