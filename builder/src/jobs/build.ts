/**
 * The "build" job: turns a static-site project into a manifest of
 * content-addressed blobs in the Worker's storage (DESIGN §4, Static sites).
 * Each step is announced by a `svc` log line and fails early, with a message
 * that says what to do: source → configuration (app overrides, svc.json,
 * detection) → lockfile → install → build → output folder → manifest →
 * generated container files → upload. Install and build run in the sandbox
 * under the job's memory limit; everything else runs in the builder and reads
 * the job's files only through `static/files.ts`.
 */
import { constants } from "node:fs";
import { access, chown, lstat, mkdir, realpath, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { FsImages, IMAGE_DATA_DIR } from "../fs-image.js";
import {
  COMMON_OUTPUT_DIRS,
  PROJECT_ROOT,
  type PackageJson,
  type PackageManager,
  type ProjectFiles,
  planSite,
  readPackageJson,
} from "../detect.js";
import type { JobOutcome } from "../job-manager.js";
import type { BuildResult, BuildSpec } from "../protocol.js";
import type { SandboxHost } from "../sandbox-host.js";
import {
  DEFAULT_PATH,
  type JobLog,
  type JobUser,
  SANDBOX_TOOLS_DIR,
  SANDBOX_WORK_DIR,
  type SandboxOutcome,
  formatBytes,
  runInSandbox,
} from "../sandbox.js";
import { downloadSource } from "../source-archive.js";
import { projectFiles, realDirInside } from "../static/files.js";
import { buildManifest } from "../static/manifest.js";
import { parseSvcJson, runtimeMismatch, type SvcJson } from "../static/project-config.js";
import { CONTAINER_FILES, generateServerFiles } from "../static/server-config.js";
import { uploadMissingBlobs } from "../static/upload.js";
import { installFailureFromLog } from "./install-error.js";
import { failure, finish, interrupted } from "./run.js";

/** The job log's file in the job's folder (job-manager.ts opens it there). */
const JOB_LOG_FILE = "log";

/** Inputs of {@link runBuild}. */
export interface BuildJobInput {
  id: string;
  spec: BuildSpec;
  /** `jobs/<id>`; the build works in `jobs/<id>/work`, removed when it ends. */
  jobDir: string;
  log: JobLog;
  host: SandboxHost;
  /** The tenant's user. */
  user: JobUser;
  /** Room for the project, its dependencies and its output (a filesystem of this size when the builder can make one). */
  scratchBytes: number;
  /** Signs the requests to the Worker's blobs endpoint. */
  secret: string;
  /** The package mirror (the builder's NPM_CONFIG_REGISTRY), or null for the package managers' default. */
  npmRegistry: string | null;
  /** Aborting cancels the build (reason "shutdown" when the builder stops). */
  signal: AbortSignal;
}

/** How each package manager installs exactly what its lockfile pins. */
const INSTALL_COMMANDS: Record<PackageManager, string> = {
  npm: "npm ci --no-audit --no-fund",
  yarn: "yarn install --frozen-lockfile",
  pnpm: "pnpm install --frozen-lockfile",
};

/**
 * What runs yarn or pnpm when the builder has neither installed: npx, which
 * ships with npm and fetches through the same mirror. (Corepack is not used: the
 * one bundled with Node 20 rejects current registry signatures, and newer Node
 * releases no longer bundle it.) yarn 1 also runs yarn 2+ projects, through the
 * `yarnPath` release they commit.
 */
const NPX_DEFAULTS: Record<Exclude<PackageManager, "npm">, string> = { yarn: "yarn@1", pnpm: "pnpm@latest" };

/** Everything decided before anything of the user's runs. */
interface BuildPlan {
  framework: string | null;
  buildCommand: string | null;
  outputDir: string;
  spa: boolean;
  port: number;
  install: {
    packageManager: PackageManager;
    lockfile: string;
    command: string;
    /** npx package spec (`pnpm@9.15.0`) standing in for a package manager the builder lacks. */
    viaNpx: string | null;
  } | null;
  /** `Dockerfile` or `Containerfile` when the project brings one. */
  ownContainerFile: string | null;
}

type Decision<T> = { ok: true; value: T } | { ok: false; error: string };

/**
 * Builds the site and publishes its blobs; the outcome carries a BuildResult
 * on success. Never throws for anything the project does.
 */
export async function runBuild(input: BuildJobInput): Promise<JobOutcome> {
  const { spec, log } = input;
  const scratch = join(input.jobDir, "scratch");
  const workDir = join(scratch, IMAGE_DATA_DIR);
  const homeDir = join(scratch, "home");
  const toolsDir = join(input.jobDir, "tools");
  const deadline = Date.now() + spec.timeoutSeconds * 1000;
  const timeout = AbortSignal.timeout(spec.timeoutSeconds * 1000);
  const signal = AbortSignal.any([input.signal, timeout]);
  /** Failure of a step the builder itself runs: an abort wins over the step's own message. */
  const fail = (error: string): JobOutcome => {
    if (input.signal.aborted) return finish(log, interrupted(input.signal));
    if (timeout.aborted) return finish(log, failure("timeout", `timed out after ${spec.timeoutSeconds} s`));
    return finish(log, failure("error", error));
  };
  let peakMemoryBytes = 0;
  let sourceArchive: string | null = null;
  /** Runs one step in the job's sandbox, under its limits, for what is left of its time. */
  const sandboxed = (command: string, env: Record<string, string>, options: { network: "registry" | "none"; tools: string | null }) =>
    runInSandbox({
      host: input.host,
      jobId: input.id,
      command,
      env,
      user: input.user,
      work: { path: workDir, home: homeDir },
      source: sourceArchive,
      network: options.network,
      tools: options.tools,
      timeoutMs: Math.max(1, deadline - Date.now()),
      memoryLimitBytes: spec.memoryMb * 1024 * 1024,
      disk: null,
      log,
      signal: input.signal,
    });
  try {
    await createScratch(input, scratch, homeDir);
    const source = await downloadSource({ url: spec.sourceUrl, jobDir: input.jobDir, user: input.user, log, signal });
    if (!source.ok) return fail(source.error);
    // Unpacked in the sandbox: the archive can reach nothing but the scratch space.
    sourceArchive = source.path;
    const unpacked = await sandboxed("true", {}, { network: "none", tools: null });
    sourceArchive = null;
    await rm(source.path, { force: true });
    if (unpacked.reason !== null) return fail(unpacked.error ?? "the source archive could not be unpacked");
    const root = await realpath(workDir);
    const files = projectFiles(root);

    const planned = await planBuild(files, spec, log).catch((error: unknown) => ({
      ok: false as const,
      error: error instanceof Error ? error.message : String(error), // e.g. a package.json over 1 MiB
    }));
    if (!planned.ok) return fail(planned.error);
    const plan = planned.value;
    const searchPath = spec.env.PATH ?? DEFAULT_PATH;
    const registry = registryEnv(input.npmRegistry);

    // Step runner: the sandbox, reaching only the package registry.
    const step = async (what: string, command: string, env: Record<string, string>): Promise<SandboxOutcome | null> => {
      const started = Date.now();
      const outcome = await sandboxed(command, env, { network: "registry", tools: plan.install?.viaNpx ? toolsDir : null });
      peakMemoryBytes = Math.max(peakMemoryBytes, outcome.peakMemoryBytes);
      if (outcome.reason === null) {
        log.note(`${what} finished in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        return null;
      }
      if (outcome.reason === "timeout") outcome.error = `timed out after ${spec.timeoutSeconds} s (during ${what})`;
      if (outcome.reason === "OOMKilled") {
        outcome.error = `${outcome.error} during ${what}; raise the app's memory limit or slim the build`;
      }
      if (outcome.reason === "exit_code") outcome.error = `${what} failed: ${outcome.error}`;
      return { ...outcome, peakMemoryBytes };
    };

    // A `yarn` or `pnpm` command running it through npx, for install and build alike, when the builder lacks it.
    let toolsPath = searchPath;
    if (plan.install?.viaNpx) {
      await mkdir(toolsDir, { mode: 0o755 }); // in the builder's own job folder: the job cannot plant links there
      const shim = `#!/bin/sh\nexec npx --yes ${plan.install.viaNpx} "$@"\n`;
      await writeFile(join(toolsDir, plan.install.packageManager), shim, { mode: 0o755 });
      toolsPath = `${SANDBOX_TOOLS_DIR}:${searchPath}`;
    }

    if (plan.install) {
      const { packageManager, lockfile, command, viaNpx } = plan.install;
      const from = `${input.npmRegistry ? `the registry mirror ${input.npmRegistry}` : `the registry ${input.host.registry.allowed}`} (the only host builds can reach)`;
      const through = viaNpx ? ` (${packageManager} is not installed: running ${viaNpx} through npx)` : "";
      log.note(`installing dependencies from ${lockfile} with ${packageManager}${through} from ${from}`);
      log.note(`$ ${command}`);
      // Without NODE_ENV: NODE_ENV=production makes every package manager skip devDependencies, where build tools live.
      const { NODE_ENV: _omitted, ...appEnv } = spec.env;
      await log.settled();
      const installOutput = log.bytes;
      const failed = await step("install", command, { CI: "true", ...appEnv, ...registry, PATH: toolsPath });
      if (failed) {
        if (failed.reason === "exit_code") {
          // The cause is one line among many: quote it in the summary, with what to do (install-error.ts).
          await log.settled();
          const why = await installFailureFromLog(join(input.jobDir, JOB_LOG_FILE), installOutput, lockfile, packageManager).catch(() => null);
          if (why !== null) failed.error = `${failed.error}: ${why}`;
        }
        return finish(log, failed);
      }
    }

    if (plan.buildCommand !== null) {
      log.note(`building with a memory limit of ${spec.memoryMb} MiB`);
      log.note(`$ ${plan.buildCommand}`);
      // Like `npm run`: the project's installed CLIs (vite, astro, …) are on the PATH.
      const path = `${SANDBOX_WORK_DIR}/node_modules/.bin:${toolsPath}`;
      const env = { NODE_ENV: "production", CI: "true", ...spec.env, ...registry, PATH: path };
      const failed = await step("the build", plan.buildCommand, env);
      if (failed) return finish(log, failed);
    }

    const outputRoot = await realDirInside(root, plan.outputDir);
    if (outputRoot === null) return fail(await missingOutputMessage(root, plan.outputDir, plan.buildCommand !== null));
    const plainFolder = plan.outputDir === PROJECT_ROOT;
    const scanned = await buildManifest(outputRoot, { plainFolder });
    if (!scanned.ok) return fail(scanned.error);
    const { entries, skipped, leftOut } = scanned.scan;
    if (entries.length === 0) return fail(`outputDir "${plan.outputDir}" has no files; check what the build writes there`);
    const totalBytes = entries.reduce((sum, entry) => sum + entry.size, 0);
    log.note(`output ${plan.outputDir}: ${entries.length} file${entries.length === 1 ? "" : "s"}, ${formatBytes(totalBytes)}`);
    if (plainFolder && leftOut.length > 0) {
      const shown = leftOut.slice(0, 8).join(", ") + (leftOut.length > 8 ? ", …" : "");
      log.note(`served the project root as a plain folder, leaving out what is not site content (svc.json, dotfiles, .gitignore'd paths): ${shown}`);
    }
    if (skipped.length > 0) {
      const shown = skipped.slice(0, 5).join(", ") + (skipped.length > 5 ? ", …" : "");
      log.note(
        `left out ${skipped.length} entr${skipped.length === 1 ? "y" : "ies"} that are not files inside the output (links leading outside it, sockets, …): ${shown}`,
      );
    }
    const has = (path: string) => entries.some((entry) => entry.path === path);
    if (!has("/index.html")) log.note(`warning: ${plan.outputDir} has no index.html, so / will answer 404`);

    let artifacts: BuildResult["artifacts"] = null;
    if (plan.ownContainerFile) {
      log.note(`the project has its own ${plan.ownContainerFile}: no container files generated`);
    } else {
      artifacts = generateServerFiles({ outputDir: plan.outputDir, spa: plan.spa, has404: has("/404.html"), port: plan.port });
      log.note(`generated a Dockerfile and an nginx configuration serving ${plan.outputDir} (no Dockerfile in the project)`);
    }

    const upload = await uploadMissingBlobs({
      endpoint: spec.blobsEndpoint,
      secret: input.secret,
      root: outputRoot,
      manifest: entries,
      signal,
    });
    if (!upload.ok) return fail(`upload failed: ${upload.error}`);
    const { distinct, uploaded, uploadedBytes } = upload.report;
    log.note(
      `blobs: ${distinct} distinct, ${distinct - uploaded} already stored, ${uploaded} uploaded (${formatBytes(uploadedBytes)})`,
    );

    const result: BuildResult = {
      kind: "build",
      framework: plan.framework,
      buildCommand: plan.buildCommand,
      outputDir: plan.outputDir,
      spa: plan.spa,
      packageManager: plan.install?.packageManager ?? null,
      manifest: entries,
      artifacts,
      uploadedBlobs: uploaded,
      peakMemoryBytes,
    };
    const ran = plan.install !== null || plan.buildCommand !== null;
    return { ...finish(log, { exitCode: ran ? 0 : null, signal: null, reason: null, error: null, peakMemoryBytes }), result };
  } finally {
    await removeScratch(input.host, scratch);
    await rm(toolsDir, { recursive: true, force: true });
  }
}

/**
 * The build's room: a filesystem of `scratchBytes` (or a plain folder when the
 * builder cannot make one) holding the project (`data/`, the sandbox's /work)
 * and HOME (`home/`, for package manager caches), both owned by the tenant.
 */
async function createScratch(input: BuildJobInput, scratch: string, homeDir: string): Promise<void> {
  if (input.host.images) {
    await FsImages.create(`${scratch}.img`, scratch, input.scratchBytes, input.user);
  } else {
    await mkdir(scratch, { mode: 0o711 });
    await mkdir(join(scratch, IMAGE_DATA_DIR), { mode: 0o700 });
    await chown(join(scratch, IMAGE_DATA_DIR), input.user.uid, input.user.gid);
  }
  await mkdir(homeDir, { mode: 0o700 });
  await chown(homeDir, input.user.uid, input.user.gid);
}

async function removeScratch(host: SandboxHost, scratch: string): Promise<void> {
  if (host.images) {
    await FsImages.unmount(scratch).catch((error: unknown) => console.error(`builder: ${String(error)}`));
    await rm(`${scratch}.img`, { force: true });
  }
  await rm(scratch, { recursive: true, force: true });
}

/**
 * Decides framework, build command, output folder and routing ({@link planSite}:
 * the app's settings win over svc.json, which wins over detection, and a project
 * with dependencies but no lockfile is refused before anything is installed),
 * then how the package manager runs here and whether the project brings its own
 * container file.
 */
async function planBuild(files: ProjectFiles, spec: BuildSpec, log: JobLog): Promise<Decision<BuildPlan>> {
  const svcText = await files.read("svc.json");
  let config: SvcJson | null = null;
  if (svcText === null) {
    log.note("no svc.json: detecting the framework");
  } else {
    const parsed = parseSvcJson(svcText);
    if (!parsed.ok) return parsed;
    config = parsed.config;
    log.note(`svc.json: ${JSON.stringify(config)}`);
    const mismatch = runtimeMismatch(config, "static");
    if (mismatch !== null) return { ok: false, error: mismatch };
  }
  const planned = await planSite(files, config, spec.overrides ?? {});
  if (!planned.ok) return planned;
  const site = planned.value;
  log.note(site.summary);
  if (site.nothingToInstall !== null) log.note(site.nothingToInstall);

  let install: BuildPlan["install"] = null;
  if (site.install !== null) {
    const { packageManager, lockfile } = site.install;
    const pkg = await readPackageJson(files);
    const tool = await availableTool(packageManager, pkg !== null && !("error" in pkg) ? pkg : {}, spec.env.PATH ?? DEFAULT_PATH);
    if (!tool.ok) return tool;
    install = { packageManager, lockfile, command: INSTALL_COMMANDS[packageManager], viaNpx: tool.value };
  }

  let ownContainerFile: string | null = null;
  for (const name of CONTAINER_FILES) if (ownContainerFile === null && (await files.exists(name))) ownContainerFile = name;
  const { framework, buildCommand, outputDir, spa } = site;
  return {
    ok: true,
    value: { framework, buildCommand, outputDir, spa, port: config?.port ?? 80, install, ownContainerFile },
  };
}

/**
 * How the package manager runs: installed (value null), or through npx (value
 * the package spec: the exact version package.json's `packageManager` names,
 * else a default). npm itself must be installed; npx comes with it.
 */
async function availableTool(
  packageManager: PackageManager,
  pkg: PackageJson,
  searchPath: string,
): Promise<Decision<string | null>> {
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
function registryEnv(registry: string | null): Record<string, string> {
  if (registry === null) return {};
  return {
    NPM_CONFIG_REGISTRY: registry, // npm, pnpm
    YARN_REGISTRY: registry, // yarn 1
    YARN_NPM_REGISTRY_SERVER: registry, // yarn 2+
  };
}

/** The outputDir is missing: say which usual output folders do exist, so the fix is obvious. */
async function missingOutputMessage(root: string, outputDir: string, built: boolean): Promise<string> {
  const after = built ? " after the build" : "";
  const exists = await lstat(join(root, outputDir)).then(
    () => true,
    () => false,
  );
  if (exists) return `outputDir "${outputDir}" is not a folder inside the project${after}`;
  const found = [];
  for (const dir of COMMON_OUTPUT_DIRS) if (dir !== outputDir && (await realDirInside(root, dir))) found.push(dir);
  if (found.length > 0) {
    return `outputDir "${outputDir}" does not exist${after}; found: ${found.join(", ")} (set outputDir in svc.json to the folder the build writes)`;
  }
  return `outputDir "${outputDir}" does not exist${after}, nor does any usual output folder (${COMMON_OUTPUT_DIRS.join(", ")}); check what the build writes`;
}
