import { describe, expect, it } from "vitest";
import type { ProjectFiles } from "../../builder/src/static/detect.js";
import { detectRuntime, parseProcfile, planRelease, shellWord } from "../../builder/src/jobs/release-plan.js";
import { parseSvcJson, type SvcJson } from "../../builder/src/static/project-config.js";

/** A project held in memory. */
function files(entries: Record<string, string>): ProjectFiles {
  return { read: async (path) => entries[path] ?? null, exists: async (path) => path in entries };
}

const pkg = (fields: Record<string, unknown>) => JSON.stringify(fields);
const config = (fields: Record<string, unknown>): SvcJson => {
  const parsed = parseSvcJson(JSON.stringify(fields));
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.config;
};
async function plan(entries: Record<string, string>, runtime: "node" | "python" | "custom", svc: SvcJson | null = null) {
  const planned = await planRelease(files(entries), svc, runtime);
  if (!planned.ok) throw new Error(planned.error);
  return planned.value;
}
async function refusal(entries: Record<string, string>, runtime: "node" | "python" | "custom", svc: SvcJson | null = null) {
  const planned = await planRelease(files(entries), svc, runtime);
  if (planned.ok) throw new Error(`planned: ${planned.value.summary}`);
  return planned.error;
}

describe("planRelease for node", () => {
  it("starts with npm start for a start script (whatever the lockfile), builds with the lockfile's package manager", async () => {
    const project = {
      "package.json": pkg({ scripts: { start: "node server.js", build: "tsc" }, dependencies: { express: "4.22.3" } }),
      "yarn.lock": "",
    };
    expect(await plan(project, "node")).toMatchObject({
      runtime: "node",
      type: "web",
      startCommand: "npm start",
      startFrom: "package.json's start script",
      buildCommand: "yarn run build",
      install: { packageManager: "yarn", lockfile: "yarn.lock" },
      port: 8080,
      healthCheckPath: null,
      nothingToInstall: null,
    });
  });

  it("falls back to main, then server.js, index.js, app.js, quoting what the shell would read", async () => {
    expect((await plan({ "package.json": pkg({ main: "dist/main.js" }) }, "node")).startCommand).toBe("node dist/main.js");
    expect((await plan({ "package.json": pkg({ main: "my app.js" }) }, "node")).startCommand).toBe("node 'my app.js'");
    expect((await plan({ "package.json": "{}", "app.js": "", "index.js": "" }, "node")).startCommand).toBe("node index.js");
    expect(await plan({ "package.json": "{}", "server.js": "", "index.js": "" }, "node")).toMatchObject({
      startCommand: "node server.js",
      startFrom: "found server.js",
      install: null,
      buildCommand: null,
      nothingToInstall: "package.json lists no dependencies: nothing to install",
    });
  });

  it("takes svc.json over a Procfile over package.json, and the app's build command over svc.json's", async () => {
    const project = {
      "package.json": pkg({ scripts: { start: "node a.js", build: "x" } }),
      Procfile: "# processes\nweb: node web.js\nworker: node jobs.js\n",
    };
    expect(await plan(project, "node")).toMatchObject({ startCommand: "node web.js", startFrom: "Procfile web:" });
    expect(await plan(project, "node", config({ runtime: "node", type: "worker" }))).toMatchObject({
      type: "worker",
      startCommand: "node jobs.js",
      port: null,
      healthCheckPath: null,
    });
    const svc = config({ runtime: "node", startCommand: "node b.js", buildCommand: "make", port: 3000, healthCheckPath: "/healthz" });
    expect(await plan(project, "node", svc)).toMatchObject({ startCommand: "node b.js", startFrom: "svc.json", buildCommand: "make", port: 3000, healthCheckPath: "/healthz" });
    const overridden = await planRelease(files(project), svc, "node", { buildCommand: "npm run compile" });
    expect(overridden.ok && overridden.value.buildCommand).toBe("npm run compile");
    expect(overridden.ok && overridden.value.summary).toBe(
      'node app (web): start "node b.js" (svc.json), build "npm run compile" (app settings), port 3000 (svc.json), health check GET /healthz within 60 s',
    );
  });

  it("knows whether an install brings devDependencies to prune: listed at the root, or possibly by workspaces", async () => {
    const start = { start: "node a.js" };
    const locked = (fields: Record<string, unknown>) => ({ "package.json": pkg({ scripts: start, ...fields }), "package-lock.json": "{}" });
    expect(await plan(locked({ dependencies: { express: "4" } }), "node")).toMatchObject({ devDependencies: false });
    expect(await plan(locked({ devDependencies: {} }), "node")).toMatchObject({ devDependencies: false });
    expect(await plan(locked({ devDependencies: { vitest: "4" } }), "node")).toMatchObject({ devDependencies: true });
    expect(await plan(locked({ workspaces: ["packages/*"] }), "node")).toMatchObject({ devDependencies: true });
  });

  it("takes a web app's start timeout and a worker's minimum uptime and overlap from svc.json, and refuses them where they mean nothing", async () => {
    const project = { "package.json": pkg({ scripts: { start: "node a.js" } }) };
    expect(await plan(project, "node")).toMatchObject({ startTimeoutSeconds: 60, minReadySeconds: 0, overlap: false, keepDevDependencies: false });
    const web = await plan(project, "node", config({ runtime: "node", startTimeoutSeconds: 5, minReadySeconds: 3, keepDevDependencies: true }));
    expect(web).toMatchObject({ startTimeoutSeconds: 5, minReadySeconds: 3, keepDevDependencies: true });
    expect(web.summary).toContain("health check the port accepting connections within 5 s, deployed once up 3 s");
    const worker = await plan(project, "node", config({ runtime: "node", type: "worker" }));
    expect(worker).toMatchObject({ startTimeoutSeconds: null, minReadySeconds: 10, overlap: false });
    expect(worker.summary).toContain("deployed once up 10 s, a redeploy stops the old release first");
    expect((await plan(project, "node", config({ runtime: "node", type: "worker", overlap: true, minReadySeconds: 0 }))).summary).toMatch(
      /a redeploy runs the new release beside the old one$/,
    );
    for (const [fields, error] of [
      [{ runtime: "node", startTimeoutSeconds: 4 }, '"startTimeoutSeconds" must be 5–600'],
      [{ runtime: "node", startTimeoutSeconds: 1.5 }, '"startTimeoutSeconds" must be an integer'],
      [{ runtime: "node", minReadySeconds: 601 }, '"minReadySeconds" must be 0–600'],
      [{ runtime: "node", type: "worker", startTimeoutSeconds: 30 }, '"startTimeoutSeconds"'],
      [{ runtime: "static", minReadySeconds: 5 }, '"minReadySeconds" is for apps that run'],
      [{ runtime: "node", overlap: "yes" }, '"overlap" must be true or false'],
    ] as const) {
      const parsed = parseSvcJson(JSON.stringify(fields));
      expect(parsed.ok, JSON.stringify(fields)).toBe(false);
      if (!parsed.ok) expect(parsed.error).toContain(error);
    }
  });

  it("refuses no package.json, dependencies without a lockfile, and nothing to start", async () => {
    expect(await refusal({ "server.js": "" }, "node")).toMatch(/^a node app needs a package\.json at the root of the project/);
    expect(await refusal({ "package.json": pkg({ scripts: { start: "node ." }, dependencies: { express: "4" } }) }, "node")).toBe(
      "package.json lists dependencies but no lockfile was found: commit one of package-lock.json, yarn.lock, pnpm-lock.yaml (the build installs exactly what it pins)",
    );
    expect(await refusal({ "package.json": pkg({ scripts: { build: "tsc" } }) }, "node")).toBe(
      "no start command: add a start script to package.json, or startCommand to svc.json (or a Procfile with a web: line); also looked for main in package.json and server.js, index.js, app.js",
    );
    expect(await refusal({ "package.json": "{}", Procfile: "worker: node q.js" }, "node")).toContain(
      '(the Procfile has a worker: line; for a worker set "type": "worker" in svc.json)',
    );
  });
});

describe("planRelease for python and custom", () => {
  it("installs from requirements.txt before pyproject.toml, and starts main.py, app.py or server.py", async () => {
    expect(await plan({ "requirements.txt": "flask", "pyproject.toml": "", "app.py": "", "server.py": "" }, "python")).toMatchObject({
      install: { packageManager: "pip", lockfile: "requirements.txt" },
      startCommand: "python3 app.py",
    });
    expect((await plan({ "pyproject.toml": "", "main.py": "" }, "python")).install).toEqual({ packageManager: "pip", lockfile: "pyproject.toml" });
    expect(await plan({ "main.py": "" }, "python")).toMatchObject({
      install: null,
      nothingToInstall: "no requirements.txt or pyproject.toml: nothing to install (the standard library only)",
    });
    expect(await plan({ "requirements.txt": "gunicorn", Procfile: "web: gunicorn app:app" }, "python")).toMatchObject({ startCommand: "gunicorn app:app" });
    expect(await plan({ "requirements.txt": "# none yet\n\n", "main.py": "" }, "python")).toMatchObject({
      install: null,
      nothingToInstall: "requirements.txt names no requirements: nothing to install (the standard library only)",
    });
    expect(await refusal({ "requirements.txt": "" }, "python")).toMatch(/^no start command: add startCommand to svc\.json \(e\.g\. "gunicorn app:app"\)/);
  });

  it("needs a start command for custom, from svc.json or a Procfile, and installs nothing", async () => {
    expect(await plan({ Procfile: "web: ./serve --port $PORT" }, "custom")).toMatchObject({ startCommand: "./serve --port $PORT", install: null, buildCommand: null });
    expect(await plan({ "package.json": pkg({ scripts: { start: "x" } }) }, "custom", config({ runtime: "custom", startCommand: "./run" }))).toMatchObject({
      startCommand: "./run",
      install: null,
    });
    expect(await refusal({ "server.js": "" }, "custom")).toBe("a custom app needs a start command: add startCommand to svc.json, or a Procfile with a web: line");
  });

  it("refuses an svc.json that names another runtime", async () => {
    expect(await refusal({ "main.py": "" }, "python", config({ runtime: "node" }))).toBe(
      'svc.json says "runtime": "node" but the app\'s runtime is python: set "runtime": "python" in svc.json, or deploy to an app created with --runtime node',
    );
  });
});

describe("svc.json fields by runtime", () => {
  const error = (fields: Record<string, unknown>) => {
    const parsed = parseSvcJson(JSON.stringify(fields));
    return parsed.ok ? null : parsed.error;
  };

  it("accepts each runtime's fields", () => {
    expect(error({ runtime: "node", type: "web", startCommand: "npm start", buildCommand: "npm run build", port: 3000, healthCheckPath: "/healthz" })).toBeNull();
    expect(error({ runtime: "python", type: "worker", startCommand: "python3 worker.py" })).toBeNull();
    expect(error({ runtime: "static", outputDir: "dist", spa: true, port: 80 })).toBeNull();
  });

  it("refuses fields that do not fit the runtime or the process type, naming each", () => {
    expect(error({ runtime: "node", outputDir: "dist", spa: true })).toBe(
      'svc.json: field "outputDir" is for static sites (runtime "static"); a node app keeps its whole folder and runs startCommand; ' +
        'field "spa" is for static sites (runtime "static"); a node app keeps its whole folder and runs startCommand',
    );
    expect(error({ runtime: "static", outputDir: "dist", startCommand: "x" })).toBe(
      'svc.json: field "startCommand" is for apps that run (runtime "node", "python" or "custom"), not static sites',
    );
    expect(error({ runtime: "python", type: "worker", port: 8080, healthCheckPath: "/" })).toBe(
      'svc.json: field "port" is for web processes; a worker ("type": "worker") listens on no port and has no health check; ' +
        'field "healthCheckPath" is for web processes; a worker ("type": "worker") listens on no port and has no health check',
    );
  });

  it("refuses unknown runtimes, types and malformed values", () => {
    expect(error({ runtime: "ruby" })).toBe('svc.json: field "runtime" must be one of "static", "node", "python", "custom" (got "ruby")');
    expect(error({})).toBe('svc.json: field "runtime" is required: one of "static", "node", "python", "custom"');
    expect(error({ runtime: "node", type: "cron", healthCheckPath: "healthz", startCommand: "" })).toBe(
      'svc.json: field "type" must be "web" or "worker"; field "startCommand" must not be empty; ' +
        'field "healthCheckPath" must be a path starting with / (no spaces or control characters), e.g. /healthz',
    );
    expect(error({ runtime: "node", start: "x" })).toBe(
      'svc.json: unknown field "start" (allowed: name, runtime, type, buildCommand, startCommand, outputDir, spa, port, healthCheckPath, startTimeoutSeconds, minReadySeconds, overlap, instances, keepDevDependencies)',
    );
  });
});

describe("parseProcfile and shellWord", () => {
  it("reads name: command lines, first wins, comments and blanks skipped", () => {
    expect(parseProcfile("web: npm start\r\n\n# x: y\nworker:   node q.js  \nweb: other\nbad line\nrelease:\n")).toEqual(
      new Map([
        ["web", "npm start"],
        ["worker", "node q.js"],
      ]),
    );
  });

  it("quotes only what the shell would read specially", () => {
    expect(shellWord("dist/index.js")).toBe("dist/index.js");
    expect(shellWord("a b's.js")).toBe("'a b'\\''s.js'");
    expect(shellWord("$(reboot).js")).toBe("'$(reboot).js'");
  });
});

describe("detectRuntime", () => {
  it("tells static frameworks, python, node servers, plain sites, Procfiles apart, in that order", async () => {
    const detect = async (entries: Record<string, string>) => (await detectRuntime(files(entries)))?.runtime ?? null;
    expect(await detect({ "package.json": pkg({ scripts: { start: "vite preview" }, devDependencies: { vite: "8" } }) })).toBe("static");
    expect(await detect({ "requirements.txt": "", "package.json": pkg({ scripts: { start: "x" } }) })).toBe("python");
    expect(await detect({ "package.json": pkg({ scripts: { start: "node server.js" } }), "static/index.html": "" })).toBe("node");
    expect(await detect({ "package.json": pkg({}), "static/index.html": "" })).toBe("static");
    expect(await detect({ "index.html": "" })).toBe("static");
    expect(await detect({ "package.json": pkg({ scripts: { build: "x" } }) })).toBe("node");
    expect(await detect({ "app.py": "" })).toBe("python");
    expect(await detect({ Procfile: "web: ./serve" })).toBe("custom");
    expect(await detect({ "README.md": "" })).toBeNull();
  });
});
