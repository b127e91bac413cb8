/**
 * Decides how an app that runs (runtime `node`, `python` or `custom`) is
 * installed, built and started, before anything of the user's runs (DESIGN §9,
 * protocol/processes.ts "Releases"). Pure functions over the same file-reading interface
 * as detect.ts, so the builder (over the extracted source), `svc init` (to
 * write svc.json) and `svc deploy`'s checks before the upload (over the
 * user's folder) agree on every project.
 *
 * Precedence, for each setting: the app's settings (the build's overrides),
 * then svc.json, then a Procfile (`web:` or `worker:` line), then the
 * runtime's conventions. The runtime itself is the app's, chosen when it was
 * created; svc.json must agree with it when it names one.
 */
import {
  type PackageJson,
  type PackageManager,
  type ProjectFiles,
  MISSING_LOCKFILE,
  detectProject,
  findLockfile,
  hasDependencies,
  readPackageJson,
} from "../static/detect.js";
import { DEFAULT_APP_PORT, DEFAULT_START_TIMEOUT_SECONDS, type ProcessType, type ServerRuntime } from "../protocol/processes.js";
import { type Runtime, type SvcJson, runtimeMismatch } from "../static/project-config.js";

/** How dependencies are installed: a node package manager from its lockfile, or pip from requirements.txt / pyproject.toml. */
export type ReleaseInstall =
  | { packageManager: PackageManager; lockfile: string }
  | { packageManager: "pip"; lockfile: "requirements.txt" | "pyproject.toml" };

/** Everything decided about a release before anything runs. */
export interface ReleasePlan {
  runtime: ServerRuntime;
  type: ProcessType;
  /** Runs with `/bin/sh -c` in the app's folder (/work). */
  startCommand: string;
  /** Where the start command came from, for logs and `svc init` ("package.json's start script"). */
  startFrom: string;
  buildCommand: string | null;
  install: ReleaseInstall | null;
  /** The port a web process listens on (it gets it in PORT); null for a worker. */
  port: number | null;
  healthCheckPath: string | null;
  /** Web: seconds to pass the health check; null for a worker. */
  startTimeoutSeconds: number | null;
  /** Seconds a new process must stay up once ready before it counts as deployed: svc.json's, else 10 for a worker, 0 for a web app. */
  minReadySeconds: number;
  /** A worker's new release runs beside the old one during a deploy (svc.json `overlap`); false: the old one stops first. */
  overlap: boolean;
  /** How many processes should serve the app (svc.json `instances`); null: as many as the app has. */
  instances: number | null;
  /** Node apps: devDependencies stay in the release (svc.json `keepDevDependencies`); false: pruned after the build. */
  keepDevDependencies: boolean;
  /**
   * Node apps: package.json lists devDependencies, or workspaces that may;
   * false: an install brings none, so there is nothing to prune.
   */
  devDependencies: boolean;
  /** One line saying each choice and where it came from. */
  summary: string;
  /** Why nothing is installed; null when something is. */
  nothingToInstall: string | null;
}

/** The app's own settings, which win over svc.json (as for static sites). */
export interface ReleaseOverrides {
  buildCommand?: string;
}

type Decision<T> = { ok: true; value: T } | { ok: false; error: string };

/** A worker's new release counts as deployed once it stayed up this long (it has no health check to pass). */
export const DEFAULT_WORKER_MIN_READY_SECONDS = 10;

/** Files a node app is started from, in order, when package.json names no start script or main. */
export const NODE_ENTRY_FILES = ["server.js", "index.js", "app.js"] as const;
/** Files a python app is started from, in order, when nothing names a start command. */
export const PYTHON_ENTRY_FILES = ["main.py", "app.py", "server.py"] as const;

/** A process line of a Procfile: `name: command`. */
const PROCFILE_LINE = /^([A-Za-z0-9_-]+):\s*(.*?)\s*$/;

/** The process types of a Procfile (Heroku's format: `web: npm start`), blank lines and `#` comments skipped. */
export function parseProcfile(text: string): Map<string, string> {
  const processes = new Map<string, string>();
  for (const line of text.split(/\r?\n/)) {
    if (line.trim() === "" || line.trimStart().startsWith("#")) continue;
    const match = PROCFILE_LINE.exec(line);
    if (match && match[2] !== "" && !processes.has(match[1]!)) processes.set(match[1]!, match[2]!);
  }
  return processes;
}

/** A word for `/bin/sh -c`: as it is when it holds nothing the shell reads specially, else single-quoted. */
export function shellWord(word: string): string {
  return /^[\w./@+,:=-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

async function firstExisting(files: ProjectFiles, names: readonly string[]): Promise<string | null> {
  for (const name of names) if (await files.exists(name)) return name;
  return null;
}

/** The runtime's own way to start the app, when it has one. */
async function conventionalStart(files: ProjectFiles, runtime: ServerRuntime, pkg: PackageJson | null): Promise<{ command: string; from: string } | null> {
  if (runtime === "node") {
    // npm runs any package.json script whatever installed node_modules, and ships with node on every node;
    // yarn and pnpm may not be installed where the app runs (builds fetch them through npx).
    if (pkg?.scripts?.start) return { command: "npm start", from: "package.json's start script" };
    if (pkg?.main) return { command: `node ${shellWord(pkg.main)}`, from: "package.json's main" };
    const entry = await firstExisting(files, NODE_ENTRY_FILES);
    return entry === null ? null : { command: `node ${entry}`, from: `found ${entry}` };
  }
  if (runtime === "python") {
    const entry = await firstExisting(files, PYTHON_ENTRY_FILES);
    return entry === null ? null : { command: `python3 ${entry}`, from: `found ${entry}` };
  }
  return null;
}

/** What to add when nothing says how to start the app. */
function noStartCommand(runtime: ServerRuntime, type: ProcessType, procfile: Map<string, string> | null): string {
  const line = `a Procfile with a ${type}: line`;
  const otherType = type === "web" ? "worker" : "web";
  const wrongType = procfile?.has(otherType)
    ? ` (the Procfile has a ${otherType}: line; for ${otherType === "worker" ? 'a worker set "type": "worker"' : 'a web process remove "type": "worker"'} in svc.json)`
    : "";
  if (runtime === "node") {
    return `no start command: add a start script to package.json, or startCommand to svc.json (or ${line}); also looked for main in package.json and ${NODE_ENTRY_FILES.join(", ")}${wrongType}`;
  }
  if (runtime === "python") {
    return `no start command: add startCommand to svc.json (e.g. "gunicorn app:app"), or ${line}, or a ${PYTHON_ENTRY_FILES.join(", ")}${wrongType}`;
  }
  return `a custom app needs a start command: add startCommand to svc.json, or ${line}${wrongType}`;
}

/** Installs for a node app: its lockfile's package manager, refused (before anything runs) when it has dependencies but no lockfile. */
async function nodeInstall(files: ProjectFiles, pkg: PackageJson): Promise<Decision<{ install: ReleaseInstall | null; packageManager: PackageManager }>> {
  const lockfile = await findLockfile(files, pkg);
  const packageManager = lockfile?.packageManager ?? "npm";
  if (!hasDependencies(pkg)) return { ok: true, value: { install: null, packageManager } };
  if (lockfile === null) return { ok: false, error: MISSING_LOCKFILE };
  return { ok: true, value: { install: { packageManager, lockfile: lockfile.file }, packageManager } };
}

/**
 * Decides the release of an app of `runtime`: type, start command, build
 * command, what to install, port and health check. Refuses what would fail
 * later, before anything is uploaded or installed: svc.json naming another
 * runtime, a node app without package.json, dependencies without a lockfile,
 * nothing to start.
 */
export async function planRelease(
  files: ProjectFiles,
  config: SvcJson | null,
  runtime: ServerRuntime,
  overrides: ReleaseOverrides = {},
): Promise<Decision<ReleasePlan>> {
  const mismatch = runtimeMismatch(config, runtime);
  if (mismatch !== null) return { ok: false, error: mismatch };
  const type: ProcessType = config?.type ?? "web";

  let pkg: PackageJson | null = null;
  let install: ReleaseInstall | null = null;
  let nothingToInstall: string | null = null;
  let conventionalBuild: { command: string; from: string } | null = null;
  if (runtime === "node") {
    const read = await readPackageJson(files);
    if (read === null) {
      return { ok: false, error: "a node app needs a package.json at the root of the project (none was found); for another language create the app with --runtime custom" };
    }
    if ("error" in read) return { ok: false, error: read.error };
    pkg = read;
    const installed = await nodeInstall(files, pkg);
    if (!installed.ok) return installed;
    install = installed.value.install;
    if (install === null) nothingToInstall = "package.json lists no dependencies: nothing to install";
    if (pkg.scripts?.build) conventionalBuild = { command: `${installed.value.packageManager} run build`, from: "package.json's build script" };
  } else if (runtime === "python") {
    const from = await firstExisting(files, ["requirements.txt", "pyproject.toml"] as const);
    const requirements = from === "requirements.txt" ? await files.read(from) : null;
    if (requirements?.split(/\r?\n/).every((line) => /^\s*(#.*)?$/.test(line))) {
      nothingToInstall = "requirements.txt names no requirements: nothing to install (the standard library only)";
    } else if (from !== null) {
      install = { packageManager: "pip", lockfile: from as "requirements.txt" | "pyproject.toml" };
    } else {
      nothingToInstall = "no requirements.txt or pyproject.toml: nothing to install (the standard library only)";
    }
  } else {
    nothingToInstall = "custom runtime: nothing is installed (buildCommand can fetch what the app needs from the package registry)";
  }

  const procfileText = await files.read("Procfile");
  const procfile = procfileText === null ? null : parseProcfile(procfileText);
  const fromProcfile = procfile?.get(type);
  const conventional = await conventionalStart(files, runtime, pkg);
  const start =
    config?.startCommand !== undefined
      ? { command: config.startCommand, from: "svc.json" }
      : fromProcfile !== undefined
        ? { command: fromProcfile, from: `Procfile ${type}:` }
        : conventional;
  if (start === null) return { ok: false, error: noStartCommand(runtime, type, procfile) };

  const buildCommand = overrides.buildCommand ?? config?.buildCommand ?? conventionalBuild?.command ?? null;
  const buildFrom =
    overrides.buildCommand !== undefined ? "app settings" : config?.buildCommand !== undefined ? "svc.json" : (conventionalBuild?.from ?? null);
  const port = type === "web" ? (config?.port ?? DEFAULT_APP_PORT) : null;
  const healthCheckPath = type === "web" ? (config?.healthCheckPath ?? null) : null;
  const startTimeoutSeconds = type === "web" ? (config?.startTimeoutSeconds ?? DEFAULT_START_TIMEOUT_SECONDS) : null;
  const minReadySeconds = config?.minReadySeconds ?? (type === "worker" ? DEFAULT_WORKER_MIN_READY_SECONDS : 0);
  const overlap = type === "worker" && config?.overlap === true;
  const keepDevDependencies = config?.keepDevDependencies === true;
  const devDependencies = pkg !== null && (Object.keys(pkg.devDependencies ?? {}).length > 0 || pkg.workspaces !== undefined);

  const parts = [`start ${JSON.stringify(start.command)} (${start.from})`];
  parts.push(buildCommand === null ? "build none" : `build ${JSON.stringify(buildCommand)} (${buildFrom})`);
  if (port !== null) parts.push(`port ${port} (${config?.port !== undefined ? "svc.json" : "default"})`);
  if (type === "web") {
    parts.push(`health check ${healthCheckPath === null ? "the port accepting connections" : `GET ${healthCheckPath}`} within ${startTimeoutSeconds} s`);
  }
  if (minReadySeconds > 0) parts.push(`deployed once up ${minReadySeconds} s`);
  if (type === "worker") parts.push(overlap ? "a redeploy runs the new release beside the old one" : "a redeploy stops the old release first");
  if (config?.instances !== undefined) parts.push(`${config.instances} instance${config.instances === 1 ? "" : "s"} (svc.json)`);
  const summary = `${runtime} app (${type}): ${parts.join(", ")}`;
  return {
    ok: true,
    value: {
      runtime,
      type,
      startCommand: start.command,
      startFrom: start.from,
      buildCommand,
      install,
      port,
      healthCheckPath,
      startTimeoutSeconds,
      minReadySeconds,
      overlap,
      instances: config?.instances ?? null,
      keepDevDependencies,
      devDependencies,
      summary,
      nothingToInstall,
    },
  };
}

/**
 * Which runtime a folder looks like, for `svc init`: a static framework in
 * package.json, then python (requirements.txt, pyproject.toml), then a node
 * server (package.json with a start script, main or server.js/index.js/app.js),
 * then a plain static site (static/index.html, or index.html without
 * package.json), then any package.json (node: planning says what to add), a
 * main.py/app.py/server.py, a Procfile (custom); null when nothing fits.
 */
export async function detectRuntime(files: ProjectFiles): Promise<{ runtime: Runtime; why: string } | null> {
  const site = await detectProject(files);
  if (site?.framework) return { runtime: "static", why: `a static site framework (${site.framework})` };
  const python = await firstExisting(files, ["requirements.txt", "pyproject.toml"]);
  if (python !== null) return { runtime: "python", why: python };
  const read = await readPackageJson(files);
  const pkg = read !== null && !("error" in read) ? read : null;
  const nodeStart = pkg === null ? null : await conventionalStart(files, "node", pkg);
  if (nodeStart !== null) return { runtime: "node", why: "package.json" };
  if (site !== null) return { runtime: "static", why: site.outputDir === "static" ? "static/index.html" : "index.html at the root" };
  if (read !== null) return { runtime: "node", why: "package.json" };
  const entry = await firstExisting(files, PYTHON_ENTRY_FILES);
  if (entry !== null) return { runtime: "python", why: entry };
  if (await files.exists("Procfile")) return { runtime: "custom", why: "a Procfile" };
  return null;
}
