/**
 * The project a command stands in: the nearest `svc.json` in the current
 * folder or one above it, whose `name` is the app every app command acts on
 * when `--app` is not given (as `svc deploy` always did with its folder's).
 */
import { readFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { parseSvcJson } from "../../builder/src/static/project-config.js";
import { CliError } from "./output.js";

/** The nearest svc.json from `cwd` up to the filesystem root (`file` relative to `cwd`), or null; one that does not parse is an error. */
export function nearestProject(cwd: string): { file: string; name: string | undefined } | null {
  for (let folder = cwd; ; folder = dirname(folder)) {
    const file = join(folder, "svc.json");
    let text: string | undefined;
    try {
      text = readFileSync(file, "utf8");
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "ENOENT" && code !== "ENOTDIR") throw new CliError(`could not read ${file}`, [err instanceof Error ? err.message : String(err)]);
    }
    if (text !== undefined) {
      const parsed = parseSvcJson(text);
      const shown = relative(cwd, file) || "svc.json";
      if (!parsed.ok) throw new CliError(`${shown} is not valid`, [parsed.error], "fix it, pass --app <app>, or write a fresh one with `svc init --force`");
      return { file: shown, name: parsed.config.name };
    }
    if (dirname(folder) === folder) return null;
  }
}
