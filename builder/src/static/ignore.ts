/**
 * `.gitignore` rules as git applies them. The CLI and the dashboard pack a
 * deploy's source with them (the files git would not commit are not uploaded
 * either: build output, caches, local secrets), and the builder applies them
 * again when a plain folder's root is served, so a source uploaded any other
 * way cannot publish what it ignores. The pattern syntax (gitignore(5): comments, escapes,
 * negation, directory-only and anchored patterns, `*`, `?`, `[…]`, `**`) is
 * the `ignore` package's, the one eslint and prettier use; this file is the
 * policy around it: one rule set per `.gitignore` file, applied below its
 * folder, deeper files winning over higher ones as in git, matched
 * case-sensitively as git does on Linux, and what ALWAYS_EXCLUDED names
 * (`node_modules`, `.git`, `.venv`, `__pycache__`, …) never packed. The
 * caller walks top-down and does not enter ignored directories, which is what
 * makes excluded folders final (git does not look inside them).
 */
import ignore, { type Ignore } from "ignore";

/** The rules of one `.gitignore`, with the folder (relative to the source root, "" for the root) they apply under. */
export type RuleSet = { base: string; rules: Ignore };

/**
 * Names never packed, whatever `.gitignore` says: dependencies are installed
 * by the build (node_modules, a python virtualenv), history is not source,
 * and caches of the machine that packs are not the app's.
 */
export const ALWAYS_EXCLUDED = new Set(["node_modules", ".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox"]);

/** Whether `path` is left out by {@link ALWAYS_EXCLUDED}, whatever the rules say. */
export function alwaysExcluded(path: string): boolean {
  return ALWAYS_EXCLUDED.has(path.slice(path.lastIndexOf("/") + 1));
}

/** Parses a whole `.gitignore` file. */
export function parseIgnoreFile(text: string): Ignore {
  return ignore({ ignorecase: false }).add(text);
}

/**
 * Whether `path` (relative to the source root, `/`-separated, no trailing
 * slash) is ignored by the rule sets, given in order from the root's
 * `.gitignore` to the deepest: the last file with a rule that matches decides.
 */
export function isIgnored(path: string, isDir: boolean, sets: readonly RuleSet[]): boolean {
  if (alwaysExcluded(path)) return true;
  let ignored = false;
  for (const { base, rules } of sets) {
    let relative: string;
    if (base === "") relative = path;
    else if (path.startsWith(`${base}/`)) relative = path.slice(base.length + 1);
    else continue;
    // A trailing slash tells the package it is a directory, for `dir/` patterns.
    const verdict = rules.test(isDir ? `${relative}/` : relative);
    if (verdict.ignored) ignored = true;
    else if (verdict.unignored) ignored = false;
  }
  return ignored;
}
