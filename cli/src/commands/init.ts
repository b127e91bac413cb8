import { lstat, readFile, stat, writeFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import {
  type DetectedProject,
  describeNotStatic,
  FRAMEWORK_NAMES,
  findLockfile,
  PROJECT_ROOT,
  type ProjectFiles,
  readPackageJson,
  detectProject,
  rootOutputProblem,
} from "../../../builder/src/detect.js";
import { siteDir } from "../../../builder/src/protocol.js";
import { type BaseContext, defineCommand, YES_OPTION } from "../command.js";
import { CliError } from "../output.js";
import { confirm } from "../prompt.js";
import type { App } from "./apps.js";

/** What `svc init` writes: the spec's svc.json fields (port is left to its default). */
export type SvcJson = {
  name: string;
  runtime: "static";
  buildCommand?: string;
  outputDir: string;
  spa: boolean;
};

/** The API's app-name rule: apps become subdomains. */
const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$/;

/** Largest file detection reads (package.json, framework configs): anything bigger is not a config. */
const MAX_READ_BYTES = 1024 * 1024;

/** Read access to a folder on disk, the interface the builder's detection reads projects through. */
export function folderFiles(root: string): ProjectFiles {
  const regular = async (path: string) => (await stat(join(root, path)).catch(() => null))?.isFile() === true;
  return {
    async read(path) {
      const file = join(root, path);
      const info = await stat(file).catch(() => null);
      if (!info?.isFile()) return null;
      if (info.size > MAX_READ_BYTES) throw new CliError(`${file} is larger than ${MAX_READ_BYTES} bytes`, [], "is it really a configuration file?");
      return readFile(file, "utf8");
    },
    exists: regular,
  };
}

/** A folder name as an app name: lower case, runs of anything else as one hyphen, at most 52 characters. */
export function dnsLabel(folder: string): string {
  const label = folder
    .toLowerCase()
    .normalize("NFKD")
    .replace(/[\u0300-\u036f]/g, "")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+/, "")
    .slice(0, 52)
    .replace(/-+$/, "");
  return label === "" ? "site" : label;
}

/**
 * Whether unknown paths should get index.html. Detection says so when it sees
 * a client-side router; beyond that, Vite and Create React App build one HTML
 * page whose script renders every route, so they are single-page apps unless
 * told otherwise, and SvelteKit is one when adapter-static has a `fallback`
 * page. Frameworks that prerender a page per route (Next.js export, Astro,
 * Gatsby, Nuxt generate, Eleventy) and plain folders are not: a miss there
 * should be a real 404.
 */
export async function spaFor(detected: DetectedProject, files: ProjectFiles): Promise<boolean> {
  if (detected.spa !== undefined) return detected.spa;
  if (detected.framework === "vite" || detected.framework === "create-react-app") return true;
  if (detected.framework === "sveltekit") {
    for (const name of ["svelte.config.js", "svelte.config.mjs", "svelte.config.ts"]) {
      const text = await files.read(name);
      if (text !== null) return /\bfallback\s*:/.test(text);
    }
  }
  return false;
}

/** What the command line asks for; each given field wins over detection. */
export type InitChoices = { name?: string; buildCommand?: string; outputDir?: string; spa?: boolean };

/** The fields of an svc.json already there (with --force), kept where neither flags nor detection say otherwise. */
async function previousConfig(file: string): Promise<Partial<SvcJson>> {
  const text = await readFile(file, "utf8").catch(() => null);
  if (text === null) return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return {};
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return {};
  const record = value as Record<string, unknown>;
  const str = (key: string) => (typeof record[key] === "string" && record[key] !== "" ? (record[key] as string) : undefined);
  const kept: Partial<SvcJson> = {};
  const name = str("name");
  const buildCommand = str("buildCommand");
  const outputDir = str("outputDir");
  if (name !== undefined && DNS_LABEL.test(name)) kept.name = name;
  if (buildCommand !== undefined) kept.buildCommand = buildCommand;
  if (outputDir !== undefined) kept.outputDir = outputDir;
  if (typeof record.spa === "boolean") kept.spa = record.spa;
  return kept;
}

/** What `svc init` found, for the "Detected:" line. */
export type InitPlan = { config: SvcJson; detected: DetectedProject | null; packageManager: string | null; lockfile: string | null };

/**
 * The svc.json `svc init` writes for the folder. Each field comes from the
 * command line, else detection, else the svc.json being replaced (--force), else
 * a default: the folder's name, the package.json `build` script, spa false. A
 * CliError when no output folder is known: then it is not a static site.
 */
export async function planInit(dir: string, choices: InitChoices = {}, previous: Partial<SvcJson> = {}): Promise<InitPlan> {
  const files = folderFiles(dir);
  const detected = await detectProject(files);
  const pkg = await readPackageJson(files);
  const pkgJson = pkg !== null && !("error" in pkg) ? pkg : null;
  const lockfile = await findLockfile(files, pkgJson);
  const outputDir = choices.outputDir ?? detected?.outputDir ?? previous.outputDir;
  if (outputDir === undefined) {
    throw new CliError(
      `no static site found in ${dir}`,
      [await describeNotStatic(files)],
      "put the site in static/index.html (or index.html at the root, without package.json), or say where the build writes it: svc init --output-dir <folder> --build-command <command>",
    );
  }
  const buildScript = pkgJson?.scripts?.build ? `${lockfile?.packageManager ?? "npm"} run build` : undefined;
  const buildCommand = choices.buildCommand ?? detected?.buildCommand ?? previous.buildCommand ?? buildScript;
  if (siteDir(outputDir) === PROJECT_ROOT) {
    // The builder's own rule (detect.ts): only a plain folder is served from its root.
    const problem = await rootOutputProblem(files, buildCommand ?? null);
    if (problem !== null) throw new CliError(`cannot serve ${dir} as it is`, [problem], "pass --output-dir <folder> with the folder the build writes");
  }
  const spa = choices.spa ?? (detected ? await spaFor(detected, files) : undefined) ?? previous.spa ?? false;
  const config: SvcJson = {
    name: choices.name ?? previous.name ?? dnsLabel(basename(dir)),
    runtime: "static",
    ...(buildCommand === undefined ? {} : { buildCommand }),
    outputDir,
    spa,
  };
  return { config, detected, packageManager: lockfile?.packageManager ?? null, lockfile: lockfile?.file ?? null };
}

/** What the account already has for this folder's app name: the next step `svc init` suggests depends on it. */
type AppLookup =
  | { kind: "exists"; app: App }
  | { kind: "missing"; unused: App[] }
  | { kind: "unknown" };

/**
 * Looks the app up when a login is configured and the API answers; anything
 * else (not logged in, API down) is "unknown": `svc init` works offline.
 * `unused` are the static apps with nothing deployed yet, the usual target of
 * a folder being set up after `svc apps create`.
 */
async function lookUpApp(ctx: BaseContext, name: string): Promise<AppLookup> {
  try {
    const apps = await (await ctx.api()).data<App[]>("GET", "/v1/apps", undefined, { what: "list apps" });
    const app = apps.find((a) => a.name === name);
    if (app) return { kind: "exists", app };
    return { kind: "missing", unused: apps.filter((a) => a.runtime === "static" && a.activeDeploymentId === null) };
  } catch {
    return { kind: "unknown" };
  }
}

/** The line after "Wrote svc.json": what to run next, given what the account has. */
function nextStep(name: string, lookup: AppLookup): string {
  const create = `svc apps create --name ${name} --runtime static`;
  if (lookup.kind === "exists") {
    return lookup.app.runtime === "static"
      ? `App ${name} exists (static). Next: svc deploy`
      : `App ${name} exists but its runtime is ${lookup.app.runtime}, and svc deploy builds static sites: choose another --name (svc init --force --name <name>)`;
  }
  if (lookup.kind === "missing" && lookup.unused.length > 0) {
    const names = lookup.unused.slice(0, 3).map((a) => a.name);
    return `No app named ${name} yet. Next: ${create}, then svc deploy; or deploy to ${names.length === 1 ? "your static app" : "one of your static apps"} ${names.join(", ")}: svc init --force --name ${names[0]}`;
  }
  return `Next: ${create}, then svc deploy`;
}

export const init = defineCommand({
  name: "init",
  summary: "Write svc.json for the static site in this folder",
  description: `Detects the framework (Vite, Next.js with output: 'export', Astro, SvelteKit with adapter-static,
Gatsby, Nuxt, Create React App, Eleventy), a plain static/index.html, or a plain folder with index.html at
its root and no package.json (served as it is, without svc.json, dotfiles and .gitignore'd files), and
writes svc.json with the app name (default: the folder's name as a DNS label), runtime "static", the
build command, the output folder and spa (true for single-page apps: Vite, Create React App, a
client-side router, SvelteKit with a fallback page). --build-command, --output-dir and --spa win over
what is detected, which makes any build tool work. An existing svc.json is replaced only with --force,
and its fields are kept where neither the flags nor detection say otherwise. When logged in, it says
whether the app exists yet, and on a terminal offers your one static app with nothing deployed when
no app has the folder's name. On a terminal it asks before writing unless --yes.`,
  options: {
    name: { type: "string", value: "name", description: "app name (default: the folder's name)" },
    dir: { type: "string", value: "path", description: "the project folder (default: the current folder)" },
    "build-command": { type: "string", value: "command", description: "the command that builds the site (default: detected)" },
    "output-dir": { type: "string", value: "folder", description: 'the folder the build writes, "." for a plain folder (default: detected)' },
    spa: { type: "string", value: "true|false", description: "answer unknown paths with index.html (default: detected)" },
    yes: YES_OPTION,
    force: { type: "boolean", description: "overwrite an existing svc.json" },
  },
  examples: ["svc init", "svc init --name my-site --yes", 'svc init --build-command "node build.js" --output-dir build --spa false'],
  async run(ctx) {
    const { opts, out, interactive, fail } = ctx;
    const dir = resolve(opts.dir ?? ".");
    if (!(await stat(dir).catch(() => null))?.isDirectory()) throw new CliError(`cannot initialise ${dir}`, ["no such folder"], "pass the project folder with --dir <path>");
    if (opts.name !== undefined && !DNS_LABEL.test(opts.name)) {
      throw fail(`--name must be a DNS label (lower-case letters, digits and hyphens, at most 52 characters), got "${opts.name}"`);
    }
    const outputDir = opts["output-dir"];
    if (outputDir !== undefined && siteDir(outputDir) === null) {
      throw fail(`--output-dir must be a folder inside the project (relative, without ..) or "." for a plain folder, got "${outputDir}"`);
    }
    if (opts.spa !== undefined && opts.spa !== "true" && opts.spa !== "false") throw fail(`--spa must be true or false, got "${opts.spa}"`);
    const file = join(dir, "svc.json");
    const existing = await lstat(file).catch(() => null);
    if (existing && !opts.force) {
      throw new CliError(`${file} already exists`, ["svc init does not overwrite it"], "pass --force to replace it (its fields are kept where nothing else is found), or edit it by hand");
    }
    const choices: InitChoices = {};
    if (opts.name !== undefined) choices.name = opts.name;
    if (opts["build-command"] !== undefined) choices.buildCommand = opts["build-command"];
    if (outputDir !== undefined) choices.outputDir = siteDir(outputDir) ?? outputDir;
    if (opts.spa !== undefined) choices.spa = opts.spa === "true";
    const plan = await planInit(dir, choices, existing ? await previousConfig(file) : {});
    const { config, detected, lockfile, packageManager } = plan;
    const framework = !detected
      ? "no framework (output folder as given)"
      : detected.framework
        ? (FRAMEWORK_NAMES[detected.framework] ?? detected.framework)
        : detected.outputDir === PROJECT_ROOT
          ? "plain folder (index.html at the root, served as it is)"
          : "plain static site (static/index.html)";
    const deps = lockfile ? `, dependencies from ${lockfile} (${packageManager})` : "";
    out.step(`Detected: ${framework}${deps}`);

    let lookup: AppLookup = out.json ? { kind: "unknown" } : await lookUpApp(ctx, config.name);
    const offered = lookup.kind === "missing" && lookup.unused.length === 1 ? lookup.unused[0] : undefined;
    if (offered && choices.name === undefined && interactive && !opts.yes) {
      if (await confirm(`No app named ${config.name}. Deploy this folder to your static app ${offered.name}, which has nothing deployed yet?`)) {
        config.name = offered.name;
        lookup = { kind: "exists", app: offered };
      }
    }

    const text = `${JSON.stringify(config, null, 2)}\n`;
    if (interactive && !opts.yes && !out.json) {
      process.stderr.write(text);
      if (!(await confirm(`Write ${file}?`))) throw new CliError("svc.json not written", ["the question was not answered with y"]);
    }
    await writeFile(file, text);
    out.result(config, `Wrote ${file}:\n${text.trimEnd()}\n${nextStep(config.name, lookup)}`);
  },
});
