import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BuilderError } from "../../builder/src/protocol/shared.js";
import { type FakeWorker, startFakeWorker, svcLines } from "./build-support.js";
import { type BuilderProcess, signedFetch, startBuilder, TEST_TENANT } from "./builder-process.js";
import { appsDir, copyApp, releaseSpec, releaseToEnd } from "./release-support.js";
import { type FakeStorage, startFakeStorage } from "./snapshot-storage.js";

/** A builder with the npm registry and no python package index or wheels. */
let builder: BuilderProcess;
let worker: FakeWorker;
let storage: FakeStorage;
const scratch: string[] = [];
beforeAll(async () => {
  builder = await startBuilder({ env: { NPM_CONFIG_REGISTRY: "https://registry.npmjs.org/" } });
  worker = await startFakeWorker(builder.secret);
  storage = await startFakeStorage(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await storage?.close();
  await builder?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** A project made of the given files. */
async function project(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "svc-app-"));
  scratch.push(dir);
  for (const [path, content] of Object.entries(files)) {
    await mkdir(join(dir, path, ".."), { recursive: true });
    await writeFile(join(dir, path), content);
  }
  return dir;
}

let builds = 0;
/** Builds `dir` as an app of `runtime`; expects it to fail before anything of the project ran, and answers the error. */
async function refused(dir: string, runtime: "node" | "python" | "custom"): Promise<string> {
  const { status, result, log } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, `refused-${++builds}`, dir, runtime));
  expect(status, log).toMatchObject({ status: "failed", reason: "error", exitCode: null });
  expect(result).toBeNull();
  expect(log).not.toMatch(/ (out|err) /); // nothing ran
  expect(storage.parts.size).toBe(0); // nothing uploaded
  expect(svcLines(log).at(-1)).toBe(`job failed: ${status.error}`);
  return status.error ?? "";
}

describe("refused before anything runs", () => {
  it("a node app with nothing to start, saying what to add", async () => {
    const dir = await project({ "package.json": JSON.stringify({ scripts: { build: "tsc" } }), "src/main.ts": "" });
    expect(await refused(dir, "node")).toBe(
      "no start command: add a start script to package.json, or startCommand to svc.json (or a Procfile with a web: line); also looked for main in package.json and server.js, index.js, app.js",
    );
  });

  it("a node app with dependencies and no lockfile", async () => {
    const dir = await project({ "package.json": JSON.stringify({ scripts: { start: "node server.js" }, dependencies: { express: "4.22.1" } }), "server.js": "" });
    expect(await refused(dir, "node")).toBe(
      "package.json lists dependencies but no lockfile was found: commit one of package-lock.json, yarn.lock, pnpm-lock.yaml (the build installs exactly what it pins)",
    );
  });

  it("an svc.json with fields that do not fit the runtime, naming each", async () => {
    const dir = await project({ "svc.json": JSON.stringify({ runtime: "node", type: "worker", outputDir: "dist", port: 3000 }), "package.json": "{}", "index.js": "" });
    expect(await refused(dir, "node")).toBe(
      'svc.json: field "outputDir" is for static sites (runtime "static"); a node app keeps its whole folder and runs startCommand; ' +
        'field "port" is for web processes; a worker ("type": "worker") listens on no port and has no health check',
    );
  });

  it("an svc.json naming another runtime than the app's", async () => {
    const dir = await project({ "svc.json": JSON.stringify({ runtime: "python" }), "package.json": "{}", "index.js": "" });
    expect(await refused(dir, "node")).toBe(
      'svc.json says "runtime": "python" but the app\'s runtime is node: set "runtime": "node" in svc.json, or deploy to an app created with --runtime python',
    );
  });

  it("python requirements on a builder without a package index, naming the settings", async () => {
    expect(await refused(join(appsDir, "python-requirements"), "python")).toBe(
      "requirements.txt needs a python package index, and this builder has none: set BUILDER_PIP_INDEX_URL (a PyPI mirror) " +
        "or BUILDER_PIP_FIND_LINKS (a folder of wheels) in the builder's environment",
    );
  });

  it("a custom app without a start command", async () => {
    const dir = await project({ "svc.json": JSON.stringify({ runtime: "custom", buildCommand: "make" }), "Makefile": "" });
    expect(await refused(dir, "custom")).toBe("a custom app needs a start command: add startCommand to svc.json, or a Procfile with a web: line");
  });
});

describe("failing steps", () => {
  it("an install past the memory limit still says OOMKilled, during install", async () => {
    const dir = await copyApp("node-express");
    scratch.push(dir);
    // npm ci runs the project's own preinstall script before it fetches anything.
    const hog = `node -e "const a = []; setInterval(() => a.push(Buffer.alloc(8 * 1024 * 1024, 1)), 20)"`;
    await writeFile(join(dir, "package.json"), JSON.stringify({ name: "node-express-fixture", version: "1.0.0", scripts: { preinstall: hog, start: "node server.js" }, dependencies: { express: "4.22.1" } }));
    const { status, result, log } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "oom", dir, "node", { memoryMb: 128 }));
    expect(status, log).toMatchObject({ status: "failed", reason: "OOMKilled" });
    expect(status.error).toMatch(/^memory limit 128 MiB exceeded \(peak \d+ MiB\) during install; raise the app's memory limit or slim the build$/);
    expect(result).toBeNull();
    expect(storage.parts.size).toBe(0);
  }, 120_000);

  it("a build leaving a link that leads outside the app's folder fails, naming it", async () => {
    const dir = await project({
      "svc.json": JSON.stringify({ runtime: "custom", startCommand: "./serve", buildCommand: "ln -s /etc/passwd passwd && ln -s ../../x up && ln -s serve alias" }),
      serve: "",
    });
    const { status, log } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "escaping-link", dir, "custom"));
    expect(status, log).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toBe(
      "the release would hold 2 links leading outside the app's folder, which no node could restore: passwd -> /etc/passwd, up -> ../../x; " +
        "make them relative links inside the project, or remove them in the build command",
    );
    expect(storage.parts.size).toBe(0);
  });

  it("a failing build command reports its exit code, as for static sites", async () => {
    const dir = await project({ "svc.json": JSON.stringify({ runtime: "custom", startCommand: "./serve", buildCommand: "exit 3" }) });
    const { status } = await releaseToEnd(builder, storage, releaseSpec(worker, storage, "build-fails", dir, "custom"));
    expect(status).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 3, error: "the build failed: exit code 3" });
  });
});

describe("the release target", () => {
  it("answers 400 for a runtime the builder cannot run and parts below 5 MiB", async () => {
    const response = await signedFetch(builder, "/v1/builds", {
      method: "POST",
      body: {
        tenant: TEST_TENANT,
        sourceUrl: `${worker.url}/source/x`,
        env: {},
        memoryMb: 512,
        timeoutSeconds: 60,
        blobsEndpoint: worker.url,
        release: { runtime: "ruby", partUrlEndpoint: storage.partUrlEndpoint, partSizeBytes: 1024 },
      },
    });
    expect(response.status).toBe(400);
    const body = BuilderError.parse(await response.json());
    expect(body.error.details).toEqual(
      expect.arrayContaining([expect.objectContaining({ path: "release.runtime" }), expect.objectContaining({ path: "release.partSizeBytes" })]),
    );
  });
});
