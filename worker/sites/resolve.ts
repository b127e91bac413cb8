/**
 * The static-site serving rules (spec "Static sites" 3-5, DESIGN §4) as one
 * pure function: it takes the request path and a manifest lookup and decides
 * what to answer, so every rule is unit-tested without R2 or D1 (STYLE 10).
 */
import { hasContentHash } from "./fingerprint";

/** `immutable`: the deployment found the file fingerprinted (fingerprint.ts); absent for every other file. */
export type ManifestEntry = { sha256: string; size: number; contentType: string; immutable?: true };

export type Lookup = (path: string) => ManifestEntry | undefined;

export type Decision =
  | { kind: "file"; path: string; entry: ManifestEntry; status: 200 }
  | { kind: "spa-fallback"; path: "/index.html"; entry: ManifestEntry; status: 200 }
  | { kind: "not-found-page"; path: "/404.html"; entry: ManifestEntry; status: 404 }
  | { kind: "not-found"; status: 404 };

/** Decodes and normalises a URL path; null for paths that try to leave the root or are malformed. */
export function normalisePath(pathname: string): string | null {
  let decoded: string;
  try {
    decoded = decodeURIComponent(pathname);
  } catch {
    return null;
  }
  if (!decoded.startsWith("/") || decoded.includes("\0") || decoded.includes("\\")) return null;
  const segments = decoded.split("/");
  if (segments.some((s) => s === ".." || s === ".")) return null;
  return decoded.replace(/\/{2,}/g, "/");
}

/**
 * file → `dir/` → `dir/index.html` → `path.html` / `path/index.html`; then,
 * on a miss, `index.html` (200) when `spa`, else `404.html` (404) if the site
 * has one (ignored when `spa`), else a plain 404.
 */
export function decide(pathname: string, lookup: Lookup, spa: boolean): Decision {
  return decidePath(normalisePath(pathname), lookup, spa);
}

/**
 * {@link decide} for a path {@link normalisePath} already read (null when it
 * refused it): the edge normalises once, and matches `_headers` rules against
 * the same path that chooses the file, never a second decoding of it.
 */
export function decidePath(path: string | null, lookup: Lookup, spa: boolean): Decision {
  if (path !== null) {
    const candidates = path.endsWith("/") ? [`${path}index.html`] : [path, `${path}.html`, `${path}/index.html`];
    for (const candidate of candidates) {
      const entry = lookup(candidate);
      if (entry) return { kind: "file", path: candidate, entry, status: 200 };
    }
  }
  if (spa) {
    const index = lookup("/index.html");
    if (index) return { kind: "spa-fallback", path: "/index.html", entry: index, status: 200 };
    return { kind: "not-found", status: 404 };
  }
  const page = lookup("/404.html");
  if (page) return { kind: "not-found-page", path: "/404.html", entry: page, status: 404 };
  return { kind: "not-found", status: 404 };
}

/**
 * HTML and every fallback must revalidate (a missing hashed asset must never be
 * cached as immutable); fingerprinted assets are immutable for a year. Which
 * files are fingerprinted the deployment decided (`marked`: the manifest's
 * entries carry `immutable`); manifests stored before that are read by name.
 */
export function cacheControl(decision: Exclude<Decision, { kind: "not-found" }>, marked = false): string {
  if (decision.kind !== "file") return "no-cache";
  if (decision.entry.contentType.startsWith("text/html")) return "no-cache";
  const name = decision.path.slice(decision.path.lastIndexOf("/") + 1);
  const immutable = marked ? decision.entry.immutable === true : hasContentHash(name);
  return immutable ? "public, max-age=31536000, immutable" : "no-cache";
}

/** Weak comparison of an If-None-Match header against our strong ETag. */
export function matchesEtag(ifNoneMatch: string | null, etag: string): boolean {
  if (!ifNoneMatch) return false;
  if (ifNoneMatch.trim() === "*") return true;
  return ifNoneMatch.split(",").some((t) => t.trim().replace(/^W\//, "") === etag);
}
