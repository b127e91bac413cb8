/**
 * Custom domains (docs/domains.md): an app answers at a hostname its account
 * proved it controls. Ownership is checked before the domain serves anything:
 * a TXT record `_svc-verify.<hostname>` holding the domain's token, read through
 * DNS over HTTPS (production), or locally the token answered by our own edge
 * for that Host (the verifier asks DOMAIN_CHECK_ORIGIN with the domain's Host
 * header). Several accounts may claim a hostname none has proven, each with its
 * own token; the first to prove it owns it, and D1's partial unique index keeps
 * it that way whatever the race. Where CF_ZONE_ID and CF_API_TOKEN are set a
 * verified domain gets a Cloudflare for SaaS custom hostname, whose certificate
 * must be active before the domain is; without them (a local stack) a verified
 * domain is active at once, served over plain HTTP.
 */
import { and, asc, eq, inArray } from "drizzle-orm";
import type { Db } from "../db/client";
import { type AppRow, type DomainRedirect, type DomainRow, domains } from "../db/schema";
import type { Config } from "../env";
import { ApiError } from "../lib/errors";
import { newId, randomBase62 } from "../lib/ids";

/** Where the token lives in DNS, and how the edge answers it for the local HTTP check. */
export const TXT_PREFIX = "_svc-verify";
export const TXT_VALUE_PREFIX = "svc-verify=";
export const HTTP_CHECK_PATH = "/.well-known/svc-domain-verification";
/**
 * The domain an HTTP check asks about, beside its Host: a Worker's fetch cannot
 * set Host (workerd sends the URL's), so the local check, which asks its own
 * edge at DOMAIN_CHECK_ORIGIN, names the domain here. The edge reads it on the
 * check's path only, where all it can get is an unproven domain's own token.
 */
export const CHECK_HOST_HEADER = "X-Svc-Check-Host";
/** A domain's checks against outside services (DNS, Cloudflare's API) are bounded. */
const CHECK_TIMEOUT_MS = 5_000;
/** Custom domains per app. */
const MAX_DOMAINS_PER_APP = 20;

/** What the API says about a domain. */
export interface DomainView {
  id: string;
  app: string;
  hostname: string;
  status: DomainRow["status"];
  reason: string | null;
  redirect: DomainRedirect;
  httpsOnly: boolean;
  /** The DNS records to create, exactly. */
  records: { type: "TXT" | "CNAME"; name: string; value: string; purpose: string }[];
  verification: { method: "dns" | "http"; checkedAt: string | null; verifiedAt: string | null };
  certificate: "none" | "pending" | "active";
  createdAt: string;
}

/**
 * Why a hostname cannot be a custom domain, or null. Lowercase LDH labels
 * (international names in their punycode form), at least two of them, no IP
 * address, and nothing the platform answers itself.
 */
function hostnameProblem(hostname: string, config: Config): string | null {
  if (hostname.length > 253) return "must be at most 253 characters";
  const labels = hostname.split(".");
  if (labels.length < 2) return "must be a full domain name, such as www.example.com";
  for (const label of labels) {
    if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(label)) {
      return label.includes("*") ? "wildcards are not supported" : `"${label}" is not a valid DNS label (letters, digits and inner hyphens, at most 63)`;
    }
  }
  if (/^\d+$/.test(labels.at(-1)!)) return "must be a domain name, not an IP address";
  const appsDomain = config.APPS_DOMAIN.replace(/:\d+$/, "").toLowerCase();
  if (hostname === appsDomain || hostname.endsWith(`.${appsDomain}`)) return `is the platform's own (${appsDomain}): apps already answer there`;
  if (config.CONTROL_PLANE_HOSTS.has(hostname)) return "is the platform's own API host";
  return null;
}


/** The www ↔ apex counterpart a redirect leads to. */
export function redirectTarget(hostname: string, redirect: DomainRedirect): string | null {
  if (redirect === "to-www") return `www.${hostname}`;
  if (redirect === "to-apex") return hostname.slice("www.".length);
  return null;
}

function redirectProblem(hostname: string, redirect: DomainRedirect): string | null {
  if (redirect === "to-www" && hostname.startsWith("www.")) return "to-www is for the apex (example.com), not a www hostname";
  if (redirect === "to-apex" && (!hostname.startsWith("www.") || hostname.split(".").length < 3)) return "to-apex is for a www hostname (www.example.com)";
  return null;
}

export function domainView(row: DomainRow, app: Pick<AppRow, "name">, config: Config): DomainView {
  const records: DomainView["records"] = [];
  if (row.status === "pending_verification" || row.status === "failed") {
    records.push({
      type: "TXT",
      name: `${TXT_PREFIX}.${row.hostname}`,
      value: `${TXT_VALUE_PREFIX}${row.token}`,
      purpose: config.DOMAIN_VERIFICATION === "dns" ? "proves the account controls the domain" : "proves the account controls the domain (in production; a local stack checks over HTTP)",
    });
  }
  if (config.DOMAIN_CNAME_TARGET) {
    records.push({ type: "CNAME", name: row.hostname, value: config.DOMAIN_CNAME_TARGET, purpose: "sends the domain's traffic to the platform (an apex: CNAME flattening or ALIAS)" });
  }
  return {
    id: row.id,
    app: app.name,
    hostname: row.hostname,
    status: row.status,
    reason: row.reason,
    redirect: row.redirect,
    httpsOnly: row.httpsOnly,
    records,
    verification: {
      method: config.DOMAIN_VERIFICATION,
      checkedAt: row.checkedAt === null ? null : new Date(row.checkedAt).toISOString(),
      verifiedAt: row.verifiedAt === null ? null : new Date(row.verifiedAt).toISOString(),
    },
    certificate: row.certificateId === null ? "none" : row.status === "active" ? "active" : "pending",
    createdAt: new Date(row.createdAt).toISOString(),
  };
}

export async function listDomains(db: Db, app: AppRow): Promise<DomainRow[]> {
  return db.select().from(domains).where(eq(domains.appId, app.id)).orderBy(asc(domains.createdAt)).all();
}

export async function domainOf(db: Db, app: AppRow, hostname: string): Promise<DomainRow> {
  const row = await db
    .select()
    .from(domains)
    .where(and(eq(domains.appId, app.id), eq(domains.hostname, hostname)))
    .get();
  if (!row) throw new ApiError("DOMAIN_NOT_FOUND", `${hostname} is not a domain of app ${app.name}`);
  return row;
}

/** The verified row of a hostname (any account), if one exists. */
async function verifiedRow(db: Db, hostname: string): Promise<DomainRow | undefined> {
  return db
    .select()
    .from(domains)
    .where(and(eq(domains.hostname, hostname), inArray(domains.status, ["pending_certificate", "active"])))
    .get();
}

/** Adds a domain to an app, pending its owner's proof; refused when another account (or another app) holds it. */
export async function addDomain(
  db: Db,
  config: Config,
  app: AppRow,
  input: { hostname: string; redirect: DomainRedirect; httpsOnly: boolean },
): Promise<DomainRow> {
  const hostname = input.hostname;
  const problem = hostnameProblem(hostname, config);
  if (problem) throw new ApiError("VALIDATION_ERROR", `hostname: ${problem}`, [{ field: "hostname", message: problem }]);
  const redirect = redirectProblem(hostname, input.redirect);
  if (redirect) throw new ApiError("VALIDATION_ERROR", `redirect: ${redirect}`, [{ field: "redirect", message: redirect }]);
  const held = await verifiedRow(db, hostname);
  if (held && held.accountId !== app.accountId) throw new ApiError("DOMAIN_TAKEN", `${hostname} is already verified by another account`);
  const mine = await db
    .select({ appId: domains.appId })
    .from(domains)
    .where(and(eq(domains.accountId, app.accountId), eq(domains.hostname, hostname)))
    .get();
  if (mine) {
    throw new ApiError("DOMAIN_TAKEN", mine.appId === app.id ? `${hostname} is already a domain of this app` : `${hostname} is already a domain of another app of this account`);
  }
  const count = (await db.select({ id: domains.id }).from(domains).where(eq(domains.appId, app.id)).all()).length;
  if (count >= MAX_DOMAINS_PER_APP) throw new ApiError("PLAN_LIMIT_EXCEEDED", `an app has at most ${MAX_DOMAINS_PER_APP} custom domains`);
  const row: DomainRow = {
    id: newId("domain"),
    accountId: app.accountId,
    appId: app.id,
    hostname,
    status: "pending_verification",
    reason: "waiting for proof of ownership: create the TXT record, then verify",
    token: randomBase62(32),
    redirect: input.redirect,
    httpsOnly: input.httpsOnly,
    certificateId: null,
    verifiedAt: null,
    checkedAt: null,
    createdAt: Date.now(),
  };
  try {
    await db.insert(domains).values(row);
  } catch (err) {
    if (String(err).includes("UNIQUE")) throw new ApiError("DOMAIN_TAKEN", `${hostname} was just added elsewhere`);
    throw err;
  }
  return row;
}

export async function updateDomain(db: Db, row: DomainRow, changes: { redirect?: DomainRedirect; httpsOnly?: boolean }): Promise<DomainRow> {
  const redirect = changes.redirect ?? row.redirect;
  const problem = redirectProblem(row.hostname, redirect);
  if (problem) throw new ApiError("VALIDATION_ERROR", `redirect: ${problem}`, [{ field: "redirect", message: problem }]);
  const next = { ...row, redirect, httpsOnly: changes.httpsOnly ?? row.httpsOnly };
  await db.update(domains).set({ redirect: next.redirect, httpsOnly: next.httpsOnly }).where(eq(domains.id, row.id));
  return next;
}

/**
 * Checks the domain now: ownership while it is unproven, then its certificate.
 * Never throws for what the outside world answers: the row says why.
 */
export async function verifyDomain(db: Db, config: Config, row: DomainRow): Promise<DomainRow> {
  const now = Date.now();
  let next: DomainRow = { ...row, checkedAt: now };
  if (row.status === "pending_verification" || row.status === "failed") {
    const held = await verifiedRow(db, row.hostname);
    if (held && held.accountId !== row.accountId) {
      next = { ...next, status: "failed", reason: "verified by another account first" };
    } else {
      const proof = config.DOMAIN_VERIFICATION === "dns" ? await checkTxt(config, row) : await checkHttp(config, row);
      // Not proven yet is not a failure: DNS takes its time. It stays pending, saying what it found.
      if (proof !== null) next = { ...next, status: "pending_verification", reason: proof };
      else next = { ...next, status: "pending_certificate", reason: "proven; asking for a certificate", verifiedAt: now };
    }
  }
  if (next.status === "pending_certificate") next = await certificateStep(config, next);
  try {
    await db
      .update(domains)
      .set({ status: next.status, reason: next.reason, verifiedAt: next.verifiedAt, checkedAt: next.checkedAt, certificateId: next.certificateId })
      .where(eq(domains.id, row.id));
  } catch (err) {
    // Another account's row won the hostname between our read and this write (the partial unique index).
    if (!String(err).includes("UNIQUE")) throw err;
    next = { ...row, checkedAt: now, status: "failed", reason: "verified by another account first" };
    await db.update(domains).set({ status: next.status, reason: next.reason, checkedAt: now }).where(eq(domains.id, row.id));
  }
  return next;
}

/** Removes a domain: it stops serving at once (within the edge's cache time) and its hostname is free again. */
export async function removeDomain(db: Db, config: Config, row: DomainRow): Promise<void> {
  if (row.certificateId !== null && cloudflareConfigured(config)) {
    await cloudflare(config, "DELETE", `/custom_hostnames/${encodeURIComponent(row.certificateId)}`).catch((err: unknown) =>
      console.error(`domain ${row.hostname}: removing its custom hostname failed: ${String(err)}`),
    );
  }
  await db.delete(domains).where(eq(domains.id, row.id));
}

/** Removes every domain of an app that is being deleted, each with its custom hostname at Cloudflare (D1's cascade would leave those behind). */
export async function removeAppDomains(db: Db, config: Config, app: AppRow): Promise<void> {
  for (const row of await listDomains(db, app)) await removeDomain(db, config, row);
}

/** Whether `token` is an unproven domain's of `hostname`: the edge then answers it (the local HTTP proof). */
export async function pendingToken(db: Db, hostname: string, token: string): Promise<boolean> {
  const row = await db
    .select({ id: domains.id })
    .from(domains)
    .where(and(eq(domains.hostname, hostname), eq(domains.token, token), inArray(domains.status, ["pending_verification", "failed"])))
    .get();
  return row !== undefined;
}

/**
 * A check's GET, each try bounded by {@link CHECK_TIMEOUT_MS}, tried once more
 * when the connection failed before an answer (a kept-alive connection the
 * other side closed as it was reused fails as "Network connection lost"):
 * a GET is safe to repeat, and a verify should not fail on that. A timeout
 * is not tried again: the check would take twice as long to say so.
 */
async function fetchRetryingLostConnection(url: URL, init: RequestInit): Promise<Response> {
  const attempt = () => fetch(url, { ...init, signal: AbortSignal.timeout(CHECK_TIMEOUT_MS) });
  try {
    return await attempt();
  } catch (err) {
    if (err instanceof Error && (err.name === "TimeoutError" || err.name === "AbortError")) throw err;
    return attempt();
  }
}

/** null when the TXT record holds the token, else why not. */
async function checkTxt(config: Config, row: DomainRow): Promise<string | null> {
  const name = `${TXT_PREFIX}.${row.hostname}`;
  const url = new URL(config.DNS_OVER_HTTPS_URL);
  url.searchParams.set("name", name);
  url.searchParams.set("type", "TXT");
  let answer: { Status?: number; Answer?: { type: number; data: string }[] };
  try {
    const res = await fetchRetryingLostConnection(url, { headers: { Accept: "application/dns-json" } });
    if (!res.ok) return `the DNS lookup of ${name} failed (HTTP ${res.status}); verify again in a moment`;
    answer = await res.json();
  } catch (err) {
    return `the DNS lookup of ${name} failed (${err instanceof Error ? err.message : String(err)}); verify again in a moment`;
  }
  const values = (answer.Answer ?? []).filter((record) => record.type === 16).map((record) => record.data.replace(/^"|"$/g, "").replace(/"\s*"/g, ""));
  const expected = `${TXT_VALUE_PREFIX}${row.token}`;
  if (values.includes(expected)) return null;
  if (values.length === 0) return `no TXT record at ${name} yet (DNS changes can take minutes to show); create it with the value ${expected}`;
  return `the TXT record at ${name} holds ${values.map((value) => JSON.stringify(value)).join(", ")}, not ${expected}`;
}

/** null when our edge answers the domain's token for its Host, else why not (the local stack's proof). */
async function checkHttp(config: Config, row: DomainRow): Promise<string | null> {
  const origin = config.DOMAIN_CHECK_ORIGIN ?? `http://${row.hostname}`;
  const url = new URL(`${HTTP_CHECK_PATH}/${row.token}`, origin);
  try {
    const res = await fetchRetryingLostConnection(url, { headers: { Host: row.hostname, [CHECK_HOST_HEADER]: row.hostname }, redirect: "manual" });
    const body = res.ok ? (await res.text()).trim() : "";
    if (body === row.token) return null;
    return `http://${row.hostname}${HTTP_CHECK_PATH}/… did not answer the domain's token (HTTP ${res.status}): point the domain at the platform first`;
  } catch (err) {
    return `http://${row.hostname}${HTTP_CHECK_PATH}/… could not be reached (${err instanceof Error ? err.message : String(err)})`;
  }
}

function cloudflareConfigured(config: Config): boolean {
  return config.CF_ZONE_ID !== undefined && config.CF_API_TOKEN !== undefined;
}

type CustomHostname = { id: string; status: string; ssl?: { status?: string; validation_errors?: { message: string }[] }; verification_errors?: string[] };

/** One call to Cloudflare's API on the SaaS zone; its `result`, or an error naming what it said. */
async function cloudflare(config: Config, method: string, path: string, body?: unknown): Promise<CustomHostname> {
  const res = await fetch(`${config.CF_API_URL}/zones/${encodeURIComponent(config.CF_ZONE_ID!)}${path}`, {
    method,
    headers: { Authorization: `Bearer ${config.CF_API_TOKEN}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(CHECK_TIMEOUT_MS),
  });
  const json = (await res.json().catch(() => ({}))) as { success?: boolean; result?: CustomHostname; errors?: { message: string }[] };
  if (!res.ok || json.success === false || (method !== "DELETE" && !json.result)) {
    throw new Error(`Cloudflare answered ${res.status}: ${(json.errors ?? []).map((e) => e.message).join("; ") || "no result"}`);
  }
  return json.result ?? { id: "", status: "deleted" };
}

/**
 * A proven domain's certificate: asked for once (a custom hostname with an
 * HTTP-validated DV certificate), then read until it is active. Without
 * Cloudflare configured there is none to wait for.
 */
async function certificateStep(config: Config, row: DomainRow): Promise<DomainRow> {
  if (!cloudflareConfigured(config)) {
    return { ...row, status: "active", reason: null };
  }
  try {
    const hostname =
      row.certificateId === null
        ? await cloudflare(config, "POST", "/custom_hostnames", { hostname: row.hostname, ssl: { method: "http", type: "dv" } })
        : await cloudflare(config, "GET", `/custom_hostnames/${encodeURIComponent(row.certificateId)}`);
    const ssl = hostname.ssl?.status ?? "pending";
    if (hostname.status === "active" && ssl === "active") return { ...row, certificateId: hostname.id, status: "active", reason: null };
    const errors = [...(hostname.ssl?.validation_errors ?? []).map((e) => e.message), ...(hostname.verification_errors ?? [])];
    if (errors.length > 0) return { ...row, certificateId: hostname.id, status: "failed", reason: `certificate: ${errors.join("; ")}` };
    return { ...row, certificateId: hostname.id, status: "pending_certificate", reason: `certificate ${ssl} (hostname ${hostname.status}): verify again in a minute` };
  } catch (err) {
    return { ...row, reason: `asking for a certificate failed: ${err instanceof Error ? err.message : String(err)}; verify again to retry` };
  }
}
