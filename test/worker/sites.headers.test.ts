import { describe, expect, it } from "vitest";
import { HEADERS_LIMITS, type HeaderRule, headersFor, parseHeadersFile } from "../../worker/sites/headers";

const rule = (pattern: string): HeaderRule => ({ pattern, headers: [["X-Hit", pattern]] });
const hits = (rules: HeaderRule[], ...paths: string[]) => Object.keys(headersFor(rules, ...paths)).length > 0;
const matches = (pattern: string, path: string) => hits([rule(pattern)], path);

/** Wall-clock milliseconds `fn` takes (workerd's test clock advances during synchronous work). */
function timed(fn: () => void): number {
  const started = performance.now();
  fn();
  return performance.now() - started;
}

describe("_headers patterns: what they match", () => {
  it("* matches any run of characters, / included and empty allowed; :name one non-empty segment", () => {
    expect(matches("/*", "/")).toBe(true);
    expect(matches("/assets/*", "/assets/js/app.js")).toBe(true);
    expect(matches("/assets/*", "/assets/")).toBe(true);
    expect(matches("/assets/*", "/assets")).toBe(false);
    expect(matches("/*.js", "/a/b/c.js")).toBe(true);
    expect(matches("/*.js", "/a/b/c.json")).toBe(false);
    expect(matches("/x/*a*a*b", "/x/aab")).toBe(true);
    expect(matches("/x/*a*a*b", "/x/ab")).toBe(false);
    expect(matches("/blog/:slug", "/blog/hello")).toBe(true);
    expect(matches("/blog/:slug", "/blog/")).toBe(false);
    expect(matches("/blog/:slug", "/blog/a/b")).toBe(false);
    expect(matches("/blog/:slug/*", "/blog/a/b/c")).toBe(true);
    expect(matches("/post-:id.html", "/post-12.html")).toBe(true);
    expect(matches("/:a-:b", "/x-y-z")).toBe(true);
    expect(matches("/:a-:b", "/x-/z")).toBe(false);
    expect(matches("/:lang/*", "/en/docs/x")).toBe(true);
  });

  it("takes the rest of a pattern literally, regular-expression characters included", () => {
    expect(matches("/a.b", "/a.b")).toBe(true);
    expect(matches("/a.b", "/aXb")).toBe(false);
    expect(matches("/(x)+[y]?$", "/(x)+[y]?$")).toBe(true);
    expect(matches("/a:1", "/a:1")).toBe(true);
  });

  it("reads percent-escapes in a pattern as the characters they stand for", () => {
    expect(matches("/some%20page", "/some page")).toBe(true);
    expect(matches("/caf%C3%A9/*", "/café/menu")).toBe(true);
    expect(matches("/a%2A", "/a*")).toBe(true);
    expect(matches("/a%2A", "/abc")).toBe(false);
  });

  it("applies a rule when it matches any of the paths given (the path asked for, the file served)", () => {
    const rules = [rule("/admin/*")];
    expect(hits(rules, "/admin", "/admin/index.html")).toBe(true);
    expect(hits(rules, "/docs", "/docs.html")).toBe(false);
  });
});

describe("_headers patterns: hostile input (ReDoS)", () => {
  // The example: a regular expression took 10 s on this with 250 × a.
  const stars = "/x/*a*a*a*a*b";
  // Adjacent placeholders are nested quantifiers too ([^/]+[^/]+…).
  const placeholders = "/:a:b:c:d:e:f:g/x";

  it("matches the issue's pattern against /x/ + 250 × a in well under a millisecond's worth of work", () => {
    let hit = true;
    expect(timed(() => (hit = matches(stars, `/x/${"a".repeat(250)}`)))).toBeLessThan(50);
    expect(hit).toBe(false);
  });

  it("stays linear with the most rules, the most wildcards and the longest path the edge accepts", () => {
    const path = `/${"a".repeat(HEADERS_LIMITS.pathChars - 1)}`;
    // Patterns that pass the cheap literal checks at both ends, so every rule walks the whole path once per token.
    const mixed = `/${":p*a".repeat(HEADERS_LIMITS.wildcards / 2)}`;
    const params = `/${":p".repeat(HEADERS_LIMITS.wildcards - 1)}*`;
    const rules = Array.from({ length: HEADERS_LIMITS.rules }, (_, i) => rule(i % 2 ? mixed : params));
    let out: Record<string, string> = {};
    // 100 rules × 4,096 characters × 8 wildcards: a backtracking matcher would not finish.
    const ms = timed(() => (out = headersFor(rules, path, path)));
    expect(out).toEqual({ "X-Hit": mixed });
    expect(ms).toBeLessThan(200);
    // Eight times the longest path, on the two hostile patterns: no blow-up hidden behind the limits.
    const long = `/${"a".repeat(8 * HEADERS_LIMITS.pathChars)}`;
    expect(timed(() => headersFor([rule(stars), rule(placeholders), rule(mixed), rule(params)], long))).toBeLessThan(200);
  });
});

describe("_headers files: hostile input at deploy", () => {
  it("reads a file of long runs of spaces in linear time (the deployment must not stall on it)", () => {
    const text = `/*\n${" ".repeat(HEADERS_LIMITS.fileBytes - 100)}x\n`;
    let result: ReturnType<typeof parseHeadersFile> = { ok: true, rules: [] };
    expect(timed(() => (result = parseHeadersFile(text)))).toBeLessThan(200);
    expect(result).toMatchObject({ ok: false, line: 2 });
  });
});

describe("_headers files: parsing and limits", () => {
  const parsed = (text: string) => {
    const result = parseHeadersFile(text);
    if (!result.ok) throw new Error(`refused: line ${result.line}: ${result.message}`);
    return result.rules;
  };

  it("parses rules, keeping each pattern as written", () => {
    const rules = parsed("/*\n  X-Frame-Options: DENY\n\n/assets/*\n  Access-Control-Allow-Origin: *\n");
    expect(rules).toEqual([
      { pattern: "/*", headers: [["X-Frame-Options", "DENY"]] },
      { pattern: "/assets/*", headers: [["Access-Control-Allow-Origin", "*"]] },
    ]);
  });

  it("refuses more rules than the limit, naming the first rule over it", () => {
    const text = Array.from({ length: HEADERS_LIMITS.rules + 1 }, (_, i) => `/p${i}\n  X-A: ${i}`).join("\n");
    const result = parseHeadersFile(text);
    expect(result).toMatchObject({ ok: false, line: 2 * HEADERS_LIMITS.rules + 1 });
    expect(!result.ok && result.message).toMatch(/more than 100 rules/);
    expect(parseHeadersFile(text.split("\n").slice(0, -2).join("\n")).ok).toBe(true);
  });

  it("refuses a line over 2,000 characters, a pattern with too many wildcards, and a file over its size", () => {
    const long = parseHeadersFile(`/*\n  X-Long: ${"v".repeat(HEADERS_LIMITS.lineChars)}\n`);
    expect(long).toMatchObject({ ok: false, line: 2 });
    expect(!long.ok && long.message).toMatch(/2,000 characters/);
    const wild = parseHeadersFile(`/*\n  X-A: 1\n/x/${"*a".repeat(HEADERS_LIMITS.wildcards + 1)}\n  X-B: 1\n`);
    expect(wild).toMatchObject({ ok: false, line: 3 });
    expect(!wild.ok && wild.message).toMatch(/wildcards/);
    expect(parseHeadersFile(`/x/${"*a".repeat(HEADERS_LIMITS.wildcards)}\n  X-B: 1\n`).ok).toBe(true);
    const big = parseHeadersFile(`# ${"x".repeat(HEADERS_LIMITS.fileBytes)}\n/*\n  X-A: 1\n`);
    expect(big).toMatchObject({ ok: false, line: null });
    expect(!big.ok && big.message).toMatch(/64 KiB/);
  });

  it("refuses a pattern that could never match a path: a malformed percent-escape, . or .. segments", () => {
    expect(parseHeadersFile("/a%E0%A4%A/*\n  X-A: 1\n")).toMatchObject({ ok: false, line: 1 });
    expect(parseHeadersFile("/a/../b\n  X-A: 1\n")).toMatchObject({ ok: false, line: 1 });
    expect(parseHeadersFile("/a/./b\n  X-A: 1\n")).toMatchObject({ ok: false, line: 1 });
  });
});

describe("_headers files: Set-Cookie", () => {
  it("refuses a Set-Cookie with a Domain attribute in any spelling, naming the line", () => {
    for (const value of [
      "x=1; Domain=apps.example",
      "x=1;domain=.apps.example",
      "x=1; Path=/;  DOMAIN = apps.example ; Secure",
      "x=1; Secure; dOmAiN",
    ]) {
      const result = parseHeadersFile(`/*\n  X-A: 1\n  set-cookie: ${value}\n`);
      expect(result, value).toMatchObject({ ok: false, line: 3 });
      expect(!result.ok && result.message).toMatch(/Domain/);
    }
  });

  it("keeps a host-only Set-Cookie (no Domain), even one named Domain", () => {
    const result = parseHeadersFile("/*\n  Set-Cookie: Domain=1; Path=/; Secure; HttpOnly\n");
    expect(result).toEqual({ ok: true, rules: [{ pattern: "/*", headers: [["Set-Cookie", "Domain=1; Path=/; Secure; HttpOnly"]] }] });
  });

  it("never sends a Set-Cookie with a Domain attribute from rules stored before it was refused", () => {
    const stored: HeaderRule[] = [
      { pattern: "/*", headers: [["Set-Cookie", "x=1; Domain=apps.example"], ["X-A", "1"]] },
      { pattern: "/ok", headers: [["set-cookie", "y=2; Path=/"]] },
    ];
    expect(headersFor(stored, "/")).toEqual({ "X-A": "1" });
    expect(headersFor(stored, "/ok")).toEqual({ "X-A": "1", "set-cookie": "y=2; Path=/" });
  });
});
