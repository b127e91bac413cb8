import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { freePort, ROOT } from "../../scripts/local-stack.js";
import type { WorkerDevOptions } from "../../scripts/worker-dev.js";

const run = promisify(execFile);
const env = { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false", NO_COLOR: "1", FORCE_COLOR: "0" };

/** The rows of wrangler's "Your Worker has access to the following bindings" table: binding → resource kind and shown value. */
function bindingsTable(output: string): Map<string, string> {
  const rows = new Map<string, string>();
  const start = output.indexOf("Your Worker has access to the following bindings:");
  for (const line of output.slice(start).split("\n").slice(2)) {
    // Local runs add a Mode column ("local"): not part of what is bound.
    const [binding = "", resource] = line.trim().replace(/\s{2,}local$/, "").split(/\s{2,}/);
    const m = /^env\.(\S+)(?: (.*))?$/.exec(binding);
    if (!m || !resource) break;
    rows.set(m[1]!, `${m[2] ?? ""} ${resource}`.trim());
  }
  return rows;
}

describe("scripts/worker-dev.ts: the Worker npm start and the tests run", () => {
  const dirs: string[] = [];
  let child: ChildProcess | undefined;
  afterAll(async () => {
    if (child?.pid && child.exitCode === null) process.kill(-child.pid, "SIGTERM");
    await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  });

  it("binds exactly what wrangler deploy ships, plus the secrets file and the local addresses, and serves /__scheduled", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-worker-dev-"));
    dirs.push(dir);
    const deploy = await run(join(ROOT, "node_modules", ".bin", "wrangler"), ["deploy", "--dry-run", "--env", "", "--outdir", join(dir, "out")], { cwd: ROOT, env });
    const shipped = bindingsTable(deploy.stdout);
    expect(shipped.size).toBeGreaterThan(10);

    const secrets = { OPERATOR_TOKEN: "t".repeat(32), BUILDER_SECRET: "b".repeat(32) };
    await writeFile(join(dir, "secrets.env"), Object.entries(secrets).map(([k, v]) => `${k}="${v}"\n`).join(""));
    const port = await freePort();
    const options: WorkerDevOptions = {
      port,
      persistDir: join(dir, "persist"),
      envFile: join(dir, "secrets.env"),
      vars: { PUBLIC_URL: `http://127.0.0.1:${port}`, APPS_DOMAIN: `localhost:${port}` },
      logLevel: "log",
    };
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

    const local = bindingsTable(output);
    const expected = new Map(shipped);
    for (const [name, value] of Object.entries(options.vars)) expected.set(name, `("${value}") Environment Variable`);
    for (const name of Object.keys(secrets)) expected.set(name, `("(hidden)") Environment Variable`);
    expect(Object.fromEntries(local)).toEqual(Object.fromEntries(expected));

    const scheduled = await fetch(`http://127.0.0.1:${port}/__scheduled?cron=${encodeURIComponent("17 * * * *")}`);
    expect([scheduled.status, await scheduled.text()]).toEqual([200, "Ran scheduled event"]);
    // No devtools inspector: wrangler announces none.
    expect(output).not.toMatch(/inspector|DevTools/i);
  }, 90_000);
});
