import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startOwnStack, svc, tempHome } from "../cli/svc.js";
import { expectExit, siteRequest } from "./sites.js";

/**
 * A custom domain's whole life on a stack whose control plane asks Cloudflare
 * for SaaS for certificates. Cloudflare's API is the one part imitated: a
 * local HTTP server standing in for `api.cloudflare.com/client/v4` at its HTTP
 * boundary (the custom hostname routes the Worker calls), since the real one
 * cannot be reached from here; everything else is the real stack, whose edge
 * answers the domain's ownership token (the local proof) and then its traffic.
 */
type CustomHostname = { id: string; hostname: string; gets: number; fail: boolean };
type Domain = { hostname: string; status: string; reason: string | null; certificate: string };

describe("a custom domain with a certificate from Cloudflare for SaaS", () => {
  let stack: LocalStack & { stateDir: string };
  let home: Awaited<ReturnType<typeof tempHome>>;
  let cloudflare: Server;
  const calls: string[] = [];
  const hostnames = new Map<string, CustomHostname>();
  const suffix = Math.random().toString(36).slice(2, 8);

  beforeAll(async () => {
    // Cloudflare's custom hostname API, imitated: pending until read twice, then active (or refused for `fail-*` names).
    cloudflare = createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => {
        body += chunk;
      });
      req.on("end", () => {
        calls.push(`${req.method} ${req.url} ${req.headers.authorization}`);
        const answer = (result: unknown) => res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ success: true, errors: [], result }));
        const view = (h: CustomHostname) => {
          const ready = h.gets >= 2;
          if (h.fail && ready) return { id: h.id, hostname: h.hostname, status: "pending", ssl: { status: "pending_validation", validation_errors: [{ message: "CAA record prevents issuance" }] } };
          return { id: h.id, hostname: h.hostname, status: ready ? "active" : "pending", ssl: { status: ready ? "active" : "pending_validation" } };
        };
        const id = /\/custom_hostnames\/([^/]+)$/.exec(req.url ?? "")?.[1];
        if (req.method === "POST") {
          const { hostname } = JSON.parse(body) as { hostname: string };
          const made = { id: `ch-${hostnames.size + 1}`, hostname, gets: 0, fail: hostname.startsWith("fail-") };
          hostnames.set(made.id, made);
          return answer(view(made));
        }
        const found = id ? hostnames.get(id) : undefined;
        if (!found) return res.writeHead(404, { "Content-Type": "application/json" }).end(JSON.stringify({ success: false, errors: [{ message: "not found" }] }));
        if (req.method === "DELETE") {
          hostnames.delete(found.id);
          return answer({ id: found.id });
        }
        found.gets++;
        return answer(view(found));
      });
    });
    await new Promise<void>((resolve) => cloudflare.listen(0, "127.0.0.1", resolve));
    const port = (cloudflare.address() as AddressInfo).port;
    // `npm start -- --nodes 3`'s stack: the app runs on whichever node placement picks, and the domain follows it.
    stack = await startOwnStack({
      nodes: 3,
      workerVars: { CF_ZONE_ID: "zone-test", CF_API_TOKEN: "test-cf-token", CF_API_URL: `http://127.0.0.1:${port}/client/v4` },
    });
    home = await tempHome();
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    cloudflare?.close();
  });

  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${stack.adminKey}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return { status: res.status, body: res.status === 204 ? null : ((await res.json()) as { data: Domain }) };
  };

  it("proves ownership through its own edge, waits for the certificate, serves the running app, and lets go on removal", async () => {
    const app = `web-${suffix}`;
    const env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "node"], env), 0, "apps create");
    expectExit(await svc(["deploy", "--source", join(ROOT, "test", "fixtures", "apps", "node-express"), "--app", app], env), 0, "deploy");
    const hostname = `www.shop-${suffix}.example.test`;
    expect((await api("POST", `/v1/apps/${app}/domains`, { hostname })).status).toBe(201);
    expect((await siteRequest(stack, app, "/", { host: hostname })).status).toBe(404);

    // The proof passes (the edge answers the token), then the certificate is asked for: pending until Cloudflare says active.
    const first = await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    expect(first.body?.data).toMatchObject({ status: "pending_certificate", certificate: "pending" });
    expect(calls).toContain("POST /client/v4/zones/zone-test/custom_hostnames Bearer test-cf-token");
    expect((await siteRequest(stack, app, "/", { host: hostname })).status).toBe(404);
    await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    const active = await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    expect(active.body?.data).toMatchObject({ status: "active", reason: null, certificate: "active" });

    // Served by the app's process, as <app>.localhost is (the edge's copy of the host lasts at most 1 s).
    let served = await siteRequest(stack, app, "/", { host: hostname });
    for (let i = 0; i < 30 && served.status !== 200; i++) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      served = await siteRequest(stack, app, "/", { host: hostname });
    }
    expect(served.status).toBe(200);
    expect(served.body).toMatch(/^hello from express /);

    expect((await api("DELETE", `/v1/apps/${app}/domains/${hostname}`)).status).toBe(204);
    expect(calls.some((call) => call.startsWith("DELETE /client/v4/zones/zone-test/custom_hostnames/ch-"))).toBe(true);
    let gone = await siteRequest(stack, app, "/", { host: hostname });
    for (let i = 0; i < 30 && gone.status !== 404; i++) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      gone = await siteRequest(stack, app, "/", { host: hostname });
    }
    expect(gone.status).toBe(404);
    expect(gone.body).toBe(`No site is served at ${hostname}\n`);
  }, 180_000);

  it("fails with Cloudflare's reason when the certificate is refused, and serves nothing", async () => {
    const app = `cert-${suffix}`;
    const env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "static"], env), 0, "apps create");
    const hostname = `fail-${suffix}.example.test`;
    expect((await api("POST", `/v1/apps/${app}/domains`, { hostname })).status).toBe(201);
    await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    const failed = await api("POST", `/v1/apps/${app}/domains/${hostname}/verify`);
    expect(failed.body?.data).toMatchObject({ status: "failed", reason: "certificate: CAA record prevents issuance" });
    expect((await siteRequest(stack, app, "/", { host: hostname })).status).toBe(404);
  }, 60_000);
});
