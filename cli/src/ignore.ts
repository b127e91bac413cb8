/**
 * `.gitignore` rules as git applies them, for packing a deploy's source: the
 * files git would not commit are not uploaded either (build output, caches,
 * local secrets). Written here because the CLI may not add dependencies.
 *
 * Semantics (gitignore(5)): blank lines and `#` comments are skipped; `\#`,
 * `\!` and `\ ` escape; unescaped trailing spaces are dropped. `!` re-includes
 * what an earlier rule excluded. A trailing `/` matches directories only. A
 * pattern with a `/` at its start or middle is anchored to the directory of its
 * `.gitignore`; one without matches a name at any depth below it. `*`, `?` and
 * `[…]` never match `/`; a double asterisk matches across directories when it
 * stands for a whole path segment: leading (any folder), trailing (everything
 * inside) or in the middle (zero or more folders). Rules of deeper `.gitignore` files win over
 * higher ones, later rules over earlier ones; nothing inside an excluded
 * directory can be re-included (git does not look inside it, nor does the walk).
 */

/** One compiled pattern line. */
export type IgnoreRule = {
  /** The line as written, for messages and tests. */
  source: string;
  negated: boolean;
  dirOnly: boolean;
  regex: RegExp;
};

/** The rules of one `.gitignore`, with the folder (relative to the source root, "" for the root) they apply under. */
export type RuleSet = { base: string; rules: IgnoreRule[] };

/** Names never packed, whatever `.gitignore` says: dependencies are installed by the build, and history is not source. */
export const ALWAYS_EXCLUDED = new Set(["node_modules", ".git"]);

/** Escapes one literal character for a RegExp. */
const literal = (ch: string) => ch.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");

/**
 * Translates a `[…]` bracket expression starting at `pattern[start]` (the `[`).
 * Returns the RegExp class and the index after `]`, or null when it is not closed
 * (then `[` is an ordinary character, as in git).
 */
function bracket(pattern: string, start: number): { re: string; end: number } | null {
  let i = start + 1;
  let negate = false;
  if (pattern[i] === "!" || pattern[i] === "^") {
    negate = true;
    i++;
  }
  let body = "";
  let first = true;
  for (; i < pattern.length; i++) {
    const ch = pattern[i]!;
    if (ch === "]" && !first) return { re: `[${negate ? "^" : ""}${body}]`, end: i + 1 };
    first = false;
    if (ch === "\\" && i + 1 < pattern.length) {
      body += literal(pattern[++i]!);
    } else if (ch === "[" && pattern[i + 1] === ":") {
      const close = pattern.indexOf(":]", i + 2);
      if (close === -1) return null;
      const name = pattern.slice(i + 2, close);
      const classes: Record<string, string> = {
        alnum: "a-zA-Z0-9",
        alpha: "a-zA-Z",
        digit: "0-9",
        lower: "a-z",
        upper: "A-Z",
        space: "\\s",
        xdigit: "0-9a-fA-F",
        punct: "!-\\/:-@\\[-`{-~",
      };
      body += classes[name] ?? "";
      i = close + 1;
    } else if (ch === "-" && body !== "" && pattern[i + 1] !== "]") {
      body += "-";
    } else {
      body += literal(ch);
    }
  }
  return null;
}

/** The glob body (no `!`, no trailing `/`, no leading `/`) as a RegExp source matching a whole relative path. */
function globToRegex(glob: string): string {
  let re = "";
  let i = 0;
  while (i < glob.length) {
    const ch = glob[i]!;
    if (ch === "*" && glob[i + 1] === "*") {
      const atStart = i === 0;
      const slashBefore = atStart || glob[i - 1] === "/";
      let j = i;
      while (glob[j] === "*") j++;
      const atEnd = j === glob.length;
      if (slashBefore && (atEnd || glob[j] === "/")) {
        if (atEnd) {
          // `/**` at the end (or a bare `**`): everything inside.
          re += ".*";
          i = j;
        } else {
          // `**/` at the start or `/**/` in the middle: zero or more folders.
          re += "(?:.*/)?";
          i = j + 1;
        }
        continue;
      }
      // Any other run of asterisks is an ordinary `*`.
      re += "[^/]*";
      i = j;
      continue;
    }
    if (ch === "*") re += "[^/]*";
    else if (ch === "?") re += "[^/]";
    else if (ch === "[") {
      const cls = bracket(glob, i);
      if (cls) {
        re += cls.re;
        i = cls.end;
        continue;
      }
      re += "\\[";
    } else if (ch === "\\" && i + 1 < glob.length) {
      re += literal(glob[++i]!);
    } else re += literal(ch);
    i++;
  }
  return re;
}

/** Compiles one line of a `.gitignore`; null for blank lines, comments and lines that match nothing. */
export function compileRule(line: string): IgnoreRule | null {
  let text = line.replace(/\r$/, "");
  // Trailing spaces are dropped unless escaped with a backslash.
  text = text.replace(/(?<!\\)\s+$/, "");
  if (text === "" || text.startsWith("#")) return null;
  let negated = false;
  if (text.startsWith("!")) {
    negated = true;
    text = text.slice(1);
  } else if (text.startsWith("\\!") || text.startsWith("\\#")) {
    text = text.slice(1);
  }
  let dirOnly = false;
  while (text.endsWith("/")) {
    dirOnly = true;
    text = text.slice(0, -1);
  }
  if (text === "") return null;
  const anchored = text.includes("/");
  if (text.startsWith("/")) text = text.slice(1);
  if (text === "") return null;
  const body = globToRegex(text);
  const regex = new RegExp(anchored ? `^${body}$` : `^(?:.*/)?${body}$`);
  return { source: line, negated, dirOnly, regex };
}

/** Parses a whole `.gitignore` file. */
export function parseIgnoreFile(text: string): IgnoreRule[] {
  return text
    .split("\n")
    .map(compileRule)
    .filter((rule): rule is IgnoreRule => rule !== null);
}

/**
 * Whether `path` (relative to the source root, `/`-separated, no trailing
 * slash) is ignored by the rule sets, given in order from the root's
 * `.gitignore` to the deepest. The caller walks top-down and does not enter
 * ignored directories, which is what makes excluded folders final.
 */
export function isIgnored(path: string, isDir: boolean, sets: readonly RuleSet[]): boolean {
  const name = path.slice(path.lastIndexOf("/") + 1);
  if (ALWAYS_EXCLUDED.has(name)) return true;
  let ignored = false;
  for (const { base, rules } of sets) {
    let relative: string;
    if (base === "") relative = path;
    else if (path.startsWith(`${base}/`)) relative = path.slice(base.length + 1);
    else continue;
    for (const rule of rules) {
      if (rule.dirOnly && !isDir) continue;
      if (rule.regex.test(relative)) ignored = !rule.negated;
    }
  }
  return ignored;
}
