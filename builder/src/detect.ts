/**
 * Decides whether a project is a static site and how to build it (spec, "Static
 * sites" rule 1): a recognised front-end framework (including one configured for
 * static export), or a `static/index.html` at the root. Pure functions over a
 * small file-reading interface, so the builder (over the extracted source) and
 * the CLI's `svc init` (over the user's folder) agree on every project.
 *
 * `svc.json` is not read here: `svc init` writes it from this detection, and in
 * a build its fields win over what is detected.
 */
import { projectDir } from "./protocol.js";

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
  packageManager?: string;
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
  "static/index.html, outputDir in svc.json, or a framework in package.json (Vite, Next.js with output: 'export', Astro, " +
  "SvelteKit with @sveltejs/adapter-static, Gatsby, Nuxt, Create React App, Eleventy)";

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
  return pkg;
}

/** Whether installing is needed at all: only dependencies and devDependencies count. */
export function hasDependencies(pkg: PackageJson): boolean {
  return Object.keys(pkg.dependencies ?? {}).length + Object.keys(pkg.devDependencies ?? {}).length > 0;
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
