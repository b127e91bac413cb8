import { join } from "node:path";
import { chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { until } from "./fleet-api.js";
import { expectExit, FixtureCopies, siteRequest } from "./sites.js";

type Metrics = {
  since: string;
  stepSeconds: number;
  points: { at: string; requests: number; s2xx: number; s4xx: number; p50Ms: number | null }[];
  totals: { requests: number; s2xx: number; s3xx: number; s4xx: number; s5xx: number; bytes: number; p50Ms: number | null; p95Ms: number | null; p99Ms: number | null };
};

const SHOTS = join(ROOT, "test-output", "metrics");

/**
 * Issue 32's metrics against `npm start`'s stack: a generated load on a
 * static site shows up with exactly the requests and status classes the
 * client sent, in the API, `svc metrics` and the dashboard's charts
 * (Chromium, at 390 and 1280 px).
 */
describe("request metrics", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const fixtures = new FixtureCopies();
  const app = `metered-${Math.random().toString(36).slice(2, 8)}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await home?.remove();
    await fixtures.removeAll();
  });

  it("counts exactly the requests sent, by status class, with latency, in the API and svc metrics", async () => {
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "static"], env), 0, "apps create");
    expectExit(await svc(["deploy", "--source", await fixtures.copy("plain"), "--app", app], env), 0, "deploy");
    const sent = { ok: 0, missing: 0 };
    await Promise.all(
      Array.from({ length: 4 }, async (_, client) => {
        for (let i = 0; i < 12; i++) {
          const missing = (client + i) % 4 === 0;
          const res = await siteRequest(stack, app, missing ? `/no-such-page-${i}` : "/");
          expect(res.status).toBe(missing ? 404 : 200);
          if (missing) sent.missing++;
          else sent.ok++;
        }
      }),
    );
    const metrics = await until(
      "the metrics of the load",
      async () => {
        const res = await fetch(`${stack.apiUrl}/v1/apps/${app}/metrics?since=1h`, { headers: { Authorization: `Bearer ${stack.adminKey}` } });
        const { data } = (await res.json()) as { data: Metrics };
        return data.totals.requests === sent.ok + sent.missing ? data : null;
      },
      15_000,
    );
    expect(metrics.totals).toMatchObject({ requests: 48, s2xx: sent.ok, s3xx: 0, s4xx: sent.missing, s5xx: 0 });
    expect(metrics.totals.bytes).toBeGreaterThan(0);
    expect(metrics.totals.p50Ms).not.toBeNull();
    expect(metrics.totals.p50Ms!).toBeLessThanOrEqual(metrics.totals.p99Ms!);
    expect(metrics.stepSeconds).toBe(60);
    expect(metrics.points).toHaveLength(61);
    expect(metrics.points.reduce((sum, p) => sum + p.requests, 0)).toBe(48);
    const table = expectExit(await svc(["metrics", app], env), 0, "svc metrics");
    expect(table.stdout).toMatch(new RegExp(`requests\\s+48 \\(${sent.ok} 2xx, 0 3xx, ${sent.missing} 4xx, 0 5xx\\)`));
    expect(table.stdout).toMatch(/^TIME\s+REQUESTS\s+2XX\s+3XX\s+4XX\s+5XX\s+P50\s+P95\s+P99\s+BYTES\s+CPU\s+MEM$/m);
    const json = JSON.parse(expectExit(await svc(["metrics", app, "--since", "24h", "--json"], env), 0, "svc metrics --json").stdout) as Metrics;
    expect(json).toMatchObject({ since: "24h", stepSeconds: 900, totals: { requests: 48 } });
    const refused = await svc(["metrics", app, "--since", "2w"], env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("--since must be one of 1h, 24h, 7d, 30d");
  }, 120_000);

  it("draws the requests and latency charts in Chromium at 390 and 1280 px, inside the page", async () => {
    const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--headless", "--no-sandbox", "--disable-background-networking"] });
    try {
      for (const width of [390, 1280]) {
        const context = await browser.newContext({ viewport: { width, height: 900 } });
        await context.addInitScript(`sessionStorage.setItem("svc.apiKey", ${JSON.stringify(stack.adminKey)});`);
        const page = await context.newPage();
        await page.goto(`${stack.apiUrl}/apps/${app}/metrics`);
        const requests = page.getByRole("figure", { name: "Requests by status" });
        await requests.locator("canvas").waitFor();
        await page.getByRole("figure", { name: "Latency" }).locator("canvas").waitFor();
        await page.getByText("48 requests (12 4xx, 0 5xx)").waitFor();
        const box = (await requests.boundingBox())!;
        expect(box.width).toBeGreaterThan(width * 0.6);
        expect(box.x + box.width).toBeLessThanOrEqual(width);
        expect(await page.evaluate("document.documentElement.scrollWidth")).toBeLessThanOrEqual(width);
        await page.getByRole("button", { name: "24 hours" }).click();
        await page.getByText("15-minute steps").waitFor();
        await page.screenshot({ path: join(SHOTS, `metrics-${width}.png`), fullPage: true });
        await context.close();
      }
    } finally {
      await browser.close();
    }
  }, 60_000);
});
