import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, ROOT } from "../../scripts/local-stack.js";
import { processCommandLines } from "../cli/svc.js";
import { siteRequest } from "./sites.js";

/**
 * The README's "Using it" block, run as written, the way a newcomer meets it:
 * a fresh copy of the repository (what git would commit from this checkout),
 * `npm start` in it, and then the block from the copy's own README, line by
 * line in bash, from the copy's root. The block scaffolds its site itself with
 * `npm create vite@latest` from the npm registry and installs it, in a fresh
 * home folder, exactly as a newcomer's machine would.
 *
 * One stand-in keeps the test fast and says so: the copy's `node_modules` is a
 * link to this checkout's (instead of the repository's own `npm install`).
 * `npm start` gets a free PORT (its documented setting), HOME is a temporary
 * folder, and `npm link` installs into a private prefix, so nothing outside the
 * temporary folder is touched.
 */

/** The first ```sh block after the "## Using it" heading. */
function usingItBlock(readme: string): string {
  const section = readme.slice(readme.indexOf("\n## Using it\n"));
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1];
  if (!block) throw new Error('README has no sh block under "## Using it"');
  return block;
}

/** Runs a command to its end, resolving to its exit code and output. */
function runToEnd(command: string, args: string[], options: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs: number }) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, env: options.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => {
      stdout += d;
    });
    child.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    const timer = setTimeout(() => {
      if (child.pid) process.kill(-child.pid, "SIGKILL");
    }, options.timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe("the README's Using it block, as written, against npm start", () => {
  let dir: string;
  let clone: string;
  let port: number;
  let start: ChildProcess;
  let startOutput = "";
  let startSeconds = 0;
  const exited = () => start.exitCode !== null || start.signalCode !== null;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "svc-readme-"));
    clone = join(dir, "svc");
    await mkdir(clone);
    // A fresh clone of this checkout's working tree: tracked files and new ones git would commit.
    const files = execFileSync("git", ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], { cwd: ROOT });
    execFileSync("sh", ["-c", `tar --null -T - -cf - | tar -xf - -C '${clone}'`], { cwd: ROOT, input: files });
    await symlink(join(ROOT, "node_modules"), join(clone, "node_modules"));

    port = await freePort();
    const began = Date.now();
    start = spawn("npm", ["start"], { cwd: clone, env: { ...process.env, PORT: String(port) }, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const collect = (d: Buffer) => {
      startOutput += d;
    };
    start.stdout?.on("data", collect);
    start.stderr?.on("data", collect);
    const deadline = Date.now() + 230_000;
    while (!startOutput.includes("Press Ctrl-C to stop.")) {
      if (exited() || Date.now() > deadline) throw new Error(`npm start did not come up:\n${startOutput}`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    startSeconds = (Date.now() - began) / 1000;
  }, 240_000);

  afterAll(async () => {
    if (start?.pid && !exited()) {
      const gone = new Promise((resolve) => start.once("exit", resolve));
      process.kill(-start.pid, "SIGINT"); // npm start's own Ctrl-C path: it stops the stack it started
      const timer = setTimeout(() => start.pid && process.kill(-start.pid, "SIGKILL"), 60_000);
      await gone;
      clearTimeout(timer);
    }
    if (dir) await rm(dir, { recursive: true, force: true });
  }, 90_000);

  it("keeps exactly two set-up commands on the README's first screen", async () => {
    const readme = await readFile(join(clone, "README.md"), "utf8");
    const first = /```sh\n([\s\S]*?)```/.exec(readme)?.[1] ?? "";
    expect(first.trimEnd().split("\n").map((line) => line.split("#")[0]!.trim())).toEqual(["npm install && npm start", "npm test"]);
    expect(readme.indexOf("```sh")).toBeLessThan(readme.split("\n").slice(0, 25).join("\n").length);
    expect(readme).not.toContain("../shared");
  });

  it("npm start says how to log in, hands the Worker its secrets only through .dev.vars, and fires crons without a warning", async () => {
    expect(startOutput).toContain(`API        http://127.0.0.1:${port}`);
    expect(startOutput).toContain("npx svc login --local");
    expect(startOutput).not.toContain("Scheduled Workers are not automatically triggered");
    console.log(`npm start (dashboard build, migrations, builder, the Worker, account) came up in ${startSeconds.toFixed(1)} s`);

    const secrets = [...(await readFile(join(clone, ".dev.vars"), "utf8")).matchAll(/^[A-Z0-9_]+="?([^"\n]+)"?$/gm)].map((m) => m[1]!);
    expect(secrets).toHaveLength(5);
    const commandLines = await processCommandLines();
    const worker = commandLines.filter((line) => line.includes("scripts/worker-dev.ts") && line.includes(`"port":${port},`));
    expect(worker, "the Worker process of this npm start").toHaveLength(1);
    expect(worker[0]).not.toContain('"envFile"'); // npm start: the Worker reads .dev.vars itself
    for (const secret of secrets) expect(commandLines.filter((line) => line.includes(secret))).toEqual([]);
  });

  it(
    "runs every line without an error, deploys the site and drives crons, disks and backups",
    async () => {
      const block = usingItBlock(await readFile(join(clone, "README.md"), "utf8"));
      const home = join(dir, "home");
      const prefix = join(dir, "npm-prefix");
      await mkdir(home);
      const { SVC_API_URL: _url, SVC_API_KEY: _key, ...env } = process.env;
      const began = Date.now();
      // -e stops at the first failing line, -x shows which line it was.
      const r = await runToEnd("bash", ["-e", "-o", "pipefail", "-x", "-c", block], {
        cwd: clone,
        env: { ...env, HOME: home, XDG_CONFIG_HOME: join(home, ".config"), npm_config_prefix: prefix, PATH: `${prefix}/bin:${env.PATH}` },
        timeoutMs: 400_000,
      });
      const seconds = (Date.now() - began) / 1000;
      if (r.code !== 0) throw new Error(`the README block failed (exit ${r.code}):\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`);
      console.log(`the README block ran in ${seconds.toFixed(1)} s; ${/built in [\d.]+ s/.exec(r.stdout)?.[0] ?? "build time not printed"}`);

      expect(r.stdout).toContain("Logged in.");
      expect(r.stdout).toContain("App my-site exists (static). Next: svc deploy");
      expect(r.stderr, "a fresh scaffold after npm install has its lockfile").not.toContain("no lockfile");
      expect(r.stdout).toContain(`Deployed: http://my-site.localhost:${port}`);
      // The app comes from svc.json, said on stderr; the build log is there by `svc logs --build`.
      expect(r.stderr).toMatch(/^Using app my-site from svc\.json \(--app overrides\)$/m);
      expect(r.stdout).toMatch(/ svc output dist: \d+ files/);
      expect(r.stdout).toMatch(/^Created cron job nightly$/m);
      expect(r.stdout).toMatch(/ out hello from cron$/m);
      expect(r.stdout).toMatch(/^Run manual-\w+-\d+ succeeded/m);
      expect(r.stdout).toMatch(/^Enabled cron job nightly; next run /m);
      expect(r.stdout).toMatch(/^uploads +disk_\w+ +1 GB +[\d.]+ (?:B|KiB|MiB) \(/m);
      expect(r.stdout).toMatch(/^Downloaded backup bak_\w+ to .*uploads\.tar\.gz \(.*SHA-256 verified\)$/m);
      expect(r.stdout).toMatch(/^Restored disk uploads from .*uploads\.tar\.gz; app my-site restarts with the restored data$/m);
      expect(existsSync(join(home, "my-project", "svc.json"))).toBe(true);
      expect(existsSync(join(home, "my-project", "package-lock.json"))).toBe(true);
      // The backup is kept out of the project, so the next deploy does not publish it.
      expect((await stat(join(home, "uploads.tar.gz"))).size).toBeGreaterThan(0);
      expect((await readdir(join(home, "my-project"))).filter((name) => /\.(?:tar|gz|tgz|zip)$/.test(name))).toEqual([]);

      const page = await siteRequest({ apiUrl: `http://127.0.0.1:${port}` }, "my-site", "/");
      expect(page.status).toBe(200);
      expect(page.body).toContain('<div id="root">');
      const downloaded = await siteRequest({ apiUrl: `http://127.0.0.1:${port}` }, "my-site", "/uploads.tar.gz");
      expect(downloaded.body, "the single-page app's index.html, not an archive").toContain('<div id="root">');
    },
    420_000,
  );
});
