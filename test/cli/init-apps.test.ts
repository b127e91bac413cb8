import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, ROOT } from "../../scripts/local-stack.js";
import { svc, tempHome } from "./svc.js";

/**
 * `svc init` and `svc deploy`'s checks before the upload for apps that run
 * (issue 18), on the app fixtures and folders of their own, without a stack:
 * the svc.json written is what the build will decide.
 */

let scratch: string;
let home: Awaited<ReturnType<typeof tempHome>>;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "svc-init-apps-"));
  home = await tempHome();
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
  await home?.remove();
});

/** A copy of an app fixture in a folder of the same name. */
async function copy(name: string): Promise<string> {
  const dir = join(await mkdtemp(join(scratch, "app-")), name);
  await cp(join(ROOT, "test", "fixtures", "apps", name), dir, { recursive: true });
  return dir;
}

/** A folder of the given files. */
async function tree(name: string, files: Record<string, string>): Promise<string> {
  const dir = join(await mkdtemp(join(scratch, "tree-")), name);
  await mkdir(dir);
  for (const [path, content] of Object.entries(files)) {
    await mkdir(dirname(join(dir, path)), { recursive: true });
    await writeFile(join(dir, path), content);
  }
  return dir;
}

const written = async (dir: string) => JSON.parse(await readFile(join(dir, "svc.json"), "utf8")) as unknown;

describe("svc init for apps that run", () => {
  it("the Express app: node, npm start from its start script, port 8080, the lockfile named", async () => {
    const dir = await copy("node-express");
    const r = await svc(["init", "--dir", dir], home.env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(
      /^Detected: node app \(package\.json\), web, port 8080, start "npm start" \(package\.json's start script\), dependencies from package-lock\.json \(npm\)$/m,
    );
    expect(r.stdout.trimEnd().split("\n").at(-1)).toBe("Next: svc apps create --name node-express --runtime node, then svc deploy");
    expect(await written(dir)).toEqual({ name: "node-express", runtime: "node", type: "web", startCommand: "npm start", port: 8080 });
  });

  it("python apps: requirements.txt with pip, the standard library alone keeping svc.json's health check with --force", async () => {
    const withRequirements = await copy("python-requirements");
    const r = await svc(["init", "--dir", withRequirements], home.env);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('Detected: python app (requirements.txt), web, port 8080, start "python3 app.py" (found app.py), dependencies from requirements.txt (pip)');
    expect(await written(withRequirements)).toEqual({ name: "python-requirements", runtime: "python", type: "web", startCommand: "python3 app.py", port: 8080 });

    const pyproject = await copy("python-pyproject");
    const fromPyproject = await svc(["init", "--dir", pyproject], home.env);
    expect(fromPyproject.stdout).toContain('Detected: python app (pyproject.toml), web, port 8080, start "python3 main.py" (found main.py), dependencies from pyproject.toml (pip)');

    const stdlib = await copy("python-stdlib");
    const forced = await svc(["init", "--dir", stdlib, "--force"], home.env);
    expect(forced.code).toBe(0);
    expect(await written(stdlib)).toEqual({
      name: "python-stdlib",
      runtime: "python",
      type: "web",
      startCommand: "python3 main.py",
      port: 8080,
      healthCheckPath: "/healthz",
    });
  });

  it("a worker keeps its type and takes the Procfile's worker: line; a custom app its build command and web: line", async () => {
    const worker = await copy("node-worker");
    expect((await svc(["init", "--dir", worker, "--force"], home.env)).code).toBe(0);
    expect(await written(worker)).toEqual({ name: "node-worker", runtime: "node", type: "worker", startCommand: "node worker.js" });

    const custom = await copy("custom");
    expect((await svc(["init", "--dir", custom, "--force"], home.env)).code).toBe(0);
    expect(await written(custom)).toEqual({
      name: "custom-app",
      runtime: "custom",
      type: "web",
      buildCommand: "sh build.sh",
      startCommand: 'python3 -m http.server "$PORT" --directory public',
      port: 8080,
    });
  });

  it("writes exactly what the flags say, and refuses flags that do not fit the runtime or the type", async () => {
    const dir = await tree("anything", { serve: "#!/bin/sh\n" });
    const r = await svc(
      ["init", "--dir", dir, "--runtime", "custom", "--start-command", "./serve", "--port", "3000", "--health-check-path", "/up"],
      home.env,
    );
    expect(r.code).toBe(0);
    expect(await written(dir)).toEqual({ name: "anything", runtime: "custom", type: "web", startCommand: "./serve", port: 3000, healthCheckPath: "/up" });

    const workerPort = await svc(["init", "--dir", dir, "--force", "--type", "worker", "--port", "3000"], home.env);
    expect(workerPort.code).toBe(1);
    expect(workerPort.stderr).toContain("--port: a worker listens on no port and has no health check");
    const staticStart = await svc(["init", "--dir", dir, "--force", "--runtime", "static", "--start-command", "x"], home.env);
    expect(staticStart.code).toBe(1);
    expect(staticStart.stderr).toContain("--start-command is for apps that run (runtime node, python or custom)");
    const nodeOutput = await svc(["init", "--dir", dir, "--force", "--runtime", "node", "--output-dir", "dist"], home.env);
    expect(nodeOutput.stderr).toContain("--output-dir is for static sites (runtime static)");
    const ruby = await svc(["init", "--dir", dir, "--runtime", "ruby"], home.env);
    expect(ruby.code).toBe(2);
    expect(ruby.stderr).toContain('--runtime must be one of static, node, python, custom, got "ruby"');
  });

  it("says what to pass when nothing is recognised", async () => {
    const dir = await tree("empty", { "README.md": "# hi\n" });
    const r = await svc(["init", "--dir", dir], home.env);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`Error: no static site or app to run found in ${dir}`);
    expect(r.stderr).toContain("Hint: for an app that runs pass --runtime node|python|custom and --start-command <command>;");
    const started = await svc(["init", "--dir", dir, "--start-command", "./run.sh"], home.env);
    expect(started.code).toBe(0);
    expect(await written(dir)).toMatchObject({ runtime: "custom", startCommand: "./run.sh" });
  });
});

describe("svc deploy's checks before the upload for apps that run (nothing listens at the API URL)", () => {
  const deployOffline = async (root: string) =>
    svc(["deploy", "--source", root], { ...home.env, SVC_API_URL: `http://127.0.0.1:${await freePort()}`, SVC_API_KEY: "svc_unused" });

  it("refuses a node app with nothing to start, and a requirements.txt .gitignore keeps from being uploaded", async () => {
    const noStart = await deployOffline(await tree("api", { "svc.json": JSON.stringify({ name: "api", runtime: "node" }), "package.json": "{}" }));
    expect(noStart.code).toBe(1);
    expect(noStart.stderr).toMatch(/^Error: cannot deploy \S+\n {2}no start command: add a start script to package\.json/);
    expect(noStart.stderr).toContain("Hint: `svc init --force --start-command <command>` writes it into svc.json");

    const ignored = await deployOffline(
      await tree("py", { "svc.json": JSON.stringify({ name: "py", runtime: "python" }), "requirements.txt": "flask\n", "app.py": "", ".gitignore": "requirements.txt\n" }),
    );
    expect(ignored.code).toBe(1);
    expect(ignored.stderr).toContain("requirements.txt is left out by .gitignore, so the build would install without it");

    const misplaced = await deployOffline(await tree("site", { "svc.json": JSON.stringify({ name: "site", runtime: "node", spa: true }), "index.js": "" }));
    expect(misplaced.stderr).toContain('field "spa" is for static sites (runtime "static")');
    for (const r of [noStart, ignored, misplaced]) expect(r.stderr).not.toContain("is the API running");
  });
});
