import { describe, expect, it } from "vitest";
import { isImmutable } from "../../worker/sites/fingerprint";
import { cacheControl, type ManifestEntry } from "../../worker/sites/resolve";
import fixture from "../fixtures/hashed-assets.json";
import { get, HTML, newSite } from "./sites-helpers";

type Build = { tool: string; framework: string | null; hashed: string[]; notHashed: string[]; missed?: Record<string, string> };
const builds = fixture.builds as Build[];
const FRAMEWORKS = [null, "vite", "nextjs", "astro", "sveltekit", "nuxt", "gatsby", "create-react-app", "eleventy"];
const IMMUTABLE = "public, max-age=31536000, immutable";

const entry = (contentType: string, immutable?: true): ManifestEntry => ({ sha256: "a".repeat(64), size: 1, contentType, ...(immutable ? { immutable } : {}) });
const fileDecision = (path: string, e: ManifestEntry) => ({ kind: "file" as const, path, entry: e, status: 200 as const });

describe("fingerprinted files (real build outputs, test/fixtures/hashed-assets.json)", () => {
  for (const build of builds) {
    it(`${build.tool}: every hashed file is immutable, no other file is`, () => {
      const missed = new Set(Object.keys(build.missed ?? {}));
      expect(build.hashed.filter((p) => !missed.has(p) && !isImmutable(p, build.framework))).toEqual([]);
      expect([...missed].filter((p) => isImmutable(p, build.framework))).toEqual([]);
      expect(build.notHashed.filter((p) => isImmutable(p, build.framework))).toEqual([]);
    });
  }

  it("calls no hand-written name immutable, for any framework", () => {
    for (const framework of FRAMEWORKS) {
      expect(fixture.handWritten.notHashed.filter((p) => isImmutable(p, framework)), String(framework)).toEqual([]);
    }
  });

  it("trusts a framework's folder only for that framework's builds", () => {
    expect(isImmutable("/_next/static/chunks/0cz1d0mv5g_q7.js", "nextjs")).toBe(true);
    expect(isImmutable("/_next/static/chunks/0cz1d0mv5g_q7.js", null)).toBe(false);
    expect(isImmutable("/_astro/about.DQvOIEEG.css", "astro")).toBe(true);
    expect(isImmutable("/_app/immutable/chunks/B2IFXpC9.js", "sveltekit")).toBe(true);
    expect(isImmutable("/_app/immutable/chunks/B2IFXpC9.js", "vite")).toBe(false);
    // Vite copies public/assets/ beside its hashed assets: the folder vouches for nothing.
    expect(isImmutable("/assets/logo.png", "vite")).toBe(false);
    // A source map is not named after its own content, even in a framework's folder.
    expect(isImmutable("/_next/static/chunks/0cz1d0mv5g_q7.js.map", "nextjs")).toBe(false);
  });
});

describe("Cache-Control of a file", () => {
  it("follows the manifest's marks when it has them", () => {
    const js = "text/javascript; charset=utf-8";
    expect(cacheControl(fileDecision("/_next/static/chunks/0cz1d0mv5g_q7.js", entry(js, true)), true)).toBe(IMMUTABLE);
    expect(cacheControl(fileDecision("/assets/app-4f3a9c1b.js", entry(js)), true)).toBe("no-cache");
    expect(cacheControl(fileDecision("/page.html", entry(HTML, true)), true)).toBe("no-cache");
  });

  it("reads the name in manifests stored before marks existed: the issue's examples, and no hand-written name", () => {
    const css = "text/css; charset=utf-8";
    expect(cacheControl(fileDecision("/_astro/about.DQvOIEEG.css", entry(css)))).toBe(IMMUTABLE);
    expect(cacheControl(fileDecision("/assets/app-4f3a9c1b.js", entry(css)))).toBe(IMMUTABLE);
    for (const path of fixture.handWritten.notHashed) {
      expect([path, cacheControl(fileDecision(path, entry("application/octet-stream")))]).toEqual([path, "no-cache"]);
    }
  });

  it("is served immutable for a file the deployment marked, no-cache for one it did not", async () => {
    const js = "text/javascript; charset=utf-8";
    const files: Record<string, [string, string]> = {
      "/index.html": [HTML, "<h1>home</h1>"],
      "/_next/static/chunks/0cz1d0mv5g_q7.js": [js, "1"],
      "/font-awesome-webfont.woff2": ["font/woff2", "2"],
    };
    const marked = await newSite(false, files, undefined, {
      immutableMarked: true,
      files: { "/_next/static/chunks/0cz1d0mv5g_q7.js": entry(js, true) },
    });
    expect((await get(marked.name, "/_next/static/chunks/0cz1d0mv5g_q7.js")).headers.get("Cache-Control")).toBe(IMMUTABLE);
    expect((await get(marked.name, "/font-awesome-webfont.woff2")).headers.get("Cache-Control")).toBe("no-cache");
    const old = await newSite(false, files);
    expect((await get(old.name, "/font-awesome-webfont.woff2")).headers.get("Cache-Control")).toBe("no-cache");
  });
});
