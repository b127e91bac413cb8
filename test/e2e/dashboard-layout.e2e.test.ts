import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack } from "../cli/svc.js";
import { siteRequest } from "./sites.js";

/** Debian's Chromium, launched as test/e2e/dashboard.e2e.test.ts launches it. */
const CHROMIUM = "/usr/bin/chromium";
const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"];
/** The folder of test/e2e/dashboard.e2e.test.ts's screenshots (git-ignored); these are named `layout-<width>-…`. */
const SHOTS = join(ROOT, "test-output", "dashboard");
/** A phone (iPhone 12-15 in CSS pixels) and a laptop. */
const WIDTHS = [
  { width: 390, height: 844 },
  { width: 1280, height: 900 },
] as const;

/**
 * What the in-page check found: the document's widths, every element past the
 * viewport's right edge outside a box that scrolls itself, and the boxes that
 * do scroll sideways (a table too wide for its place scrolls in its own box;
 * with rows that reflow, none should at the widths tested here).
 */
type Layout = { innerWidth: number; scrollWidth: number; bodyScrollWidth: number; offenders: string[]; scrollers: string[] };

/**
 * Runs in the page (a string: this file is compiled without the DOM types).
 * Walks every rendered element in document order and reports the outermost
 * ones whose box ends past the viewport's right edge, unless an ancestor
 * scrolls horizontally by itself (overflow-x auto or scroll): the log viewers
 * may, the page may not.
 */
const LAYOUT_CHECK = `(() => {
  const vw = window.innerWidth;
  const scrollsItself = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const x = getComputedStyle(a).overflowX;
      if (x === "auto" || x === "scroll") return true;
    }
    return false;
  };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + [...el.classList].map((c) => "." + c).join("");
  const path = (el) => {
    const parts = [];
    for (let a = el; a && a !== document.body && parts.length < 4; a = a.parentElement) parts.unshift(name(a));
    return parts.join(" > ");
  };
  const outer = [];
  const scrollers = [];
  for (const el of document.body.querySelectorAll("*")) {
    const x = getComputedStyle(el).overflowX;
    if ((x === "auto" || x === "scroll") && el.scrollWidth > el.clientWidth + 1) scrollers.push(path(el) + " scrolls " + el.scrollWidth + " px in " + el.clientWidth);
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    if (box.right <= vw + 0.5) continue;
    if (scrollsItself(el)) continue;
    if (outer.some((o) => o.el.contains(el))) continue;
    outer.push({ el, box });
  }
  return {
    innerWidth: vw,
    scrollWidth: document.documentElement.scrollWidth,
    bodyScrollWidth: document.body.scrollWidth,
    scrollers,
    offenders: outer.map(({ el, box }) => path(el) + " right=" + Math.round(box.right) + " width=" + Math.round(box.width) + ' "' + (el.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 70) + '"'),
  };
})()`;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Asks `check` every 250 ms until it returns something, for at most `ms`. */
async function until<T>(what: string, check: () => Promise<T | undefined>, ms = 120_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(250);
  }
}

/**
 * Issue 20 (points 8 and 9): every dashboard route, with real content, at a
 * phone's width (390 px) and a laptop's (1280 px). The document is never
 * wider than the viewport and no element reaches past its right edge except
 * inside a box that scrolls itself; a full-page screenshot of each page at
 * each width is saved for a person to look at. The data is made through the
 * API first (an app with env vars, a deployment and requests, a cron job with
 * a run, a disk with used space and a backup, keys) so no page is empty.
 */
describe("the dashboard's layout at 390 and 1280 px", () => {
  let stack: LocalStack;
  let browser: Browser;
  let work: string;
  const suffix = randomBytes(3).toString("hex");
  /** A name as long as the API allows (52 characters), the hardest to fit on a phone. */
  const longest = (prefix: string) => `${`${prefix}-${suffix}-with-the-longest-name-the-api-allows-${"x".repeat(52)}`.slice(0, 51)}z`;
  const app = longest("layout");
  const disk = longest("disk");
  /** An everyday name, which a table at 1280 px keeps on one line (issue 20: it used to break at its hyphen). */
  const cron = `nightly-${suffix}`;
  let cronId = "";
  const problems: string[] = [];
  /** Per width, what the check measured on each page (printed at the end: the document widths). */
  const measured: Record<number, { page: string; layout: Layout }[]> = {};

  const api = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${stack.adminKey}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return (text === "" ? undefined : JSON.parse(text)) as T;
  };

  /** A static site with one page, deployed through the API, and a few requests (one with a long path) for the request log. */
  const deploy = async () => {
    const site = join(work, "site");
    await mkdir(join(site, "static"), { recursive: true });
    await writeFile(join(site, "static", "index.html"), "<!doctype html><title>layout</title><h1>Layout</h1>\n");
    execFileSync("tar", ["-czf", join(work, "site.tgz"), "-C", site, "."]);
    const source = await readFile(join(work, "site.tgz"));
    const created = await api<{ data: { deployment: { id: string }; uploadUrl: string } }>("POST", `/v1/apps/${app}/deployments`, { sizeBytes: source.byteLength });
    const put = await fetch(created.data.uploadUrl, { method: "PUT", body: source });
    if (put.status !== 200) throw new Error(`uploading the source: ${put.status}`);
    const id = created.data.deployment.id;
    await api("POST", `/v1/apps/${app}/deployments/${id}/start`);
    const done = await until("the deployment", async () => {
      const { data } = await api<{ data: { status: string; error: string | null } }>("GET", `/v1/apps/${app}/deployments/${id}`);
      return ["ready", "failed", "cancelled"].includes(data.status) ? data : undefined;
    });
    if (done.status !== "ready") throw new Error(`deployment ${done.status}: ${done.error}`);
    await siteRequest(stack, app, "/");
    await siteRequest(stack, app, `/${"a-rather-long-path-segment/".repeat(8)}report.csv?from=2026-01-01&to=2026-12-31`);
    await siteRequest(stack, app, "/missing");
  };

  /** Runs the cron job once and waits for the run: it writes 3 MB to the disk (used space) and prints a long line (log wrapping). */
  const runCron = async () => {
    const { data } = await api<{ data: { jobName: string } }>("POST", `/v1/crons/${cronId}/run`);
    const run = await until("the cron run", async () => {
      const runs = (await api<{ data: { jobName: string; status: string }[] }>("GET", `/v1/crons/${cronId}/runs`)).data;
      const r = runs.find((x) => x.jobName === data.jobName);
      return r && r.status !== "running" ? r : undefined;
    });
    if (run.status !== "success") throw new Error(`cron run ${run.status}`);
  };

  beforeAll(async () => {
    if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium), as .ci/run does`);
    if (!existsSync(join(ROOT, "dashboard", "dist", "index.html"))) throw new Error("dashboard/dist is missing: run npm run build:dashboard (npm test runs it first)");
    await mkdir(SHOTS, { recursive: true });
    work = await mkdtemp(join(tmpdir(), "svc-dashboard-layout-"));
    [stack, browser] = await Promise.all([startStack(), chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS })]);

    const started = Date.now();
    const created = await api<{ data: { id: string } }>("POST", "/v1/apps", { name: app, runtime: "static" });
    await api("PATCH", `/v1/apps/${app}/env`, {
      vars: { GREETING: "hello", DATABASE_URL: `postgres://reporting:${"s3cr3t".repeat(12)}@db.internal.example.com:5432/reports?sslmode=require` },
    });
    // A pending domain shows its records (long TXT names and values), an active one its state.
    await api("POST", `/v1/apps/${app}/domains`, { hostname: `www.a-rather-long-shop-name-${suffix}.example.test` });
    await createKey(stack, `layout-deploy-only-${suffix}`, ["deploy"]);
    const { data: d } = await api<{ data: { id: string } }>("POST", "/v1/disks", { name: disk, sizeGb: 1, mountPath: "/data" });
    await api("POST", `/v1/disks/${disk}/attach`, { app });
    const { data: c } = await api<{ data: { id: string } }>("POST", "/v1/crons", {
      appId: created.data.id,
      name: cron,
      schedule: "0 3 * * *",
      timezone: "Europe/Berlin",
      command: `head -c 3000000 /dev/urandom > "$SVC_DISK_PATH/blob.bin" && echo wrote-3-MB && printf 'x%.0s' $(seq 1 400) && echo`,
    });
    cronId = c.id;
    await Promise.all([deploy(), runCron()]);
    const { data: backup } = await api<{ data: { id: string } }>("POST", `/v1/disks/${d.id}/backups`, { description: "before the layout check" });
    await until("the backup", async () => {
      const list = (await api<{ data: { id: string; status: string }[] }>("GET", `/v1/disks/${d.id}/backups`)).data;
      const b = list.find((x) => x.id === backup.id);
      if (b?.status === "failed") throw new Error("the backup failed");
      return b?.status === "ready" ? b : undefined;
    });
    console.log(`dashboard layout: data made in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }, STACK_START_TIMEOUT_MS + 180_000);

  afterAll(async () => {
    await browser?.close();
    await stack?.stop();
    if (work) await rm(work, { recursive: true, force: true });
    for (const [width, pages] of Object.entries(measured)) {
      console.log(`dashboard layout at ${width} px: ${pages.map(({ page, layout }) => `${page} ${layout.scrollWidth}`).join(", ")}`);
    }
  });

  /** A page of the walk: where it is, what shows it has loaded, and what to do there before measuring (open a log, a dialog). */
  type Step = { name: string; path?: string; ready: string; act?: (p: Page) => Promise<void> };

  const steps = (): Step[] => [
    { name: "apps", path: "/apps", ready: "main table" },
    { name: "app-overview", path: `/apps/${app}`, ready: "main dl.facts" },
    {
      name: "app-deployments",
      path: `/apps/${app}/deployments`,
      ready: "main table",
      act: async (p) => {
        await p.getByRole("button", { name: "Log", exact: true }).first().click();
        await p.getByRole("region", { name: /^Build log of dep_/ }).getByRole("status").waitFor({ timeout: 30_000 });
      },
    },
    {
      name: "app-deploy-packed",
      ready: "main form, main section",
      act: async (p) => {
        await p.getByRole("region", { name: "Deploy" }).getByLabel("Project folder").setInputFiles(join(work, "site"));
        await p.getByRole("button", { name: `Deploy to ${app}` }).waitFor();
      },
    },
    {
      name: "app-env",
      path: `/apps/${app}/env`,
      ready: "main table",
      act: async (p) => {
        await p.getByRole("button", { name: "Reveal values" }).click();
        await p.getByText("db.internal.example.com", { exact: false }).waitFor();
      },
    },
    {
      name: "app-env-confirm",
      ready: "main table",
      act: async (p) => {
        await p.getByRole("row").filter({ hasText: "DATABASE_URL" }).getByRole("button", { name: "Unset" }).click();
        await p.getByText("Unset DATABASE_URL?").waitFor();
      },
    },
    { name: "app-domains", path: `/apps/${app}/domains`, ready: "main form" },
    { name: "app-request-log", path: `/apps/${app}/logs`, ready: "main table.requests" },
    { name: "app-runtime-log", path: `/apps/${app}/runtime`, ready: "main .hint" },
    { name: "app-not-found", path: "/apps/no-such-app", ready: "main [role=alert]" },
    { name: "crons", path: "/crons", ready: `main table a[href="/apps/${app}"]` },
    {
      name: "cron-by-id",
      path: `/crons/${cronId}`,
      ready: `main dl.facts a[href="/apps/${app}"]`,
      act: async (p) => {
        await p.getByRole("button", { name: "Log", exact: true }).first().click();
        await p.getByRole("region", { name: /^Log of / }).getByText("wrote-3-MB").waitFor();
      },
    },
    { name: "cron-by-name", path: `/crons/${cron}`, ready: `main dl.facts a[href="/apps/${app}"]` },
    { name: "cron-not-found", path: "/crons/no-such-job", ready: "main [role=alert]" },
    { name: "disks", path: "/disks", ready: "main table" },
    {
      name: "disk",
      path: `/disks/${disk}`,
      ready: "main table",
      act: async (p) => {
        await p.getByRole("row").filter({ hasText: "before the layout check" }).getByRole("button", { name: "Restore", exact: true }).click();
        await p.getByText("DISK_IN_USE").first().waitFor();
      },
    },
    { name: "disk-not-found", path: "/disks/no-such-disk", ready: "main [role=alert]" },
    { name: "webhooks", path: "/webhooks", ready: "main form" },
    { name: "keys", path: "/keys", ready: "main table" },
    {
      name: "keys-secret-once",
      ready: "main table",
      act: async (p) => {
        const form = p.getByRole("form", { name: "Create an API key" });
        await form.getByLabel("Name").fill(`layout-${p.viewportSize()?.width}-${suffix}`);
        await form.getByRole("button", { name: "Create key" }).click();
        await p.getByRole("region", { name: "New API key" }).waitFor();
      },
    },
    { name: "not-found", path: "/no/such/page", ready: "main h1" },
  ];

  for (const { width, height } of WIDTHS) {
    it(`at ${width} px every page fits the viewport: no sideways scroll, nothing past the right edge`, async () => {
      const context = await browser.newContext({ viewport: { width, height } });
      context.setDefaultTimeout(15_000);
      const p = await context.newPage();
      p.on("pageerror", (error) => problems.push(`${width}px pageerror: ${error.message}`));
      const pages: { page: string; layout: Layout }[] = [];
      measured[width] = pages;
      let n = 0;
      const look = async (name: string) => {
        // Fonts and late layout (a log scrolled into view) settle before the measure.
        await p.evaluate("new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)))");
        const layout = (await p.evaluate(LAYOUT_CHECK)) as Layout;
        pages.push({ page: name, layout });
        n++;
        await p.screenshot({ path: join(SHOTS, `layout-${width}-${String(n).padStart(2, "0")}-${name}.png`), fullPage: true });
      };

      await p.goto(stack.apiUrl);
      await p.getByLabel("API key").waitFor();
      await look("sign-in");
      // A key of its own per width: one walk makes ~100 API calls in a few seconds, and two walks on one key
      // met its rate limit (100 per 10 s) on the second, whose page then waited out the Retry-After.
      const { key } = await createKey(stack, `admin-${width}`, ["admin", "deploy", "db", "registry"]);
      await p.getByLabel("API key").fill(key);
      await p.getByRole("button", { name: "Sign in" }).click();
      await p.locator(".who strong").waitFor();

      // A page that does not show what it should is reported with the rest; the walk goes on, so one run shows every problem.
      const failed: string[] = [];
      for (const step of steps()) {
        try {
          if (step.path !== undefined) await p.goto(`${stack.apiUrl}${step.path}`);
          await p.locator(step.ready).first().waitFor();
          // The header names the signed-in key once its own request is answered.
          await p.locator(".who strong").waitFor();
          await step.act?.(p);
        } catch (err) {
          failed.push(`${step.name}: ${String(err instanceof Error ? err.message : err).split("\n")[0]}`);
        }
        await look(step.name);
      }
      await context.close();

      const wrong = pages
        .filter(({ layout: l }) => l.scrollWidth > l.innerWidth || l.bodyScrollWidth > l.innerWidth || l.offenders.length > 0 || l.scrollers.length > 0)
        .map(({ page, layout: l }) => `${page}: document ${l.scrollWidth} px, body ${l.bodyScrollWidth} px, viewport ${l.innerWidth} px${[...l.offenders, ...l.scrollers].map((o) => `\n    ${o}`).join("")}`);
      expect(failed).toEqual([]);
      expect(wrong).toEqual([]);
      expect(problems).toEqual([]);
    }, 120_000);
  }

  it("keeps an everyday name on one line in a table at 1280 px", async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    await context.addInitScript(`sessionStorage.setItem("svc.apiKey", ${JSON.stringify(stack.adminKey)});`);
    const p = await context.newPage();
    await p.goto(`${stack.apiUrl}/crons`);
    const name = p.getByRole("row").filter({ hasText: cron }).getByRole("link", { name: cron });
    await p.getByRole("row").filter({ hasText: cron }).getByRole("link", { name: app }).waitFor();
    // One line of the table's text is 22 px high (15 px type, line-height 1.45); two would be 44.
    expect((await name.boundingBox())!.height).toBeLessThan(30);
    await context.close();
  }, 30_000);

  it("opens a cron job by its name, says when no job has a name, and shows a disk's used space and DISK_IN_USE outside the table", async () => {
    const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
    await context.addInitScript(`sessionStorage.setItem("svc.apiKey", ${JSON.stringify(stack.adminKey)});`);
    const p = await context.newPage();

    await p.goto(`${stack.apiUrl}/crons/${cron}`);
    await p.getByRole("heading", { name: cron, level: 1 }).waitFor();
    await expect(p.locator("main dl.facts").textContent()).resolves.toContain("wrote-3-MB");
    await p.getByRole("row").filter({ hasText: "manual" }).first().waitFor();

    await p.goto(`${stack.apiUrl}/crons/no-such-job`);
    await expect(p.getByRole("alert").textContent()).resolves.toMatch(/CRON_NOT_FOUND.*cron job no-such-job not found/);

    await p.goto(`${stack.apiUrl}/disks`);
    const listed = p.getByRole("row").filter({ hasText: disk });
    await expect(listed.textContent()).resolves.toMatch(/\d+(\.\d)? MiB of 1 GB \((<1|\d+)%\)/);

    await p.goto(`${stack.apiUrl}/disks/${disk}`);
    await expect(p.locator("main dl.facts").textContent()).resolves.toMatch(/Used\s*\d+(\.\d)? MiB of 1 GB \((<1|\d+)%\)/);
    await p.getByRole("row").filter({ hasText: "before the layout check" }).getByRole("button", { name: "Restore", exact: true }).click();
    const notice = p.getByRole("alert").filter({ hasText: "DISK_IN_USE" });
    await expect(notice.textContent()).resolves.toMatch(/attached to app .* which is running/);
    expect(await notice.locator("xpath=ancestor::td | ancestor::th | ancestor::table").count()).toBe(0);
    await expect(notice.getByRole("button", { name: `Stop ${app}` }).isVisible()).resolves.toBe(true);
    await expect(notice.getByRole("button", { name: "Detach disk" }).isVisible()).resolves.toBe(true);
    await context.close();
  }, 60_000);
});
