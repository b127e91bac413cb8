import type { Config, Env } from "./env";

/**
 * The dashboard: a single-page app built into Workers Static Assets
 * (`dashboard/dist`) and served on the API's own origin, never on an app host.
 * The Worker runs first for every request (app hosts share it), answers `/v1`,
 * `/storage`, `/internal` and `/healthz` itself, and hands the other GET/HEAD
 * requests of the API origin to the ASSETS binding, adding the security and
 * caching headers here, where the storage origin the page uploads to is known.
 */

/** Paths the Worker owns on the API origin; the dashboard never shadows them. */
const WORKER_PATHS = /^\/(v1|storage|internal)(\/|$)|^\/healthz$/;

/** Vite puts content-hashed files here; nothing else is. */
const HASHED = /^\/assets\//;

/** Whether a request that matched no Worker route is the dashboard's. */
export function isDashboardRequest(method: string, path: string): boolean {
  return (method === "GET" || method === "HEAD") && !WORKER_PATHS.test(path);
}

/**
 * The Content-Security-Policy: scripts, styles and API calls from this origin
 * only (no inline script, no eval), uploads also to the storage origin when
 * presigned URLs point elsewhere (R2 in production), and never in a frame.
 */
export function contentSecurityPolicy(storageOrigin: string | null): string {
  const connect = storageOrigin ? `'self' ${storageOrigin}` : "'self'";
  return [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "font-src 'self'",
    `connect-src ${connect}`,
    "manifest-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ");
}

/** The headers every dashboard response carries; hashed assets are cached for good, the rest revalidated. */
export function dashboardHeaders(path: string, storageOrigin: string | null): Record<string, string> {
  return {
    "Content-Security-Policy": contentSecurityPolicy(storageOrigin),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": HASHED.test(path) ? "public, max-age=31536000, immutable" : "no-cache",
  };
}

/** The origin of presigned storage URLs, when it is not the API's own. */
function storageOrigin(config: Config, requestUrl: URL): string | null {
  const origin = new URL(config.S3_ENDPOINT).origin;
  return origin === requestUrl.origin ? null : origin;
}

/**
 * Serves a dashboard path from the assets. Unknown paths are client-side
 * routes and get index.html (`not_found_handling = "single-page-application"`),
 * except under /assets/: a missing hashed file is a 404, never an HTML page
 * cached as immutable under a script's name.
 */
export async function serveDashboard(request: Request, env: Env, config: Config): Promise<Response> {
  const url = new URL(request.url);
  const asset = await env.ASSETS.fetch(request);
  const headers = dashboardHeaders(url.pathname, storageOrigin(config, url));
  if (HASHED.test(url.pathname) && asset.headers.get("Content-Type")?.startsWith("text/html")) {
    await asset.body?.cancel();
    return new Response(`no such asset: ${url.pathname}\n`, {
      status: 404,
      headers: { ...headers, "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache" },
    });
  }
  const response = new Response(asset.body, asset);
  for (const [name, value] of Object.entries(headers)) response.headers.set(name, value);
  return response;
}
