import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BuildSpec } from "../../builder/src/protocol/static.js";
import { type BuilderProcess, startBuilder, TEST_TENANT } from "./builder-process.js";
import { type FakeWorker, buildToEnd, copyFixture, packProject, sitesDir, startFakeWorker, svcLines } from "./build-support.js";

const REGISTRY = "https://registry.npmjs.org/";

let builder: BuilderProcess;
let worker: FakeWorker;
beforeAll(async () => {
  // The mirror setting the builder passes to installs: the public registry stands in for it here.
  builder = await startBuilder({ env: { NPM_CONFIG_REGISTRY: REGISTRY } });
  worker = await startFakeWorker(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await builder?.stop();
});

/** A spec for the project in `dir`, published under `tag`. */
function specFor(tag: string, dir: string, extra: Partial<BuildSpec> = {}): BuildSpec {
  return {
    sourceUrl: worker.serveSource(tag, packProject(dir)),
    tenant: TEST_TENANT,
    env: {},
    memoryMb: 1024,
    timeoutSeconds: 120,
    blobsEndpoint: worker.blobsEndpoint(tag),
    ...extra,
  };
}

describe("plain static/ folder", () => {
  it("publishes static/ without a build, with text types in UTF-8, and retries a failed PUT", async () => {
    worker.failNextPuts(1);
    const { status, result, log } = await buildToEnd(builder, specFor("plain", join(sitesDir, "plain")));
    expect(status, log).toMatchObject({ status: "succeeded", reason: null, exitCode: null });
    expect(result).toMatchObject({ framework: null, buildCommand: null, outputDir: "static", spa: false, packageManager: null });
    const index = await readFile(join(sitesDir, "plain/static/index.html"));
    expect(result?.manifest).toEqual([
      { path: "/index.html", sha256: sha256(index), size: index.length, contentType: "text/html; charset=utf-8" },
      expect.objectContaining({ path: "/style.css", contentType: "text/css; charset=utf-8" }),
    ]);
    const traffic = worker.traffic("plain");
    expect(traffic.failedPuts).toBe(1);
    expect(traffic.put.sort()).toEqual(result?.manifest.map((entry) => entry.sha256).sort());
    expect(result?.uploadedBlobs).toBe(2);
    expect(worker.stored.get(sha256(index))?.bytes.equals(index)).toBe(true);
    expect(svcLines(log)).not.toContainEqual(expect.stringMatching(/^\$ /)); // nothing ran
    expect(svcLines(log).at(-1)).toBe("job succeeded (exit code 0)");
  });

  it("uploads exactly the one changed file on a redeploy", async () => {
    const dir = await copyFixture("plain");
    try {
      const first = await buildToEnd(builder, specFor("redeploy-1", dir));
      expect(first.status.status).toBe("succeeded");
      await writeFile(join(dir, "static/style.css"), "body { color: rebeccapurple; }\n");
      const second = await buildToEnd(builder, specFor("redeploy-2", dir));
      expect(second.status.status, second.log).toBe("succeeded");
      const css = second.result?.manifest.find((entry) => entry.path === "/style.css");
      expect(worker.traffic("redeploy-2").asked).toHaveLength(2);
      expect(worker.traffic("redeploy-2").missing).toEqual([css?.sha256]);
      expect(worker.traffic("redeploy-2").put).toEqual([css?.sha256]);
      expect(second.result?.uploadedBlobs).toBe(1);
      expect(second.log).toContain("blobs: 2 distinct, 1 already stored, 1 uploaded (31 B)");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("announces blobs in batches of at most 500, and identical files once", async () => {
    const dir = await copyFixture("plain");
    try {
      await mkdir(join(dir, "static/pages"));
      for (let page = 0; page < 1100; page++) await writeFile(join(dir, `static/pages/${page}.txt`), `page ${page}\n`);
      await writeFile(join(dir, "static/copy-of-index.html"), await readFile(join(dir, "static/index.html")));
      const spec = specFor("many-files", dir, { blobsEndpoint: worker.blobsEndpoint("many-files", { hasAll: true }) });
      const { status, result } = await buildToEnd(builder, spec);
      expect(status.status).toBe("succeeded");
      expect(result?.manifest).toHaveLength(1103);
      expect(worker.traffic("many-files").batches).toEqual([500, 500, 102]);
      expect(result?.uploadedBlobs).toBe(0);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("serves static/ as it is, without running package.json's build script", async () => {
    const dir = await copyFixture("plain");
    try {
      await writeFile(join(dir, "package.json"), JSON.stringify({ scripts: { build: "exit 1" } }));
      const { status, result } = await buildToEnd(builder, specFor("plain-with-script", dir));
      expect(status.status).toBe("succeeded");
      expect(result).toMatchObject({ buildCommand: null, outputDir: "static" });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("generates no container files when the project brings a Dockerfile", async () => {
    const dir = await copyFixture("plain");
    try {
      await writeFile(join(dir, "Dockerfile"), "FROM caddy:alpine\nCOPY static/ /srv/\n");
      const { status, result } = await buildToEnd(builder, specFor("own-dockerfile", dir));
      expect(status.status).toBe("succeeded");
      expect(result?.artifacts).toBeNull();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("a plain folder with index.html at its root", () => {
  it("publishes the root without svc.json, dotfiles, container files or what .gitignore leaves out", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-site-plain-root-"));
    const write = async (path: string, content: string) => {
      await mkdir(join(dir, path, ".."), { recursive: true });
      await writeFile(join(dir, path), content);
    };
    await write("index.html", "<!doctype html><h1>root</h1>");
    await write("css/site.css", "h1 { color: red }");
    await write(".well-known/security.txt", "Contact: mailto:a@example.com");
    await write("svc.json", JSON.stringify({ name: "root", runtime: "static", outputDir: ".", spa: false }));
    await write(".gitignore", "drafts/\n*.log\n");
    await write(".env", "SECRET=1");
    await write("drafts/next.html", "unfinished");
    await write("debug.log", "x");
    await write("notes/.secret", "x");
    try {
      const { status, result, log } = await buildToEnd(builder, specFor("plain-root", dir));
      expect(status, log).toMatchObject({ status: "succeeded" });
      expect(result?.outputDir).toBe(".");
      expect(result?.manifest.map((entry) => entry.path)).toEqual(["/.well-known/security.txt", "/css/site.css", "/index.html"]);
      expect(log).toContain("static site: output . (the project root) (svc.json), build none (default)");
      expect(log).toContain(
        "served the project root as a plain folder, leaving out what is not site content (svc.json, dotfiles, .gitignore'd paths): .env, .gitignore, debug.log, drafts/, notes/.secret, svc.json",
      );
      expect(result?.artifacts?.webServerConfig).toContain("location ~ /\\.(?!well-known/)");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses the root as output of a project with a package.json, before anything runs", async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-site-root-pkg-"));
    await writeFile(join(dir, "index.html"), "<!doctype html>");
    await writeFile(join(dir, "package.json"), JSON.stringify({ scripts: { build: "node build.js" } }));
    await writeFile(join(dir, "svc.json"), JSON.stringify({ runtime: "static", outputDir: "." }));
    try {
      const { status, log } = await buildToEnd(builder, specFor("root-with-package", dir));
      expect(status).toMatchObject({ status: "failed", reason: "error" });
      expect(status.error).toContain('outputDir "." (the project root) is served only for a plain folder');
      expect(status.error).toContain('this project has a package.json and has a build command ("npm run build")');
      expect(log).not.toMatch(/ (out|err) /);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("svc.json with outputDir", () => {
  it("runs buildCommand, publishes outputDir with its 404.html, and generates an nginx config using it", async () => {
    const { status, result, log } = await buildToEnd(builder, specFor("outdir", join(sitesDir, "outdir")));
    expect(status, log).toMatchObject({ status: "succeeded", exitCode: 0 });
    expect(result).toMatchObject({
      framework: null,
      buildCommand: "node build.js",
      outputDir: "build",
      spa: false,
      packageManager: null,
    });
    expect(result?.manifest.map((entry) => entry.path)).toEqual(["/404.html", "/about/index.html", "/index.html"]);
    expect(log).toMatch(/ out wrote build\/index.html/);
    expect(log).toContain("package.json lists no dependencies: nothing to install");

    const { dockerfile, webServerConfig } = result!.artifacts!;
    expect(dockerfile).toMatch(/^FROM nginx:stable-alpine$/m);
    expect(dockerfile).toContain('COPY ["build/","/usr/share/nginx/html/"]');
    expect(dockerfile).toContain("COPY svc-nginx.conf /etc/nginx/conf.d/default.conf");
    expect(webServerConfig).toContain("error_page 404 /404.html;");
    expect(webServerConfig).toContain("try_files $uri $uri/index.html =404;");
    expect(webServerConfig).not.toContain("/index.html;\n");
  });
});

describe("Vite + React app with a client-side router", () => {
  let outcome: Awaited<ReturnType<typeof buildToEnd>>;
  beforeAll(async () => {
    const env = { VITE_GREETING: "hello from the app's env", SECRET_TOKEN: "s3cr3t-never-in-the-bundle" };
    outcome = await buildToEnd(builder, specFor("vite-react", join(sitesDir, "vite-react"), { env }));
  }, 180_000);

  it("installs from the registry with the committed lockfile, then builds", () => {
    const { status, result, log } = outcome;
    expect(status, log).toMatchObject({ status: "succeeded", reason: null, exitCode: 0 });
    expect(result).toMatchObject({
      framework: "vite",
      buildCommand: "npm run build",
      outputDir: "dist",
      spa: true,
      packageManager: "npm",
    });
    const lines = svcLines(log);
    expect(lines).toContain(
      `installing dependencies from package-lock.json with npm from the registry mirror ${REGISTRY} (the only host builds can reach)`,
    );
    expect(lines).toContain("$ npm ci --no-audit --no-fund");
    expect(lines).toContain('static site (Vite): output dist (detected), build "npm run build" (detected), spa true (detected)');
    expect(log).toMatch(/ out added \d+ packages/);
    expect(log).toMatch(/ out .*built in/);
    expect(status.peakMemoryBytes).toBeGreaterThan(0);
    expect(result?.peakMemoryBytes).toBe(status.peakMemoryBytes);
  });

  it("publishes hashed assets with their content types", () => {
    const manifest = outcome.result!.manifest;
    const byType = (pattern: RegExp) => manifest.filter((entry) => pattern.test(entry.path));
    expect(byType(/^\/index\.html$/)).toEqual([expect.objectContaining({ contentType: "text/html; charset=utf-8" })]);
    expect(byType(/^\/assets\/index-[\w-]{8}\.js$/)).toEqual([
      expect.objectContaining({ contentType: "text/javascript; charset=utf-8" }),
    ]);
    expect(byType(/^\/assets\/index-[\w-]{8}\.css$/)).toEqual([
      expect.objectContaining({ contentType: "text/css; charset=utf-8" }),
    ]);
    for (const entry of manifest) expect(worker.stored.get(entry.sha256)?.bytes.length).toBe(entry.size);
  });

  it("bakes VITE_GREETING into the bundle, and no variable without the prefix", () => {
    const script = outcome.result!.manifest.find((entry) => entry.path.endsWith(".js"))!;
    const bundle = worker.stored.get(script.sha256)!.bytes.toString("utf8");
    expect(bundle).toContain("hello from the app's env");
    expect(bundle).toContain("Deep route rendered by the client-side router");
    expect(bundle).not.toContain("s3cr3t-never-in-the-bundle");
  });

  it("generates an nginx config with the SPA fallback", () => {
    const { webServerConfig, dockerfile } = outcome.result!.artifacts!;
    expect(webServerConfig).toContain("try_files $uri $uri/index.html /index.html;");
    expect(webServerConfig).not.toContain("error_page");
    expect(dockerfile).toContain('COPY ["dist/","/usr/share/nginx/html/"]');
  });
});

describe("yarn.lock on a builder without yarn", () => {
  // The sandbox shows a job the host's /usr: with yarn installed there, the npx path is not taken.
  it.runIf(!onPath("yarn"))("installs and builds with yarn 1 run through npx", async () => {
    const spec = specFor("yarn", join(sitesDir, "yarn"));
    const { status, result, log } = await buildToEnd(builder, spec);
    expect(status, log).toMatchObject({ status: "succeeded" });
    expect(result).toMatchObject({ packageManager: "yarn", buildCommand: "yarn run build", outputDir: "out" });
    expect(svcLines(log)).toContain(
      `installing dependencies from yarn.lock with yarn (yarn is not installed: running yarn@1 through npx) from the registry mirror ${REGISTRY} (the only host builds can reach)`,
    );
    expect(svcLines(log)).toContain("$ yarn install --frozen-lockfile");
    const page = worker.stored.get(result!.manifest[0]!.sha256)!.bytes.toString("utf8");
    expect(page).toContain("......padded by left-pad");
  });
});

/** Whether the host (whose /usr jobs see) has a command in the sandbox's default PATH. */
function onPath(command: string): boolean {
  return ["/usr/local/bin", "/usr/bin", "/bin"].some((dir) => existsSync(join(dir, command)));
}

function sha256(bytes: Buffer): string {
  return createHash("sha256").update(bytes).digest("hex");
}
