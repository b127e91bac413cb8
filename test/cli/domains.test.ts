import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectExit, type SiteResponse, siteRequest } from "../e2e/sites.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "./svc.js";

type Domain = {
  id: string;
  app: string;
  hostname: string;
  status: string;
  reason: string | null;
  redirect: string;
  httpsOnly: boolean;
  records: { type: string; name: string; value: string; purpose: string }[];
  verification: { method: string; checkedAt: string | null; verifiedAt: string | null };
  certificate: string;
  createdAt: string;
};


/** How long the edge may keep an app (or its absence) for a host: EDGE_APP_TTL_MS, with room. */
const EDGE_SETTLE_MS = 10_000;

/**
 * `svc domains` through the real binary against the real Worker (custom
 * domains): locally ownership is proven over HTTP by the stack's own edge,
 * so a domain is active after one verify, and served at its Host at once.
 */
describe("svc domains against wrangler dev", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  /** A second account, for who may claim a hostname. */
  let otherEnv: Record<string, string>;
  let site: string;
  const suffix = randomBytes(4).toString("hex");
  const app = `dom-${suffix}`;
  const otherApp = `dom-other-${suffix}`;
  const apex = `${suffix}.example.test`;
  const www = `www.${apex}`;
  const pending = `pending.${apex}`;

  beforeAll(async () => {
    stack = await startStack();
    const other = await startStack(); // a new account on the same stack
    home = await tempHome();
    const key = await createKey(stack, "cli-domains", ["deploy"]);
    const otherKey = await createKey(other, "cli-domains-other", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    otherEnv = { ...home.env, SVC_API_URL: other.apiUrl, SVC_API_KEY: otherKey.key };
    expectExit(await svc(["apps", "create", "--name", app, "--runtime", "static"], env), 0, "apps create");
    expectExit(await svc(["apps", "create", "--name", otherApp, "--runtime", "static"], otherEnv), 0, "apps create (other account)");
    // A plain folder: served as it is, no build.
    site = await mkdtemp(join(tmpdir(), "svc-domains-site-"));
    await writeFile(join(site, "index.html"), `<!doctype html><h1>Served for ${suffix}</h1>`);
    expectExit(await svc(["deploy", "--source", site, "--app", app], env), 0, "deploy");
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    if (site) await rm(site, { recursive: true, force: true });
  });

  const json = <T>(stdout: string) => JSON.parse(stdout) as T;

  /** A request to the stack's edge as a browser sends it for `hostname`. */
  const hostRequest = (hostname: string, path = "/"): Promise<SiteResponse> => siteRequest(stack, app, path, { host: hostname });

  /** The edge's answer for `hostname` once `done` holds (it keeps a host's app for up to 1 s). */
  const settled = async (hostname: string, done: (r: SiteResponse) => boolean, path = "/"): Promise<SiteResponse> => {
    const deadline = Date.now() + EDGE_SETTLE_MS;
    for (;;) {
      const r = await hostRequest(hostname, path);
      if (done(r) || Date.now() > deadline) return r;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  };

  it("add prints the status, the DNS records to create and the next step", async () => {
    const r = await svc(["domains", "add", www, "--app", app], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    const lines = r.stdout.trimEnd().split("\n");
    expect(lines[0]).toBe(`Added ${www} to app ${app}: pending_verification (waiting for proof of ownership: create the TXT record, then verify)`);
    expect(r.stdout).toContain("Create these DNS records:");
    expect(r.stdout).toMatch(/^TYPE\s+NAME\s+VALUE$/m);
    expect(r.stdout).toMatch(new RegExp(`^TXT\\s+_svc-verify\\.${www.replace(/\./g, "\\.")}\\s+svc-verify=[0-9A-Za-z]{32}$`, "m"));
    expect(r.stdout).toContain("This stack proves ownership over HTTP");
    expect(lines.at(-1)).toBe(`Next: svc domains verify ${www} --app ${app}`);
  });

  it("add --json prints the domain, with the redirect asked for", async () => {
    const r = await svc(["domains", "add", app, apex.toUpperCase(), "--redirect", "to-www", "--json"], env);
    expect(r.code).toBe(0);
    const domain = json<Domain>(r.stdout);
    expect(domain).toMatchObject({
      app,
      hostname: apex,
      status: "pending_verification",
      redirect: "to-www",
      httpsOnly: true,
      certificate: "none",
      verification: { method: "http", checkedAt: null, verifiedAt: null },
    });
    expect(domain.id).toMatch(/^\w+_[0-9A-Za-z]{24}$/);
    expect(domain.records).toContainEqual(expect.objectContaining({ type: "TXT", name: `_svc-verify.${apex}`, value: expect.stringMatching(/^svc-verify=[0-9A-Za-z]{32}$/) }));
    // Several domains per app, one account's claims each with a token of its own.
    const added = expectExit(await svc(["domains", "add", pending, "--app", app, "--no-https-only", "--json"], env), 0, "add pending");
    expect(json<Domain>(added.stdout).httpsOnly).toBe(false);
  });

  it("add refuses a bad hostname with the API's VALIDATION_ERROR, and mistakes of the command line before any request", async () => {
    const bad = await svc(["domains", "add", `bad_label.${apex}`, "--app", app], env);
    expect(bad.code).toBe(1);
    const lines = bad.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not add domain bad_label.${apex} to app ${app}`);
    expect(lines[1]).toMatch(/^ {2}VALIDATION_ERROR: hostname: "bad_label" is not a valid DNS label/);
    expect(lines.at(-1)).toBe("  Hint: fix <hostname> and try again (`svc domains add --help` lists the options)");
    const ip = await svc(["domains", "add", "127.0.0.1", "--app", app], env);
    expect(ip.code).toBe(1);
    expect(ip.stderr).toContain("VALIDATION_ERROR: hostname: must be a domain name, not an IP address");
    const wrongRedirect = await svc(["domains", "add", www, "--app", app, "--redirect", "to-www"], env);
    expect(wrongRedirect.code).toBe(1);
    expect(wrongRedirect.stderr).toMatch(/VALIDATION_ERROR: redirect: to-www is for the apex/);

    const redirect = await svc(["domains", "add", www, "--app", app, "--redirect", "apex"], env);
    expect(redirect.code).toBe(2);
    expect(redirect.stderr).toContain('--redirect must be one of none, to-www, to-apex, got "apex"');
    const swapped = await svc(["domains", "add", www, app], env);
    expect(swapped.code).toBe(2);
    expect(swapped.stderr).toContain(`"${www}" is a hostname, not an app`);
  });

  it("add of a hostname the app already has is DOMAIN_TAKEN", async () => {
    const r = await svc(["domains", "add", www, "--app", app], env);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`DOMAIN_TAKEN: ${www} is already a domain of this app`);
    expect(r.stderr).toMatch(/Hint: .*svc domains list --app <app>/);
  });

  it("list shows the app's domains in a table and as JSON", async () => {
    const human = await svc(["domains", "list", "--app", app], env);
    expect(human.code).toBe(0);
    const [header, ...rows] = human.stdout.trimEnd().split("\n");
    expect(header).toMatch(/^HOSTNAME\s+STATUS\s+CERTIFICATE\s+REDIRECT\s+REASON$/);
    expect(rows).toHaveLength(3);
    expect(rows.find((row) => row.startsWith(`${www} `))).toMatch(/^\S+\s+pending_verification\s+none\s+none\s+waiting for proof of ownership/);
    expect(rows.find((row) => row.startsWith(`${apex} `))).toMatch(/^\S+\s+pending_verification\s+none\s+to-www\s+/);
    const list = json<Domain[]>(expectExit(await svc(["domains", "list", app, "--json"], env), 0, "list --json").stdout);
    expect(list.map((d) => d.hostname)).toEqual([www, apex, pending]);
    const empty = await svc(["domains", "list", "--app", otherApp], otherEnv);
    expect(empty.stdout.trim()).toBe(`No custom domains on app ${otherApp}. Add one: svc domains add <hostname> --app ${otherApp}`);
  });

  it("an unverified domain serves nothing: its host gets the plain 404", async () => {
    const r = await hostRequest(www);
    expect(r.status).toBe(404);
    expect(r.headers["content-type"]).toMatch(/^text\/plain/);
    expect(r.body).toBe(`No site is served at ${www}\n`);
  });

  it("verify proves a local domain at once and exits 0, saying how to try it", async () => {
    const r = await svc(["domains", "verify", www, "--app", app], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout.trimEnd().split("\n")).toEqual([`${www} is active: it serves app ${app}`, `Try it: curl -H 'Host: ${www}' ${stack.apiUrl}/`]);
  });

  it("info --json shows the active domain, without the TXT record it no longer needs", async () => {
    const r = await svc(["domains", "info", www, "--app", app, "--json"], env);
    expect(r.code).toBe(0);
    const domain = json<Domain>(r.stdout);
    expect(domain).toMatchObject({ hostname: www, app, status: "active", reason: null, certificate: "none", verification: { method: "http" } });
    expect(domain.verification.verifiedAt).not.toBeNull();
    expect(domain.verification.checkedAt).not.toBeNull();
    expect(domain.records.filter((record) => record.type === "TXT")).toEqual([]);
    const human = await svc(["domains", "info", "--app", app, www], env);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^status\s+active$/m);
    expect(human.stdout).toMatch(/^https only\s+yes/m);
    expect(human.stdout).toMatch(/^verified\s+\d{4}-\d\d-\d\dT/m);
  });

  it("the edge serves an active domain exactly as the app's own host", async () => {
    const r = await settled(www, (res) => res.status === 200);
    expect(r.status).toBe(200);
    expect(r.body).toContain(`Served for ${suffix}`);
    // http stays http: a local stack has no TLS, whatever httpsOnly says.
    expect(r.headers.location).toBeUndefined();
    const missing = await hostRequest(www, "/no-such-page");
    expect(missing.status).toBe(404);
    expect(missing.body).not.toContain("No site is served at");
  });

  it("verify of an apex with to-www makes it redirect to www, and update changes that", async () => {
    expectExit(await svc(["domains", "verify", apex, "--app", app], env), 0, "verify apex");
    const redirected = await settled(apex, (res) => res.status === 308, "/about?x=1");
    expect(redirected.status).toBe(308);
    expect(redirected.headers.location).toMatch(new RegExp(`^http://${www.replace(/\./g, "\\.")}(:\\d+)?/about\\?x=1$`));

    const changed = await svc(["domains", "update", apex, "--app", app, "--redirect", "none", "--no-https-only", "--json"], env);
    expect(changed.code).toBe(0);
    expect(json<Domain>(changed.stdout)).toMatchObject({ hostname: apex, redirect: "none", httpsOnly: false, status: "active" });
    const served = await settled(apex, (res) => res.status === 200);
    expect(served.status).toBe(200);
    expect(served.body).toContain(`Served for ${suffix}`);

    const human = await svc(["domains", "update", apex, "--app", app, "--https-only"], env);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(new RegExp(`^Updated ${apex.replace(/\./g, "\\.")}$`, "m"));
    expect(human.stdout).toMatch(/^https only\s+yes/m);
    const wrong = await svc(["domains", "update", www, "--app", app, "--redirect", "to-www"], env);
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain("VALIDATION_ERROR: redirect: to-www is for the apex");
    const nothing = await svc(["domains", "update", www, "--app", app], env);
    expect(nothing.code).toBe(2);
    expect(nothing.stderr).toContain("nothing to change");
  });

  it("another account may claim an unverified hostname, but not a verified one (DOMAIN_TAKEN)", async () => {
    const claim = await svc(["domains", "add", pending, "--app", otherApp, "--json"], otherEnv);
    expect(claim.code).toBe(0);
    expect(json<Domain>(claim.stdout).status).toBe("pending_verification");

    const taken = await svc(["domains", "add", www, "--app", otherApp], otherEnv);
    expect(taken.code).toBe(1);
    const lines = taken.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not add domain ${www} to app ${otherApp}`);
    expect(lines[1]).toBe(`  DOMAIN_TAKEN: ${www} is already verified by another account`);
    expect(lines.at(-1)).toMatch(/^ {2}Hint: another account has verified/);
  });

  it("remove asks first, then the host answers 404 and the hostname is free for any account", async () => {
    const refused = await svc(["domains", "remove", www, "--app", app], env);
    expect(refused.code).toBe(1);
    expect(refused.stderr.trimEnd().split("\n")).toEqual([
      `Error: refusing to remove domain ${www} from app ${app} without confirmation`,
      "  stdin is not a terminal, so svc cannot ask",
      `  Hint: pass --yes: svc domains remove ${www} --app ${app} --yes`,
    ]);
    expect((await hostRequest(www)).status).toBe(200);

    const removed = await svc(["domains", "remove", www, "--app", app, "--yes"], env);
    expect(removed.code).toBe(0);
    expect(removed.stdout.trim()).toBe(`Removed ${www} from app ${app}`);
    const gone = await settled(www, (res) => res.status === 404);
    expect(gone.status).toBe(404);
    expect(gone.body).toBe(`No site is served at ${www}\n`);

    const info = await svc(["domains", "info", www, "--app", app], env);
    expect(info.code).toBe(1);
    expect(info.stderr).toContain(`DOMAIN_NOT_FOUND: ${www} is not a domain of app ${app}`);
    expect(info.stderr).toContain(`Hint: \`svc domains list --app ${app}\` shows the app's domains`);

    const claimed = await svc(["domains", "add", www, "--app", otherApp, "--json"], otherEnv);
    expect(claimed.code).toBe(0);
    expect(json<Domain>(claimed.stdout)).toMatchObject({ hostname: www, app: otherApp, status: "pending_verification" });
  });

  it("verify of a hostname another account proved first fails with exit 1 and says what to do", async () => {
    // The other account proves the hostname both claimed; this account's claim can no longer win.
    expectExit(await svc(["domains", "verify", pending, "--app", otherApp], otherEnv), 0, "verify (other account)");
    const r = await svc(["domains", "verify", pending, "--app", app], env);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: ${pending} is not active yet`);
    expect(lines[1]).toBe("  status: failed");
    expect(lines[2]).toBe("  reason: verified by another account first");
    expect(lines.at(-1)).toMatch(/^ {2}Hint: the hostname belongs to the account that proved it first: remove it here \(svc domains remove /);
    const asJson = await svc(["domains", "verify", pending, "--app", app, "--json"], env);
    expect(asJson.code).toBe(1);
    expect(json<Domain>(asJson.stdout)).toMatchObject({ hostname: pending, status: "failed" });
  });
});
