import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BuilderError } from "../../builder/src/protocol/shared.js";
import type { BuildSpec } from "../../builder/src/protocol/static.js";
import { type BuilderProcess, followLog, jobStatus, signedFetch, startBuilder, TEST_TENANT } from "./builder-process.js";
import { type FakeWorker, buildToEnd, packProject, sitesDir, startFakeWorker, submitBuild, svcLines } from "./build-support.js";

let builder: BuilderProcess;
let worker: FakeWorker;
const scratch: string[] = [];
beforeAll(async () => {
  builder = await startBuilder();
  worker = await startFakeWorker(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await builder?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** A project made of the given files (string contents, or `{ link }` for a symlink). */
async function project(files: Record<string, string | { link: string }>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "svc-site-"));
  scratch.push(dir);
  for (const [path, content] of Object.entries(files)) {
    await mkdir(join(dir, path, ".."), { recursive: true });
    if (typeof content === "string") await writeFile(join(dir, path), content);
    else await symlink(content.link, join(dir, path));
  }
  return dir;
}

let builds = 0;
function specFor(dir: string, extra: Partial<BuildSpec> = {}): BuildSpec {
  const tag = `build-${++builds}`;
  return {
    sourceUrl: worker.serveSource(tag, packProject(dir)),
    tenant: TEST_TENANT,
    env: {},
    memoryMb: 512,
    timeoutSeconds: 60,
    blobsEndpoint: worker.blobsEndpoint(tag),
    ...extra,
  };
}

const outdir = join(sitesDir, "outdir");

describe("dependencies without a lockfile", () => {
  it("fails before installing anything, naming the three accepted lockfiles", async () => {
    const dir = await project({
      "package.json": JSON.stringify({ scripts: { build: "vite build" }, devDependencies: { vite: "8.3.8" } }),
      "index.html": "<!doctype html><title>x</title>",
    });
    const { status, result, log } = await buildToEnd(builder, specFor(dir));
    expect(status).toMatchObject({ status: "failed", reason: "error", exitCode: null });
    expect(status.error).toBe(
      "package.json lists dependencies but no lockfile was found: commit one of package-lock.json, yarn.lock, pnpm-lock.yaml (the build installs exactly what it pins)",
    );
    expect(result).toBeNull();
    expect(log).not.toMatch(/ (out|err) /); // no command ran
    expect(svcLines(log)).not.toContainEqual(expect.stringMatching(/^(\$|installing)/));
    expect(svcLines(log).at(-1)).toBe(`job failed: ${status.error}`);
  });
});

describe("install failures", () => {
  it("quote the package manager's own reason and say what to do", async () => {
    // npm ci checks the lockfile against package.json before it fetches anything.
    const dir = await project({
      "package.json": JSON.stringify({ name: "x", version: "1.0.0", scripts: { build: "true" }, dependencies: { "left-pad": "1.3.0" } }),
      "package-lock.json": JSON.stringify({ name: "x", version: "1.0.0", lockfileVersion: 3, requires: true, packages: { "": { name: "x", version: "1.0.0" } } }),
      "svc.json": JSON.stringify({ runtime: "static", buildCommand: "npm run build", outputDir: "static" }),
      "static/index.html": "<!doctype html>",
    });
    const { status, log } = await buildToEnd(builder, specFor(dir));
    expect(status, log).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 1 });
    // The package is named; npm's ~80 lines of usage text after it stay in the log only.
    expect(status.error).toBe(
      'install failed: exit code 1: npm ci found package-lock.json out of sync with package.json: "Missing: left-pad@1.3.0 from lock file"; run npm install and commit package-lock.json',
    );
    expect(log).toMatch(/ err npm error Usage:$/m);
    expect(svcLines(log)).not.toContainEqual(expect.stringMatching(/npm install --no-save|optional dependency/)); // no fallback for a real mismatch
    expect(svcLines(log).at(-1)).toBe(`job failed: ${status.error}`);
  });
});

describe("build failures", () => {
  it("quote the build tool's first error with its file and line", async () => {
    // A correct lockfile for typescript 5.9.3 (as npm 11 writes it), and a type error in the source.
    const dir = await project({
      "package.json": JSON.stringify({ name: "x", version: "1.0.0", scripts: { build: "tsc -p ." }, devDependencies: { typescript: "5.9.3" } }),
      "package-lock.json": JSON.stringify({
        name: "x",
        version: "1.0.0",
        lockfileVersion: 3,
        requires: true,
        packages: {
          "": { name: "x", version: "1.0.0", devDependencies: { typescript: "5.9.3" } },
          "node_modules/typescript": {
            version: "5.9.3",
            integrity: "sha512-jl1vZzPDinLr9eUt3J/t7V6FgNEw9QjvBPdysz9KfQDD41fQrC2Y4vKQdiaUpFT4bXlb1RHhLpp8wtm6M5TgSw==",
            dev: true,
            license: "Apache-2.0",
            bin: { tsc: "bin/tsc", tsserver: "bin/tsserver" },
            engines: { node: ">=14.17" },
          },
        },
      }),
      "tsconfig.json": JSON.stringify({ compilerOptions: { strict: true, noEmit: true }, include: ["src"] }),
      "src/title.ts": "export const ok = 1;\nexport const title: string = 3;\n",
      "svc.json": JSON.stringify({ runtime: "static", buildCommand: "npm run build", outputDir: "static" }),
      "static/index.html": "<!doctype html>",
    });
    const { status, log } = await buildToEnd(builder, specFor(dir));
    expect(status, log).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 2 });
    expect(status.error).toBe("the build failed: src/title.ts:2:14: error TS2322: Type 'number' is not assignable to type 'string'. (exit code 2)");
    expect(log).toMatch(/ out src\/title\.ts\(2,14\): error TS2322: /m);
    expect(svcLines(log).at(-1)).toBe(`job failed: ${status.error}`);
  });
});

describe("build output", () => {
  it("is stored without terminal colour codes", async () => {
    const colour = "printf '\\033[32m\\342\\234\\223\\033[39m built in \\033[1m1.2s\\033[22m\\n\\033]8;;http://x\\007link\\033]8;;\\007\\n'; printf '\\033[31mred on stderr\\033[0m' >&2";
    const { status, log } = await buildToEnd(builder, specFor(outdir, { overrides: { buildCommand: `${colour} && node build.js` } }));
    expect(status, log).toMatchObject({ status: "succeeded" });
    expect(log).not.toContain("\x1b");
    expect(log).toMatch(/ out \u2713 built in 1\.2s$/m);
    expect(log).toMatch(/ out link$/m);
    expect(log).toMatch(/ err red on stderr$/m);
  });
});

describe("outputDir", () => {
  it("names the folder the build did write when outputDir is wrong", async () => {
    const spec = specFor(outdir, { overrides: { buildCommand: "node build.js && mv build dist" } });
    const { status, log } = await buildToEnd(builder, spec);
    expect(status, log).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toBe(
      'outputDir "build" does not exist after the build; found: dist (set outputDir in svc.json to the folder the build writes)',
    );
  });

  it("leaves out links leading outside the output, and ignores project files linking out of the project", async () => {
    const dir = await project({
      "static/index.html": "<!doctype html><title>linked</title>",
      "static/passwd": { link: "/etc/passwd" },
      "static/escape": { link: "../svc.json" },
      "static/alias.html": { link: "index.html" },
      "svc.json": { link: "/etc/hostname" },
    });
    const { status, result, log } = await buildToEnd(builder, specFor(dir));
    expect(status, log).toMatchObject({ status: "succeeded" });
    expect(result?.manifest.map((entry) => entry.path)).toEqual(["/alias.html", "/index.html"]);
    expect(result?.manifest[0]?.sha256).toBe(result?.manifest[1]?.sha256);
    expect(worker.traffic(`build-${builds}`).asked).toHaveLength(1); // same bytes, announced once
    expect(log).toContain("no svc.json: detecting the framework");
    expect(log).toMatch(/left out 2 entries .*: (escape, passwd|passwd, escape)/);
  });
});

describe("limits", () => {
  it("ends a build allocating past its memory limit as OOMKilled, naming limit and peak", async () => {
    const hog = `node -e "const a = []; setInterval(() => a.push(Buffer.alloc(8 * 1024 * 1024, 1)), 20)"`;
    const { status, log } = await buildToEnd(builder, specFor(outdir, { memoryMb: 128, overrides: { buildCommand: hog } }));
    expect(status, log).toMatchObject({ status: "failed", reason: "OOMKilled" });
    expect(status.error).toMatch(
      /^memory limit 128 MiB exceeded \(peak \d+ MiB\) during the build; raise the app's memory limit or slim the build$/,
    );
    // A cgroup's peak stops at its limit; RSS sampling sees it pass the limit.
    expect(status.peakMemoryBytes).toBeGreaterThanOrEqual(128 * 1024 * 1024);
  });

  it("ends a build running past timeoutSeconds as timeout", async () => {
    const { status } = await buildToEnd(builder, specFor(outdir, { timeoutSeconds: 2, overrides: { buildCommand: "sleep 30" } }));
    expect(status).toMatchObject({ status: "failed", reason: "timeout", error: "timed out after 2 s (during the build)" });
  });

  it("reports a failing build command with its exit code", async () => {
    const { status } = await buildToEnd(builder, specFor(outdir, { overrides: { buildCommand: "exit 3" } }));
    expect(status).toMatchObject({ status: "failed", reason: "exit_code", exitCode: 3, error: "the build failed: exit code 3" });
  });

  it("cancels a running build", async () => {
    const submitted = await submitBuild(builder, specFor(outdir, { overrides: { buildCommand: "echo started; sleep 30" } }));
    let log = "";
    for (let tries = 0; !log.includes(" out started") && tries < 100; tries++) {
      log = await (await signedFetch(builder, `/v1/jobs/${submitted.id}/logs`)).text();
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const cancelled = await signedFetch(builder, `/v1/jobs/${submitted.id}/cancel`, { method: "POST" });
    expect(cancelled.status).toBe(200);
    await followLog(builder, submitted.id);
    expect(await jobStatus(builder, submitted.id)).toMatchObject({ status: "cancelled", reason: "cancelled", result: null });
  });
});

describe("configuration", () => {
  it("refuses an svc.json with unknown fields or bad values, naming each field", async () => {
    const dir = await project({
      "svc.json": JSON.stringify({ runtime: "ruby", outputdir: "dist", outputDir: "../up", spa: "yes" }),
      "static/index.html": "<!doctype html>",
    });
    const { status } = await buildToEnd(builder, specFor(dir));
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toMatch(/^svc\.json: /);
    expect(status.error).toContain(
      'unknown field "outputdir" (allowed: name, runtime, type, buildCommand, startCommand, outputDir, spa, port, healthCheckPath, startTimeoutSeconds, minReadySeconds, overlap, instances, keepDevDependencies)',
    );
    expect(status.error).toContain('field "runtime" must be one of "static", "node", "python", "custom" (got "ruby")');
    expect(status.error).toContain('field "outputDir" must be a folder inside the project');
    expect(status.error).toContain('field "spa" must be true or false');
  });

  it("refuses an svc.json naming a server runtime for a static app, saying how to agree", async () => {
    const dir = await project({ "svc.json": JSON.stringify({ runtime: "node", startCommand: "npm start" }), "static/index.html": "<!doctype html>" });
    const { status, log } = await buildToEnd(builder, specFor(dir));
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toBe(
      'svc.json says "runtime": "node" but the app\'s runtime is static: set "runtime": "static" in svc.json, or deploy to an app created with --runtime node',
    );
    expect(log).not.toMatch(/ (out|err) /);
  });

  it("refuses svc.json that is not JSON", async () => {
    const dir = await project({ "svc.json": "{ runtime: static }", "static/index.html": "<!doctype html>" });
    const { status } = await buildToEnd(builder, specFor(dir));
    expect(status.error).toMatch(/^svc\.json is not valid JSON \(/);
  });

  it("sends a Next.js app without output: 'export' to a server runtime", async () => {
    const dir = await project({
      "package.json": JSON.stringify({ scripts: { build: "next build" }, dependencies: { next: "16.0.0" } }),
      "package-lock.json": "{}",
      "next.config.mjs": "export default { reactStrictMode: true };\n",
    });
    const { status } = await buildToEnd(builder, specFor(dir));
    expect(status).toMatchObject({ status: "failed", reason: "error" });
    expect(status.error).toBe(
      "this Next.js app uses server features, which need a server runtime; for a static site set output: 'export' in next.config.js (or .mjs/.ts), or set outputDir in svc.json",
    );
  });

  it("says what it looked for when the project is not a static site", async () => {
    const dir = await project({ "README.md": "# nothing to serve\n" });
    const { status } = await buildToEnd(builder, specFor(dir));
    expect(status.error).toBe(
      "not a static site: looked for static/index.html, index.html at the root of a folder without package.json, outputDir in svc.json, or a framework in package.json (Vite, Next.js with output: 'export', Astro, SvelteKit with @sveltejs/adapter-static, Gatsby, Nuxt, Create React App, Eleventy)",
    );
  });

  it("answers 400 with details for an invalid BuildSpec", async () => {
    const response = await signedFetch(builder, "/v1/builds", {
      method: "POST",
      body: {
        sourceUrl: "file:///etc/passwd",
        env: {},
        memoryMb: 512,
        timeoutSeconds: 60,
        blobsEndpoint: worker.url,
        overrides: { outputDir: "../etc" },
      },
    });
    expect(response.status).toBe(400);
    const body = BuilderError.parse(await response.json());
    expect(body.error.code).toBe("VALIDATION_ERROR");
    expect(body.error.details).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ path: "sourceUrl" }),
        {
          path: "overrides.outputDir",
          message: 'must be a folder inside the project: relative, without .. (e.g. dist), or "." for a plain folder served as it is',
        },
      ]),
    );
  });
});
