import { describe, expect, it } from "vitest";
import { call } from "./helpers";
import { get, HTML, newSite } from "./sites-helpers";

const ADMIN_HEADERS: [string, string][] = [
  ["Content-Security-Policy", "default-src 'self'"],
  ["X-Frame-Options", "DENY"],
];

const adminSite = (): Record<string, [string, string]> => ({
  "/index.html": [HTML, "<h1>home</h1>"],
  "/404.html": [HTML, "<h1>not found</h1>"],
  "/admin/index.html": [HTML, "<h1>admin</h1>"],
  "/admin/panel.html": [HTML, "<h1>panel</h1>"],
});

/** Milliseconds from `since` until `request` has answered and its body is read. */
async function finishedAt(since: number, request: Promise<Response>): Promise<{ ms: number; status: number }> {
  const res = await request;
  await res.arrayBuffer();
  return { ms: performance.now() - since, status: res.status };
}

describe("_headers rules at the edge: hostile patterns (ReDoS)", () => {
  it("a hostile pattern answers in milliseconds and never holds up another account's site or the API", async () => {
    // Stored as an old manifest would hold it: the serving path must be safe whatever the deploy-time checks let through.
    const hostile = await newSite(false, adminSite(), [
      { pattern: "/x/*a*a*a*a*b", headers: [["X-Hostile", "1"]] },
      { pattern: "/:a:b:c:d:e:f:g/x", headers: [["X-Hostile", "2"]] },
    ]);
    const other = await newSite(false, adminSite(), [{ pattern: "/*", headers: [["X-Other", "1"]] }]);
    // Warm both sites (app row, manifest), so what is timed is the matching.
    await (await get(hostile.name, "/")).arrayBuffer();
    await (await get(other.name, "/")).arrayBuffer();

    for (const path of [`/x/${"a".repeat(250)}`, `/x/${"a".repeat(4000)}`, `/${"a".repeat(4000)}`]) {
      const since = performance.now();
      const [attack, neighbour, health] = await Promise.all([
        finishedAt(since, get(hostile.name, path)),
        finishedAt(since, get(other.name, "/admin/")),
        finishedAt(since, call("/healthz")),
      ]);
      expect([attack.status, neighbour.status, health.status]).toEqual([404, 200, 200]);
      expect(attack.ms, `hostile request for ${path.length} chars`).toBeLessThan(200);
      expect(neighbour.ms, "another account's site").toBeLessThan(200);
      expect(health.ms, "/healthz").toBeLessThan(200);
    }
  }, 120_000);

  it("answers a path longer than any file's with 414, before any rule is tried", async () => {
    const { name } = await newSite(true, adminSite(), [{ pattern: "/*", headers: [["X-A", "1"]] }]);
    const res = await get(name, `/${"a".repeat(5000)}`);
    expect([res.status, res.headers.get("X-A")]).toEqual([414, null]);
    expect(await res.text()).not.toContain("<h1>home</h1>");
  });
});

describe("_headers rules at the edge: other spellings of a path", () => {
  it("every spelling that serves an admin page carries the admin rules' headers", async () => {
    for (const spa of [false, true]) {
      const { name } = await newSite(spa, adminSite(), [{ pattern: "/admin/*", headers: ADMIN_HEADERS }]);
      for (const [path, body] of [
        ["/admin/", "admin"],
        ["/%61dmin/", "admin"],
        ["//admin/", "admin"],
        ["/admin//", "admin"],
        ["///admin///", "admin"],
        ["/%2Fadmin/", "admin"],
        ["/admin%2F", "admin"],
        ["/admin", "admin"],
        ["/admin/index.html", "admin"],
        ["/admin/panel", "panel"],
        ["/admin%2Fpanel.html", "panel"],
        ["/admin/%70anel", "panel"],
        ["/./admin/", "admin"],
        ["/x/../admin/", "admin"],
        ["/x/%2e%2e/admin/", "admin"],
      ] as const) {
        const res = await get(name, path);
        expect([path, res.status, await res.text()]).toEqual([path, 200, `<h1>${body}</h1>`]);
        expect([path, res.headers.get("Content-Security-Policy"), res.headers.get("X-Frame-Options")]).toEqual([
          path,
          "default-src 'self'",
          "DENY",
        ]);
      }
    }
  }, 60_000);

  it("a fallback (404.html, or index.html of an SPA) carries the rules of the path asked for and of the file served", async () => {
    const rules = [
      { pattern: "/admin/*", headers: ADMIN_HEADERS },
      { pattern: "/index.html", headers: [["X-Index", "1"]] as [string, string][] },
      { pattern: "/404.html", headers: [["X-Robots-Tag", "noindex"]] as [string, string][] },
    ];
    const plain = await newSite(false, adminSite(), rules);
    const miss = await get(plain.name, "/%61dmin/missing");
    expect([miss.status, await miss.text(), miss.headers.get("X-Frame-Options"), miss.headers.get("X-Robots-Tag")]).toEqual([
      404,
      "<h1>not found</h1>",
      "DENY",
      "noindex",
    ]);
    const spa = await newSite(true, adminSite(), rules);
    const route = await get(spa.name, "//admin/settings");
    expect([route.status, await route.text(), route.headers.get("X-Frame-Options"), route.headers.get("X-Index")]).toEqual([
      200,
      "<h1>home</h1>",
      "DENY",
      "1",
    ]);
  });

  it("a path that cannot be decoded serves no file of the site (its rules could not be matched)", async () => {
    for (const spa of [false, true]) {
      const { name } = await newSite(spa, adminSite(), [{ pattern: "/admin/*", headers: ADMIN_HEADERS }]);
      for (const path of ["/admin/%E0%A4%A", "/admin/%", "/admin/%00", "/admin/%5C..%5C"]) {
        const res = await get(name, path);
        const body = await res.text();
        expect([path, res.status]).toEqual([path, 404]);
        expect(body).not.toMatch(/<h1>(home|admin|not found)<\/h1>/);
      }
    }
  });
});

describe("_headers rules at the edge: cookies", () => {
  it("a Set-Cookie with a Domain attribute stored by an older deployment never reaches the browser", async () => {
    const { name } = await newSite(false, adminSite(), [
      { pattern: "/*", headers: [["Set-Cookie", "toss=1; Domain=apps.example; Path=/"]] },
      { pattern: "/admin/*", headers: [["Set-Cookie", "own=1; Path=/admin; Secure"]] },
    ]);
    expect((await get(name, "/")).headers.get("Set-Cookie")).toBeNull();
    expect((await get(name, "/admin/")).headers.get("Set-Cookie")).toBe("own=1; Path=/admin; Secure");
  });
});
