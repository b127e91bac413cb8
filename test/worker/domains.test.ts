import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { describe, expect, it, vi } from "vitest";
import { createApp } from "../../worker/app";
import { countingD1 } from "../support/d1-count";
import { call, type ErrorJson, expectAuthEnforced, json, newAccount } from "./helpers";
import { newSite } from "./sites-helpers";

/**
 * Custom domains through the real Worker entry: the API's rules, and the edge
 * routing a host by its domain. Proving ownership needs something answering
 * outside the Worker (DNS, or the stack's own URL): test/cli/domains.test.ts
 * does it against a running stack; here a proven domain is made active in D1
 * directly, as verifyDomain would.
 */
type Domain = { hostname: string; status: string; reason: string | null; records: { type: string; name: string; value: string }[]; redirect: string };

const unique = () => `${crypto.randomUUID().slice(0, 8)}.example.org`;
const add = (key: string, app: string, body: unknown) => call(`/v1/apps/${app}/domains`, { method: "POST", key, body });
const activate = (hostname: string) => env.DB.prepare("UPDATE domains SET status = 'active', reason = NULL WHERE hostname = ?").bind(hostname).run();
const at = (hostname: string, path: string, init: RequestInit = {}) => exports.default.fetch(new Request(`http://${hostname}${path}`, init));

describe("custom domains: the API", () => {
  it("adds a domain pending its proof, with the exact TXT record to create", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    const hostname = `www.${unique()}`;
    const res = await add(site.key, site.name, { hostname: ` ${hostname.toUpperCase()}. ` });
    expect(res.status).toBe(201);
    const { data } = await json<{ data: Domain }>(res);
    expect(data).toMatchObject({ hostname, status: "pending_verification", redirect: "none" });
    expect(data.records[0]).toMatchObject({ type: "TXT", name: `_svc-verify.${hostname}` });
    expect(data.records[0]!.value).toMatch(/^svc-verify=[0-9A-Za-z]{32}$/);
    const listed = await json<{ data: Domain[] }>(await call(`/v1/apps/${site.name}/domains`, { key: site.key }));
    expect(listed.data.map((d) => d.hostname)).toEqual([hostname]);
    // Not proven, it serves nothing.
    expect((await at(hostname, "/")).status).toBe(404);
  });

  it("refuses what cannot be a custom domain with 400 naming the hostname, storing nothing", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    for (const hostname of ["localhost", "192.168.1.1", "*.example.org", "exa_mple.org", `a.${env.APPS_DOMAIN}`, "api.test", "-a.example.org", `${"a".repeat(64)}.example.org`]) {
      const res = await add(site.key, site.name, { hostname });
      expect(res.status, hostname).toBe(400);
      expect((await json<ErrorJson>(res)).error.details?.[0]?.field, hostname).toBe("hostname");
    }
    expect((await add(site.key, site.name, { hostname: `www.${unique()}`, redirect: "to-www" })).status).toBe(400);
    expect((await add(site.key, site.name, { hostname: unique(), redirect: "to-apex" })).status).toBe(400);
    expect((await json<{ data: Domain[] }>(await call(`/v1/apps/${site.name}/domains`, { key: site.key }))).data).toEqual([]);
  });

  it("lets another account claim a domain nobody proved, but never one proven by someone else; removal frees it", async () => {
    const owner = await newSite(false, { "/index.html": ["text/html", "owner"] });
    const other = await newSite(false, { "/index.html": ["text/html", "other"] });
    const hostname = unique();
    expect((await add(owner.key, owner.name, { hostname })).status).toBe(201);
    // A pending claim holds nothing: another account may claim it too, with a token of its own.
    expect((await add(other.key, other.name, { hostname })).status).toBe(201);
    await call(`/v1/apps/${other.name}/domains/${hostname}`, { method: "DELETE", key: other.key });
    await activate(hostname);
    const taken = await add(other.key, other.name, { hostname });
    expect(taken.status).toBe(409);
    expect((await json<ErrorJson>(taken)).error.code).toBe("DOMAIN_TAKEN");
    // The same account cannot give it to a second app either.
    const second = await call("/v1/apps", { method: "POST", key: owner.key, body: { name: `s-${crypto.randomUUID().slice(0, 8)}`, runtime: "static" } });
    const secondApp = (await json<{ data: { name: string } }>(second)).data.name;
    expect((await add(owner.key, secondApp, { hostname })).status).toBe(409);
    // The other account sees none of it.
    expect((await call(`/v1/apps/${owner.name}/domains/${hostname}`, { key: other.key })).status).toBe(404);
    expect((await call(`/v1/apps/${owner.name}/domains/${hostname}`, { method: "DELETE", key: owner.key })).status).toBe(204);
    expect((await add(other.key, other.name, { hostname })).status).toBe(201);
  });

  it("needs a key with the deploy scope on every route", async () => {
    const { accountId } = await newAccount();
    for (const [method, path] of [
      ["GET", "/v1/apps/x/domains"],
      ["POST", "/v1/apps/x/domains"],
      ["GET", "/v1/apps/x/domains/a.example.org"],
      ["POST", "/v1/apps/x/domains/a.example.org/verify"],
      ["PATCH", "/v1/apps/x/domains/a.example.org"],
      ["DELETE", "/v1/apps/x/domains/a.example.org"],
    ] as const) {
      const result = await expectAuthEnforced(path, { method, body: method === "POST" || method === "PATCH" ? {} : undefined }, "deploy", accountId);
      expect(result.unauthenticated, path).toBe(401);
      expect(result.garbage, path).toBe(401);
      expect(result.wrongScope?.error.code, path).toBe("INSUFFICIENT_SCOPE");
    }
  });
});

describe("custom domains: the edge", () => {
  it("serves an active domain exactly as the app's own host: files, SPA fallback, _headers", async () => {
    const site = await newSite(true, { "/index.html": ["text/html", "spa home"], "/app.js": ["text/javascript", "js"] }, [
      { pattern: "/app.js", headers: [["X-Custom", "on the domain too"]] },
    ]);
    const hostname = unique();
    expect((await add(site.key, site.name, { hostname })).status).toBe(201);
    await activate(hostname);
    expect(await (await at(hostname, "/")).text()).toBe("spa home");
    expect(await (await at(hostname, "/some/client/route")).text()).toBe("spa home");
    const js = await at(`${hostname}:8443`, "/app.js");
    expect(js.headers.get("X-Custom")).toBe("on the domain too");
  });

  it("costs no D1 read per request beyond the app host's own: one indexed statement per host, cached per isolate", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    const hostname = unique();
    expect((await add(site.key, site.name, { hostname })).status).toBe(201);
    await activate(hostname);
    /** Ten requests for `host` through the real app on a D1 binding that counts: the reads they made. */
    const reads = async (host: string) => {
      const { db, counts } = countingD1(env.DB);
      const ctx = createExecutionContext();
      for (let i = 0; i < 10; i++) {
        const res = await createApp().fetch(new Request(`http://${host}/`), { ...env, DB: db }, ctx);
        expect(await res.text()).toBe("home");
      }
      await waitOnExecutionContext(ctx);
      return counts;
    };
    const own = await reads(`${site.name}.${env.APPS_DOMAIN}`);
    const custom = await reads(hostname);
    // One lookup each (a second only if the ten straddled the edge's 1 s cache), and the request log's batched writes alike.
    expect(own.reads).toBeLessThanOrEqual(2);
    expect(custom.reads).toBeLessThanOrEqual(2);
    expect(custom.reads).toBeLessThanOrEqual(own.reads + 1);
    const [lookup] = custom.statements;
    const plan = await env.DB.prepare(`EXPLAIN QUERY PLAN ${lookup}`).bind(hostname, "active").all<{ detail: string }>();
    expect(plan.results.map((row) => row.detail).join("; ")).toMatch(/SEARCH domains USING (COVERING )?INDEX domains_(hostname|verified_hostname)_idx/);
  });

  it("redirects apex to www (308, path and query kept) when asked", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    const apex = unique();
    expect((await add(site.key, site.name, { hostname: apex, redirect: "to-www" })).status).toBe(201);
    await activate(apex);
    const res = await at(apex, "/a/b?c=1", { redirect: "manual" });
    expect(res.status).toBe(308);
    expect(res.headers.get("Location")).toBe(`http://www.${apex}/a/b?c=1`);
  });

  it("answers a host that is no app's, no active domain's and not the API's with a plain 404: never the API or the dashboard", async () => {
    for (const path of ["/", "/v1/apps", "/healthz", "/login"]) {
      const res = await at(`nobody-${unique()}`, path);
      expect(res.status, path).toBe(404);
      expect(res.headers.get("Content-Type"), path).toBe("text/plain; charset=utf-8");
      expect(await res.text(), path).toMatch(/^No site is served at /);
    }
    // The control plane's own hosts still reach the API.
    expect((await call("/healthz")).status).toBe(200);
    expect((await exports.default.fetch(new Request("http://127.0.0.1:8787/healthz"))).status).toBe(200);
  });

  it("verify tries a check once more when its connection is lost before an answer, and then proves the domain", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    const hostname = unique();
    const { data } = await json<{ data: Domain }>(await add(site.key, site.name, { hostname }));
    const token = data.records[0]!.value.slice("svc-verify=".length);
    // The check's answer (whichever proof this stack uses, HTTP or DNS over HTTPS) comes on the second try only.
    const checks: string[] = [];
    const realFetch = globalThis.fetch;
    const lossy = vi.spyOn(globalThis, "fetch").mockImplementation(async (input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      const isCheck = url.includes("/.well-known/svc-domain-verification/") || url.includes("type=TXT");
      if (!isCheck) return realFetch(input, init);
      checks.push(url);
      if (checks.length === 1) throw new Error("Network connection lost.");
      return url.includes("type=TXT")
        ? Response.json({ Status: 0, Answer: [{ type: 16, data: `"svc-verify=${token}"` }] })
        : new Response(token);
    });
    try {
      const res = await call(`/v1/apps/${site.name}/domains/${hostname}/verify`, { method: "POST", key: site.key });
      const verified = (await json<{ data: Domain }>(res)).data;
      expect(checks).toHaveLength(2);
      expect(checks[1]).toBe(checks[0]);
      expect(verified.status).not.toBe("pending_verification");
      expect(verified.reason ?? "").not.toContain("could not be reached");
    } finally {
      lossy.mockRestore();
    }
  });

  it("answers an unproven domain's own token for the local HTTP proof, and nothing else", async () => {
    const site = await newSite(false, { "/index.html": ["text/html", "home"] });
    const hostname = unique();
    const { data } = await json<{ data: Domain }>(await add(site.key, site.name, { hostname }));
    const token = data.records[0]!.value.slice("svc-verify=".length);
    const proof = await at(hostname, `/.well-known/svc-domain-verification/${token}`);
    expect(proof.status).toBe(200);
    expect(await proof.text()).toBe(token);
    // The local check asks the control plane's own host, naming the domain in a header (a Worker's fetch cannot set Host).
    const asked = await call(`/.well-known/svc-domain-verification/${token}`, { headers: { "X-Svc-Check-Host": hostname } });
    expect(await asked.text()).toBe(token);
    expect((await at(`other-${hostname}`, `/.well-known/svc-domain-verification/${token}`)).status).toBe(404);
    expect((await at(hostname, `/.well-known/svc-domain-verification/${"x".repeat(32)}`)).status).toBe(404);
  });
});
