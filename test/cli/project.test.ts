import { randomBytes } from "node:crypto";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectExit, FixtureCopies } from "../e2e/sites.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "./svc.js";

/** A build through the real builder (a plain folder: no install). */
const DEPLOY_MS = 120_000;

/**
 * Issue 20, the CLI points, against the real stack: the app a command acts on
 * comes from the nearest svc.json; one command reads every log; the cron verbs
 * people try; a missing lockfile said by `svc init`; a deploy that would
 * publish an archive or ship a secret says so first; disks show their use.
 */
describe("the CLI in a project folder, against wrangler dev", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const fixtures = new FixtureCopies();
  const suffix = randomBytes(3).toString("hex");
  const site = `proj-${suffix}`;
  const other = `other-${suffix}`;
  let project: string;
  let deploymentId: string;

  /** Writes `files` under `root`. */
  const write = async (root: string, files: Record<string, string>) => {
    for (const [path, content] of Object.entries(files)) {
      await mkdir(join(root, path, ".."), { recursive: true });
      await writeFile(join(root, path), content);
    }
  };
  /** Runs svc in `cwd`, expecting `code`. */
  const run = async (cwd: string, args: string[], code = 0) => expectExit(await svc(args, env, "", cwd), code, args.join(" "));
  const usingLine = (file: string) => `Using app ${site} from ${file} (--app overrides)`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "project", ["deploy", "admin"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    for (const name of [site, other]) expectExit(await svc(["apps", "create", "--name", name, "--runtime", "static"], env), 0, "apps create");
    project = await fixtures.folder("site");
    await write(project, { "index.html": "<h1>project</h1>", "docs/guide.html": "<h1>guide</h1>" });
    await run(project, ["init", "--name", site]);
    const deployed = await run(project, ["deploy", "--json"]);
    deploymentId = (JSON.parse(deployed.stdout) as { id: string }).id;
  }, STACK_START_TIMEOUT_MS + DEPLOY_MS);
  afterAll(async () => {
    await home?.remove();
    await fixtures.removeAll();
  });

  it("4. every app command takes the app from the nearest svc.json, says so once, and --app still wins", async () => {
    const info = await run(project, ["apps", "info"]);
    expect(info.stdout).toMatch(new RegExp(`^name +${site}$`, "m"));
    expect(info.stderr.trimEnd()).toBe(usingLine("svc.json"));

    // From a folder below the project, and for commands whose other arguments are positional.
    const below = join(project, "docs");
    const set = await run(below, ["env", "set", "GREETING=hello", "COLOUR=teal"]);
    expect(set.stderr.trimEnd()).toBe(usingLine(join("..", "svc.json")));
    expect((await run(below, ["env", "list"])).stdout).toMatch(/^GREETING\b/m);
    expect((await run(below, ["env", "unset", "COLOUR"])).stderr).toContain(usingLine(join("..", "svc.json")));
    expect((await run(project, ["deployments", "info", deploymentId])).stdout).toContain(deploymentId);
    expect((await run(project, ["deployments", "info", "--deployment", deploymentId])).stdout).toContain(deploymentId);

    // --app (or the app as the first argument) wins, and nothing is said about svc.json.
    for (const args of [["apps", "info", "--app", other], ["apps", "info", other]]) {
      const r = await run(project, args);
      expect(r.stdout).toMatch(new RegExp(`^name +${other}$`, "m"));
      expect(r.stderr).toBe("");
    }

    // Outside a project, or with a svc.json that names no app or does not parse, the error says why.
    const outside = await fixtures.folder("elsewhere");
    const missing = await run(outside, ["apps", "info"], 2);
    expect(missing.stderr).toContain("missing --app <app>");
    expect(missing.stderr).toContain("pass --app <app>, or run it in a project folder whose svc.json names the app");
    await writeFile(join(outside, "svc.json"), JSON.stringify({ runtime: "static", outputDir: "." }));
    expect((await run(outside, ["logs"], 2)).stderr).toContain('svc.json names no app: add "name" to it, or pass --app <app>');
    await writeFile(join(outside, "svc.json"), "{ not json");
    expect((await run(outside, ["logs"], 1)).stderr).toContain("Error: svc.json is not valid");
    expect((await run(outside, ["logs", "--app", site])).stderr).toBe("");
  });

  it("5. svc logs reads the request, build and runtime logs; --deployment is understood where people try it", async () => {
    const requests = await run(project, ["logs"]);
    expect(requests.stdout.length).toBeGreaterThan(0);
    const build = await run(project, ["logs", "--build"]);
    expect(build.stdout).toMatch(/ svc output \.: \d+ files?, /);
    // Step 4's env changes built the site again (a static site reads its variables when built): the newest build is theirs.
    const [newest] = JSON.parse((await run(project, ["deployments", "list", "--json"])).stdout) as { id: string; cause: string | null }[];
    expect(newest!.cause).toMatch(/^config: /);
    const byId = await run(project, ["logs", "--deployment", newest!.id]);
    expect(byId.stdout).toBe(build.stdout);
    expect((await run(project, ["apps", "logs", "--deployment", newest!.id])).stdout).toBe(build.stdout);
    const both = await run(project, ["logs", "--runtime", "--deployment", deploymentId], 2);
    expect(both.stderr).toContain("--runtime and --build (or --deployment) are different logs: choose one");
    // A static site has no runtime log: the API's answer names the other two.
    const runtime = await run(project, ["logs", "--runtime"], 1);
    expect(runtime.stderr).toContain(`its request log is \`svc logs --app ${site}\``);
  });

  it("6. cron jobs are created disabled, enabled and disabled by name; pause and resume are suggested", async () => {
    const name = `tidy-${suffix}`;
    const created = await run(project, ["cron", "create", "--name", name, "--schedule", "0 3 * * *", "--command", "echo tidy", "--disabled", "--json"]);
    const job = JSON.parse(created.stdout) as { id: string; enabled: boolean };
    expect(job.enabled).toBe(false);
    expect((JSON.parse((await run(project, ["cron", "info", name, "--json"])).stdout) as { nextRuns: string[] }).nextRuns).toEqual([]);
    expect((await run(project, ["cron", "enable", name])).stdout).toMatch(new RegExp(`^Enabled cron job ${name}; next run \\d{4}-`, "m"));
    expect((await run(project, ["cron", "info", job.id, "--json"])).stdout).toContain('"enabled": true');
    expect((await run(project, ["cron", "disable", job.id])).stdout).toContain(`Disabled cron job ${name}: no scheduled runs until \`svc cron enable ${job.id}\``);
    expect((await run(project, ["cron", "info", name, "--json"])).stdout).toContain('"enabled": false');
    for (const [typed, meant] of [["pause", "disable"], ["resume", "enable"]]) {
      const r = await run(project, ["cron", typed!, name], 2);
      expect(r.stderr).toContain(`unknown command "cron ${typed}"`);
      expect(r.stderr).toContain(`did you mean \`svc cron ${meant}\`?`);
    }
  });

  it("9. disks show their size and the space they use", async () => {
    const disk = `data-${suffix}`;
    await run(project, ["disk", "create", "--name", disk, "--size", "1"]);
    const attached = await run(project, ["disk", "attach", disk]);
    expect(attached.stderr).toContain(usingLine("svc.json"));
    const list = await run(project, ["disk", "list"]);
    expect(list.stdout).toMatch(/^NAME +ID +SIZE +USED +/m);
    expect(list.stdout).toMatch(new RegExp(`^${disk} +disk_\\w+ +1 GB +[\\d.]+ (?:B|KiB|MiB) \\((?:<1|\\d+)%\\)`, "m"));
    const info = JSON.parse((await run(project, ["disk", "info", disk, "--json"])).stdout) as { usedBytes: number | null; sizeGb: number };
    expect(info.usedBytes).toBeGreaterThanOrEqual(0);
    expect(info.usedBytes).toBeLessThan(info.sizeGb * 1024 ** 3);
    expect((await run(project, ["disk", "info", disk])).stdout).toMatch(/^used +[\d.]+ (?:B|KiB|MiB) \(/m);
    await run(project, ["disk", "detach", disk]);
    await run(project, ["disk", "delete", disk, "--yes"]);
  });

  it("1. svc init says a project with dependencies needs its lockfile first, and that npm install writes it", async () => {
    const dir = await fixtures.copy("vite-react");
    await rm(join(dir, "package-lock.json"));
    const init = await run(dir, ["init", "--name", site]);
    expect(init.stderr).toContain("Warning: package.json lists dependencies but");
    expect(init.stderr).toContain("run npm install here (or yarn / pnpm install) and commit the lockfile it writes");
    expect(init.stdout.trimEnd().split("\n").at(-1)).toBe(`App ${site} exists (static). Next: npm install, then svc deploy`);
    // With the lockfile there, no warning.
    const withLock = await fixtures.copy("vite-react");
    expect((await run(withLock, ["init", "--name", site])).stderr).not.toContain("Warning");
  });

  it("3. a failed build quotes the build tool's first error with its file and line, and says what to do", async () => {
    const dir = await fixtures.folder("type-error");
    // What tsc prints for a type error (the builder's own tests run the real tsc and vite): here without an install.
    await write(dir, {
      "package.json": JSON.stringify({ scripts: { build: "node build.js" } }),
      "build.js":
        "console.log('> tsc -b && vite build');\nconsole.log(\"src/App.tsx(3,7): error TS2322: Type 'number' is not assignable to type 'string'.\");\nprocess.exit(2);\n",
      "svc.json": JSON.stringify({ name: site, runtime: "static", buildCommand: "node build.js", outputDir: "dist" }),
    });
    const r = await run(dir, ["deploy"], 1);
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines).toContain("  the build failed: src/App.tsx:3:7: error TS2322: Type 'number' is not assignable to type 'string'. (exit code 2)");
    expect(lines.at(-1)).toMatch(
      new RegExp(`^ {2}Hint: the quote above is the build tool's first error: fix it, try \`npm run build\` locally, and deploy again; \`svc logs --app ${site} --deployment dep_\\w+\` shows all it printed$`),
    );
  }, DEPLOY_MS);

  it("7. svc deploy warns before it publishes an archive or ships a secret, and not for templates or unserved files", async () => {
    const dir = await fixtures.folder("with-archive");
    await write(dir, {
      "index.html": "<h1>hi</h1>",
      "uploads.tar.gz": "not really gzip",
      "downloads/site.zip": "zip",
      ".env": "TOKEN=1",
      ".env.example": "TOKEN=",
      "keys/server.pem": "-----BEGIN",
      ".gitignore": "ignored.zip\n",
      "ignored.zip": "left out",
    });
    await writeFile(join(dir, "svc.json"), JSON.stringify({ name: site, runtime: "static", outputDir: "." }));
    const r = await run(dir, ["deploy"]);
    const warnings = r.stderr.split("\n").filter((line) => line.startsWith("Warning:"));
    expect(warnings).toHaveLength(4);
    expect(warnings).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^Warning: \.env \(\d+ B\) looks like secrets and is uploaded with the source \(the build can read it\)$/),
        expect.stringMatching(/^Warning: downloads\/site\.zip \(\d+ B\) is an archive and would be public at \/downloads\/site\.zip$/),
        expect.stringMatching(/^Warning: keys\/server\.pem \(\d+ B\) looks like secrets and would be public at \/keys\/server\.pem$/),
        expect.stringMatching(/^Warning: uploads\.tar\.gz \(\d+ B\) is an archive and would be public at \/uploads\.tar\.gz$/),
      ]),
    );
    expect(r.stderr).toContain(`Leave them out with .gitignore (svc deploy packs what git would commit); give secrets to the app with \`svc env set KEY=VALUE --app ${site}\``);
    // A built site publishes its output, not an archive beside its sources: no warning.
    const built = await fixtures.folder("built");
    await write(built, {
      "package.json": JSON.stringify({ scripts: { build: "node build.js" } }),
      "build.js": "require('fs').mkdirSync('out', { recursive: true }); require('fs').writeFileSync('out/index.html', '<h1>built</h1>');",
      "backup.tar.gz": "x",
      "svc.json": JSON.stringify({ name: site, runtime: "static", buildCommand: "node build.js", outputDir: "out" }),
    });
    const quiet = await run(built, ["deploy"]);
    expect(quiet.stderr).not.toContain("Warning");
  }, DEPLOY_MS);
});
