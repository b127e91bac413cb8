import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { ensureSecrets, freePort, ROOT } from "../../scripts/local-stack.js";
import { siteRequest } from "../e2e/sites.js";
import { SCHEDULED_PATH } from "../../scripts/scheduled-route.js";
import { miniflareOptions, type WorkerDevOptions } from "../../scripts/worker-dev.js";

const run = promisify(execFile);
const env = { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false", NO_COLOR: "1", FORCE_COLOR: "0" };
const WRANGLER = join(ROOT, "node_modules", ".bin", "wrangler");

/** The rows of wrangler's "Your Worker has access to the following bindings" table: binding name → resource kind. */
function bindingsTable(output: string): Map<string, string> {
  const rows = new Map<string, string>();
  const start = output.indexOf("Your Worker has access to the following bindings:");
  for (const line of output.slice(start).split("\n").slice(2)) {
    const [binding = "", resource] = line.trim().split(/\s{2,}/);
    const m = /^env\.(\S+)/.exec(binding);
    if (!m || !resource) break;
    rows.set(m[1]!, resource);
  }
  return rows;
}

/** Where each kind of binding wrangler lists sits in Miniflare's worker options. */
const OPTION_OF: Record<string, string> = {
  "D1 Database": "d1Databases",
  "R2 Bucket": "r2Buckets",
  "Durable Object": "durableObjects",
  "Rate Limit": "ratelimits",
  Queue: "queueProducers",
  Assets: "assets",
  "Environment Variable": "bindings",
};

describe("scripts/worker-dev.ts: the Worker npm start and the tests run", () => {
  const dirs: string[] = [];
  let child: ChildProcess | undefined;
  afterAll(async () => {
    if (child?.pid && child.exitCode === null) process.kill(-child.pid, "SIGTERM");
    await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  });

  it("binds what wrangler deploy ships, plus the secrets file and the local addresses over its vars", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-worker-dev-"));
    dirs.push(dir);
    const deploy = await run(WRANGLER, ["deploy", "--dry-run", "--env", "", "--outdir", join(dir, "out")], { cwd: ROOT, env });
    const shipped = bindingsTable(deploy.stdout);
    expect(shipped.size).toBeGreaterThan(10);
    await writeFile(join(dir, "secrets.env"), `OPERATOR_TOKEN="${"t".repeat(32)}"\n`);
    const options = await miniflareOptions(
      { port: 1, persistDir: join(dir, "p"), envFile: join(dir, "secrets.env"), vars: { PUBLIC_URL: "http://127.0.0.1:1" }, logLevel: "warn" },
      join(dir, "w.mjs"),
    );
    const worker = options.workers[0] as Record<string, Record<string, unknown> | undefined>;
    for (const [name, kind] of shipped) {
      const option = OPTION_OF[kind];
      expect(option, `a binding kind worker-dev.ts does not know: ${kind}`).toBeDefined();
      const bound = option === "assets" ? worker.assets?.binding === name : worker[option!]?.[name] !== undefined;
      expect(bound, `${name} (${kind})`).toBe(true);
    }
    // Nothing more: every name bound is one wrangler ships, or the secret from the file.
    const boundNames = [
      ...Object.values(OPTION_OF)
        .filter((option) => option !== "assets")
        .flatMap((option) => Object.keys(worker[option] ?? {})),
      String(worker.assets?.binding),
    ];
    expect(boundNames.sort()).toEqual([...shipped.keys(), "OPERATOR_TOKEN"].sort());
    expect(worker.bindings).toMatchObject({ OPERATOR_TOKEN: "t".repeat(32), PUBLIC_URL: "http://127.0.0.1:1", APPS_URL_SCHEME: "http" });
    expect(options.defaultPersistRoot).toBe(join(dir, "p", "v3"));
  });

  it("serves on the port it is given, with migrations wrangler applied, the dashboard's assets and the scheduled route", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-worker-dev-"));
    dirs.push(dir);
    const persistDir = join(dir, "persist");
    await run(WRANGLER, ["d1", "migrations", "apply", "DB", "--local", "--persist-to", persistDir], { cwd: ROOT, env });
    // The secrets npm start writes.
    const { OPERATOR_TOKEN: operatorToken } = await ensureSecrets(join(dir, "secrets.env"));
    const port = await freePort();
    const options: WorkerDevOptions = { port, persistDir, envFile: join(dir, "secrets.env"), vars: { APPS_DOMAIN: `localhost:${port}` }, logLevel: "log" };
    child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "scripts", "worker-dev.ts"), JSON.stringify(options)], {
      cwd: ROOT,
      env,
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    let output = "";
    child.stdout?.on("data", (d: Buffer) => {
      output += d;
    });
    child.stderr?.on("data", (d: Buffer) => {
      output += d;
    });
    const deadline = Date.now() + 60_000;
    while (!output.includes("Ready on") && child.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect(output).toContain(`Ready on http://127.0.0.1:${port}`);
    const api = `http://127.0.0.1:${port}`;

    // The secret from the file, D1 with wrangler's migrations: the operator makes an account.
    const account = await fetch(`${api}/v1/accounts`, {
      method: "POST",
      headers: { Authorization: `Bearer ${operatorToken}`, "Content-Type": "application/json" },
      body: JSON.stringify({ name: "worker-dev" }),
    });
    expect(account.status, await account.clone().text()).toBe(201);
    // The local address as APPS_DOMAIN: an app host is served as a site.
    const site = await siteRequest({ apiUrl: api }, "nothing-here", "/");
    expect([site.status, site.body.includes("No such site")]).toEqual([404, true]);
    // The assets binding: the dashboard.
    const page = await fetch(`${api}/`);
    expect([page.status, page.headers.get("Content-Type")]).toEqual([200, "text/html; charset=utf-8"]);
    // Requests whose bodies nothing reads (refused before the body mattered), one after another on kept-alive
    // connections: none is cut (workerd closed such a connection under the next request).
    const refused: string[] = [];
    for (let i = 0; i < 400; i++) {
      const res = await fetch(`${api}/v1/whoami`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ i }) }).catch(
        (err: Error) => err,
      );
      refused.push(res instanceof Response ? String(res.status) : `${res.message}: ${(res.cause as Error | undefined)?.message}`);
      if (res instanceof Response) await res.text();
    }
    expect(refused.filter((answer) => answer !== "401")).toEqual([]);
    const scheduled = await fetch(`${api}${SCHEDULED_PATH}?cron=${encodeURIComponent("17 * * * *")}`);
    expect([scheduled.status, await scheduled.text()]).toEqual([200, "ok"]);
    expect(output).not.toMatch(/inspector|DevTools/i);
  }, 90_000);
});
