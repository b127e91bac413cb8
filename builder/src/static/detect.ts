/**
 * Decides whether a project is a static site and how to build it (spec, "Static
 * sites" rule 1): a recognised front-end framework (including one configured for
 * static export), a `static/index.html`, or a plain folder with `index.html` at
 * its root. Pure functions over a small file-reading interface, so the builder
 * (over the extracted source), `svc init` and `svc deploy`'s checks before the
 * upload (over the user's folder) agree on every project.
 *
 * `svc.json` is not parsed here (static/project-config.ts does that); its fields
 * reach {@link planSite}, where they win over what is detected.
 */
import { PROJECT_ROOT, projectDir, siteDir } from "../protocol/static.js";

export { PROJECT_ROOT };

/** Read access to a project's files, by path relative to its root. */
export interface ProjectFiles {
  /** The file's UTF-8 text; null when it does not exist or is not a regular file. */
  read(path: string): Promise<string | null>;
  /** Whether a regular file exists (lockfiles can be megabytes; their presence is what counts). */
  exists(path: string): Promise<boolean>;
}

/** Package managers the builder installs with, one per accepted lockfile. */
export type PackageManager = "npm" | "yarn" | "pnpm";

/** The lockfiles a project may commit (spec rule 7), each naming its package manager. */
export const LOCKFILES: ReadonlyArray<{ file: string; packageManager: PackageManager }> = [
  { file: "package-lock.json", packageManager: "npm" },
  { file: "yarn.lock", packageManager: "yarn" },
  { file: "pnpm-lock.yaml", packageManager: "pnpm" },
];

/** What detection found: enough to build the site and to write `svc.json`. */
export interface DetectedProject {
  /** Framework id (`vite`, `nextjs`, …); null for a plain `static/index.html` site. */
  framework: string | null;
  /** Null when nothing needs building (plain `static/` folder). */
  buildCommand: string | null;
  /** Relative to the project root. */
  outputDir: string;
  /** Set only when the project says which way it routes (a client-side router dependency). */
  spa?: boolean;
}

/** The subset of package.json detection reads. */
export interface PackageJson {
  scripts?: Record<string, string>;
  dependencies?: Record<string, string>;
  devDependencies?: Record<string, string>;
  /** A monorepo's packages, whose own devDependencies an install brings too. */
  workspaces?: unknown;
  packageManager?: string;
  /** The entry point a server app runs (`node <main>`) when it has no start script. */
  main?: string;
}

/** People-facing names of the framework ids, for logs and error messages. */
export const FRAMEWORK_NAMES: Readonly<Record<string, string>> = {
  nextjs: "Next.js",
  nuxt: "Nuxt",
  astro: "Astro",
  sveltekit: "SvelteKit",
  gatsby: "Gatsby",
  eleventy: "Eleventy",
  "create-react-app": "Create React App",
  vite: "Vite",
};

/** Dependencies that mean "routes are resolved in the browser", so unknown paths must get index.html. */
const CLIENT_ROUTERS = [
  "react-router",
  "react-router-dom",
  "@tanstack/react-router",
  "wouter",
  "vue-router",
  "@solidjs/router",
  "preact-router",
  "svelte-spa-router",
];

/** Where a project's output usually lands; named when the configured `outputDir` is missing after a build. */
export const COMMON_OUTPUT_DIRS = ["dist", "out", "build", "public", "_site", ".output/public", "static"];

/** What was looked for, for the "not a static site" message. */
const LOOKED_FOR =
  "static/index.html, index.html at the root of a folder without package.json, outputDir in svc.json, " +
  "or a framework in package.json (Vite, Next.js with output: 'export', Astro, " +
  "SvelteKit with @sveltejs/adapter-static, Gatsby, Nuxt, Create React App, Eleventy)";

/**
 * The plain-folder rule, the one case where the project root itself is the site:
 * a hand-written site (index.html at the root, as Netlify and Render users keep
 * it) with no package.json and nothing to build. A project with a package.json
 * or a build command must publish a folder its build writes, so that its sources
 * (package.json, src/, configuration) are never served by mistake.
 */
export async function rootOutputProblem(files: ProjectFiles, buildCommand: string | null): Promise<string | null> {
  const why = [];
  if (await files.exists("package.json")) why.push("has a package.json");
  if (buildCommand !== null) why.push(`has a build command (${JSON.stringify(buildCommand)})`);
  if (why.length === 0) return null;
  return (
    `outputDir "${PROJECT_ROOT}" (the project root) is served only for a plain folder: index.html at the root, no package.json, ` +
    `nothing to build; this project ${why.join(" and ")}, so set outputDir to the folder its build writes (e.g. dist), ` +
    "or move the site's files into a folder of their own (e.g. static/)"
  );
}

/** Root-level names that configure a project and are never served from a plain folder, whatever .gitignore says. */
const PLAIN_FOLDER_CONFIG = new Set(["svc.json", "Dockerfile", "Containerfile", "svc-nginx.conf"]);

/**
 * What serving a plain folder's root leaves out besides `.gitignore`d paths,
 * `.git` and `node_modules`: `svc.json` and container files at the root, and
 * every dotfile or dot-folder at any depth (`.gitignore`, `.env`, `.vscode/`,
 * `.github/`…), except `.well-known/`, which sites publish on purpose.
 */
export function leftOutOfPlainFolder(path: string): boolean {
  const segments = path.split("/");
  if (segments.length === 1 && PLAIN_FOLDER_CONFIG.has(path)) return true;
  return segments.some((segment) => segment.startsWith(".") && segment !== ".well-known");
}

/** Parses package.json; null when absent, an error message when it is not a JSON object. */
export async function readPackageJson(files: ProjectFiles): Promise<PackageJson | null | { error: string }> {
  const text = await files.read("package.json");
  if (text === null) return null;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { error: `package.json is not valid JSON (${error instanceof Error ? error.message : String(error)})` };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { error: "package.json is not a JSON object" };
  const record = value as Record<string, unknown>;
  const strings = (field: string): Record<string, string> | undefined => {
    const entries = record[field];
    if (typeof entries !== "object" || entries === null || Array.isArray(entries)) return undefined;
    return Object.fromEntries(Object.entries(entries).filter((entry): entry is [string, string] => typeof entry[1] === "string"));
  };
  const pkg: PackageJson = {};
  const scripts = strings("scripts");
  const dependencies = strings("dependencies");
  const devDependencies = strings("devDependencies");
  if (scripts) pkg.scripts = scripts;
  if (dependencies) pkg.dependencies = dependencies;
  if (devDependencies) pkg.devDependencies = devDependencies;
  if (typeof record.packageManager === "string") pkg.packageManager = record.packageManager;
  if (typeof record.main === "string" && record.main !== "") pkg.main = record.main;
  if (record.workspaces !== undefined) pkg.workspaces = record.workspaces;
  return pkg;
}

/** Why a project with dependencies and no lockfile is refused before anything is installed (spec rule 7). */
export const MISSING_LOCKFILE =
  `package.json lists dependencies but no lockfile was found: commit one of ${LOCKFILES.map((entry) => entry.file).join(", ")} ` +
  "(the build installs exactly what it pins)";

/** Whether installing is needed at all: only dependencies and devDependencies count. */
export function hasDependencies(pkg: PackageJson): boolean {
  return Object.keys(pkg.dependencies ?? {}).length + Object.keys(pkg.devDependencies ?? {}).length > 0;
}

/** Whether a site's build installs dependencies first, and so needs a lockfile ({@link MISSING_LOCKFILE} without one). */
export function siteInstalls(buildCommand: string | null, pkg: PackageJson | null): boolean {
  return buildCommand !== null && pkg !== null && hasDependencies(pkg);
}

/**
 * The committed lockfile and so the package manager (null when there is none).
 * With several, the one package.json's `packageManager` field names wins, then
 * pnpm, yarn, npm: a stray package-lock.json is the usual leftover of a migration.
 */
export async function findLockfile(
  files: ProjectFiles,
  pkg: PackageJson | null,
): Promise<{ file: string; packageManager: PackageManager } | null> {
  const present = [];
  for (const lockfile of LOCKFILES) if (await files.exists(lockfile.file)) present.push(lockfile);
  const declared = pkg?.packageManager?.split("@")[0];
  return present.find((lockfile) => lockfile.packageManager === declared) ?? present.at(-1) ?? null;
}

/** Reads the first of `names` that exists. */
async function readFirst(files: ProjectFiles, names: string[]): Promise<string | null> {
  for (const name of names) {
    const text = await files.read(name);
    if (text !== null) return text;
  }
  return null;
}

const configNames = (base: string) => ["js", "mjs", "cjs", "ts", "mts"].map((extension) => `${base}.${extension}`);

/** `output: 'export'` (any quote style) in next.config.*: Next.js then writes a static site to `out/`. */
async function nextStaticExport(files: ProjectFiles): Promise<boolean> {
  const config = await readFirst(files, configNames("next.config"));
  return config !== null && /\boutput\s*:\s*(["'`])export\1/.test(config);
}

/** Astro builds a static site unless its config asks for `output: 'server'`. */
async function astroServerOutput(files: ProjectFiles): Promise<boolean> {
  const config = await readFirst(files, configNames("astro.config"));
  return config !== null && /\boutput\s*:\s*(["'`])server\1/.test(config);
}

/** A literal `build.outDir` in vite.config.*, when it is a plain relative folder. */
async function viteOutDir(files: ProjectFiles): Promise<string | null> {
  const config = await readFirst(files, configNames("vite.config"));
  const outDir = config === null ? undefined : /\boutDir\s*:\s*(["'`])([^"'`]+)\1/.exec(config)?.[2];
  return outDir === undefined ? null : projectDir(outDir);
}

/** How `pm` runs a package.json script. */
const runScript = (packageManager: PackageManager, script: string) => `${packageManager} run ${script}`;

/**
 * Finds a static site in the project, or null (then {@link describeNotStatic}
 * says why). Frameworks come first: a `static/` folder is also where SvelteKit
 * and others keep their public assets. The build command runs the project's own
 * `build` script through its package manager when there is one, else the
 * framework's CLI (the builder puts `node_modules/.bin` on the build's PATH).
 */
export async function detectProject(files: ProjectFiles): Promise<DetectedProject | null> {
  const pkg = await readPackageJson(files);
  if (pkg !== null && !("error" in pkg)) {
    const deps = { ...pkg.dependencies, ...pkg.devDependencies };
    const has = (name: string) => Object.hasOwn(deps, name);
    const packageManager = (await findLockfile(files, pkg))?.packageManager ?? "npm";
    const build = (cli: string) => (pkg.scripts?.build ? runScript(packageManager, "build") : cli);
    const spa = CLIENT_ROUTERS.some(has) ? { spa: true } : {};

    if (has("next")) {
      return (await nextStaticExport(files))
        ? { framework: "nextjs", buildCommand: build("next build"), outputDir: "out" }
        : null;
    }
    if (has("nuxt")) {
      const buildCommand = pkg.scripts?.generate ? runScript(packageManager, "generate") : "nuxt generate";
      return { framework: "nuxt", buildCommand, outputDir: ".output/public" };
    }
    if (has("astro")) {
      return (await astroServerOutput(files))
        ? null
        : { framework: "astro", buildCommand: build("astro build"), outputDir: "dist" };
    }
    if (has("@sveltejs/kit")) {
      return has("@sveltejs/adapter-static")
        ? { framework: "sveltekit", buildCommand: build("vite build"), outputDir: "build" }
        : null;
    }
    if (has("gatsby")) return { framework: "gatsby", buildCommand: build("gatsby build"), outputDir: "public" };
    if (has("@11ty/eleventy")) return { framework: "eleventy", buildCommand: build("eleventy"), outputDir: "_site" };
    if (has("react-scripts")) {
      return { framework: "create-react-app", buildCommand: build("react-scripts build"), outputDir: "build", ...spa };
    }
    if (has("vite")) {
      const outputDir = (await viteOutDir(files)) ?? "dist";
      return { framework: "vite", buildCommand: build("vite build"), outputDir, ...spa };
    }
  }
  if (await files.exists("static/index.html")) return { framework: null, buildCommand: null, outputDir: "static" };
  if (pkg === null && (await files.exists("index.html"))) return { framework: null, buildCommand: null, outputDir: PROJECT_ROOT };
  return null;
}

/**
 * Why {@link detectProject} found no static site, as one sentence saying what to
 * do: server-rendering setups of known frameworks need a server runtime (rule 9),
 * anything else is told what was looked for.
 */
export async function describeNotStatic(files: ProjectFiles): Promise<string> {
  const pkg = await readPackageJson(files);
  if (pkg !== null && "error" in pkg) return pkg.error;
  const deps = { ...pkg?.dependencies, ...pkg?.devDependencies };
  const serverOnly = (what: string, fix: string) =>
    `${what} uses server features, which need a server runtime; for a static site ${fix}, or set outputDir in svc.json`;
  if (Object.hasOwn(deps, "next")) {
    return serverOnly("this Next.js app", "set output: 'export' in next.config.js (or .mjs/.ts)");
  }
  if (Object.hasOwn(deps, "astro")) return serverOnly("this Astro site (output: 'server')", "remove output: 'server'");
  if (Object.hasOwn(deps, "@sveltejs/kit")) return serverOnly("this SvelteKit app", "use @sveltejs/adapter-static");
  return `not a static site: looked for ${LOOKED_FOR}`;
}

/** A site's settings from one source (svc.json, or the app's settings), each optional. */
export interface SiteSettings {
  buildCommand?: string;
  outputDir?: string;
  spa?: boolean;
}

/** How a project is built and what is published, decided before anything of the user's runs. */
export interface SitePlan {
  framework: string | null;
  buildCommand: string | null;
  /** Normalised: a folder inside the project, or {@link PROJECT_ROOT} for a plain folder. */
  outputDir: string;
  spa: boolean;
  /** What to install from, or null when nothing is installed. */
  install: { packageManager: PackageManager; lockfile: string } | null;
  /** One line saying each choice and where it came from (app settings, svc.json, detected, default). */
  summary: string;
  /** Why nothing is installed although something is built; null otherwise. */
  nothingToInstall: string | null;
}

/**
 * Decides framework, build command, output folder and routing: `overrides`
 * (the app's settings) win over `config` (svc.json), which wins over detection.
 * Refuses what would fail later, before anything is uploaded or installed: no
 * static site found, the root as output of a project that is not a plain folder
 * ({@link rootOutputProblem}), dependencies without a lockfile (spec rule 7).
 * The builder runs this over the extracted source and `svc deploy` over the
 * folder it is about to upload, so both say the same.
 */
export async function planSite(
  files: ProjectFiles,
  config: SiteSettings | null,
  overrides: SiteSettings = {},
): Promise<{ ok: true; value: SitePlan } | { ok: false; error: string }> {
  const pkg = await readPackageJson(files);
  if (pkg !== null && "error" in pkg) return { ok: false, error: pkg.error };
  const detected = await detectProject(files);
  const chosenDir = overrides.outputDir ?? config?.outputDir ?? detected?.outputDir;
  const outputDir = chosenDir === undefined ? null : siteDir(chosenDir);
  if (outputDir === null) return { ok: false, error: await describeNotStatic(files) };

  const lockfile = await findLockfile(files, pkg);
  // Without a detected framework (svc.json named the folder), the project's build script is the natural command;
  // a plain folder is served as it is unless a command is configured.
  const defaultCommand = detected
    ? detected.buildCommand
    : pkg?.scripts?.build
      ? `${lockfile?.packageManager ?? "npm"} run build`
      : null;
  const buildCommand = overrides.buildCommand ?? config?.buildCommand ?? defaultCommand;
  if (outputDir === PROJECT_ROOT) {
    const problem = await rootOutputProblem(files, buildCommand);
    if (problem !== null) return { ok: false, error: problem };
  }
  const spa = overrides.spa ?? config?.spa ?? detected?.spa ?? false;
  const from = (override: unknown, configured: unknown, found: unknown) =>
    override !== undefined ? "app settings" : configured !== undefined ? "svc.json" : found !== undefined ? "detected" : "default";
  const framework = detected?.framework ?? null;
  const command = buildCommand === null ? "none" : JSON.stringify(buildCommand);
  const output = outputDir === PROJECT_ROOT ? `${PROJECT_ROOT} (the project root)` : outputDir;
  const summary =
    `static site${framework ? ` (${FRAMEWORK_NAMES[framework] ?? framework})` : ""}: ` +
    `output ${output} (${from(overrides.outputDir, config?.outputDir, detected?.outputDir)}), ` +
    `build ${command} (${from(overrides.buildCommand, config?.buildCommand, defaultCommand ?? undefined)}), ` +
    `spa ${spa} (${from(overrides.spa, config?.spa, detected?.spa)})`;

  let install: SitePlan["install"] = null;
  let nothingToInstall: string | null = null;
  if (siteInstalls(buildCommand, pkg)) {
    if (lockfile === null) return { ok: false, error: MISSING_LOCKFILE };
    install = { packageManager: lockfile.packageManager, lockfile: lockfile.file };
  } else if (buildCommand !== null) {
    nothingToInstall = pkg === null ? "no package.json: nothing to install" : "package.json lists no dependencies: nothing to install";
  }
  return { ok: true, value: { framework, buildCommand, outputDir, spa, install, summary, nothingToInstall } };
}
