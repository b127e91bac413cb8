import { describe, expect, it } from "vitest";
import { contentSecurityPolicy, dashboardHeaders, isDashboardRequest } from "../../worker/dashboard";
import { call, type ErrorJson, json, newAccount } from "./helpers";

/** The built index.html names its hashed script; the test reads it from there. */
async function scriptPath(): Promise<string> {
  const html = await (await call("/")).text();
  const src = /<script type="module"[^>]* src="([^"]+)"/.exec(html)?.[1];
  if (!src) throw new Error(`no module script in the dashboard's index.html:\n${html}`);
  return src;
}

describe("the dashboard on the API origin", () => {
  it("answers / with index.html under a strict CSP, no-cache", async () => {
    const res = await call("/");
    expect(res.status).toBe(200);
    expect(res.headers.get("Content-Type")).toMatch(/^text\/html/);
    expect(await res.text()).toContain('<div id="root"></div>');
    const csp = res.headers.get("Content-Security-Policy") ?? "";
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toContain("unsafe-inline");
    expect(res.headers.get("X-Frame-Options")).toBe("DENY");
    expect(res.headers.get("X-Content-Type-Options")).toBe("nosniff");
    expect(res.headers.get("Cache-Control")).toBe("no-cache");
  });

  it("answers a client-side route (/apps/my-site) with the same index.html", async () => {
    const [home, deep] = await Promise.all([call("/"), call("/apps/my-site/deployments")]);
    expect(deep.status).toBe(200);
    expect(deep.headers.get("Cache-Control")).toBe("no-cache");
    expect(await deep.text()).toBe(await home.text());
  });

  it("serves hashed assets as immutable, and a missing one as a 404 that is not cached", async () => {
    const script = await scriptPath();
    expect(script).toMatch(/^\/assets\/.+\.js$/);
    const res = await call(script);
    expect(res.status).toBe(200);
    expect(res.headers.get("Content-Type")).toMatch(/javascript/);
    expect(res.headers.get("Cache-Control")).toBe("public, max-age=31536000, immutable");
    await res.arrayBuffer();

    const missing = await call("/assets/index-gone0000.js");
    expect(missing.status).toBe(404);
    expect(missing.headers.get("Cache-Control")).toBe("no-cache");
    expect(await missing.text()).not.toContain("<html");
  });

  it("leaves /v1, /storage and /internal to the Worker: an unknown route is a JSON error, never the page", async () => {
    const { adminKey: key } = await newAccount();
    const codes: Record<string, string> = {};
    for (const path of ["/v1/nope", "/storage/nope", "/internal/nope"]) {
      const res = await call(path, { key });
      expect(res.headers.get("Content-Type"), path).toMatch(/^application\/json/);
      codes[path] = `${res.status} ${(await json<ErrorJson>(res)).error.code}`;
    }
    // /internal checks its own (builder) credentials before routing.
    expect(codes).toEqual({ "/v1/nope": "404 NOT_FOUND", "/storage/nope": "404 NOT_FOUND", "/internal/nope": "401 UNAUTHORIZED" });
    const post = await call("/apps", { method: "POST", body: {} });
    expect(post.status).toBe(404);
    expect((await json<ErrorJson>(post)).error.code).toBe("NOT_FOUND");
  });

  it("never serves the dashboard on an app host, whatever the path", async () => {
    for (const path of ["/", "/index.html", "/apps/x", "/assets/whatever.js"]) {
      const res = await call(path, { headers: { Host: "no-such-app.localhost" } });
      expect(res.status, path).toBe(404);
      const body = await res.text();
      expect(body, path).not.toContain('<div id="root">');
      expect(res.headers.get("Content-Security-Policy"), path).toBeNull();
    }
  });
});

describe("dashboard headers (pure)", () => {
  it("adds the storage origin to connect-src only when uploads go elsewhere", () => {
    expect(contentSecurityPolicy(null)).toContain("connect-src 'self';");
    expect(contentSecurityPolicy("https://acct.r2.cloudflarestorage.com")).toContain("connect-src 'self' https://acct.r2.cloudflarestorage.com;");
  });

  it("caches only /assets/ for good", () => {
    expect(dashboardHeaders("/assets/index-abc123.js", null)["Cache-Control"]).toBe("public, max-age=31536000, immutable");
    expect(dashboardHeaders("/favicon.svg", null)["Cache-Control"]).toBe("no-cache");
    expect(dashboardHeaders("/", null)["Cache-Control"]).toBe("no-cache");
  });

  it("claims GET and HEAD outside the Worker's own prefixes", () => {
    expect(isDashboardRequest("GET", "/")).toBe(true);
    expect(isDashboardRequest("HEAD", "/keys")).toBe(true);
    expect(isDashboardRequest("GET", "/v1x")).toBe(true);
    for (const path of ["/v1", "/v1/apps", "/storage/x", "/internal/x", "/healthz"]) expect(isDashboardRequest("GET", path), path).toBe(false);
    expect(isDashboardRequest("POST", "/")).toBe(false);
  });
});
