/**
 * How a build installs dependencies, for static sites and releases alike: the
 * command of each package manager (the lockfile's for node, pip into a
 * virtualenv at /work/.venv for python), how a yarn or pnpm the builder lacks
 * runs anyway (npx), and the variables that point every package manager at
 * the only registries a build can reach.
 */
import { constants } from "node:fs";
import { access } from "node:fs/promises";
import { join } from "node:path";
import type { PackageJson, PackageManager } from "../static/detect.js";
import { SANDBOX_WHEELS_DIR, SANDBOX_WORK_DIR } from "../sandbox/sandbox.js";

/** Where python builds install from: the builder's BUILDER_PIP_INDEX_URL and BUILDER_PIP_FIND_LINKS. */
export interface PipSources {
  indexUrl: string | null;
  /** A host folder of wheels. */
  findLinks: string | null;
}

export const NO_PIP_SOURCES: PipSources = { indexUrl: null, findLinks: null };

/** The install step of a build, decided before anything runs. */
export interface InstallStep {
  packageManager: PackageManager | "pip";
  /** The file installed from (a lockfile, requirements.txt or pyproject.toml): named in the log and in failure advice. */
  lockfile: string;
  command: string;
  /** npx package spec (`pnpm@9.15.0`) standing in for a package manager the builder lacks. */
  viaNpx: string | null;
  /** Variables the step needs besides the app's (pip's sources); they win over the app's. */
  env: Record<string, string>;
  /** The host folder of wheels to show the sandbox, or null. */
  wheels: string | null;
  /** Where the packages come from, for the log. */
  from: string;
}

/** A node project's install step. */
export type NodeInstallStep = InstallStep & { packageManager: PackageManager };

type Decision<T> = { ok: true; value: T } | { ok: false; error: string };

/** How each package manager installs exactly what its lockfile pins. */
export const INSTALL_COMMANDS: Record<PackageManager, string> = {
  npm: "npm ci --no-audit --no-fund",
  yarn: "yarn install --frozen-lockfile",
  pnpm: "pnpm install --frozen-lockfile",
};

/**
 * What installs from a package-lock.json that `npm ci` refuses only because it
 * lacks entries for optional platform packages (install-error.ts): it resolves
 * from the lockfile as `npm ci` does, so every pinned version stays, adds what
 * the lockfile lacks when the registry has it and skips it when not (it is
 * optional), and writes neither package.json nor the lockfile.
 */
export const NPM_INSTALL_KEEPING_LOCKFILE = "npm install --no-audit --no-fund --no-save";

/** Where a python app's virtualenv lives: the process runner puts its bin/ first on the PATH. */
export const VENV_DIR = `${SANDBOX_WORK_DIR}/.venv`;

/**
 * Makes a fresh virtualenv (replacing one the source brought) whose python3
 * is a copy, not the usual absolute link to /usr/bin: a release may hold only
 * links that stay inside it (any node restores it with the same extractor as
 * disks), and `python` / `python3.X` stay relative links to that copy.
 */
const MAKE_VENV = `python3 -m venv --clear ${VENV_DIR} && cp --remove-destination "$(readlink -f ${VENV_DIR}/bin/python3)" ${VENV_DIR}/bin/python3`;

/** How pip installs each kind of python project into the virtualenv. */
export const PIP_COMMANDS: Record<"requirements.txt" | "pyproject.toml", string> = {
  "requirements.txt": `${MAKE_VENV} && ${VENV_DIR}/bin/pip install -r requirements.txt`,
  "pyproject.toml": `${MAKE_VENV} && ${VENV_DIR}/bin/pip install .`,
};

/**
 * What runs yarn or pnpm when the builder has neither installed: npx, which
 * ships with npm and fetches through the same mirror. (Corepack is not used: the
 * one bundled with Node 20 rejects current registry signatures, and newer Node
 * releases no longer bundle it.) yarn 1 also runs yarn 2+ projects, through the
 * `yarnPath` release they commit.
 */
const NPX_DEFAULTS: Record<Exclude<PackageManager, "npm">, string> = { yarn: "yarn@1", pnpm: "pnpm@latest" };

/** The install step of a node project: its lockfile's package manager, installed or through npx. */
export async function nodeInstallStep(
  install: { packageManager: PackageManager; lockfile: string },
  pkg: PackageJson,
  searchPath: string,
  from: string,
): Promise<Decision<NodeInstallStep>> {
  const { packageManager, lockfile } = install;
  const tool = await availableTool(packageManager, pkg, searchPath);
  if (!tool.ok) return tool;
  return { ok: true, value: { packageManager, lockfile, command: INSTALL_COMMANDS[packageManager], viaNpx: tool.value, env: {}, wheels: null, from } };
}

/**
 * The install step of a python project: pip into {@link VENV_DIR}, from the
 * builder's package index, its folder of wheels, or both. Without either there
 * is nowhere to install from, which is said before anything runs.
 */
export async function pipInstallStep(
  lockfile: "requirements.txt" | "pyproject.toml",
  sources: PipSources,
  searchPath: string,
): Promise<Decision<InstallStep>> {
  if (sources.indexUrl === null && sources.findLinks === null) {
    return {
      ok: false,
      error:
        `${lockfile} needs a python package index, and this builder has none: set BUILDER_PIP_INDEX_URL (a PyPI mirror) ` +
        "or BUILDER_PIP_FIND_LINKS (a folder of wheels) in the builder's environment",
    };
  }
  if (!(await onPath("python3", searchPath))) return { ok: false, error: "python3 is not installed on this builder, so the dependencies cannot be installed" };
  const env: Record<string, string> = { PIP_DISABLE_PIP_VERSION_CHECK: "1", PIP_NO_INPUT: "1", PIP_PROGRESS_BAR: "off" };
  const from: string[] = [];
  if (sources.indexUrl !== null) {
    env.PIP_INDEX_URL = sources.indexUrl;
    // pip ignores a plain-HTTP index unless it is told to trust its host (a local mirror).
    if (new URL(sources.indexUrl).protocol === "http:") env.PIP_TRUSTED_HOST = new URL(sources.indexUrl).hostname;
    from.push(`the package index ${sources.indexUrl}`);
  } else {
    env.PIP_NO_INDEX = "1";
  }
  if (sources.findLinks !== null) {
    env.PIP_FIND_LINKS = SANDBOX_WHEELS_DIR;
    from.push("the builder's folder of wheels (BUILDER_PIP_FIND_LINKS)");
  }
  return {
    ok: true,
    value: { packageManager: "pip", lockfile, command: PIP_COMMANDS[lockfile], viaNpx: null, env, wheels: sources.findLinks, from: from.join(" and ") },
  };
}

/**
 * How the package manager runs: installed (value null), or through npx (value
 * the package spec: the exact version package.json's `packageManager` names,
 * else a default). npm itself must be installed; npx comes with it.
 */
async function availableTool(packageManager: PackageManager, pkg: PackageJson, searchPath: string): Promise<Decision<string | null>> {
  if (await onPath(packageManager, searchPath)) return { ok: true, value: null };
  if (packageManager !== "npm" && (await onPath("npx", searchPath))) {
    const declared = /^(yarn|pnpm)@(\d+\.\d+\.\d+(?:-[\w.]+)?)(?:\+.*)?$/.exec(pkg.packageManager ?? "");
    return {
      ok: true,
      value: declared?.[1] === packageManager ? `${packageManager}@${declared[2]}` : NPX_DEFAULTS[packageManager],
    };
  }
  const missing = packageManager === "npm" ? "npm is not installed" : `${packageManager} is not installed, nor npx to run it,`;
  return { ok: false, error: `${missing} on this builder, so the dependencies cannot be installed` };
}

async function onPath(name: string, searchPath: string): Promise<boolean> {
  for (const dir of searchPath.split(":")) {
    if (dir === "") continue;
    try {
      await access(join(dir, name), constants.X_OK);
      return true;
    } catch {
      // not in this directory
    }
  }
  return false;
}

/**
 * Points every package manager at the mirror. This is the one builder setting
 * that reaches user commands, on purpose: the build network has no public
 * internet (spec rule 7), so installs must use the mirror, and it is a URL, not
 * a credential. It wins over the app's variables for the same reason. Unset, the
 * package managers keep their defaults.
 */
export function registryEnv(registry: string | null): Record<string, string> {
  if (registry === null) return {};
  return {
    NPM_CONFIG_REGISTRY: registry, // npm, pnpm
    YARN_REGISTRY: registry, // yarn 1
    YARN_NPM_REGISTRY_SERVER: registry, // yarn 2+
  };
}
