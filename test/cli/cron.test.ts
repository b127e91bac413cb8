import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "./svc.js";

type Run = { jobName: string; status: string; trigger: string; exitCode: number | null; error: string | null };

/** `svc cron` through the real binary against the real Worker and builder (issue 4). */
describe("svc cron against wrangler dev", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const app = `cron-${randomBytes(3).toString("hex")}`;
  const job = `greet-${randomBytes(3).toString("hex")}`;
  let id: string;
  let okRun: string;
  let failedRun: string;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "cli-cron", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    const created = await svc(["apps", "create", "--name", app, "--runtime", "static"], env);
    if (created.code !== 0) throw new Error(`apps create: ${created.stderr}`);
    const set = await svc(["env", "set", "GREETING=world", "--app", app], env);
    if (set.code !== 0) throw new Error(`env set: ${set.stderr}`);
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
  });

  const json = <T>(stdout: string) => JSON.parse(stdout) as T;

  it("create insists on its app argument and its three flags before calling the API", async () => {
    const noCommand = await svc(["cron", "create", app, "--name", job, "--schedule", "0 3 * * *"], env);
    expect(noCommand.code).toBe(2);
    expect(noCommand.stderr).toMatch(/^Error: missing --command <cmd>$/m);
    const noApp = await svc(["cron", "create", "--name", job, "--schedule", "0 3 * * *", "--command", "true"], env);
    expect(noApp.code).toBe(2);
    expect(noApp.stderr).toMatch(/^Error: missing --app <app>$/m);
    const policy = await svc(["cron", "create", app, "--name", job, "--schedule", "0 3 * * *", "--command", "true", "--concurrency", "never"], env);
    expect(policy.code).toBe(2);
    expect(policy.stderr).toContain("--concurrency must be one of forbid, allow, replace");
  });

  it("an invalid schedule gets the three-part INVALID_CRON_EXPRESSION error naming the five fields", async () => {
    const r = await svc(["cron", "create", app, "--name", job, "--schedule", "61 * * * *", "--command", "true"], env);
    expect(r.code).toBe(1);
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not create cron job ${job} in app ${app}`);
    expect(lines[1]).toMatch(/^ {2}INVALID_CRON_EXPRESSION: invalid cron expression/);
    expect(lines.at(-1)).toMatch(/^ {2}Hint: a schedule is five fields, .*minute \(0-59\) hour \(0-23\) day-of-month \(1-31\) month \(1-12\) day-of-week/);
    const six = await svc(["cron", "create", app, "--name", job, "--schedule", "0 0 3 * * *", "--command", "true"], env);
    expect(six.code).toBe(1);
    expect(six.stderr).toContain("INVALID_CRON_EXPRESSION");
  });

  it("an unknown app gets APP_NOT_FOUND with a pointer to apps list", async () => {
    const r = await svc(["cron", "create", "no-such-app", "--name", job, "--schedule", "0 3 * * *", "--command", "true"], env);
    expect(r.code).toBe(1);
    expect(r.stderr.trimEnd().split("\n")).toEqual([
      `Error: could not create cron job ${job} in app no-such-app`,
      "  APP_NOT_FOUND: app not found",
      '  Hint: no app "no-such-app" in this account: `svc apps list` shows the names and ids',
    ]);
  });

  it("create prints the new job", async () => {
    const r = await svc(["cron", "create", app, "--name", job, "--schedule", "0 3 * * *", "--command", "echo hello $GREETING", "--timeout", "10m"], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`Created cron job ${job}\n`);
    expect(r.stdout).toMatch(new RegExp(`^app\\s+${app} \\(app_\\w{24}\\)$`, "m"));
    expect(r.stdout).toMatch(/^schedule\s+0 3 \* \* \* \(UTC\)$/m);
    expect(r.stdout).toMatch(/^timeout\s+10m$/m);
    id = /\bcron_[0-9A-Za-z]{24}\b/.exec(r.stdout)![0];
  });

  it("list shows id, name, app, schedule and enabled", async () => {
    const r = await svc(["cron", "list"], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^ID\s+NAME\s+APP\s+SCHEDULE\s+ENABLED\s+COMMAND$/m);
    expect(r.stdout).toMatch(new RegExp(`^${id}\\s+${job}\\s+${app}\\s+0 3 \\* \\* \\*\\s+yes\\s+echo hello \\$GREETING$`, "m"));
    const asJson = await svc(["cron", "list", "--json"], env);
    expect(json<{ id: string }[]>(asJson.stdout)).toContainEqual(expect.objectContaining({ id, name: job, enabled: true }));
  });

  it("info shows the job with its last, next and next five runs, by id and by name", async () => {
    const r = await svc(["cron", "info", id], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^app\\s+${app} \\(app_\\w+\\)$`, "m"));
    expect(r.stdout).toMatch(/^last run\s+never$/m);
    expect(r.stdout).toMatch(/^next run\s+\d{4}-\d\d-\d\dT03:00:00\.000Z \(in .+\)$/m);
    const nextRuns = /^next runs\s+([\s\S]*?)\ncreated/m.exec(r.stdout)![1]!.split("\n").map((l) => l.trim());
    expect(nextRuns).toHaveLength(5);
    for (const time of nextRuns) expect(time).toMatch(/T03:00:00\.000Z$/);
    const byName = await svc(["cron", "info", job, "--json"], env);
    expect(byName.code).toBe(0);
    expect(json<{ id: string; nextRuns: string[] }>(byName.stdout)).toMatchObject({ id, command: "echo hello $GREETING" });
  });

  it("update changes only the given field", async () => {
    const r = await svc(["cron", "update", id, "--schedule", "30 4 * * 1-5", "--json"], env);
    expect(r.code).toBe(0);
    expect(json(r.stdout)).toMatchObject({ id, schedule: "30 4 * * 1-5", command: "echo hello $GREETING", timezone: "UTC", timeoutSeconds: 600, enabled: true });
    const paused = await svc(["cron", "update", id, "--disable"], env);
    expect(paused.code).toBe(0);
    expect(paused.stdout).toMatch(/^enabled\s+no /m);
    expect(paused.stdout).toMatch(/^schedule\s+30 4 \* \* 1-5 \(UTC\)$/m);
    const resumed = await svc(["cron", "update", job, "--enable", "--json"], env);
    expect(json(resumed.stdout)).toMatchObject({ enabled: true, schedule: "30 4 * * 1-5" });
    const bad = await svc(["cron", "update", id, "--schedule", "@daily"], env);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/^ {2}INVALID_CRON_EXPRESSION: invalid cron expression/m);
  });

  it("run --wait of `echo hello $GREETING` prints the log with the app's env var and exits 0", async () => {
    const r = await svc(["cron", "run", id, "--wait"], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    okRun = /^Started run (manual-[a-z0-9]{6}-\d+)$/m.exec(r.stdout)![1]!;
    expect(r.stdout).toMatch(/^\S+ out hello world$/m);
    expect(r.stdout).toMatch(new RegExp(`^Run ${okRun} succeeded after \\d+\\.\\d s$`, "m"));
  });

  it("run --wait of `exit 2` prints the failure in three parts and exits 1", async () => {
    const changed = await svc(["cron", "update", id, "--command", "exit 2"], env);
    expect(changed.code).toBe(0);
    const r = await svc(["cron", "run", id, "--wait"], env);
    expect(r.code).toBe(1);
    failedRun = /^Started run (manual-[a-z0-9]{6}-\d+)$/m.exec(r.stdout)![1]!;
    expect(r.stdout).toMatch(/svc error: command exited with code 2$/m);
    expect(r.stderr.trimEnd().split("\n")).toEqual([
      `Error: run ${failedRun} failed`,
      "  command exited with code 2",
      `  Hint: the log shows what the command printed: svc cron logs ${id} ${failedRun}`,
    ]);
  });

  it("run without --wait prints the run's name, and --json the API's data", async () => {
    const r = await svc(["cron", "run", id, "--json"], env);
    expect(r.code).toBe(0);
    const started = json<{ jobName: string; status: string }>(r.stdout);
    expect(started).toMatchObject({ jobName: expect.stringMatching(/^manual-[a-z0-9]{6}-\d+$/), status: "running" });
    const followed = await svc(["cron", "logs", id, started.jobName, "--follow"], env);
    expect(followed.code).toBe(0);
    expect(followed.stdout).toContain(" svc error: command exited with code 2");
  });

  it("runs lists both runs, newest first", async () => {
    const r = await svc(["cron", "runs", id], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^JOB NAME\s+STATUS\s+TRIGGER\s+STARTED\s+DURATION\s+EXIT\s+ERROR$/m);
    expect(r.stdout).toMatch(new RegExp(`^${okRun}\\s+success\\s+manual\\s+.+\\s0$`, "m"));
    expect(r.stdout).toMatch(new RegExp(`^${failedRun}\\s+failed\\s+manual\\s+.+\\s2\\s+command exited with code 2$`, "m"));
    const runs = json<Run[]>((await svc(["cron", "runs", id, "--json"], env)).stdout);
    const names = runs.map((run) => run.jobName);
    expect(names.indexOf(failedRun)).toBeLessThan(names.indexOf(okRun));
    expect(runs.find((run) => run.jobName === okRun)).toMatchObject({ status: "success", trigger: "manual", exitCode: 0, error: null });
  });

  it("logs prints each run's log; an unknown run gets RUN_NOT_FOUND", async () => {
    const ok = await svc(["cron", "logs", id, okRun], env);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(/^\d{4}-\d\d-\d\dT\S+ out hello world$/m);
    const failed = await svc(["cron", "logs", job, failedRun, "--json"], env);
    expect(json<{ logs: string }>(failed.stdout).logs).toContain("error: command exited with code 2");
    // Without a run: the newest one, named on stderr.
    const [latest] = json<Run[]>((await svc(["cron", "runs", id, "--json"], env)).stdout);
    const newest = await svc(["cron", "logs", id], env);
    expect(newest.code).toBe(0);
    expect(newest.stderr.trim()).toBe(`Newest run of cron job ${id}: ${latest!.jobName} (${latest!.status})`);
    expect(newest.stdout).toBe((await svc(["cron", "logs", id, latest!.jobName], env)).stdout);
    const missing = await svc(["cron", "logs", id, "manual-nope00-1"], env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^ {2}RUN_NOT_FOUND: /m);
    expect(missing.stderr).toContain(`Hint: no run "manual-nope00-1": \`svc cron runs ${id}\` lists the job's runs`);
  });

  it("logs --follow prints lines as they come until the run ends; cancel stops a run", async () => {
    await svc(["cron", "update", id, "--command", "for i in 1 2 3; do echo line-$i; sleep 1; done"], env);
    const started = json<{ jobName: string }>((await svc(["cron", "run", id, "--json"], env)).stdout);
    const followed = await svc(["cron", "logs", id, started.jobName, "--follow"], env);
    expect(followed.code).toBe(0);
    expect(followed.stdout.match(/ out line-\d$/gm)).toEqual([" out line-1", " out line-2", " out line-3"]);
    expect(followed.stderr.trim()).toBe(`Run ${started.jobName} finished: success (exit code 0)`);

    await svc(["cron", "update", id, "--command", "sleep 30"], env);
    const slow = json<{ jobName: string }>((await svc(["cron", "run", id, "--json"], env)).stdout);
    const cancelled = await svc(["cron", "cancel", id, slow.jobName], env);
    expect(cancelled.code).toBe(0);
    expect(cancelled.stdout.trim()).toBe(`Cancelled run ${slow.jobName}`);
    const again = await svc(["cron", "cancel", id, slow.jobName], env);
    expect(again.stdout.trim()).toBe(`Run ${slow.jobName} had already finished: failed (cancelled)`);
  });

  it("run on a stopped app gets the three-part APP_STOPPED error", async () => {
    expect((await svc(["apps", "stop", app], env)).code).toBe(0);
    const r = await svc(["cron", "run", id, "--wait"], env);
    expect(r.code).toBe(1);
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not run cron job ${id}`);
    expect(lines[1]).toMatch(/^ {2}APP_STOPPED: /);
    expect(lines.at(-1)).toBe(`  Hint: stopped apps run no cron jobs: start the app with \`svc apps restart --app <app>\` (\`svc cron info ${id}\` names it)`);
    expect((await svc(["apps", "restart", app], env)).code).toBe(0);
  });

  it("delete removes the job; afterwards it is not found", async () => {
    const r = await svc(["cron", "delete", job, "--yes"], env);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(`Deleted cron job ${job} (${id})`);
    const gone = await svc(["cron", "info", id], env);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toMatch(/^ {2}CRON_NOT_FOUND: /m);
    expect(gone.stderr).toContain(`Hint: no cron job "${id}" in this account: \`svc cron list\` shows the ids and names`);
    const byName = await svc(["cron", "info", job], env);
    expect(byName.code).toBe(1);
    expect(byName.stderr).toMatch(/^ {2}CRON_NOT_FOUND: /m);
    expect(byName.stderr).toContain(`Hint: no cron job "${job}" in this account: \`svc cron list\` shows the ids and names`);
  });
});
