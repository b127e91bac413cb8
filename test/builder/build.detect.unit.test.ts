import { describe, expect, it } from "vitest";
import { type ProjectFiles, describeNotStatic, detectProject, findLockfile } from "../../builder/src/static/detect.js";
import { ManifestEntry, projectDir } from "../../builder/src/protocol/static.js";
import { contentTypeFor } from "../../builder/src/static/content-types.js";
import { parseSvcJson } from "../../builder/src/static/project-config.js";
import { generateServerFiles } from "../../builder/src/static/server-config.js";

/** A project held in memory. */
function files(entries: Record<string, string>): ProjectFiles {
  return {
    read: async (path) => entries[path] ?? null,
    exists: async (path) => path in entries,
  };
}

const pkg = (deps: Record<string, string>, scripts: Record<string, string> = { build: "x" }) =>
  JSON.stringify({ scripts, dependencies: deps });

describe("detectProject", () => {
  it("finds Vite, with SPA routing when a client-side router is a dependency", async () => {
    expect(await detectProject(files({ "package.json": pkg({ vite: "8", "react-router": "7" }) }))).toEqual({
      framework: "vite",
      buildCommand: "npm run build",
      outputDir: "dist",
      spa: true,
    });
    expect(await detectProject(files({ "package.json": pkg({ vite: "8" }) }))).toEqual({
      framework: "vite",
      buildCommand: "npm run build",
      outputDir: "dist",
    });
  });

  it("reads a literal build.outDir from vite.config, and runs the framework CLI without a build script", async () => {
    const project = files({
      "package.json": pkg({ vite: "8" }, {}),
      "vite.config.ts": "export default defineConfig({ build: { outDir: './public-out/' } })",
    });
    expect(await detectProject(project)).toEqual({ framework: "vite", buildCommand: "vite build", outputDir: "public-out" });
  });

  it("runs the build script through the lockfile's package manager", async () => {
    const project = (lock: string) => files({ "package.json": pkg({ vite: "8" }), [lock]: "" });
    expect((await detectProject(project("pnpm-lock.yaml")))?.buildCommand).toBe("pnpm run build");
    expect((await detectProject(project("yarn.lock")))?.buildCommand).toBe("yarn run build");
    expect((await detectProject(project("package-lock.json")))?.buildCommand).toBe("npm run build");
  });

  it("accepts Next.js only with output: 'export', written to out/", async () => {
    for (const [name, config] of [
      ["next.config.js", "module.exports = { output: 'export' }"],
      ["next.config.mjs", 'export default { output: "export", images: { unoptimized: true } }'],
      ["next.config.ts", "const config: NextConfig = { output: `export` };\nexport default config;"],
    ] as const) {
      expect(await detectProject(files({ "package.json": pkg({ next: "16" }), [name]: config }))).toEqual({
        framework: "nextjs",
        buildCommand: "npm run build",
        outputDir: "out",
      });
    }
    const server = files({ "package.json": pkg({ next: "16" }), "next.config.js": "module.exports = { output: 'standalone' }" });
    expect(await detectProject(server)).toBeNull();
    expect(await describeNotStatic(server)).toMatch(/^this Next\.js app uses server features, which need a server runtime;/);
  });

  it("knows the output folders of Astro, SvelteKit static, Gatsby, Nuxt, Create React App and Eleventy", async () => {
    const detect = (deps: Record<string, string>, scripts?: Record<string, string>) =>
      detectProject(files({ "package.json": pkg(deps, scripts) }));
    expect(await detect({ astro: "5" })).toMatchObject({ framework: "astro", outputDir: "dist" });
    expect(await detect({ "@sveltejs/kit": "2", "@sveltejs/adapter-static": "3", vite: "7" })).toMatchObject({
      framework: "sveltekit",
      outputDir: "build",
    });
    expect(await detect({ gatsby: "5" })).toMatchObject({ framework: "gatsby", outputDir: "public" });
    expect(await detect({ nuxt: "4" })).toEqual({
      framework: "nuxt",
      buildCommand: "nuxt generate",
      outputDir: ".output/public",
    });
    expect(await detect({ nuxt: "4" }, { generate: "nuxt generate" })).toMatchObject({ buildCommand: "npm run generate" });
    expect(await detect({ "react-scripts": "5", "react-router-dom": "6" })).toEqual({
      framework: "create-react-app",
      buildCommand: "npm run build",
      outputDir: "build",
      spa: true,
    });
    expect(await detect({ "@11ty/eleventy": "3" }, {})).toEqual({
      framework: "eleventy",
      buildCommand: "eleventy",
      outputDir: "_site",
    });
  });

  it("sends server-rendering SvelteKit and Astro setups to a server runtime", async () => {
    const kit = files({ "package.json": pkg({ "@sveltejs/kit": "2", "@sveltejs/adapter-node": "5" }) });
    expect(await detectProject(kit)).toBeNull();
    expect(await describeNotStatic(kit)).toContain("use @sveltejs/adapter-static");
    const astro = files({ "package.json": pkg({ astro: "5" }), "astro.config.mjs": "export default { output: 'server' }" });
    expect(await detectProject(astro)).toBeNull();
    expect(await describeNotStatic(astro)).toContain("remove output: 'server'");
  });

  it("takes static/index.html as a site without a build, after frameworks", async () => {
    expect(await detectProject(files({ "static/index.html": "" }))).toEqual({
      framework: null,
      buildCommand: null,
      outputDir: "static",
    });
    const kit = files({
      "package.json": pkg({ "@sveltejs/kit": "2", "@sveltejs/adapter-static": "3" }),
      "static/index.html": "",
    });
    expect(await detectProject(kit)).toMatchObject({ framework: "sveltekit" });
  });

  it("finds nothing in an unrelated project, and says what it looked for", async () => {
    const project = files({ "package.json": pkg({ express: "5" }) });
    expect(await detectProject(project)).toBeNull();
    expect(await describeNotStatic(project)).toMatch(
      /^not a static site: looked for static\/index\.html, index\.html at the root of a folder without package\.json, outputDir in svc\.json/,
    );
    expect(await describeNotStatic(files({ "package.json": "{" }))).toMatch(/^package\.json is not valid JSON/);
  });
});

describe("findLockfile", () => {
  it("prefers the packageManager package.json names, then pnpm, yarn, npm", async () => {
    const all = { "package-lock.json": "", "yarn.lock": "", "pnpm-lock.yaml": "" };
    expect(await findLockfile(files(all), {})).toEqual({ file: "pnpm-lock.yaml", packageManager: "pnpm" });
    expect(await findLockfile(files(all), { packageManager: "yarn@4.5.0" })).toEqual({
      file: "yarn.lock",
      packageManager: "yarn",
    });
    expect(await findLockfile(files({}), {})).toBeNull();
  });
});

describe("contentTypeFor", () => {
  it("maps extensions case-insensitively through mime-types, text types in UTF-8, unknown ones to octet-stream", () => {
    expect(contentTypeFor("/index.html")).toBe("text/html; charset=utf-8");
    expect(contentTypeFor("/assets/app-1a2b3c4d.JS")).toBe("text/javascript; charset=utf-8");
    expect(contentTypeFor("/a.mjs")).toBe("text/javascript; charset=utf-8");
    expect(contentTypeFor("/data.json")).toBe("application/json; charset=utf-8");
    expect(contentTypeFor("/app.js.map")).toBe("application/json; charset=utf-8");
    expect(contentTypeFor("/site.webmanifest")).toBe("application/manifest+json; charset=utf-8");
    expect(contentTypeFor("/logo.svg")).toBe("image/svg+xml; charset=utf-8");
    expect(contentTypeFor("/photo.avif")).toBe("image/avif");
    expect(contentTypeFor("/font.woff2")).toBe("font/woff2");
    expect(contentTypeFor("/app.wasm")).toBe("application/wasm");
    expect(contentTypeFor("/clip.mp4")).toBe("video/mp4");
    expect(contentTypeFor("/favicon.ico")).toBe("image/vnd.microsoft.icon");
    expect(contentTypeFor("/feed.rss")).toBe("application/rss+xml; charset=utf-8");
    expect(contentTypeFor("/data.jsonld")).toBe("application/ld+json; charset=utf-8");
    expect(contentTypeFor("/photo.JPEG")).toBe("image/jpeg");
    expect(contentTypeFor("/_headers")).toBe("application/octet-stream");
    expect(contentTypeFor("/.nojekyll")).toBe("application/octet-stream");
    expect(contentTypeFor("/x.constructor")).toBe("application/octet-stream");
  });
});

describe("parseSvcJson", () => {
  it("accepts the documented fields and requires a runtime", () => {
    const config = { name: "blog", runtime: "static", buildCommand: "npm run build", outputDir: "dist", port: 80, spa: true };
    expect(parseSvcJson(JSON.stringify(config))).toEqual({ ok: true, config });
    expect(parseSvcJson("{}")).toEqual({ ok: false, error: 'svc.json: field "runtime" is required: one of "static", "node", "python", "custom"' });
    expect(parseSvcJson('{"runtime":"static","port":80.5}')).toEqual({
      ok: false,
      error: 'svc.json: field "port" must be an integer',
    });
    expect(parseSvcJson("[]")).toEqual({ ok: false, error: "svc.json: must be a JSON object" });
  });
});

describe("paths", () => {
  it("normalises project folders and refuses ones leaving the project", () => {
    expect(projectDir("./dist/")).toBe("dist");
    expect(projectDir(".output//public")).toBe(".output/public");
    for (const bad of ["/srv", "..", "a/../../b", ".", "", "a\\b"]) expect(projectDir(bad), bad).toBeNull();
  });

  it("accepts only rooted manifest paths without empty, . or .. segments", () => {
    const entry = (path: string) =>
      ManifestEntry.safeParse({ path, sha256: "a".repeat(64), size: 1, contentType: "text/plain" }).success;
    expect(entry("/index.html")).toBe(true);
    expect(entry("/a b/café.html")).toBe(true);
    for (const bad of ["index.html", "/../x", "/a/./b", "//a", "/a/"]) expect(entry(bad), bad).toBe(false);
  });
});

describe("generateServerFiles", () => {
  it("answers plain 404s when there is neither SPA routing nor a 404.html, on the configured port", () => {
    const { dockerfile, webServerConfig } = generateServerFiles({
      outputDir: ".output/public",
      spa: false,
      has404: false,
      port: 8080,
    });
    expect(dockerfile).toContain('COPY [".output/public/","/usr/share/nginx/html/"]');
    expect(dockerfile).toContain("EXPOSE 8080");
    expect(webServerConfig).toContain("listen 8080;");
    expect(webServerConfig).toContain("try_files $uri $uri/index.html =404;");
    expect(webServerConfig).not.toContain("error_page");
  });

  it("ignores 404.html for a single-page app", () => {
    const { webServerConfig } = generateServerFiles({ outputDir: "dist", spa: true, has404: true, port: 80 });
    expect(webServerConfig).toContain("try_files $uri $uri/index.html /index.html;");
    expect(webServerConfig).not.toContain("error_page");
  });
});
