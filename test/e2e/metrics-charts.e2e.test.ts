import { join } from "node:path";
import { chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { until } from "./fleet-api.js";
import { expectExit } from "./sites.js";

type AppMetrics = { processes: { id: string; memoryLimitBytes: number; points: { cpuSeconds: number | null; memoryBytes: number | null }[] }[] };
type DiskMetrics = { stepSeconds: number; sizeBytes: number | null; points: { usedBytes: number | null; usedInodes: number | null }[] };
type CronMetrics = { stepSeconds: number; totals: { runs: number; succeeded: number; failed: number; meanDurationMs: number | null } };

const SHOTS = join(ROOT, "test-output", "metrics");
const MIB = 1024 * 1024;

/**
 * Issue 32's usage charts against `npm start`'s stack: a running app's
 * processes, a disk and a cron job with a succeeded and a failed run show
 * up in `svc metrics`, `svc disk metrics` and `svc cron metrics`, and the
 * dashboard draws them (CPU and memory on the app's Metrics tab, Use on the
 * disk's page, Runs on the cron job's) in Chromium at 390 and 1280 px.
 * Processes and disks are reported by their node every 10 s: each check
 * waits for the first report.
 */
describe("usage charts", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const app = `charted-${Math.random().toString(36).slice(2, 8)}`;
  const disk = `${app}-data`;
  const job = `${app}-job`;
  let cronId = "";

  const get = async <T>(path: string) => {
    const res = await fetch(`${stack.apiUrl}${path}`, { headers: { Authorization: `Bearer ${stack.adminKey}` } });
    if (!res.ok) throw new Error(`GET ${path}: ${res.status} ${await res.text()}`);
    return ((await res.json()) as { data: T }).data;
  };

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await home?.remove();
  });

  it("svc metrics shows CPU and memory, svc disk metrics a disk's use, svc cron metrics a job's runs; --alert-at and --notify-after set the thresholds", async () => {
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "node", "--memory", "256"], env), 0, "apps create");
    expectExit(await svc(["deploy", "--source", join(ROOT, "test", "fixtures", "apps", "node-features"), "--app", app], env), 0, "deploy");

    const created = JSON.parse(expectExit(await svc(["disk", "create", "--name", disk, "--size", "1", "--alert-at", "80", "--json"], env), 0, "disk create").stdout) as {
      alertAtPercent: number;
    };
    expect(created.alertAtPercent).toBe(80);
    const updated = expectExit(await svc(["disk", "update", disk, "--alert-at", "85%"], env), 0, "disk update").stdout;
    expect(updated).toMatch(/^alert at\s+85% of its size or inode limit/m);
    const refusedAlert = await svc(["disk", "update", disk, "--alert-at", "101"], env);
    expect(refusedAlert.code).toBe(2);
    expect(refusedAlert.stderr).toContain('--alert-at must be a whole percent from 1 to 100, got "101"');

    const cron = JSON.parse(
      expectExit(
        await svc(["cron", "create", app, "--name", job, "--schedule", "0 0 1 1 *", "--command", "true", "--notify-after", "2", "--json"], env),
        0,
        "cron create",
      ).stdout,
    ) as { id: string; notifyAfterFailures: number };
    cronId = cron.id;
    expect(cron.notifyAfterFailures).toBe(2);
    expectExit(await svc(["cron", "run", job, "--wait"], env), 0, "cron run (succeeds)");
    expect(expectExit(await svc(["cron", "update", job, "--command", "exit 3", "--notify-after", "3"], env), 0, "cron update").stdout).toMatch(
      /^notify after\s+3 failed runs in a row/m,
    );
    expectExit(await svc(["cron", "run", job, "--wait"], env), 1, "cron run (fails)");

    const processes = await until(
      "the app's process's first report",
      async () => {
        const { processes } = await get<AppMetrics>(`/v1/apps/${app}/metrics?since=1h`);
        return processes.some((p) => p.points.some((point) => point.memoryBytes !== null)) ? processes : null;
      },
      60_000,
    );
    expect(processes[0]!.memoryLimitBytes).toBe(256 * MIB);
    const measured = await until(
      "the disk's first measure",
      async () => {
        const metrics = await get<DiskMetrics>(`/v1/disks/${disk}/metrics?since=1h`);
        return metrics.points.some((p) => p.usedBytes !== null) ? metrics : null;
      },
      60_000,
    );
    expect(measured.sizeBytes).toBe(1024 * MIB);

    const appTable = expectExit(await svc(["metrics", app], env), 0, "svc metrics").stdout;
    expect(appTable).toMatch(/^processes\s+1 \(memory limit 256 MiB\), 0 restarts$/m);
    expect(appTable).toMatch(/^TIME\s+REQUESTS\s+2XX\s+3XX\s+4XX\s+5XX\s+P50\s+P95\s+P99\s+BYTES\s+CPU\s+MEM$/m);
    // A step the process reported in: its CPU as a percent of a core, its memory in MiB.
    expect(appTable).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d\s.*\s\d+\.\d%\s+\d+(\.\d)? MiB$/m);

    const diskTable = expectExit(await svc(["disk", "metrics", disk], env), 0, "svc disk metrics").stdout;
    expect(diskTable).toMatch(/^size\s+1\.0 GiB$/m);
    expect(diskTable).toMatch(/^TIME\s+USED\s+% SIZE\s+FILES\s+% INODES$/m);
    expect(diskTable).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d\s+\d+(\.\d)? [KMG]?i?B\s+(<1|\d+)%\s+\d+\s+(<1|\d+)%$/m);
    const diskJson = JSON.parse(expectExit(await svc(["disk", "metrics", disk, "--since", "24h", "--json"], env), 0, "svc disk metrics --json").stdout) as DiskMetrics;
    expect(diskJson).toMatchObject({ since: "24h", stepSeconds: 900, sizeBytes: 1024 * MIB });

    const cronTable = expectExit(await svc(["cron", "metrics", job], env), 0, "svc cron metrics").stdout;
    expect(cronTable).toMatch(/^runs\s+2 \(1 ok, 1 failed\)$/m);
    expect(cronTable).toMatch(/^TIME\s+RUNS\s+OK\s+FAILED\s+MEAN\s+MAX$/m);
    const cronJson = JSON.parse(expectExit(await svc(["cron", "metrics", cronId, "--json"], env), 0, "svc cron metrics --json").stdout) as CronMetrics;
    expect(cronJson).toMatchObject({ stepSeconds: 60, totals: { runs: 2, succeeded: 1, failed: 1 } });
    expect(cronJson.totals.meanDurationMs).toBeGreaterThan(0);

    const refused = await svc(["cron", "metrics", job, "--since", "2w"], env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("--since must be one of 1h, 24h, 7d, 30d");
  }, 240_000);

  /** The figure named `name` holds a drawn canvas that fits the page's width. */
  const drawn = async (page: Page, name: string, width: number) => {
    const figure = page.getByRole("figure", { name, exact: true });
    const canvas = figure.locator("canvas").first();
    await canvas.waitFor();
    const box = (await canvas.boundingBox())!;
    expect(box.height, name).toBeGreaterThan(50);
    expect(box.width, name).toBeGreaterThan(width * 0.6);
    const outer = (await figure.boundingBox())!;
    expect(outer.x + outer.width, name).toBeLessThanOrEqual(width);
  };

  it("draws CPU and memory, a disk's use and a cron job's runs in Chromium at 390 and 1280 px, inside the page", async () => {
    expect(cronId, "the previous test made the cron job").not.toBe("");
    const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--headless", "--no-sandbox", "--disable-background-networking"] });
    try {
      for (const width of [390, 1280]) {
        const context = await browser.newContext({ viewport: { width, height: 900 } });
        await context.addInitScript(`sessionStorage.setItem("svc.apiKey", ${JSON.stringify(stack.adminKey)});`);
        const page = await context.newPage();
        const fits = async () => expect(await page.evaluate("document.documentElement.scrollWidth")).toBeLessThanOrEqual(width);

        await page.goto(`${stack.apiUrl}/apps/${app}/metrics`);
        await drawn(page, "CPU", width);
        await drawn(page, "Memory", width);
        await page.getByRole("figure", { name: "Memory", exact: true }).getByText("limit").waitFor();
        await fits();
        await page.getByRole("figure", { name: "Memory", exact: true }).scrollIntoViewIfNeeded();
        await page.screenshot({ path: join(SHOTS, `processes-${width}.png`), fullPage: true });

        await page.goto(`${stack.apiUrl}/disks/${disk}`);
        await drawn(page, "Space", width);
        await drawn(page, "Files", width);
        const threshold = page.getByRole("form", { name: "Alert threshold" }).locator('input[name="alertAtPercent"]');
        expect(await threshold.inputValue()).toBe(width === 390 ? "85" : "80");
        await page.getByRole("figure", { name: "Space", exact: true }).getByText(`alert at ${width === 390 ? 85 : 80}%`).waitFor();
        if (width === 390) {
          // Changed in place: the chart's line and the API follow.
          await threshold.fill("80");
          await page.getByRole("form", { name: "Alert threshold" }).getByRole("button", { name: "Save" }).click();
          await page.getByRole("figure", { name: "Space", exact: true }).getByText("alert at 80%").waitFor();
          expect((await get<{ alertAtPercent: number }>(`/v1/disks/${disk}`)).alertAtPercent).toBe(80);
        }
        await fits();
        await page.getByRole("button", { name: "24 hours" }).first().click();
        await page.getByText("15-minute step").waitFor();
        await drawn(page, "Space", width);
        await page.screenshot({ path: join(SHOTS, `disk-use-${width}.png`), fullPage: true });

        await page.goto(`${stack.apiUrl}/crons/${cronId}`);
        await drawn(page, "Runs", width);
        await page.getByText("2 finished runs (1 succeeded, 1 failed)").waitFor();
        await page.getByText("3 failed runs in a row: each failed run from then on sends").waitFor();
        expect(await page.getByRole("form", { name: "Edit the cron job" }).locator('input[name="notifyAfter"]').inputValue()).toBe("3");
        await fits();
        await page.getByRole("figure", { name: "Runs", exact: true }).scrollIntoViewIfNeeded();
        await page.screenshot({ path: join(SHOTS, `cron-runs-${width}.png`), fullPage: true });
        await context.close();
      }
    } finally {
      await browser.close();
    }
  }, 90_000);
});
