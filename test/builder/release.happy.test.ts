import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { lstat, readdir, readFile, readlink, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ReleaseResult } from "../../builder/src/protocol/processes.js";
import { type FakeWorker, startFakeWorker, svcLines } from "./build-support.js";
import { type BuilderProcess, startBuilder } from "./builder-process.js";
import {
  appsDir,
  copyApp,
  extractRelease,
  getFromApp,
  outputOf,
  releaseSpec,
  releaseToEnd,
  sha256,
  startApp,
  startPackageIndex,
  wheelFolder,
  writeWheel,
} from "./release-support.js";
import { type FakeStorage, startFakeStorage } from "./snapshot-storage.js";

const REGISTRY = "https://registry.npmjs.org/";

let builder: BuilderProcess;
let worker: FakeWorker;
let storage: FakeStorage;
let index: Awaited<ReturnType<typeof startPackageIndex>>;
let wheels: string;
const scratch: string[] = [];
beforeAll(async () => {
  // Two wheels built here (no PyPI): one in the builder's folder of wheels, one only on a local index.
  wheels = await wheelFolder();
  const indexed = await wheelFolder();
  scratch.push(wheels, indexed);
  await writeWheel(wheels, "svcgreeting", "1.0.0", "hello from a wheel");
  index = await startPackageIndex([await writeWheel(indexed, "svcindexed", "2.0.0", "hello from the index")]);
  builder = await startBuilder({
    env: { NPM_CONFIG_REGISTRY: REGISTRY, BUILDER_PIP_FIND_LINKS: wheels, BUILDER_PIP_INDEX_URL: index.url },
  });
  worker = await startFakeWorker(builder.secret);
  storage = await startFakeStorage(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await storage?.close();
  await index?.close();
  await builder?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** Checks the archive against the result, extracts it with the platform's extractor, and keeps the folder for cleanup. */
async function unpack(archive: Buffer, result: ReleaseResult): Promise<string> {
  expect(archive.length).toBe(result.sizeBytes);
  expect(sha256(archive)).toBe(result.sha256);
  expect(result.parts.map((part) => part.partNumber)).toEqual([...Array(result.parts.length).keys()].map((n) => n + 1));
  const dir = await extractRelease(archive, result);
  scratch.push(dir);
  return dir;
}

describe("a node app (Express, package-lock.json, a start script)", () => {
  let outcome: Awaited<ReturnType<typeof releaseToEnd>>;
  let dir: string;
  beforeAll(async () => {
    outcome = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "express", join(appsDir, "node-express"), "node"));
    if (outcome.result) dir = await unpack(outcome.archive, outcome.result);
  }, 180_000);

  it("installs with npm ci through the registry and reports the release", () => {
    const { status, result, log } = outcome;
    expect(status, log).toMatchObject({ status: "succeeded", reason: null, exitCode: 0 });
    expect(ReleaseResult.parse(result)).toMatchObject({
      kind: "release",
      runtime: "node",
      type: "web",
      startCommand: "npm start",
      buildCommand: null,
      packageManager: "npm",
      port: 8080,
      healthCheckPath: null,
    });
    expect(result!.entries).toBeGreaterThan(500);
    expect(result!.expandedBytes).toBeGreaterThan(result!.sizeBytes);
    expect(result!.peakMemoryBytes).toBe(status.peakMemoryBytes);
    expect(result!.peakMemoryBytes).toBeGreaterThan(0);
    const lines = svcLines(log);
    expect(lines).toContain('node app (web): start "npm start" (package.json\'s start script), build none, port 8080 (default), health check the port accepting connections within 60 s');
    expect(lines).toContain(`installing dependencies from package-lock.json with npm from the registry mirror ${REGISTRY} (the only host builds can reach)`);
    expect(lines).toContain("$ npm ci --no-audit --no-fund");
    expect(lines).toContainEqual(expect.stringMatching(/^release: \d{1,3}(,\d{3})* files, [\d.]+ MiB \([\d.]+ [KM]iB compressed, 1 part\), start: npm start, port 8080$/));
    expect(lines.at(-1)).toBe("job succeeded (exit code 0)");
  });

  it("holds the app with node_modules, whose .bin links survive as relative links", async () => {
    expect(JSON.parse(await readFile(join(dir, "node_modules/express/package.json"), "utf8")).version).toBe("4.22.1");
    expect(existsSync(join(dir, "server.js"))).toBe(true);
    expect((await lstat(join(dir, "node_modules/.bin/mime"))).isSymbolicLink()).toBe(true);
    expect(await readlink(join(dir, "node_modules/.bin/mime"))).toBe("../mime/cli.js");
    expect((await lstat(join(dir, "node_modules/mime/cli.js"))).mode & 0o111).not.toBe(0);
  });

  it("starts with its start command and PORT, and answers / and /healthz", async () => {
    const app = await startApp(dir, outcome.result!.startCommand);
    try {
      expect(await getFromApp(app, "/")).toEqual({ status: 200, body: "hello from express 4.22.1\n" });
      expect(await getFromApp(app, "/healthz")).toEqual({ status: 200, body: '{"ok":true}' });
    } finally {
      await app.stop();
    }
  });
});

describe("a python app with requirements.txt", () => {
  let outcome: Awaited<ReturnType<typeof releaseToEnd>>;
  let dir: string;
  beforeAll(async () => {
    const spec = releaseSpec(worker, storage, "python-requirements", join(appsDir, "python-requirements"), "python");
    outcome = await releaseToEnd(builder, storage, spec);
    if (outcome.result) dir = await unpack(outcome.archive, outcome.result);
  }, 180_000);

  it("installs into /work/.venv with pip from the folder of wheels and the package index, through the build's proxy", () => {
    const { status, result, log } = outcome;
    expect(status, log).toMatchObject({ status: "succeeded", exitCode: 0 });
    expect(result).toMatchObject({ runtime: "python", type: "web", startCommand: "python3 app.py", packageManager: "pip", port: 8080 });
    const lines = svcLines(log);
    expect(lines).toContain(
      `installing dependencies from requirements.txt with pip into .venv from the package index ${index.url} and the builder's folder of wheels (BUILDER_PIP_FIND_LINKS)`,
    );
    expect(lines).toContainEqual(expect.stringMatching(/^\$ python3 -m venv --clear \/work\/\.venv && .* && \/work\/\.venv\/bin\/pip install -r requirements\.txt$/));
    expect(log).toMatch(/ out Successfully installed svcgreeting-1\.0\.0 svcindexed-2\.0\.0/);
    expect(index.requests).toContain("/files/svcindexed-2.0.0-py3-none-any.whl");
  });

  it("holds the virtualenv with both wheels, its python3 a file of its own and no link leading out", async () => {
    const lib = join(dir, ".venv/lib");
    const [python] = await readdir(lib);
    expect(python).toMatch(/^python3\.\d+$/);
    for (const name of ["svcgreeting", "svcindexed"]) expect(existsSync(join(lib, python!, "site-packages", name, "__init__.py")), name).toBe(true);
    expect((await lstat(join(dir, ".venv/bin/python3"))).isFile()).toBe(true);
    expect(await readlink(join(dir, ".venv/bin/python"))).toBe("python3");
    expect(await readFile(join(dir, ".venv/pyvenv.cfg"), "utf8")).toMatch(/^home = \/usr\/bin$/m);
  });

  it("runs its installed commands where nodes put it, at /work (their shebangs name /work/.venv/bin/python3)", () => {
    const atWork = (command: string[]) =>
      execFileSync("bwrap", ["--ro-bind", "/", "/", "--bind", dir, "/work", "--dev", "/dev", "--proc", "/proc", "--chdir", "/work", "--", ...command], {
        encoding: "utf8",
        env: { PATH: "/work/.venv/bin:/usr/bin:/bin" },
      });
    expect(atWork(["pip", "--version"])).toMatch(/^pip \S+ from \/work\/\.venv\/lib\/python3\.\d+\/site-packages\/pip /);
    expect(atWork(["python3", "-c", "import sys, svcindexed; print(sys.prefix, svcindexed.greeting())"])).toBe("/work/.venv hello from the index\n");
  });

  it("starts with python3 app.py from the virtualenv, importing both packages", async () => {
    const app = await startApp(dir, outcome.result!.startCommand);
    try {
      expect(await getFromApp(app, "/")).toEqual({ status: 200, body: "hello from a wheel and hello from the index\n" });
    } finally {
      await app.stop();
    }
  });

  it("quotes pip's reason when a requirement is not in the index", async () => {
    const project = await copyApp("python-requirements");
    scratch.push(project);
    await writeFile(join(project, "requirements.txt"), "svcnosuchpackage==1.0.0\n");
    const { status, log } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "pip-missing", project, "python"));
    expect(status, log).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 1 });
    expect(status.error).toBe(
      'install failed: exit code 1: "ERROR: Could not find a version that satisfies the requirement svcnosuchpackage==1.0.0 (from versions: none)"; ' +
        "a requirement is not in the package index (or has no release for this Python): check its name and version in requirements.txt",
    );
  }, 120_000);
});

describe("a python project with pyproject.toml", () => {
  it("is installed with pip install . (its own build backend, its dependency from the wheels) and starts", async () => {
    const { status, result, log, archive } = await releaseToEnd(
      builder,
      storage,
      releaseSpec(worker, storage, "python-pyproject", join(appsDir, "python-pyproject"), "python"),
    );
    expect(status, log).toMatchObject({ status: "succeeded", exitCode: 0 });
    expect(result).toMatchObject({ runtime: "python", packageManager: "pip", startCommand: "python3 main.py" });
    expect(svcLines(log)).toContainEqual(expect.stringMatching(/&& \/work\/\.venv\/bin\/pip install \.$/));
    expect(log).toMatch(/ out Successfully installed pyproject-app-1\.0\.0 svcgreeting-1\.0\.0/);
    const dir = await unpack(archive, result!);
    const [python] = await readdir(join(dir, ".venv/lib"));
    expect(existsSync(join(dir, ".venv/lib", python!, "site-packages/pyproject_app/__init__.py"))).toBe(true);
    const app = await startApp(dir, result!.startCommand);
    try {
      expect(await getFromApp(app, "/")).toEqual({ status: 200, body: "hello from a wheel, through pyproject.toml\n" });
    } finally {
      await app.stop();
    }
  }, 120_000);
});

describe("a python app on the standard library alone", () => {
  it("installs nothing, starts python3 main.py and keeps svc.json's health check", async () => {
    const { status, result, log, archive } = await releaseToEnd(
      builder,
      storage,
      releaseSpec(worker, storage, "python-stdlib", join(appsDir, "python-stdlib"), "python"),
    );
    expect(status, log).toMatchObject({ status: "succeeded", exitCode: null });
    expect(result).toMatchObject({ runtime: "python", startCommand: "python3 main.py", packageManager: null, healthCheckPath: "/healthz", buildCommand: null });
    expect(svcLines(log)).toContain("no requirements.txt or pyproject.toml: nothing to install (the standard library only)");
    const dir = await unpack(archive, result!);
    expect(existsSync(join(dir, ".venv"))).toBe(false);
    const app = await startApp(dir, result!.startCommand);
    try {
      expect(await getFromApp(app, "/")).toEqual({ status: 200, body: "hello from the python standard library\n" });
      expect((await getFromApp(app, "/healthz")).status).toBe(200);
    } finally {
      await app.stop();
    }
  }, 120_000);
});

describe("a worker", () => {
  it("takes its command from the Procfile's worker: line, with no port or health check", async () => {
    const { status, result, log, archive } = await releaseToEnd(
      builder,
      storage,
      releaseSpec(worker, storage, "worker", join(appsDir, "node-worker"), "node"),
    );
    expect(status, log).toMatchObject({ status: "succeeded" });
    expect(result).toMatchObject({ type: "worker", startCommand: "node worker.js", port: null, healthCheckPath: null, packageManager: null });
    expect(svcLines(log)).toContainEqual(expect.stringMatching(/, start: node worker\.js, worker \(no port\)$/));
    const app = await startApp(await unpack(archive, result!), result!.startCommand);
    try {
      expect(await outputOf(app, /tick 1/)).toMatch(/^worker started\ntick 1/);
    } finally {
      await app.stop();
    }
  }, 120_000);
});

describe("a custom app", () => {
  it("runs svc.json's build command and starts the Procfile's web: line", async () => {
    const { status, result, log, archive } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "custom", join(appsDir, "custom"), "custom"));
    expect(status, log).toMatchObject({ status: "succeeded", exitCode: 0 });
    expect(result).toMatchObject({
      runtime: "custom",
      buildCommand: "sh build.sh",
      startCommand: 'python3 -m http.server "$PORT" --directory public',
      packageManager: null,
      port: 8080,
    });
    const app = await startApp(await unpack(archive, result!), result!.startCommand);
    try {
      expect(await getFromApp(app, "/")).toEqual({ status: 200, body: "<h1>built by a custom command</h1>\n" });
    } finally {
      await app.stop();
    }
  }, 120_000);
});
