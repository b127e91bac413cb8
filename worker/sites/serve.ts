import { and, eq } from "drizzle-orm";
import { openDb } from "../db/client";
import { type AppRow, apps, type DomainRedirect, deployments, domains } from "../db/schema";
import { HTTP_CHECK_PATH, pendingToken, redirectTarget } from "../services/domains";
import { nodeRef } from "../services/fleet";
import { configOf, type Env } from "../env";
import { appRuntimeStub, liveInstancesOf, runsProcess } from "../services/app-runtime";
import { BlobCache } from "./blob-cache";
import { compressible, gzip, MIN_GZIP_BYTES, prefersGzip } from "./encoding";
import { HEADERS_LIMITS, type HeaderRule, headersFor } from "./headers";
import { cacheControl, type Decision, decidePath, type ManifestEntry, matchesEtag, normalisePath } from "./resolve";
import { takeSlot } from "./fair-share";
import { enter, isolateName } from "./load-meter";
import { type ProcessTarget, proxyToProcess } from "./proxy";
import { logRequest } from "./request-log";

/**
 * The manifest a deployment publishes; immutable for the deployment's life.
 * `blobs` is where its files live: the account's own content-addressed folder
 * (absent in manifests written before blobs were kept per account).
 * `immutableMarked`: its entries say which files are fingerprinted (absent in
 * manifests written before, whose files are judged by name).
 */
export type Manifest = {
  spa: boolean;
  files: Record<string, ManifestEntry>;
  headers?: HeaderRule[];
  blobs?: string;
  immutableMarked?: true;
};

export const manifestKey = (deploymentId: string) => `manifests/${deploymentId}.json`;
/** An account's blobs: content-addressed, deduplicated within the account only. */
export const blobPrefix = (accountId: string) => `blobs/${accountId}/`;
/** Where manifests without `blobs` find their files (one folder shared by every account, as before). */
const LEGACY_BLOB_PREFIX = "blobs/";
export const blobKey = (prefix: string, sha256: string) => `${prefix}${sha256}`;

type SiteApp = Pick<AppRow, "id" | "accountId" | "runtime" | "status" | "activeDeploymentId" | "liveProcessId" | "liveNode" | "liveInstances" | "autoscaling"> & {
  /** The active release's kind: a worker takes no HTTP traffic. */
  processType: "web" | "worker" | null;
};

/** How a request names its app: `<name>.<APPS_DOMAIN>`, or an active custom domain (with its own settings). */
export type SiteHost = { name: string } | { domain: string };
type HostedApp = SiteApp & { redirect: DomainRedirect; httpsOnly: boolean };

/**
 * How long an app's active deployment and live process are trusted per
 * isolate: a switch is visible everywhere this long after it (AppRuntime
 * counts a deploy done only then).
 */
export const EDGE_APP_TTL_MS = 1_000;
/**
 * The same for an app that runs processes but has none live (never deployed,
 * starting, stopped): short, so that its first instance is reached soon
 * after it is recorded and a first deploy is done without waiting out
 * {@link EDGE_APP_TTL_MS}. Such an app costs an isolate at most one D1 read
 * per this long.
 */
export const EDGE_IDLE_APP_TTL_MS = 100;
const MAX_MANIFESTS = 64;
/** What a client is told to wait while an app (re)starts. */
const STARTING_RETRY_AFTER_SECONDS = 2;

const appCache = new Map<string, { app: HostedApp | null; until: number }>();
/** Hosts cached at once, per isolate: a flood of made-up hosts cannot grow it without bound. */
const MAX_CACHED_HOSTS = 10_000;
const manifestCache = new Map<string, Manifest>();

/**
 * Hot files from memory: blobs up to 256 KiB, 16 MiB in all per isolate (a
 * Workers isolate has 128 MB), least recently used evicted. Content-addressed,
 * so never stale.
 */
const hotBlobs = new BlobCache({ maxBytes: 16 * 1024 * 1024, maxEntryBytes: 256 * 1024 });
/** The gzip copies of hot blobs (encoding.ts), made once per isolate; keyed by the raw blob's hash. */
const gzippedBlobs = new BlobCache({ maxBytes: 8 * 1024 * 1024, maxEntryBytes: 256 * 1024 });
/** Blobs above the memory cache's limit, up to this size, go through the Cache API (the colo's cache) in front of R2. */
const MAX_EDGE_CACHED_BYTES = 8 * 1024 * 1024;

/** `<name>.<APPS_DOMAIN>` → name; null for any other host (the API). */
export function siteName(host: string | undefined, appsDomain: string): string | null {
  if (!host) return null;
  const h = host.toLowerCase();
  const suffix = `.${appsDomain.toLowerCase()}`;
  if (!h.endsWith(suffix)) return null;
  const name = h.slice(0, -suffix.length);
  return /^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$/.test(name) ? name : null;
}

/** How long an isolate trusts its copy of a host's app: shorter while the app has no process to route to. */
function cacheTtl(app: HostedApp | null): number {
  return app && runsProcess(app.runtime) && liveInstancesOf(app).length === 0 ? EDGE_IDLE_APP_TTL_MS : EDGE_APP_TTL_MS;
}

/**
 * The app of a host, trusted per isolate for {@link cacheTtl} unless `fresh` asks for D1's current row:
 * one read either way, a custom domain's joined to its app in the same statement.
 */
async function siteApp(env: Env, host: SiteHost, now: number, fresh = false): Promise<HostedApp | null> {
  const key = "name" in host ? host.name : `domain:${host.domain}`;
  const cached = appCache.get(key);
  if (!fresh && cached && now < cached.until) return cached.app;
  const columns = {
    id: apps.id,
    accountId: apps.accountId,
    runtime: apps.runtime,
    status: apps.status,
    activeDeploymentId: apps.activeDeploymentId,
    liveProcessId: apps.liveProcessId,
    liveNode: apps.liveNode,
    liveInstances: apps.liveInstances,
    autoscaling: apps.autoscaling,
    processType: deployments.processType,
  };
  const db = openDb(env.DB);
  const app: HostedApp | null =
    "name" in host
      ? await db
          .select(columns)
          .from(apps)
          .leftJoin(deployments, eq(deployments.id, apps.activeDeploymentId))
          .where(eq(apps.name, host.name))
          .get()
          .then((row) => (row ? { ...row, redirect: "none" as const, httpsOnly: false } : null))
      : ((await db
          .select({ ...columns, redirect: domains.redirect, httpsOnly: domains.httpsOnly })
          .from(domains)
          .innerJoin(apps, eq(apps.id, domains.appId))
          .leftJoin(deployments, eq(deployments.id, apps.activeDeploymentId))
          .where(and(eq(domains.hostname, host.domain), eq(domains.status, "active")))
          .get()) ?? null);
  if (appCache.size >= MAX_CACHED_HOSTS) appCache.delete(appCache.keys().next().value!);
  appCache.set(key, { app, until: now + cacheTtl(app) });
  return app;
}

async function manifestOf(env: Env, deploymentId: string): Promise<Manifest | null> {
  const cached = manifestCache.get(deploymentId);
  if (cached) return cached;
  const object = await env.BUCKET.get(manifestKey(deploymentId));
  if (!object) return null;
  const manifest = (await object.json()) as Manifest;
  if (manifestCache.size >= MAX_MANIFESTS) manifestCache.delete(manifestCache.keys().next().value!);
  manifestCache.set(deploymentId, manifest);
  return manifest;
}

async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * A small blob's bytes: from memory, else read from R2 and kept once its
 * SHA-256 checks out. Null when R2 lacks it.
 */
async function smallBlob(env: Env, blobs: string, sha256: string): Promise<Uint8Array | null> {
  const cached = hotBlobs.get(sha256);
  if (cached) return cached;
  const object = await env.BUCKET.get(blobKey(blobs, sha256));
  if (!object) return null;
  const bytes = new Uint8Array(await object.arrayBuffer());
  if ((await sha256Hex(bytes)) === sha256) hotBlobs.set(sha256, bytes);
  return bytes;
}

/**
 * A small blob's gzip copy: from memory without touching its bytes, else
 * made from them and kept once they checked out. Null when R2 lacks the blob.
 */
async function gzippedBlob(env: Env, blobs: string, sha256: string): Promise<Uint8Array | null> {
  const cached = gzippedBlobs.get(sha256);
  if (cached) return cached;
  const bytes = await smallBlob(env, blobs, sha256);
  if (!bytes) return null;
  const packed = await gzip(bytes);
  if (hotBlobs.get(sha256) === bytes) gzippedBlobs.set(sha256, packed);
  return packed;
}

/** The client's own Accept-Encoding: on Cloudflare the header a Worker sees is rewritten, the original is in `cf`. */
function clientAcceptEncoding(request: Request): string | null {
  const cf = request.cf as { clientAcceptEncoding?: unknown } | undefined;
  return typeof cf?.clientAcceptEncoding === "string" ? cf.clientAcceptEncoding : request.headers.get("Accept-Encoding");
}

/**
 * A mid-size blob's body through the Cache API: the colo's copy when it has
 * one, else R2's, stored in the cache after the response (waitUntil).
 * Keyed by hash under the site's own origin, so never stale. Null when R2 lacks it.
 */
async function edgeCachedBlob(
  request: Request,
  env: Env,
  blobs: string,
  entry: ManifestEntry,
  waitUntil: (promise: Promise<unknown>) => void,
): Promise<ReadableStream | null> {
  const key = new Request(new URL(`/.svc-blobs/${entry.sha256}`, request.url));
  const hit = await caches.default.match(key);
  if (hit?.body) return hit.body;
  const object = await env.BUCKET.get(blobKey(blobs, entry.sha256));
  if (!object) return null;
  const [body, copy] = object.body.tee();
  const headers = { "Content-Length": String(entry.size), "Cache-Control": "public, max-age=31536000, immutable" };
  waitUntil(caches.default.put(key, new Response(copy, { headers })).catch((err: unknown) => console.error("blob cache put failed", err)));
  return body;
}

/** While no process serves an app that should run (it starts, or restarts with its disk): come back in a moment, never a 404. */
function starting(): Response {
  return page(503, "This app is starting", { "Retry-After": String(STARTING_RETRY_AFTER_SECONDS) });
}

function page(status: number, title: string, extra: Record<string, string> = {}): Response {
  const body = `<!doctype html><meta charset="utf-8"><title>${title}</title><h1>${title}</h1>\n`;
  return new Response(body, { status, headers: { "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache", ...extra } });
}

async function respond(
  request: Request,
  env: Env,
  blobs: string,
  decision: Exclude<Decision, { kind: "not-found" }>,
  marked: boolean,
  extra: Record<string, string>,
  waitUntil: (promise: Promise<unknown>) => void,
): Promise<Response> {
  const { entry } = decision;
  const etag = `"${entry.sha256}"`;
  const ranged = decision.status === 200 && request.headers.has("Range");
  const varies = compressible(entry.contentType);
  // A hot text file goes out as the gzip copy kept beside it when the client's first choice is gzip.
  const encoded = varies && !ranged && entry.size >= MIN_GZIP_BYTES && hotBlobs.admits(entry.size) && prefersGzip(clientAcceptEncoding(request));
  const headers: Record<string, string> = {
    "Content-Type": entry.contentType,
    "Cache-Control": cacheControl(decision, marked),
    ...extra,
    // The gzip copy is another representation of the same file: a weak validator, compared weakly (matchesEtag).
    ETag: encoded ? `W/${etag}` : etag,
    "Accept-Ranges": "bytes",
  };
  if (varies) headers.Vary = extra.Vary && !/accept-encoding/i.test(extra.Vary) ? `${extra.Vary}, Accept-Encoding` : (extra.Vary ?? "Accept-Encoding");
  if (decision.status === 200 && matchesEtag(request.headers.get("If-None-Match"), etag)) {
    return new Response(null, { status: 304, headers });
  }
  const whole = { status: decision.status, headers: { ...headers, "Content-Length": String(entry.size) } };
  const head = request.method === "HEAD";
  if (head && !encoded) return new Response(null, whole);
  // Ranges keep going to R2, which answers them; whole bodies come from memory or the edge cache when they can.
  if (!ranged && hotBlobs.admits(entry.size)) {
    if (!encoded) {
      const bytes = await smallBlob(env, blobs, entry.sha256);
      return bytes ? new Response(bytes, whole) : page(500, "Site file missing");
    }
    // HEAD included: its Content-Length is the gzip copy's.
    const packed = await gzippedBlob(env, blobs, entry.sha256);
    if (!packed) return page(500, "Site file missing");
    return new Response(head ? null : packed, {
      status: decision.status,
      headers: { ...headers, "Content-Encoding": "gzip", "Content-Length": String(packed.byteLength) },
      encodeBody: "manual",
    });
  }
  if (!ranged && entry.size <= MAX_EDGE_CACHED_BYTES) {
    const body = await edgeCachedBlob(request, env, blobs, entry, waitUntil);
    return body ? new Response(body, whole) : page(500, "Site file missing");
  }
  const object = await env.BUCKET.get(blobKey(blobs, entry.sha256), ranged ? { range: request.headers } : undefined);
  if (!object) return page(500, "Site file missing");
  if (ranged && object.range && "offset" in object.range) {
    const offset = object.range.offset ?? 0;
    const length = object.range.length ?? entry.size - offset;
    return new Response(object.body, {
      status: 206,
      headers: { ...headers, "Content-Length": String(length), "Content-Range": `bytes ${offset}-${offset + length - 1}/${entry.size}` },
    });
  }
  return new Response(object.body, whole);
}

/**
 * One request against a manifest. The path is normalised once; the file and
 * the `_headers` rules are both chosen from that path, and a rule applies when
 * it matches the path asked for or the file that answers it (`/admin` serves
 * `/admin/index.html` with the rules of `/admin/*`). A path that cannot be
 * normalised, or longer than any file's, is answered without the site's files.
 */
async function serveFrom(
  request: Request,
  env: Env,
  manifest: Manifest,
  pathname: string,
  waitUntil: (promise: Promise<unknown>) => void,
): Promise<Response> {
  const path = normalisePath(pathname);
  if (path === null) return page(404, "Not found");
  if (path.length > HEADERS_LIMITS.pathChars) return page(414, "URI too long");
  const decision = decidePath(path, (p) => manifest.files[p], manifest.spa);
  if (decision.kind === "not-found") return page(404, "Not found", headersFor(manifest.headers, path));
  const extra = headersFor(manifest.headers, path, decision.path);
  return respond(request, env, manifest.blobs ?? LEGACY_BLOB_PREFIX, decision, manifest.immutableMarked === true, extra, waitUntil);
}

/**
 * Edge serving for `Host: <app>.<APPS_DOMAIN>`: app → active deployment's
 * manifest (cached per isolate) → blob in R2. Every answer is logged for
 * `svc logs <app>` after the response, never before it.
 */
/**
 * An app that runs: its requests go to the processes serving it (proxy.ts);
 * an app scaling on load has them metered (load-meter.ts), and the meter's
 * report leaves after the answer.
 */
async function serveProcess(request: Request, env: Env, host: SiteHost, app: SiteApp, waitUntil: (promise: Promise<unknown>) => void): Promise<Response> {
  const slot = takeSlot(app.id, app.accountId, request.signal);
  if (slot instanceof Response) return slot;
  const metered = app.autoscaling ? enter(app.id) : null;
  try {
    const targets = await liveTargets(env, app);
    if (targets.length === 0) return app.activeDeploymentId ? starting() : page(404, "Nothing deployed yet");
    return await proxyToProcess(request, configOf(env), targets, starting, async () => {
      const fresh = await siteApp(env, host, Date.now(), true);
      return fresh && fresh.status === "running" ? liveTargets(env, fresh) : [];
    });
  } finally {
    slot();
    const load = metered?.() ?? null;
    if (load !== null) waitUntil(appRuntimeStub(env, app.id).reportLoad(isolateName(), load).catch(() => undefined));
  }
}

/** The processes serving the app and where their nodes are reached (the fleet's view, cached per isolate); empty while none serves. */
async function liveTargets(env: Env, app: SiteApp): Promise<ProcessTarget[]> {
  const found = await Promise.all(
    liveInstancesOf(app).map(async ({ processId, node: nodeId }) => {
      const node = await nodeRef(env, nodeId).catch(() => null);
      return node ? { processId, node } : null;
    }),
  );
  return found.filter((target) => target !== null);
}

/**
 * A request for a host that is neither an app's `<name>.<APPS_DOMAIN>` nor the
 * control plane's: an unproven domain's HTTP token (the local ownership check),
 * an active custom domain (its https and www/apex redirects first, then served
 * exactly as the app's own host), or a plain 404.
 */
export async function serveCustomHost(
  request: Request,
  env: Env,
  waitUntil: (promise: Promise<unknown>) => void,
  hostname: string,
): Promise<Response> {
  const url = new URL(request.url);
  if (url.pathname.startsWith(`${HTTP_CHECK_PATH}/`)) {
    const token = url.pathname.slice(HTTP_CHECK_PATH.length + 1);
    const known = /^[0-9A-Za-z]{32}$/.test(token) && (await pendingToken(openDb(env.DB), hostname, token));
    return known ? new Response(token, { headers: { "Content-Type": "text/plain", "Cache-Control": "no-store" } }) : notFoundHost(hostname);
  }
  const app = await siteApp(env, { domain: hostname }, Date.now());
  if (!app) return notFoundHost(hostname);
  const tls = configOf(env).CUSTOM_DOMAIN_TLS === "on";
  const target = redirectTarget(hostname, app.redirect);
  if (target !== null || (tls && app.httpsOnly && url.protocol === "http:")) {
    const to = new URL(url);
    if (target !== null) to.hostname = target;
    if (tls) to.protocol = "https:";
    return new Response(null, { status: 308, headers: { Location: to.href, "Cache-Control": "no-cache" } });
  }
  return serveSite(request, env, waitUntil, { domain: hostname });
}

function notFoundHost(hostname: string): Response {
  return new Response(`No site is served at ${hostname}\n`, { status: 404, headers: { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache" } });
}

export async function serveSite(
  request: Request,
  env: Env,
  waitUntil: (promise: Promise<unknown>) => void,
  host: SiteHost,
): Promise<Response> {
  const started = Date.now();
  const pathname = new URL(request.url).pathname;
  const app = await siteApp(env, host, started);
  let response: Response;
  if (!app) response = page(404, "No such site");
  else if (app.status === "stopped") response = page(503, "This app is stopped");
  else if (app.processType === "worker") return page(404, "This app is a worker: it takes no HTTP traffic");
  else if (runsProcess(app.runtime)) response = await serveProcess(request, env, host, app, waitUntil);
  else if (request.method !== "GET" && request.method !== "HEAD") response = page(405, "Method not allowed", { Allow: "GET, HEAD" });
  else {
    const manifest = app.activeDeploymentId ? await manifestOf(env, app.activeDeploymentId) : null;
    if (!manifest) response = page(404, "Nothing deployed yet");
    else response = await serveFrom(request, env, manifest, pathname, waitUntil);
  }
  if (app) {
    const length = Number(response.headers.get("Content-Length") ?? 0);
    logRequest(
      env,
      {
        appId: app.id,
        at: started,
        method: request.method,
        path: pathname.slice(0, 2048),
        status: response.status,
        bytes: request.method === "HEAD" || response.status === 304 ? 0 : length,
        durationMs: Date.now() - started,
      },
      waitUntil,
    );
  }
  return response;
}
