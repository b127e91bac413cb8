/**
 * A site's `_headers` file (the Cloudflare Pages format, DESIGN §6): a URL
 * pattern on its own line, then indented `Name: value` lines. `*` matches any
 * run of characters (including `/`), `:name` one path segment. Rules are parsed
 * once when a deployment is published and stored in its manifest.
 */
export type HeaderRule = { pattern: string; headers: [string, string][] };

const MAX_RULES = 100;
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Set by the edge itself; a `_headers` file cannot change them. */
const RESERVED = new Set(["content-length", "content-range", "etag", "accept-ranges", "transfer-encoding"]);

export function parseHeadersFile(text: string): HeaderRule[] {
  const rules: HeaderRule[] = [];
  let current: HeaderRule | null = null;
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.replace(/\s+$/, "");
    if (line.trim() === "" || line.trim().startsWith("#")) continue;
    if (!/^\s/.test(line)) {
      current = line.startsWith("/") && rules.length < MAX_RULES ? { pattern: line.trim(), headers: [] } : null;
      if (current) rules.push(current);
      continue;
    }
    const colon = line.indexOf(":");
    if (!current || colon < 0) continue;
    const name = line.slice(0, colon).trim();
    const value = line.slice(colon + 1).trim();
    if (HEADER_NAME.test(name) && !RESERVED.has(name.toLowerCase()) && !/[\r\n\0]/.test(value)) {
      current.headers.push([name, value]);
    }
  }
  return rules.filter((r) => r.headers.length > 0);
}

/** Compiled patterns, shared by every request of the isolate (manifests are immutable). */
const matchers = new Map<string, RegExp>();

function matcher(pattern: string): RegExp {
  const cached = matchers.get(pattern);
  if (cached) return cached;
  const source = pattern
    .split(/(\*|:[A-Za-z_][A-Za-z0-9_]*)/)
    .map((part) => {
      if (part === "*") return ".*";
      if (part.startsWith(":")) return "[^/]+";
      return part.replace(/[.+?^${}()|[\]\\]/g, "\\$&");
    })
    .join("");
  const compiled = new RegExp(`^${source}$`);
  if (matchers.size < 1000) matchers.set(pattern, compiled);
  return compiled;
}

/** The headers every matching rule adds for `pathname`, later rules winning on the same name. */
export function headersFor(rules: HeaderRule[] | undefined, pathname: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const rule of rules ?? []) {
    if (!matcher(rule.pattern).test(pathname)) continue;
    for (const [name, value] of rule.headers) out[name] = value;
  }
  return out;
}
