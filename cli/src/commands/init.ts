import { lstat, readFile, stat, writeFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import {
  type DetectedProject,
  describeNotStatic,
  FRAMEWORK_NAMES,
  findLockfile,
  MISSING_LOCKFILE,
  PROJECT_ROOT,
  type ProjectFiles,
  readPackageJson,
  detectProject,
  rootOutputProblem,
  siteInstalls,
} from "../../../builder/src/static/detect.js";
import { DEFAULT_APP_PORT, type ProcessType, type ServerRuntime } from "../../../builder/src/protocol/processes.js";
import { siteDir } from "../../../builder/src/protocol/static.js";
import { detectRuntime, planRelease, type ReleasePlan } from "../../../builder/src/jobs/release-plan.js";
import { RUNTIMES, type Runtime, SvcJson as SvcJsonSchema } from "../../../builder/src/static/project-config.js";
import { type BaseContext, defineCommand, YES_OPTION } from "../command.js";
import { CliError } from "../output.js";
import { confirm } from "../prompt.js";
import type { App } from "./apps.js";

/** What `svc init` writes for a static site: the spec's svc.json fields (port is left to its default). */
export type StaticSvcJson = {
  name: string;
  runtime: "static";
  buildCommand?: string;
  outputDir: string;
  spa: boolean;
};

/** What `svc init` writes for an app that runs: what the build would decide, written down. */
export type ServerSvcJson = {
  name: string;
  runtime: ServerRuntime;
  type: ProcessType;
  buildCommand?: string;
  startCommand: string;
  port?: number;
  healthCheckPath?: string;
};

/** What `svc init` writes. */
export type SvcJson = StaticSvcJson | ServerSvcJson;

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
export type InitChoices = {
  name?: string;
  runtime?: Runtime;
  buildCommand?: string;
  outputDir?: string;
  spa?: boolean;
  startCommand?: string;
  type?: ProcessType;
  port?: number;
  healthCheckPath?: string;
};

/** The fields of an svc.json being replaced, as far as they are well-formed. */
type PreviousConfig = Partial<Omit<StaticSvcJson, "runtime">> & Partial<Omit<ServerSvcJson, "runtime">> & { runtime?: Runtime };

/** The fields of an svc.json already there (with --force), kept where neither flags nor detection say otherwise. */
async function previousConfig(file: string): Promise<PreviousConfig> {
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
  const kept: PreviousConfig = {};
  const name = str("name");
  const buildCommand = str("buildCommand");
  const outputDir = str("outputDir");
  const startCommand = str("startCommand");
  const healthCheckPath = str("healthCheckPath");
  const runtime = RUNTIMES.find((known) => known === record.runtime);
  if (name !== undefined && DNS_LABEL.test(name)) kept.name = name;
  if (runtime !== undefined) kept.runtime = runtime;
  if (buildCommand !== undefined) kept.buildCommand = buildCommand;
  if (outputDir !== undefined) kept.outputDir = outputDir;
  if (typeof record.spa === "boolean") kept.spa = record.spa;
  if (startCommand !== undefined) kept.startCommand = startCommand;
  if (record.type === "web" || record.type === "worker") kept.type = record.type;
  if (Number.isInteger(record.port)) kept.port = record.port as number;
  if (healthCheckPath !== undefined) kept.healthCheckPath = healthCheckPath;
  return kept;
}

/** What `svc init` found, for the "Detected:" line. */
export type InitPlan =
  | {
      config: StaticSvcJson;
      detected: DetectedProject | null;
      packageManager: string | null;
      lockfile: string | null;
      /** The build installs dependencies and there is no lockfile yet: svc deploy refuses the folder until one is written. */
      lockfileMissing: boolean;
    }
  | { config: ServerSvcJson; release: ReleasePlan; why: string | null };

/** Flags that only a static site has, and flags that only an app that runs has. */
const STATIC_FLAGS = { outputDir: "--output-dir", spa: "--spa" } as const;
const SERVER_FLAGS = { startCommand: "--start-command", type: "--type", healthCheckPath: "--health-check-path" } as const;

/** The hint for a plan the build would refuse, by what it says. */
function releaseHint(error: string): string {
  if (/no lockfile/.test(error)) return "run npm install (or yarn / pnpm install) in the project and commit the lockfile it writes";
  if (/no start command|needs a start command/.test(error)) {
    return 'pass --start-command <command> (e.g. "node server.js") for an app that runs, or for a static site say where the build writes it: svc init --output-dir <folder> --build-command <command>';
  }
  if (/needs a package\.json/.test(error)) return "pass --runtime custom --start-command <command> for an app that is not a node project";
  return "fix the project, or pass what svc init should write (svc init --help lists the flags)";
}

/**
 * The svc.json `svc init` writes for the folder. The runtime comes from
 * --runtime, else the flags (--output-dir and --spa mean a static site), else
 * the svc.json being replaced, else detection (detectRuntime), else
 * --start-command alone (custom); a CliError when nothing says. A static site's fields then come from the command line,
 * else detection, else the replaced svc.json, else a default (the folder's
 * name, the package.json `build` script, spa false); an app that runs is
 * planned exactly as its build will be (jobs/release-plan.ts), with the flags and
 * the replaced svc.json's fields as its svc.json.
 */
export async function planInit(dir: string, choices: InitChoices = {}, previous: PreviousConfig = {}): Promise<InitPlan> {
  const files = folderFiles(dir);
  const staticFlags = given(STATIC_FLAGS, choices);
  const serverFlags = given(SERVER_FLAGS, choices);
  let runtime = choices.runtime;
  let why: string | null = null;
  if (runtime === undefined && staticFlags.length > 0) runtime = "static";
  // The runtime is the app's, chosen when it was created: the svc.json being replaced knows it better than detection.
  runtime ??= previous.runtime;
  if (runtime === undefined) {
    const detected = await detectRuntime(files);
    if (detected !== null) {
      // --start-command on what looks like a site means the app runs: node with a package.json, else custom.
      const serverWanted = detected.runtime === "static" && serverFlags.length > 0;
      runtime = serverWanted ? ((await files.exists("package.json")) ? "node" : "custom") : detected.runtime;
      why = serverWanted ? null : detected.why;
    }
  }
  if (runtime === undefined && serverFlags.length > 0) runtime = "custom";
  if (runtime === undefined) {
    throw new CliError(
      `no static site or app to run found in ${dir}`,
      [await describeNotStatic(files)],
      "for an app that runs pass --runtime node|python|custom and --start-command <command>; for a static site put it in static/index.html (or index.html at the root, without package.json), or say where the build writes it: svc init --output-dir <folder>",
    );
  }
  if (runtime === "static") {
    if (serverFlags.length > 0) throw new CliError(`cannot write svc.json for a static site`, [`${serverFlags.join(", ")} ${serverFlags.length === 1 ? "is" : "are"} for apps that run (runtime node, python or custom)`], "leave it out, or pass --runtime node|python|custom");
    return planStatic(dir, files, choices, previous.runtime === undefined || previous.runtime === "static" ? previous : {});
  }
  if (staticFlags.length > 0) {
    throw new CliError(`cannot write svc.json for a ${runtime} app`, [`${staticFlags.join(", ")} ${staticFlags.length === 1 ? "is" : "are"} for static sites (runtime static)`], "leave it out, or pass --runtime static");
  }
  return planServer(dir, files, runtime, why, choices, previous.runtime !== undefined && previous.runtime !== "static" ? previous : {});
}

async function planStatic(dir: string, files: ProjectFiles, choices: InitChoices, previous: PreviousConfig): Promise<InitPlan> {
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
  const config: StaticSvcJson = {
    name: choices.name ?? previous.name ?? dnsLabel(basename(dir)),
    runtime: "static",
    ...(buildCommand === undefined ? {} : { buildCommand }),
    outputDir,
    spa,
  };
  const lockfileMissing = lockfile === null && siteInstalls(buildCommand ?? null, pkgJson);
  return { config, detected, packageManager: lockfile?.packageManager ?? null, lockfile: lockfile?.file ?? null, lockfileMissing };
}

async function planServer(
  dir: string,
  files: ProjectFiles,
  runtime: ServerRuntime,
  why: string | null,
  choices: InitChoices,
  previous: PreviousConfig,
): Promise<InitPlan> {
  const pick = <K extends keyof InitChoices & keyof PreviousConfig>(field: K) => choices[field] ?? previous[field];
  const type = pick("type");
  // What svc.json would say: the flags, then the svc.json being replaced (which the build would follow too).
  const fields = {
    runtime,
    ...(type === undefined ? {} : { type }),
    ...(pick("buildCommand") === undefined ? {} : { buildCommand: pick("buildCommand") }),
    ...(pick("startCommand") === undefined ? {} : { startCommand: pick("startCommand") }),
    ...(type !== "worker" && pick("port") !== undefined ? { port: pick("port") } : {}),
    ...(type !== "worker" && pick("healthCheckPath") !== undefined ? { healthCheckPath: pick("healthCheckPath") } : {}),
  };
  if (type === "worker") {
    const webOnly = given({ port: "--port", healthCheckPath: "--health-check-path" }, choices);
    if (webOnly.length > 0) throw new CliError("cannot write svc.json for a worker", [`${webOnly.join(" and ")}: a worker listens on no port and has no health check`], "leave them out, or pass --type web");
  }
  const checked = SvcJsonSchema.safeParse(fields);
  if (!checked.success) throw new CliError("cannot write svc.json", checked.error.issues.map((issue) => `${issue.path.join(".")}: ${issue.message}`));
  const planned = await planRelease(files, checked.data, runtime);
  if (!planned.ok) throw new CliError(`cannot set up ${dir} as a ${runtime} app`, [planned.error], releaseHint(planned.error));
  const release = planned.value;
  const config: ServerSvcJson = {
    name: choices.name ?? previous.name ?? dnsLabel(basename(dir)),
    runtime,
    type: release.type,
    ...(release.buildCommand === null ? {} : { buildCommand: release.buildCommand }),
    startCommand: release.startCommand,
    ...(release.port === null ? {} : { port: release.port }),
    ...(release.healthCheckPath === null ? {} : { healthCheckPath: release.healthCheckPath }),
  };
  return { config, release, why };
}

/** The flags of `flags` given on the command line. */
function given(flags: Record<string, string>, choices: InitChoices): string[] {
  return Object.entries(flags)
    .filter(([field]) => choices[field as keyof InitChoices] !== undefined)
    .map(([, flag]) => flag);
}

/** The "Detected:" line. */
function detectedLine(plan: InitPlan): string {
  if ("release" in plan) {
    const { release, why } = plan;
    const install = release.install === null ? "" : `, dependencies from ${release.install.lockfile} (${release.install.packageManager})`;
    const runs = release.type === "worker" ? "a worker" : `web, port ${release.port}`;
    return `Detected: ${release.runtime} app${why ? ` (${why})` : ""}, ${runs}, start ${JSON.stringify(release.startCommand)} (${release.startFrom})${install}`;
  }
  const { detected, lockfile, packageManager } = plan;
  const framework = !detected
    ? "no framework (output folder as given)"
    : detected.framework
      ? (FRAMEWORK_NAMES[detected.framework] ?? detected.framework)
      : detected.outputDir === PROJECT_ROOT
        ? "plain folder (index.html at the root, served as it is)"
        : "plain static site (static/index.html)";
  const deps = lockfile ? `, dependencies from ${lockfile} (${packageManager})` : "";
  return `Detected: ${framework}${deps}`;
}

/** What the account already has for this folder's app name: the next step `svc init` suggests depends on it. */
type AppLookup =
  | { kind: "exists"; app: App }
  | { kind: "missing"; unused: App[] }
  | { kind: "unknown" };

/**
 * Looks the app up when a login is configured and the API answers; anything
 * else (not logged in, API down) is "unknown": `svc init` works offline.
 * `unused` are the apps of the same runtime with nothing deployed yet, the
 * usual target of a folder being set up after `svc apps create`.
 */
async function lookUpApp(ctx: BaseContext, name: string, runtime: Runtime): Promise<AppLookup> {
  try {
    const apps = await (await ctx.api()).data<App[]>("GET", "/v1/apps", undefined, { what: "list apps" });
    const app = apps.find((a) => a.name === name);
    if (app) return { kind: "exists", app };
    return { kind: "missing", unused: apps.filter((a) => a.runtime === runtime && a.activeDeploymentId === null) };
  } catch {
    return { kind: "unknown" };
  }
}

/** The line after "Wrote svc.json": what to run next, given what the account has (and `install`, a step the folder needs first). */
function nextStep(name: string, runtime: Runtime, lookup: AppLookup, install: string | null): string {
  const create = `svc apps create --name ${name} --runtime ${runtime}`;
  const deploy = install ? `${install}, then svc deploy` : "svc deploy";
  if (lookup.kind === "exists") {
    return lookup.app.runtime === runtime
      ? `App ${name} exists (${runtime}). Next: ${deploy}`
      : `App ${name} exists but its runtime is ${lookup.app.runtime}, not ${runtime}: choose another --name (svc init --force --name <name>)`;
  }
  if (lookup.kind === "missing" && lookup.unused.length > 0) {
    const names = lookup.unused.slice(0, 3).map((a) => a.name);
    return `No app named ${name} yet. Next: ${create}, then ${deploy}; or deploy to ${names.length === 1 ? `your ${runtime} app` : `one of your ${runtime} apps`} ${names.join(", ")}: svc init --force --name ${names[0]}`;
  }
  return `Next: ${create}, then ${deploy}`;
}

const HEALTH_CHECK_PATH = /^\/[\x21-\x7e]*$/;

export const init = defineCommand({
  name: "init",
  summary: "Write svc.json for the static site or the app in this folder",
  description: `Finds what the folder is and writes svc.json with the app name (default: the folder's name as a
DNS label) and runtime:
  static  a static site framework (Vite, Next.js with output: 'export', Astro, SvelteKit with
          adapter-static, Gatsby, Nuxt, Create React App, Eleventy), a plain static/index.html, or a plain
          folder with index.html at its root and no package.json; it writes the build command, the output
          folder and spa (true for single-page apps)
  python  requirements.txt or pyproject.toml (or a main.py, app.py or server.py)
  node    package.json (a start script, main, or server.js, index.js, app.js)
  custom  a Procfile, or --start-command with nothing else recognised
For an app that runs it writes type (web or worker), the start command (svc.json, else the Procfile's
web: or worker: line, else npm start for a start script, node <main>, node server.js…, python3 main.py…),
the build command (package.json's build script) and the port it listens on (default ${DEFAULT_APP_PORT}, given
in PORT), exactly as the build will decide them. The flags win over what is detected. An existing
svc.json is replaced only with --force, and its fields are kept where the flags do not say otherwise.
When logged in, it says whether the app exists yet, and on a terminal offers your one app of the same
runtime with nothing deployed when no app has the folder's name. On a terminal it asks before writing
unless --yes.`,
  options: {
    name: { type: "string", value: "name", description: "app name (default: the folder's name)" },
    dir: { type: "string", value: "path", description: "the project folder (default: the current folder)" },
    runtime: { type: "string", value: "runtime", description: `${RUNTIMES.join(", ")} (default: detected)` },
    "build-command": { type: "string", value: "command", description: "the command that builds the site or app (default: detected)" },
    "output-dir": { type: "string", value: "folder", description: 'static sites: the folder the build writes, "." for a plain folder (default: detected)' },
    spa: { type: "string", value: "true|false", description: "static sites: answer unknown paths with index.html (default: detected)" },
    "start-command": { type: "string", value: "command", description: "apps that run: the command that starts the app (default: detected)" },
    type: { type: "string", value: "web|worker", description: "apps that run: web (listens on --port) or worker (no port); default web" },
    port: { type: "string", value: "port", description: `web apps: the port the app listens on, given in PORT (default ${DEFAULT_APP_PORT})` },
    "health-check-path": { type: "string", value: "path", description: "web apps: a path answered with 2xx once the app is ready, e.g. /healthz" },
    yes: YES_OPTION,
    force: { type: "boolean", description: "overwrite an existing svc.json" },
  },
  examples: [
    "svc init",
    "svc init --name my-site --yes",
    'svc init --build-command "node build.js" --output-dir build --spa false',
    "svc init --runtime node --health-check-path /healthz",
    'svc init --runtime python --start-command "gunicorn app:app --bind 0.0.0.0:$PORT"',
    'svc init --runtime custom --type worker --start-command "./bin/worker"',
  ],
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
    const runtime = RUNTIMES.find((known) => known === opts.runtime);
    if (opts.runtime !== undefined && runtime === undefined) throw fail(`--runtime must be one of ${RUNTIMES.join(", ")}, got "${opts.runtime}"`);
    if (opts.type !== undefined && opts.type !== "web" && opts.type !== "worker") throw fail(`--type must be web or worker, got "${opts.type}"`);
    const port = opts.port === undefined ? undefined : Number(opts.port);
    if (port !== undefined && !(Number.isInteger(port) && port >= 1 && port <= 65_535)) throw fail(`--port must be a port number, 1-65535, got "${opts.port}"`);
    const healthCheckPath = opts["health-check-path"];
    if (healthCheckPath !== undefined && !HEALTH_CHECK_PATH.test(healthCheckPath)) {
      throw fail(`--health-check-path must be a path starting with / (no spaces), e.g. /healthz, got "${healthCheckPath}"`);
    }
    const file = join(dir, "svc.json");
    const existing = await lstat(file).catch(() => null);
    if (existing && !opts.force) {
      throw new CliError(`${file} already exists`, ["svc init does not overwrite it"], "pass --force to replace it (its fields are kept where nothing else is found), or edit it by hand");
    }
    const choices: InitChoices = {};
    if (opts.name !== undefined) choices.name = opts.name;
    if (runtime !== undefined) choices.runtime = runtime;
    if (opts["build-command"] !== undefined) choices.buildCommand = opts["build-command"];
    if (outputDir !== undefined) choices.outputDir = siteDir(outputDir) ?? outputDir;
    if (opts.spa !== undefined) choices.spa = opts.spa === "true";
    if (opts["start-command"] !== undefined) choices.startCommand = opts["start-command"];
    if (opts.type === "web" || opts.type === "worker") choices.type = opts.type;
    if (port !== undefined) choices.port = port;
    if (healthCheckPath !== undefined) choices.healthCheckPath = healthCheckPath;
    const plan = await planInit(dir, choices, existing ? await previousConfig(file) : {});
    const { config } = plan;
    out.step(detectedLine(plan));
    const install = "lockfileMissing" in plan && plan.lockfileMissing ? "npm install" : null;
    if (install) {
      // The build's own refusal (detect.ts), said now rather than at the first deploy.
      out.note(`Warning: ${MISSING_LOCKFILE}. svc deploy refuses ${dir} until it has one: run npm install here (or yarn / pnpm install) and commit the lockfile it writes.`);
    }

    let lookup: AppLookup = out.json ? { kind: "unknown" } : await lookUpApp(ctx, config.name, config.runtime);
    const offered = lookup.kind === "missing" && lookup.unused.length === 1 ? lookup.unused[0] : undefined;
    if (offered && choices.name === undefined && interactive && !opts.yes) {
      if (await confirm(`No app named ${config.name}. Deploy this folder to your ${config.runtime} app ${offered.name}, which has nothing deployed yet?`)) {
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
    out.result(config, `Wrote ${file}:\n${text.trimEnd()}\n${nextStep(config.name, config.runtime, lookup, install)}`);
  },
});
