import { describe, expect, it } from "vitest";
import { type ProjectFiles, detectProject, leftOutOfPlainFolder, planSite } from "../../builder/src/static/detect.js";
import { describeInstallFailure } from "../../builder/src/jobs/install-error.js";
import { BuildSpec, siteDir } from "../../builder/src/protocol/static.js";
import { parseSvcJson } from "../../builder/src/static/project-config.js";
import { generateServerFiles } from "../../builder/src/static/server-config.js";

/** A project held in memory. */
function files(entries: Record<string, string>): ProjectFiles {
  return { read: async (path) => entries[path] ?? null, exists: async (path) => path in entries };
}

describe("the plain-folder rule (one rule for svc init, svc deploy and the builder)", () => {
  it("detects index.html at the root of a folder without package.json as a site served from the root", async () => {
    expect(await detectProject(files({ "index.html": "<h1>hi</h1>", "style.css": "" }))).toEqual({
      framework: null,
      buildCommand: null,
      outputDir: ".",
    });
    // static/index.html keeps priority (spec rule 1), and a package.json means there is a build to publish instead.
    expect((await detectProject(files({ "index.html": "", "static/index.html": "" })))?.outputDir).toBe("static");
    expect(await detectProject(files({ "index.html": "", "package.json": "{}" }))).toBeNull();
  });

  it("accepts . as outputDir in svc.json and the build spec, and normalises ./ to it", () => {
    expect(siteDir(".")).toBe(".");
    expect(siteDir("./")).toBe(".");
    expect(siteDir("./dist/")).toBe("dist");
    for (const bad of ["", "..", "/", "/srv", "../x"]) expect(siteDir(bad), bad).toBeNull();
    expect(parseSvcJson('{"runtime":"static","outputDir":"."}')).toEqual({ ok: true, config: { runtime: "static", outputDir: "." } });
    expect(parseSvcJson('{"runtime":"static","outputDir":".."}')).toMatchObject({ ok: false });
    const spec = { tenant: "t", sourceUrl: "http://x/s", env: {}, memoryMb: 256, timeoutSeconds: 60, blobsEndpoint: "http://x/b" };
    expect(BuildSpec.safeParse({ ...spec, overrides: { outputDir: "." } }).success).toBe(true);
    expect(BuildSpec.safeParse({ ...spec, overrides: { outputDir: ".." } }).success).toBe(false);
  });

  it("serves the root only for a plain folder: refused with a package.json or a build command, saying why", async () => {
    const plain = await planSite(files({ "index.html": "" }), null);
    expect(plain).toMatchObject({ ok: true, value: { outputDir: ".", buildCommand: null, install: null, spa: false } });
    expect(plain.ok && plain.value.summary).toBe(
      "static site: output . (the project root) (detected), build none (default), spa false (default)",
    );

    const withPackage = await planSite(files({ "index.html": "", "package.json": "{}" }), { outputDir: "." });
    expect(withPackage).toEqual({ ok: false, error: expect.stringContaining('outputDir "." (the project root) is served only for a plain folder') });
    expect(!withPackage.ok && withPackage.error).toContain("this project has a package.json");

    const withCommand = await planSite(files({ "index.html": "" }), { outputDir: ".", buildCommand: "make" });
    expect(!withCommand.ok && withCommand.error).toContain('has a build command ("make")');
  });

  it("leaves svc.json, container files and dotfiles out of a plain folder, but not .well-known", () => {
    for (const path of ["svc.json", "Dockerfile", ".gitignore", ".env", ".vscode", "docs/.env.local", "a/.git/config"]) {
      expect(leftOutOfPlainFolder(path), path).toBe(true);
    }
    for (const path of ["index.html", "docs/svc.json", ".well-known", ".well-known/security.txt", "img/logo.svg"]) {
      expect(leftOutOfPlainFolder(path), path).toBe(false);
    }
  });

  it("generates an nginx configuration that refuses what the edge leaves out of a plain folder", () => {
    const { dockerfile, webServerConfig } = generateServerFiles({ outputDir: ".", spa: false, has404: false, port: 80 });
    expect(dockerfile).toContain('COPY ["./","/usr/share/nginx/html/"]');
    expect(webServerConfig).toContain("location ~ /\\.(?!well-known/) { return 404; }");
    expect(webServerConfig).toContain("svc\\.json|Dockerfile");
    expect(generateServerFiles({ outputDir: "dist", spa: false, has404: false, port: 80 }).webServerConfig).not.toContain("well-known");
  });
});

describe("planSite", () => {
  it("refuses dependencies without a lockfile and names the lockfile it installs from", async () => {
    const pkg = JSON.stringify({ scripts: { build: "vite build" }, devDependencies: { vite: "8" } });
    expect(await planSite(files({ "package.json": pkg }), null)).toEqual({
      ok: false,
      error: expect.stringContaining("package.json lists dependencies but no lockfile was found"),
    });
    expect(await planSite(files({ "package.json": pkg, "package-lock.json": "{}" }), null)).toMatchObject({
      ok: true,
      value: { framework: "vite", buildCommand: "npm run build", outputDir: "dist", install: { packageManager: "npm", lockfile: "package-lock.json" } },
    });
  });
});

describe("describeInstallFailure", () => {
  it("quotes npm's first line with a message, not its code line, and says how to fix an out-of-sync lockfile", () => {
    // What `npm ci` (npm 11) prints when package.json lists a dependency the lockfile lacks.
    const npm = [
      "npm error code EUSAGE",
      "npm error",
      "npm error `npm ci` can only install packages when your package.json and package-lock.json or npm-shrinkwrap.json are in sync. Please update your lock file with `npm install` before continuing.",
      "npm error",
      "npm error Missing: left-pad@1.3.0 from lock file",
      "npm error Clean install a project",
    ];
    const said = describeInstallFailure(["added 3 packages", ...npm], "package-lock.json", "npm");
    // npm's sentence names no package; its list does (install-error.unit.test.ts has more).
    expect(said).toBe(
      'npm ci found package-lock.json out of sync with package.json: "Missing: left-pad@1.3.0 from lock file"; run npm install and commit package-lock.json',
    );
    // Without the list (npm versions that print none), the sentence itself is quoted.
    expect(describeInstallFailure(npm.slice(0, 3), "package-lock.json", "npm")).toBe(
      `"${npm[2]}" (EUSAGE); the lockfile is out of sync with package.json: run npm install and commit package-lock.json`,
    );
    const long = describeInstallFailure([`npm error ${"x".repeat(400)}`], "package-lock.json", "npm");
    expect(long).toBe(`"npm error ${"x".repeat(229)}…"; the build log above has the whole output`);
  });

  it("recognises pnpm, yarn and registry failures, and says nothing when no line gives a reason", () => {
    expect(
      describeInstallFailure([' ERR_PNPM_OUTDATED_LOCKFILE  Cannot install with "frozen-lockfile" because pnpm-lock.yaml is not up to date'], "pnpm-lock.yaml", "pnpm"),
    ).toContain("run pnpm install and commit pnpm-lock.yaml");
    expect(describeInstallFailure(["error Your lockfile needs to be updated, but yarn was run with `--frozen-lockfile`."], "yarn.lock", "yarn")).toBe(
      '"error Your lockfile needs to be updated, but yarn was run with `--frozen-lockfile`."; the lockfile is out of sync with package.json: run yarn install and commit yarn.lock',
    );
    expect(
      describeInstallFailure(["npm error code E404", "npm error 404 Not Found - GET http://registry/nope - Not found"], "package-lock.json", "npm"),
    ).toContain("(E404); a dependency is not in the package registry");
    expect(describeInstallFailure(["npm error code EFOO", "npm error something odd"], "package-lock.json", "npm")).toBe(
      '"npm error something odd" (EFOO); the build log above has the whole output',
    );
    expect(describeInstallFailure(["npm warn deprecated x", "Killed"], "package-lock.json", "npm")).toBeNull();
  });
});
