/**
 * The release half of the build job (DESIGN §9, protocol/processes.ts "Releases"): for
 * an app that runs, the build's install and build steps are the static
 * site's (jobs/build.ts), and what it publishes is the whole tree, /work with
 * its dependencies (node_modules, the python virtualenv at .venv), as one
 * `.tar.gz` uploaded in parts exactly as a disk snapshot is
 * (tar/multipart-upload.ts). Any node restores it with the disks' extractor
 * (tar/extract.ts), so a release holds only what that extractor accepts:
 * links must stay inside the tree (node_modules/.bin links are relative and
 * do); a link leading out of it fails the build, naming it.
 */
import { readdir, readlink } from "node:fs/promises";
import { join } from "node:path";
import { type ProjectFiles, readPackageJson } from "../static/detect.js";
import type { ReleaseResult } from "../protocol/processes.js";
import type { NodeCredentials } from "../protocol/shared.js";
import type { BuildSpec } from "../protocol/static.js";
import { type ReleasePlan, planRelease } from "./release-plan.js";
import { type JobLog, SANDBOX_WORK_DIR } from "../sandbox/sandbox.js";
import { formatBytes } from "../units.js";
import type { JobUser } from "../sandbox/tenants.js";
import { parseSvcJson, type SvcJson } from "../static/project-config.js";
import { resolveLink } from "../tar/extract.js";
import { PartUploadFailed, uploadDirectoryArchive } from "../tar/multipart-upload.js";
import { type InstallStep, type PipSources, VENV_DIR, nodeInstallStep, pipInstallStep } from "./install.js";

type Decision<T> = { ok: true; value: T } | { ok: false; error: string };

/** A release build's plan: what the shared install and build steps run, and what the release says. */
export interface ReleaseBuildPlan {
  kind: "release";
  release: ReleasePlan;
  buildCommand: string | null;
  install: InstallStep | null;
}

/** Inputs of {@link planReleaseBuild}. */
export interface ReleasePlanInput {
  files: ProjectFiles;
  /** A spec with `release`. */
  spec: BuildSpec;
  log: JobLog;
  pip: PipSources;
  /** The PATH install and build steps search. */
  searchPath: string;
  /** Where node packages come from, for the install's log line. */
  from: string;
}

/** Links named in a failure message, at most. */
const LINKS_SHOWN = 5;

/**
 * Reads svc.json and decides the release ({@link planRelease}: the app's
 * runtime, svc.json, Procfile, conventions), then how its dependencies install
 * on this builder. Logs each decision.
 */
export async function planReleaseBuild(input: ReleasePlanInput): Promise<Decision<ReleaseBuildPlan>> {
  const { files, spec, log } = input;
  const runtime = spec.release!.runtime;
  const svcText = await files.read("svc.json");
  let config: SvcJson | null = null;
  if (svcText === null) {
    log.note(`no svc.json: a ${runtime} app started the ${runtime} way`);
  } else {
    const parsed = parseSvcJson(svcText);
    if (!parsed.ok) return parsed;
    config = parsed.config;
    log.note(`svc.json: ${JSON.stringify(config)}`);
  }
  const { buildCommand, outputDir, spa } = spec.overrides ?? {};
  if (outputDir !== undefined || spa !== undefined) log.note("the app's outputDir and spa settings are for static sites: not used by a release");
  const planned = await planRelease(files, config, runtime, buildCommand === undefined ? {} : { buildCommand });
  if (!planned.ok) return planned;
  const release = planned.value;
  log.note(release.summary);
  if (release.nothingToInstall !== null) log.note(release.nothingToInstall);

  let install: InstallStep | null = null;
  if (release.install?.packageManager === "pip") {
    const step = await pipInstallStep(release.install.lockfile, input.pip, input.searchPath);
    if (!step.ok) return step;
    install = step.value;
  } else if (release.install !== null) {
    const pkg = await readPackageJson(files);
    const step = await nodeInstallStep(release.install, pkg !== null && !("error" in pkg) ? pkg : {}, input.searchPath, input.from);
    if (!step.ok) return step;
    install = step.value;
  }
  return { ok: true, value: { kind: "release", release, buildCommand: release.buildCommand, install } };
}

/** The PATH of a release's build step: what its processes get (the virtualenv, the project's CLIs, the system), plus the build's tools. */
export function releasePath(toolsPath: string): string {
  return `${VENV_DIR}/bin:${SANDBOX_WORK_DIR}/node_modules/.bin:${toolsPath}`;
}

/** Inputs of {@link publishRelease}. */
export interface PublishReleaseInput {
  /** The build's /work on the host (its scratch space), which nothing of the job's runs in any more. */
  root: string;
  plan: ReleaseBuildPlan;
  /** A spec with `release`. */
  spec: BuildSpec;
  jobDir: string;
  credentials: NodeCredentials;
  user: JobUser;
  log: JobLog;
  signal: AbortSignal;
  /** Highest memory use of the install and build steps. */
  peakMemoryBytes: number;
}

/**
 * Checks that the tree holds no link leading out of it, then packs and
 * uploads it; the ReleaseResult carries the parts for CompleteMultipartUpload.
 */
export async function publishRelease(input: PublishReleaseInput): Promise<{ ok: true; result: ReleaseResult } | { ok: false; error: string }> {
  const { plan, log } = input;
  const target = input.spec.release!;
  const tree = await scanTree(input.root);
  if (tree.escaping.length > 0) {
    const shown = tree.escaping.slice(0, LINKS_SHOWN).map(([path, to]) => `${path} -> ${to}`);
    const more = tree.escaping.length > LINKS_SHOWN ? `, and ${tree.escaping.length - LINKS_SHOWN} more` : "";
    return {
      ok: false,
      error:
        `the release would hold ${tree.escaping.length === 1 ? "a link" : `${tree.escaping.length} links`} leading outside the app's folder, ` +
        `which no node could restore: ${shown.join(", ")}${more}; make ${tree.escaping.length === 1 ? "it a relative link" : "them relative links"} inside the project, or remove ${tree.escaping.length === 1 ? "it" : "them"} in the build command`,
    };
  }
  log.note(`packing the release: ${SANDBOX_WORK_DIR} with its dependencies, ${tree.files.toLocaleString("en-US")} files, parts of ${formatBytes(target.partSizeBytes)}`);
  const started = Date.now();
  let archive: Awaited<ReturnType<typeof uploadDirectoryArchive>>;
  try {
    archive = await uploadDirectoryArchive({
      root: input.root,
      spoolDir: join(input.jobDir, "parts"),
      partUrlEndpoint: target.partUrlEndpoint,
      partSizeBytes: target.partSizeBytes,
      credentials: input.credentials,
      log,
      signal: input.signal,
    });
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    return { ok: false, error: error instanceof PartUploadFailed ? `release upload failed: ${message}` : `packing the release failed: ${message}` };
  }
  const { release } = plan;
  const parts = archive.parts.length;
  const runs = release.type === "web" ? `port ${release.port}` : "worker (no port)";
  log.note(`packed and uploaded in ${((Date.now() - started) / 1000).toFixed(1)} s, sha256 ${archive.sha256}`);
  log.note(
    `release: ${tree.files.toLocaleString("en-US")} files, ${formatBytes(archive.expandedBytes)} ` +
      `(${formatBytes(archive.sizeBytes)} compressed, ${parts} part${parts === 1 ? "" : "s"}), start: ${release.startCommand}, ${runs}`,
  );
  return {
    ok: true,
    result: {
      kind: "release",
      runtime: release.runtime,
      type: release.type,
      startCommand: release.startCommand,
      buildCommand: release.buildCommand,
      packageManager: plan.install?.packageManager ?? null,
      port: release.port,
      healthCheckPath: release.healthCheckPath,
      startTimeoutSeconds: release.startTimeoutSeconds,
      minReadySeconds: release.minReadySeconds,
      overlap: release.overlap,
      instances: release.instances,
      files: tree.files,
      sizeBytes: archive.sizeBytes,
      sha256: archive.sha256,
      parts: archive.parts,
      entries: archive.entries,
      expandedBytes: archive.expandedBytes,
      peakMemoryBytes: input.peakMemoryBytes,
    },
  };
}

/**
 * Counts the tree's files and finds the links that lead outside it, resolved
 * the way the extractor resolves them (through the tree's other links;
 * absolute targets always lead outside). The walk follows no link, and
 * nothing of the job's runs any more, so the tree cannot change under it.
 */
async function scanTree(root: string): Promise<{ files: number; escaping: [string, string][] }> {
  const links = new Map<string, string>();
  let files = 0;
  const walk = async (dir: string, prefix: string): Promise<void> => {
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      const path = prefix === "" ? entry.name : `${prefix}/${entry.name}`;
      if (entry.isDirectory()) await walk(join(dir, entry.name), path);
      else if (entry.isFile()) files++;
      else if (entry.isSymbolicLink()) links.set(path, await readlink(join(dir, entry.name)));
    }
  };
  await walk(root, "");
  const escaping = [...links]
    .filter(([path, target]) => resolveLink(path.split("/").slice(0, -1), target, links) === "outside")
    .sort((a, b) => (a[0] < b[0] ? -1 : 1));
  return { files, escaping };
}
