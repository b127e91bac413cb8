/**
 * The project a command stands in: its `svc.json`, checked by the builder's
 * own rules, and the nearest one in the current folder or above it, whose
 * `name` is the app every app command acts on when `--app` is not given.
 */
import { readFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { parseSvcJson, type SvcJson } from "../../builder/src/static/project-config.js";
import { CliError } from "./output.js";

/** The svc.json in `folder` (named `shown` in errors), or null when there is none; one that does not parse is an error. */
export function readSvcJson(folder: string, shown = join(folder, "svc.json")): SvcJson | null {
  const file = join(folder, "svc.json");
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return null;
    throw new CliError(`could not read ${shown}`, [err instanceof Error ? err.message : String(err)]);
  }
  const parsed = parseSvcJson(text);
  if (!parsed.ok) throw new CliError(`${shown} is not valid`, [parsed.error], "fix it, or write a fresh one with `svc init --force`");
  return parsed.config;
}

/** The nearest svc.json from `cwd` up to the filesystem root (`file` relative to `cwd`), or null. */
export function nearestProject(cwd: string): { file: string; name: string | undefined } | null {
  for (let folder = cwd; ; folder = dirname(folder)) {
    const file = relative(cwd, join(folder, "svc.json")) || "svc.json";
    const config = readSvcJson(folder, file);
    if (config !== null) return { file, name: config.name };
    if (dirname(folder) === folder) return null;
  }
}
