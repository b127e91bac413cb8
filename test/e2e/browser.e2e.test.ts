import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { type Browser, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, tempHome } from "../cli/svc.js";
import { deployViteReact, FixtureCopies } from "./sites.js";

/** Debian's Chromium; `.ci/run` installs it. */
const CHROMIUM = "/usr/bin/chromium";
const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

/**
 * Issue 6's browser acceptance: a real browser opens a client-side route of
 * the deployed Vite + React app directly (no navigation from `/`), the edge
 * answers it with index.html (spa), and the app renders that route.
 */
describe("a deployed single-page app in headless Chromium", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let browser: Browser;
  let url: string;
  const fixtures = new FixtureCopies();
  const app = `spa-${randomBytes(3).toString("hex")}`;

  beforeAll(async () => {
    // Fail (not skip) without the browser: CI installs it, so its absence is a broken setup.
    if (!existsSync(CHROMIUM)) {
      throw new Error(`${CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium), as .ci/run does`);
    }
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "e2e-browser", ["deploy"]);
    const env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    const [deployed, launched] = await Promise.all([
      deployViteReact(env, app, fixtures),
      chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS }),
    ]);
    browser = launched;
    url = deployed.deployment.url;
  }, STACK_START_TIMEOUT_MS + 120_000);
  afterAll(async () => {
    await browser?.close();
    await stack?.stop();
    await home?.remove();
    await fixtures.removeAll();
  });

  it("renders /deep/route when it is opened directly, and the home page shows the VITE_ variable", async () => {
    expect(url).toMatch(new RegExp(`^http://${app}\\.localhost:\\d+$`));
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(error.message));

    const response = await page.goto(`${url}/deep/route`);
    expect(response?.status()).toBe(200);
    await expect(page.getByRole("heading", { level: 1 }).textContent({ timeout: 10_000 })).resolves.toBe(
      "Deep route rendered by the client-side router",
    );
    expect(new URL(page.url()).pathname).toBe("/deep/route");

    // Client-side navigation back home: the public variable is in the bundle, the secret is not.
    await page.getByRole("link", { name: "Back home" }).click();
    await expect(page.locator("#greeting").textContent({ timeout: 10_000 })).resolves.toBe("hello-from-env");
    expect(await page.locator("#secret").textContent()).toBe("secret not exposed");
    expect(errors).toEqual([]);
  }, 60_000);
});
