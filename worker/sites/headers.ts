/**
 * A site's `_headers` file (the Cloudflare Pages format, DESIGN §6): a URL
 * pattern on its own line, then indented `Name: value` lines. `*` matches any
 * run of characters (including `/`), `:name` one path segment. Rules are parsed
 * once when a deployment is published (a bad file fails the deployment) and
 * stored in its manifest; the edge matches them against the normalised path
 * (resolve.ts), never a regular expression, in time linear in the path.
 */
export type HeaderRule = { pattern: string; headers: [string, string][] };

/** A file the deployment may publish, or the first line that stops it and why. */
export type ParsedHeaders = { ok: true; rules: HeaderRule[] } | { ok: false; line: number | null; message: string };

/**
 * What a `_headers` file may hold (docs/static-sites.md). Rules and line length
 * are Cloudflare Pages' own limits; the others bound the edge's work per request:
 * at most `rules × (2 × wildcards + 1)` passes over a path of at most `pathChars`.
 */
export const HEADERS_LIMITS = {
  fileBytes: 64 * 1024,
  rules: 100,
  lineChars: 2_000,
  /** `*` and `:name` together, in one pattern. */
  wildcards: 8,
  /** The longest decoded request path the edge matches (and serves): a manifest path's own limit. */
  pathChars: 4_096,
} as const;

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Set by the edge itself; a `_headers` file cannot change them. */
const RESERVED = new Set(["content-length", "content-range", "etag", "accept-ranges", "transfer-encoding"]);
const WILDCARD = /(\*|:[A-Za-z_][A-Za-z0-9_]*)/;

const STAR = 0;
const PARAM = 1;
/** A literal piece of a pattern, with its KMP failure table. */
type Literal = { text: string; fail: Int32Array };
type Token = typeof STAR | typeof PARAM | Literal;
type Compiled = { ok: true; tokens: Token[] } | { ok: false; message: string };

/**
 * A `Set-Cookie` value with a `Domain` attribute (any case or spacing) would
 * reach every site under the apps domain: cookie tossing between tenants.
 */
function setsCookieDomain(name: string, value: string): boolean {
  if (name.toLowerCase() !== "set-cookie") return false;
  return value
    .split(";")
    .slice(1)
    .some((attribute) => attribute.split("=", 1)[0]!.trim().toLowerCase() === "domain");
}

function literal(text: string): Literal {
  const fail = new Int32Array(text.length);
  for (let i = 1, k = 0; i < text.length; i++) {
    while (k > 0 && text.charCodeAt(i) !== text.charCodeAt(k)) k = fail[k - 1]!;
    if (text.charCodeAt(i) === text.charCodeAt(k)) k++;
    fail[i] = k;
  }
  return { text, fail };
}

/**
 * A pattern as the tokens the matcher walks. Its literal parts are read the
 * way request paths are (percent-escapes decoded, `//` collapsed), so a rule
 * written `/caf%C3%A9/*` matches `/café/` as the file lookup sees it.
 */
function compile(pattern: string): Compiled {
  if (pattern.length > HEADERS_LIMITS.lineChars) return { ok: false, message: "the pattern is too long" };
  const tokens: Token[] = [];
  let wildcards = 0;
  let shape = "";
  for (const [i, part] of pattern.split(WILDCARD).entries()) {
    if (i % 2 === 1) {
      wildcards++;
      shape += "\u0001";
      if (part === "*" && tokens.at(-1) === STAR) continue;
      tokens.push(part === "*" ? STAR : PARAM);
      continue;
    }
    if (part === "") continue;
    let text: string;
    try {
      text = decodeURIComponent(part).replace(/\/{2,}/g, "/");
    } catch {
      return { ok: false, message: "the pattern has a malformed percent-escape (%XX)" };
    }
    if (text.includes("\0") || text.includes("\\")) return { ok: false, message: "the pattern has a NUL or a backslash, which no path holds" };
    shape += text;
    tokens.push(literal(text));
  }
  if (wildcards > HEADERS_LIMITS.wildcards) {
    return { ok: false, message: `the pattern has ${wildcards} wildcards (* and :name); at most ${HEADERS_LIMITS.wildcards} are allowed` };
  }
  if (shape.split("/").some((segment) => segment === "." || segment === "..")) {
    return { ok: false, message: "the pattern has a . or .. segment, which no path holds once normalised" };
  }
  return { ok: true, tokens };
}

/**
 * Whether `tokens` match all of `path`: one pass over the path per token,
 * carrying the set of positions the pattern so far can end at (no
 * backtracking, so no input makes it slower than tokens × path length).
 * `reach` and `next` are scratch space of at least `path.length + 1`.
 */
function matchTokens(tokens: Token[], path: string, reach: Uint8Array, next: Uint8Array): boolean {
  const n = path.length;
  const first = tokens[0];
  const last = tokens.at(-1);
  // Cheap refusals first: most rules fail on their literal start or end.
  if (first !== undefined && typeof first === "object" && !path.startsWith(first.text)) return false;
  if (last !== undefined && typeof last === "object" && !path.endsWith(last.text)) return false;
  reach.fill(0, 0, n + 1);
  reach[0] = 1;
  for (const token of tokens) {
    next.fill(0, 0, n + 1);
    let any = false;
    if (token === STAR) {
      const from = reach.indexOf(1);
      if (from >= 0 && from <= n) {
        next.fill(1, from, n + 1);
        any = true;
      }
    } else if (token === PARAM) {
      // One or more characters other than `/`, from any position reached.
      let open = false;
      for (let i = 0; i <= n; i++) {
        if (open) {
          next[i] = 1;
          any = true;
        }
        if (i < n) {
          if (path.charCodeAt(i) === 47) open = false;
          else if (reach[i]) open = true;
        }
      }
    } else {
      // Every occurrence of the literal (Knuth-Morris-Pratt) that starts where the pattern so far ended.
      const { text, fail } = token;
      const m = text.length;
      for (let i = 0, k = 0; i < n; i++) {
        const c = path.charCodeAt(i);
        while (k > 0 && text.charCodeAt(k) !== c) k = fail[k - 1]!;
        if (text.charCodeAt(k) === c) k++;
        if (k === m) {
          if (reach[i + 1 - m]) {
            next[i + 1] = 1;
            any = true;
          }
          k = fail[k - 1]!;
        }
      }
    }
    if (!any) return false;
    reach.set(next.subarray(0, n + 1));
  }
  return reach[n] === 1;
}

/** Compiled patterns, shared by every request of the isolate (manifests are immutable). */
const compiled = new Map<string, Compiled>();

function compiledOf(pattern: string): Compiled {
  const cached = compiled.get(pattern);
  if (cached) return cached;
  const result = compile(pattern);
  if (compiled.size < 1000) compiled.set(pattern, result);
  return result;
}

/**
 * Reads a `_headers` file, refusing what the edge will not serve: more than
 * {@link HEADERS_LIMITS}, patterns that cannot match a path, and a
 * `Set-Cookie` with a `Domain` attribute. Lines for other hosts
 * (`https://…`), header lines without a rule, invalid names and the headers
 * the edge sets itself are skipped, as before.
 */
export function parseHeadersFile(text: string): ParsedHeaders {
  const bytes = new TextEncoder().encode(text).byteLength;
  if (bytes > HEADERS_LIMITS.fileBytes) {
    return { ok: false, line: null, message: `the file is ${Math.ceil(bytes / 1024)} KiB; at most ${HEADERS_LIMITS.fileBytes / 1024} KiB is allowed` };
  }
  const rules: HeaderRule[] = [];
  let current: HeaderRule | null = null;
  for (const [index, raw] of text.split(/\r?\n/).entries()) {
    const lineNumber = index + 1;
    // trimEnd, not /\s+$/: that regular expression is quadratic on a long run of spaces.
    const line = raw.trimEnd();
    if (line.trim() === "" || line.trim().startsWith("#")) continue;
    if (line.length > HEADERS_LIMITS.lineChars) {
      return { ok: false, line: lineNumber, message: `the line is ${line.length} characters long; a line may have at most ${HEADERS_LIMITS.lineChars.toLocaleString("en-US")} characters` };
    }
    if (!/^\s/.test(line)) {
      current = null;
      if (!line.startsWith("/")) continue;
      if (rules.length === HEADERS_LIMITS.rules) {
        return { ok: false, line: lineNumber, message: `more than ${HEADERS_LIMITS.rules} rules; put headers shared by many paths on one pattern (/* or /assets/*)` };
      }
      const pattern = line.trim();
      const result = compile(pattern);
      if (!result.ok) return { ok: false, line: lineNumber, message: `${result.message}: ${pattern.slice(0, 100)}` };
      current = { pattern, headers: [] };
      rules.push(current);
      continue;
    }
    const colon = line.indexOf(":");
    if (!current || colon < 0) continue;
    const name = line.slice(0, colon).trim();
    const value = line.slice(colon + 1).trim();
    if (!HEADER_NAME.test(name) || RESERVED.has(name.toLowerCase()) || /[\r\n\0]/.test(value)) continue;
    if (setsCookieDomain(name, value)) {
      return {
        ok: false,
        line: lineNumber,
        message: "a Set-Cookie with a Domain attribute would reach every site of the platform; leave Domain out (the cookie stays on your site)",
      };
    }
    current.headers.push([name, value]);
  }
  return { ok: true, rules: rules.filter((r) => r.headers.length > 0) };
}

/**
 * The headers every rule matching one of `paths` adds (normalised paths: the
 * one asked for and the file that answers it), later rules winning on the same
 * name. Rules stored before the deploy-time checks are held to the same limits
 * here: past the rule limit or with a pattern over them they are skipped, and a
 * `Set-Cookie` with `Domain` is dropped.
 */
export function headersFor(rules: HeaderRule[] | undefined, ...paths: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  if (!rules?.length) return out;
  const size = Math.max(0, ...paths.map((p) => p.length)) + 1;
  const reach = new Uint8Array(size);
  const next = new Uint8Array(size);
  for (const rule of rules.slice(0, HEADERS_LIMITS.rules)) {
    const pattern = compiledOf(rule.pattern);
    if (!pattern.ok || !paths.some((path) => matchTokens(pattern.tokens, path, reach, next))) continue;
    for (const [name, value] of rule.headers) if (!setsCookieDomain(name, value)) out[name] = value;
  }
  return out;
}
