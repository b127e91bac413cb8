/**
 * The "build" job: turns a static-site project into a manifest of
 * content-addressed blobs in the Worker's storage (DESIGN §4, Static sites),
 * or, with `spec.release`, an app that runs into a release (DESIGN §9,
 * jobs/release.ts). Each step is announced by a `svc` log line and fails
 * early, with a message that says what to do: source → configuration (app
 * overrides, svc.json, detection) → lockfile → install → build → then for a
 * site: output folder → manifest → generated container files → upload; for a
 * release: the whole tree packed and uploaded in parts. Install and build run
 * in the sandbox under the job's memory limit, the same way for both, and a
 * failure of either quotes the tool's own first error (install-error.ts,
 * build-error.ts); everything else runs in the builder and reads the job's
 * files only through `static/files.ts`.
 */
import { chown, lstat, mkdir, realpath, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { FsImages, IMAGE_DATA_DIR } from "../sandbox/fs-image.js";
import { COMMON_OUTPUT_DIRS, PROJECT_ROOT, type ProjectFiles, planSite, readPackageJson } from "../static/detect.js";
import type { JobOutcome } from "./manager.js";
import type { NodeCredentials } from "../protocol/shared.js";
import { type BuildResult, type BuildSpec, GENERATED_WEB_SERVER_CONFIG_PATH } from "../protocol/static.js";
import type { SandboxHost } from "../sandbox/host.js";
import { DEFAULT_PATH, type JobLog, SANDBOX_TOOLS_DIR, SANDBOX_WORK_DIR, type SandboxOutcome, runInSandbox } from "../sandbox/sandbox.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";
import { downloadSource } from "./source-archive.js";
import { projectFiles, realDirInside } from "../static/files.js";
import { buildManifest } from "../static/manifest.js";
import { parseSvcJson, runtimeMismatch, type SvcJson } from "../static/project-config.js";
import { CONTAINER_FILES, generateServerFiles } from "../static/server-config.js";
import { uploadMissingBlobs } from "../static/upload.js";
import { buildFailureFromLog } from "./build-error.js";
import { NPM_INSTALL_KEEPING_LOCKFILE, type NodeInstallStep, type PipSources, nodeInstallStep, registryEnv } from "./install.js";
import { absentOptionalNote, absentOptionalPackages, installFailureFromLog } from "./install-error.js";
import { type CacheKey, type CacheScope, type DependencyCache, installKey } from "./dependency-cache.js";
import type { PackageCaches } from "./package-cache.js";
import { type ReleaseBuildPlan, planReleaseBuild, publishRelease, releasePath } from "./release.js";
import { failure, finish, interrupted } from "./run.js";

export { NO_PIP_SOURCES, type PipSources } from "./install.js";

/** The job log's file in the job's folder (jobs/manager.ts opens it there). */
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
  credentials: NodeCredentials;
  /** The package mirror (the builder's NPM_CONFIG_REGISTRY), or null for the package managers' default. */
  npmRegistry: string | null;
  /** Where python releases install from (the builder's BUILDER_PIP_INDEX_URL and BUILDER_PIP_FIND_LINKS). */
  pip: PipSources;
  /** Aborting cancels the build (reason "shutdown" when the builder stops). */
  signal: AbortSignal;
  /** The node's dependency cache and the app whose entries this build may use; null: install every time. */
  dependencies: { cache: DependencyCache; scope: CacheScope } | null;
  /** The accounts' package-manager caches (~/.npm, ~/.cache), or null for a fresh HOME every build. */
  packageCaches: PackageCaches | null;
}

/** Everything decided about a static site before anything of the user's runs. */
interface SitePlan {
  kind: "site";
  framework: string | null;
  buildCommand: string | null;
  outputDir: string;
  spa: boolean;
  port: number;
  install: NodeInstallStep | null;
  /** `Dockerfile` or `Containerfile` when the project brings one. */
  ownContainerFile: string | null;
}

/** What the shared install and build steps need, for a site or a release. */
type BuildPlan = SitePlan | ReleaseBuildPlan;

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
  /** The account's package cache, taken once the build's room exists and given back when the build ends. */
  let packageCache: string | null = null;
  /** Runs one step in the job's sandbox, under its limits, for what is left of its time. */
  const sandboxed = (
    command: string,
    env: Record<string, string>,
    options: { network: "registry" | "none"; tools: string | null; wheels?: string | null },
  ) =>
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
      wheels: options.wheels ?? null,
      packageCache: options.network === "registry" ? packageCache : null,
      timeoutMs: Math.max(1, deadline - Date.now()),
      memoryLimitBytes: spec.memoryMb * 1024 * 1024,
      disk: null,
      log,
      signal: input.signal,
    });
  try {
    await createScratch(input, scratch, homeDir);
    packageCache = (await input.packageCaches?.take(spec.tenant, input.user)) ?? null;
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

    const searchPath = spec.env.PATH ?? DEFAULT_PATH;
    const planning = spec.release
      ? planReleaseBuild({ files, spec, log, pip: input.pip, searchPath, from: installSource(input) })
      : planBuild(files, spec, log, installSource(input));
    const planned = await planning.catch((error: unknown) => ({
      ok: false as const,
      error: error instanceof Error ? error.message : String(error), // e.g. a package.json over 1 MiB
    }));
    if (!planned.ok) return fail(planned.error);
    const plan: BuildPlan = planned.value;
    const registry = registryEnv(input.npmRegistry);

    // Step runner: the sandbox, reaching only the package registry. A command's failure leaves `error` as
    // the sandbox says it ("exit code 1"): the caller reads the step's output from `output` on to say why.
    const step = async (what: string, command: string, env: Record<string, string>): Promise<{ failed: SandboxOutcome | null; output: number }> => {
      await log.settled();
      const output = log.bytes;
      const started = Date.now();
      const outcome = await sandboxed(command, env, {
        network: "registry",
        tools: plan.install?.viaNpx ? toolsDir : null,
        wheels: plan.install?.wheels ?? null,
      });
      peakMemoryBytes = Math.max(peakMemoryBytes, outcome.peakMemoryBytes);
      if (outcome.reason === null) {
        log.note(`${what} finished in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        return { failed: null, output };
      }
      if (outcome.reason === "timeout") outcome.error = `timed out after ${spec.timeoutSeconds} s (during ${what})`;
      if (outcome.reason === "OOMKilled") {
        outcome.error = `${outcome.error} during ${what}; raise the app's memory limit or slim the build`;
      }
      if (outcome.reason === "exit_code") await log.settled();
      return { failed: { ...outcome, peakMemoryBytes }, output };
    };
    const logFile = join(input.jobDir, JOB_LOG_FILE);

    // A `yarn` or `pnpm` command running it through npx, for install and build alike, when the builder lacks it.
    let toolsPath = searchPath;
    if (plan.install?.viaNpx) {
      await mkdir(toolsDir, { mode: 0o755 }); // in the builder's own job folder: the job cannot plant links there
      const shim = `#!/bin/sh\nexec npx --yes ${plan.install.viaNpx} "$@"\n`;
      await writeFile(join(toolsDir, plan.install.packageManager), shim, { mode: 0o755 });
      toolsPath = `${SANDBOX_TOOLS_DIR}:${searchPath}`;
    }

    // Nothing to drop when package.json lists no devDependencies: the prune would only walk node_modules (0.6 s for Express).
    const prune = plan.kind === "release" && !plan.release.keepDevDependencies && plan.release.devDependencies ? pruneCommand(plan.install?.packageManager) : null;
    /** The cache's key of the install, and whether what it restored is already without devDependencies. */
    let cacheKey: CacheKey | null = null;
    let pruned = false;
    const cache = input.dependencies;
    /** A release without a build step needs the dependencies only as the prune leaves them: cached apart, under this key. */
    const prunedKey = (key: string) => `${key}-pruned`;
    const prunedOnly = prune !== null && plan.buildCommand === null;

    if (plan.install) {
      const { packageManager, lockfile, command, viaNpx, from } = plan.install;
      // Without NODE_ENV: NODE_ENV=production makes every package manager skip devDependencies, where build tools live.
      const { NODE_ENV: _omitted, ...appEnv } = spec.env;
      const installEnv = { CI: "true", ...appEnv, ...registry, ...plan.install.env, PATH: toolsPath };
      cacheKey = cache
        ? await installKey({ step: plan.install, files, root, env: installEnv, searchPath, wheels: plan.install.wheels }).catch(
            (error: unknown): CacheKey => ({ ok: false, why: `not cached: ${error instanceof Error ? error.message : String(error)}` }),
          )
        : null;
      if (cacheKey !== null && !cacheKey.ok) log.note(`dependencies: ${cacheKey.why}`);
      let restored = false;
      // The pruned copy first where that is all the release needs, else the install's own.
      const keys = cache && cacheKey?.ok ? [...(prunedOnly ? [prunedKey(cacheKey.key)] : []), cacheKey.key] : [];
      const cachedKey = keys.find((key) => cache!.cache.has(cache!.scope, key));
      if (cache && cacheKey?.ok && cachedKey !== undefined) {
        const started = Date.now();
        restored = await cache.cache.restore(cache.scope, cachedKey, root, signal);
        pruned = restored && cachedKey !== cacheKey.key;
        const what = pruned ? `${cacheKey.folder} without devDependencies` : cacheKey.folder;
        log.note(
          restored
            ? `dependencies: from cache (lockfile unchanged): ${what} restored in ${((Date.now() - started) / 1000).toFixed(1)} s`
            : "dependencies: the cached copy could not be restored; installing",
        );
      }
      if (!restored) {
        const through = viaNpx ? ` (${packageManager} is not installed: running ${viaNpx} through npx)` : "";
        const into = packageManager === "pip" ? " into .venv" : "";
        log.note(`installing dependencies from ${lockfile} with ${packageManager}${through}${into} from ${from}`);
        log.note(`$ ${command}`);
        let { failed, output } = await step("install", command, installEnv);
        // The cause is one line among many: quote it in the summary, with what to do (install-error.ts).
        let cause = failed?.reason === "exit_code" ? await installFailureFromLog(logFile, output, lockfile, packageManager).catch(() => null) : null;
        // npm ci refusing a lockfile npm install wrote, for optional platform packages the registry lacked: install it the other way.
        const absent = cause?.refusal && packageManager === "npm" ? await absentOptionalPackages(root, cause.refusal).catch(() => null) : null;
        if (absent) {
          log.note(absentOptionalNote(absent, NPM_INSTALL_KEEPING_LOCKFILE));
          log.note(`$ ${NPM_INSTALL_KEEPING_LOCKFILE}`);
          ({ failed, output } = await step("install", NPM_INSTALL_KEEPING_LOCKFILE, installEnv));
          cause = failed?.reason === "exit_code" ? await installFailureFromLog(logFile, output, lockfile, packageManager).catch(() => null) : null;
        }
        if (failed) {
          if (failed.reason === "exit_code") failed.error = `install failed: ${failed.error}${cause?.why ? `: ${cause.why}` : ""}`;
          return finish(log, failed);
        }
        // Kept before the build step runs: what the cache holds is what the install wrote, whatever the build does after.
        if (cache && cacheKey?.ok) log.note(await cache.cache.save(cache.scope, cacheKey.key, cacheKey.folder, root, signal));
      }
    }

    if (plan.buildCommand !== null) {
      log.note(`building with a memory limit of ${spec.memoryMb} MiB`);
      log.note(`$ ${plan.buildCommand}`);
      // Like `npm run`: the project's installed CLIs (vite, astro, …) are on the PATH; for a release, as its processes will see them.
      const path = plan.kind === "release" ? releasePath(toolsPath) : `${SANDBOX_WORK_DIR}/node_modules/.bin:${toolsPath}`;
      const env = { NODE_ENV: "production", CI: "true", ...spec.env, ...registry, ...plan.install?.env, PATH: path };
      const { failed, output } = await step("the build", plan.buildCommand, env);
      if (failed) {
        if (failed.reason === "exit_code") {
          // The build tool's first error, with its file and line (build-error.ts), rather than only the exit code.
          const cause = await buildFailureFromLog(logFile, output).catch(() => null);
          failed.error = cause === null ? `the build failed: ${failed.error}` : `the build failed: ${cause} (${failed.error})`;
        }
        return finish(log, failed);
      }
    }

    if (prune !== null && plan.install && !pruned) {
      // The build needed them; the running app does not: the package manager's own prune keeps the release lean.
      log.note(`dropping devDependencies from the release (keep them with "keepDevDependencies": true in svc.json)`);
      log.note(`$ ${prune}`);
      const { NODE_ENV: _omitted, ...appEnv } = spec.env;
      const { failed } = await step("pruning devDependencies", prune, { CI: "true", ...appEnv, ...registry, ...plan.install.env, PATH: toolsPath });
      if (failed) {
        if (failed.reason === "exit_code") failed.error = `pruning devDependencies failed: ${failed.error} (set "keepDevDependencies": true in svc.json to keep them)`;
        return finish(log, failed);
      }
      if (prunedOnly && cache && cacheKey?.ok) log.note(await cache.cache.save(cache.scope, prunedKey(cacheKey.key), cacheKey.folder, root, signal));
    }

    if (plan.kind === "release") {
      const published = await publishRelease({ root, plan, spec, jobDir: input.jobDir, credentials: input.credentials, user: input.user, log, signal, peakMemoryBytes });
      if (!published.ok) return fail(published.error);
      const { result } = published;
      const ran = plan.install !== null || plan.buildCommand !== null;
      return { ...finish(log, { exitCode: ran ? 0 : null, signal: null, reason: null, error: null, peakMemoryBytes }), result };
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
    // Only for running the site elsewhere (the edge serves the uploaded files): the deployment's downloadable artifacts.
    if (plan.ownContainerFile) {
      log.note(`the project has its own ${plan.ownContainerFile}, so no Dockerfile for self-hosting is generated (the platform serves the site without one)`);
    } else {
      artifacts = generateServerFiles({ outputDir: plan.outputDir, spa: plan.spa, has404: has("/404.html"), port: plan.port });
      log.note(
        `for self-hosting only: generated a Dockerfile and ${GENERATED_WEB_SERVER_CONFIG_PATH} (nginx serving ${plan.outputDir} with the platform's routing), ` +
          "at /v1/apps/<app>/deployments/<id>/artifacts/Dockerfile; the platform serves the site without them",
      );
    }

    const upload = await uploadMissingBlobs({
      endpoint: spec.blobsEndpoint,
      credentials: input.credentials,
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
    if (packageCache !== null) {
      const emptied = await input.packageCaches!.give(spec.tenant).catch(() => null);
      if (emptied !== null) log.note(emptied);
    }
    await removeScratch(input.host, scratch);
    await rm(toolsDir, { recursive: true, force: true });
  }
}

/** The package manager's own command that drops devDependencies from an installed tree; null when there is none to drop. */
function pruneCommand(packageManager: "npm" | "yarn" | "pnpm" | "pip" | undefined): string | null {
  if (packageManager === "npm") return "npm prune --omit=dev";
  if (packageManager === "yarn") return "yarn install --production --frozen-lockfile --ignore-scripts --prefer-offline";
  if (packageManager === "pnpm") return "pnpm prune --prod";
  return null;
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
async function planBuild(files: ProjectFiles, spec: BuildSpec, log: JobLog, from: string): Promise<Decision<SitePlan>> {
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

  let install: NodeInstallStep | null = null;
  if (site.install !== null) {
    const pkg = await readPackageJson(files);
    const step = await nodeInstallStep(site.install, pkg !== null && !("error" in pkg) ? pkg : {}, spec.env.PATH ?? DEFAULT_PATH, from);
    if (!step.ok) return step;
    install = step.value;
  }

  let ownContainerFile: string | null = null;
  for (const name of CONTAINER_FILES) if (ownContainerFile === null && (await files.exists(name))) ownContainerFile = name;
  const { framework, buildCommand, outputDir, spa } = site;
  return {
    ok: true,
    value: { kind: "site", framework, buildCommand, outputDir, spa, port: config?.port ?? 80, install, ownContainerFile },
  };
}

/** Where node packages come from, as the install step's log line says it. */
function installSource(input: BuildJobInput): string {
  const registry = input.npmRegistry ? `the registry mirror ${input.npmRegistry}` : `the registry ${input.host.registry.npmAllowed}`;
  return `${registry} (the only host builds can reach)`;
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
