import { describe, expect, it } from "vitest";
import { BlobCache } from "../../worker/sites/blob-cache";
import { headersFor, parseHeadersFile } from "../../worker/sites/headers";
import { cacheControl, decide, type ManifestEntry, matchesEtag, normalisePath } from "../../worker/sites/resolve";

const entry = (contentType = "text/html; charset=utf-8"): ManifestEntry => ({ sha256: "a".repeat(64), size: 1, contentType });
const site = (...paths: string[]) => {
  const files = new Map(paths.map((p) => [p, entry(p.endsWith(".js") ? "text/javascript; charset=utf-8" : "text/html; charset=utf-8")]));
  return (p: string) => files.get(p);
};

describe("decide (static-site serving rules)", () => {
  const lookup = site("/index.html", "/about/index.html", "/docs.html", "/404.html", "/assets/app-4f3a9c1b.js");

  it("serves files, dir/ → dir/index.html, and extensionless pages", () => {
    expect(decide("/", lookup, false)).toMatchObject({ kind: "file", path: "/index.html", status: 200 });
    expect(decide("/assets/app-4f3a9c1b.js", lookup, false)).toMatchObject({ kind: "file", path: "/assets/app-4f3a9c1b.js" });
    expect(decide("/about/", lookup, false)).toMatchObject({ kind: "file", path: "/about/index.html" });
    expect(decide("/about", lookup, false)).toMatchObject({ kind: "file", path: "/about/index.html" });
    expect(decide("/docs", lookup, false)).toMatchObject({ kind: "file", path: "/docs.html" });
  });

  it("answers a miss with index.html (200) when spa, ignoring 404.html", () => {
    expect(decide("/deep/route", lookup, true)).toMatchObject({ kind: "spa-fallback", path: "/index.html", status: 200 });
  });

  it("answers a miss with 404.html (404) without spa, or a plain 404 when there is none", () => {
    expect(decide("/nope", lookup, false)).toMatchObject({ kind: "not-found-page", path: "/404.html", status: 404 });
    expect(decide("/nope", site("/index.html"), false)).toEqual({ kind: "not-found", status: 404 });
  });

  it("never resolves paths that climb out or are malformed", () => {
    expect(normalisePath("/a/../etc/passwd")).toBeNull();
    expect(normalisePath("/a/%2e%2e/b")).toBeNull();
    expect(normalisePath("/%E0%A4%A")).toBeNull();
    expect(normalisePath("/caf%C3%A9.html")).toBe("/café.html");
    expect(decide("/%2e%2e/index.html", lookup, false)).toMatchObject({ kind: "not-found-page" });
  });

  it("marks HTML and fallbacks no-cache, fingerprinted assets immutable", () => {
    expect(cacheControl(decide("/", lookup, false) as never)).toBe("no-cache");
    expect(cacheControl(decide("/deep", lookup, true) as never)).toBe("no-cache");
    expect(cacheControl(decide("/assets/app-4f3a9c1b.js", lookup, false) as never)).toBe("public, max-age=31536000, immutable");
  });

  it("matches If-None-Match lists, weak tags and *", () => {
    expect(matchesEtag('"x", "abc"', '"abc"')).toBe(true);
    expect(matchesEtag('W/"abc"', '"abc"')).toBe(true);
    expect(matchesEtag("*", '"abc"')).toBe(true);
    expect(matchesEtag('"other"', '"abc"')).toBe(false);
    expect(matchesEtag(null, '"abc"')).toBe(false);
  });
});

describe("_headers files", () => {
  const parsed = parseHeadersFile(`# security
/*
  X-Frame-Options: DENY
  X-Content-Type-Options: nosniff

/assets/*
  Access-Control-Allow-Origin: *
  ETag: "forged"
/blog/:slug
  X-Robots-Tag: noindex
https://example.com/*
  X-Ignored: yes
not-a-pattern
  X-Ignored: yes
`);
  const rules = parsed.ok ? parsed.rules : [];

  it("parses patterns and their headers, dropping reserved names and non-path patterns", () => {
    expect(rules.map((r) => r.pattern)).toEqual(["/*", "/assets/*", "/blog/:slug"]);
    expect(rules[1]!.headers).toEqual([["Access-Control-Allow-Origin", "*"]]);
  });

  it("applies every matching rule: * spans segments, :name matches one", () => {
    expect(headersFor(rules, "/assets/js/app.js")).toEqual({
      "X-Frame-Options": "DENY",
      "X-Content-Type-Options": "nosniff",
      "Access-Control-Allow-Origin": "*",
    });
    expect(headersFor(rules, "/blog/hello")).toMatchObject({ "X-Robots-Tag": "noindex" });
    expect(headersFor(rules, "/blog/hello/comments")).not.toHaveProperty("X-Robots-Tag");
    expect(headersFor(undefined, "/")).toEqual({});
  });
});

describe("BlobCache (hot files in isolate memory)", () => {
  const bytes = (n: number) => new Uint8Array(n);

  it("keeps blobs up to the entry limit and evicts the least recently used to stay under the total", () => {
    const cache = new BlobCache({ maxBytes: 300, maxEntryBytes: 120 });
    cache.set("a", bytes(100));
    cache.set("b", bytes(100));
    cache.set("c", bytes(100));
    expect(cache.bytes).toBe(300);
    expect(cache.get("a")).toBeDefined(); // a is now the most recent: b goes first
    cache.set("d", bytes(100));
    expect([cache.get("a"), cache.get("b"), cache.get("c"), cache.get("d")].map((entry) => entry !== undefined)).toEqual([true, false, true, true]);
    expect(cache.bytes).toBe(300);
  });

  it("refuses blobs over the entry limit and counts a replaced entry once", () => {
    const cache = new BlobCache({ maxBytes: 1000, maxEntryBytes: 120 });
    expect(cache.admits(121)).toBe(false);
    cache.set("big", bytes(121));
    expect(cache.get("big")).toBeUndefined();
    cache.set("a", bytes(50));
    cache.set("a", bytes(70));
    expect(cache.bytes).toBe(70);
  });
});
