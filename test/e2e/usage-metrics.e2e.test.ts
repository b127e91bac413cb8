import { execFileSync } from "node:child_process";
import { cp, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Webhook } from "standardwebhooks";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { fleetApi, until } from "./fleet-api.js";
import { expectExit, siteRequest } from "./sites.js";
import { Receiver, signedBy } from "./webhook-receiver.js";

const MIB = 1024 * 1024;

type AppMetrics = { stepSeconds: number; processes: { id: string; memoryLimitBytes: number; points: { cpuSeconds: number | null; memoryBytes: number | null; restarts: number }[] }[] };
type DiskMetrics = { stepSeconds: number; sizeBytes: number | null; inodeLimit: number | null; points: { usedBytes: number | null; usedInodes: number | null }[] };
type CronMetrics = { totals: { runs: number; succeeded: number; failed: number; meanDurationMs: number | null; maxDurationMs: number | null } };

/**
 * Issue 32's usage metrics and their alerts against `npm start`'s stack: a
 * process that spins and allocates shows its CPU and memory against its
 * limit (read from its cgroup by its node), a disk filling shows its use and
 * sends `disk.almost_full` once, signed; a cron job's runs are counted by
 * outcome, and `cron.failed` waits for its `notifyAfterFailures`th failure.
 * Operator events are refused to an account the operator did not flag.
 */
describe("usage metrics and their alerts", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  let api: ReturnType<typeof fleetApi>;
  let secret: string;
  const receiver = new Receiver();
  const app = `usage-${Math.random().toString(36).slice(2, 8)}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
    api = fleetApi(stack);
    await receiver.start();
    const hook = await api.ok<{ secret: string }>("POST", "/v1/webhooks", {
      url: `http://127.0.0.1:${receiver.port}/usage`,
      events: ["disk.almost_full", "cron.failed", "deploy.failed", "backup.failed", "restore.failed"],
    });
    secret = hook.secret;
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    // Its process would run on for the rest of the suite on the shared stack.
    await api?.call("DELETE", `/v1/apps/${app}`);
    await receiver.stop();
    await home?.remove();
  });
  beforeEach(({ onTestFailed }) => onTestFailed(() => api.showLog()));

  it("shows a process's CPU and memory against its limit, as its cgroup counts them", async () => {
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "node", "--memory", "256"], env), 0, "apps create");
    expectExit(await svc(["deploy", "--source", join(ROOT, "test", "fixtures", "apps", "node-usage"), "--app", app], env), 0, "deploy");
    const started = Date.now();
    const metrics = await until(
      "CPU and memory of the spinning process",
      async () => {
        const { processes } = await api.ok<AppMetrics>("GET", `/v1/apps/${app}/metrics?since=1h`);
        const cpu = processes.flatMap((p) => p.points).reduce((sum, p) => sum + (p.cpuSeconds ?? 0), 0);
        return processes.length === 1 && cpu >= 2 ? processes : null;
      },
      60_000,
    );
    const [process] = metrics;
    const cpu = process!.points.reduce((sum, p) => sum + (p.cpuSeconds ?? 0), 0);
    const memory = Math.max(...process!.points.map((p) => p.memoryBytes ?? 0));
    console.log(`usage metrics e2e: ${cpu.toFixed(1)} CPU s in ${((Date.now() - started) / 1000).toFixed(0)} s, memory ${(memory / MIB).toFixed(0)} MiB of 256`);
    expect(process!.memoryLimitBytes).toBe(256 * MIB);
    // 64 MiB held (touched) plus Node itself; well under the limit.
    expect(memory).toBeGreaterThan(64 * MIB);
    expect(memory).toBeLessThan(256 * MIB);
    // About half a core: never more CPU than the time it ran.
    expect(cpu).toBeLessThan((Date.now() - started) / 1000 + 10);
  }, 120_000);

  it("shows a disk filling against its size, and sends disk.almost_full once at its threshold, signed", async () => {
    const disk = await api.ok<{ id: string; alertAtPercent: number }>("POST", "/v1/disks", { name: `${app}-data`, sizeGb: 1, alertAtPercent: 3 });
    expect(disk.alertAtPercent).toBe(3);
    await api.ok("POST", `/v1/disks/${disk.id}/attach`, { app });
    // The app starts again with the disk mounted; until then it answers 503 (or an older process without it).
    await until("the app with its disk", async () => (await siteRequest(stack, app, "/fill?mb=1")).status === 200, 90_000);
    for (let i = 0; i < 2; i++) expect((await siteRequest(stack, app, "/fill?mb=20")).status).toBe(200);
    const [alert] = await until("disk.almost_full", async () => (receiver.of("disk.almost_full").length > 0 ? receiver.of("disk.almost_full") : null), 40_000);
    expect(alert!.event.data).toMatchObject({ disk: { id: disk.id, name: `${app}-data` }, sizeBytes: 1024 * MIB, alertAtPercent: 3 });
    expect((alert!.event.data as { percent: number }).percent).toBeGreaterThanOrEqual(3);
    expect(new Webhook(secret).verify(alert!.body, alert!.headers)).toEqual(alert!.event);
    expect(signedBy(secret, alert!)).toBe(true);
    const metrics = await api.ok<DiskMetrics>("GET", `/v1/disks/${disk.id}/metrics?since=1h`);
    expect(metrics).toMatchObject({ stepSeconds: 60, sizeBytes: 1024 * MIB });
    expect(metrics.inodeLimit).toBeGreaterThan(0);
    const used = Math.max(...metrics.points.map((p) => p.usedBytes ?? 0));
    expect(used).toBeGreaterThanOrEqual(41 * MIB);
    expect(Math.max(...metrics.points.map((p) => p.usedInodes ?? 0))).toBeGreaterThanOrEqual(3);
    // Still above the threshold: not sent again.
    expect((await siteRequest(stack, app, "/fill?mb=5")).status).toBe(200);
    await until("the next measure", async () => {
      const again = await api.ok<DiskMetrics>("GET", `/v1/disks/${disk.id}/metrics?since=1h`);
      return Math.max(...again.points.map((p) => p.usedBytes ?? 0)) >= used + 5 * MIB;
    }, 30_000);
    expect(receiver.of("disk.almost_full")).toHaveLength(1);
  }, 180_000);

  it("counts a cron job's runs by outcome and sends cron.failed only from its notifyAfterFailures-th failure in a row", async () => {
    const cron = await api.ok<{ id: string; notifyAfterFailures: number }>("POST", "/v1/crons", {
      appId: app,
      name: `${app}-job`,
      schedule: "0 0 1 1 *",
      command: "exit 3",
      notifyAfterFailures: 2,
    });
    expect(cron.notifyAfterFailures).toBe(2);
    expect((await api.run(cron.id)).status).toBe("failed");
    expect((await api.run(cron.id)).status).toBe("failed");
    await api.ok("PATCH", `/v1/crons/${cron.id}`, { command: "true" });
    expect((await api.run(cron.id)).status).toBe("success");
    const [failed] = await until("cron.failed", async () => (receiver.of("cron.failed").length > 0 ? receiver.of("cron.failed") : null), 30_000);
    expect(failed!.event.data).toMatchObject({ cron: { id: cron.id }, consecutiveFailures: 2 });
    const metrics = await api.ok<CronMetrics>("GET", `/v1/crons/${cron.id}/metrics?since=1h`);
    expect(metrics.totals).toMatchObject({ runs: 3, succeeded: 1, failed: 2 });
    expect(metrics.totals.meanDurationMs).toBeGreaterThan(0);
    expect(metrics.totals.maxDurationMs).toBeGreaterThanOrEqual(metrics.totals.meanDurationMs!);
    // Only the second failure in a row was sent.
    expect(receiver.of("cron.failed")).toHaveLength(1);
  }, 120_000);

  it("sends backup.failed, restore.failed and deploy.failed, each signed and saying why", async () => {
    const disk = `${app}-data`;
    const scratch = await mkdtemp(join(tmpdir(), "svc-usage-alerts-"));
    try {
      // A path longer than a backup may hold (3,072 bytes): the disk holds it, its backup refuses it.
      const deep = await api.ok<{ id: string }>("POST", "/v1/crons", {
        appId: app,
        name: `${app}-deep`,
        schedule: "0 0 1 1 *",
        command: `cd "$SVC_DISK_PATH" && d=$(printf 'd%.0s' $(seq 200)) && for i in $(seq 16); do mkdir "$d" && cd "$d"; done`,
      });
      expect((await api.run(deep.id)).status).toBe("success");
      const backup = await api.ok<{ id: string }>("POST", `/v1/disks/${disk}/backups`, { description: "too deep" });
      const [backupFailed] = await until("backup.failed", async () => (receiver.of("backup.failed").length > 0 ? receiver.of("backup.failed") : null), 60_000);
      expect(backupFailed!.event.data).toMatchObject({ disk: { name: disk }, backup: { id: backup.id, automatic: false } });
      expect((backupFailed!.event.data as { backup: { error: string } }).backup.error).toMatch(/a backup holds paths of at most 3,072 bytes/);

      // An archive with a member that climbs out of the disk: the restore refuses it.
      await mkdir(join(scratch, "a"));
      await writeFile(join(scratch, "x"), "outside\n");
      execFileSync("tar", ["czf", "evil.tar.gz", "-P", "a/../x"], { cwd: scratch });
      expectExit(await svc(["apps", "stop", app], env), 0, "apps stop");
      const restore = await svc(["backups", "restore", disk, "--file", join(scratch, "evil.tar.gz"), "--yes"], env);
      expect(restore.code).toBe(1);
      const [restoreFailed] = await until("restore.failed", async () => (receiver.of("restore.failed").length > 0 ? receiver.of("restore.failed") : null), 60_000);
      expect(restoreFailed!.event.data).toMatchObject({ disk: { name: disk } });
      expect((restoreFailed!.event.data as { restore: { error: string } }).restore.error).toMatch(/\.\./);

      // A release that exits as it starts: its deploy fails, the app keeps what it had.
      expectExit(await svc(["apps", "restart", app], env), 0, "apps restart");
      const broken = join(scratch, "broken");
      await cp(join(ROOT, "test", "fixtures", "apps", "node-usage"), broken, { recursive: true });
      await writeFile(join(broken, "server.js"), 'console.error("cannot start"); process.exit(3);\n');
      expect((await svc(["deploy", "--source", broken, "--app", app], env)).code).toBe(1);
      const [deployFailed] = await until("deploy.failed", async () => (receiver.of("deploy.failed").length > 0 ? receiver.of("deploy.failed") : null), 30_000);
      expect(deployFailed!.event.data).toMatchObject({ app: { name: app }, deployment: { status: "failed" } });
      expect((deployFailed!.event.data as { deployment: { error: string } }).deployment.error).toMatch(/exited with code 3/);
      for (const received of [backupFailed!, restoreFailed!, deployFailed!]) {
        expect(new Webhook(secret).verify(received.body, received.headers)).toEqual(received.event);
        expect(signedBy(secret, received)).toBe(true);
      }
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }, 240_000);

  it("lets only an account the operator flagged subscribe to the fleet's node events", async () => {
    const account = async (operatorEvents: boolean) => {
      const res = await fetch(`${stack.apiUrl}/v1/accounts`, {
        method: "POST",
        headers: { Authorization: `Bearer ${stack.secrets.OPERATOR_TOKEN}`, "Content-Type": "application/json" },
        body: JSON.stringify({ name: `${operatorEvents ? "ops" : "tenant"}-${app}`, operatorEvents }),
      });
      expect(res.status).toBe(201);
      return (await res.json()) as { account: { operatorEvents: boolean }; apiKey: { key: string } };
    };
    const hook = { url: "https://hooks.example.com/fleet", events: ["node.unreachable", "node.lost"] };
    const tenant = await account(false);
    expect(tenant.account.operatorEvents).toBe(false);
    const refused = await api.call<{ error: { code: string; message: string } }>("POST", "/v1/webhooks", hook, tenant.apiKey.key);
    expect(refused.status).toBe(403);
    expect(refused.data.error.message).toMatch(/node.unreachable and node.lost are the operator's events/);
    const ops = await account(true);
    expect((await api.call("POST", "/v1/webhooks", hook, ops.apiKey.key)).status).toBe(201);
  }, 30_000);
});
