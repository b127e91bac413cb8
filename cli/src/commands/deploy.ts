import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { detectProject, PROJECT_ROOT, planSite } from "../../../builder/src/static/detect.js";
import { planRelease } from "../../../builder/src/jobs/release-plan.js";
import { RUNTIMES, type Runtime, runtimeMismatch, type SvcJson } from "../../../builder/src/static/project-config.js";
import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type ApiClient, type Call, path, RequestFailed } from "../api.js";
import { colouredLines, colourWanted } from "../colour.js";
import { APP_ARG, defineCommand, type Group } from "../command.js";
import { ago, CliError, fields, type Output, table, when } from "../output.js";
import { MAX_UPLOAD_BYTES, type PackedSource, packSource } from "../pack.js";
import { exposedFiles, type ServedAt, servedFrom } from "../exposure.js";
import { formatBytes, Progress } from "../progress.js";
import { readSvcJson } from "../project.js";
import type { App } from "./apps.js";
import { folderFiles } from "./init.js";

/** A static-site deployment as the API returns it. */
export type Deployment = Schemas["Deployment"];
/** A created deployment with the presigned URL its source goes to. */
type Created = ResponseData<"/v1/apps/{app}/deployments", "post", 201>;

/** Statuses a deployment does not leave. */
const FINAL = new Set<Deployment["status"]>(["ready", "failed", "cancelled"]);
/** How often a deployment is looked at while it is published, or when the live log stream ended early. */
const POLL_MS = 500;
/** A rollout is followed closer: its end ("serving") is what `svc deploy` waits to print. */
const ROLLOUT_POLL_MS = 100;
/** After a rollout's end, how long the process's last lines get to arrive before its stream is cut, when the stream is still opening. */
const LAST_LINES_MS = 200;
/** The same for a stream that has been open this long ({@link LIVE_STREAM_MS}): it is live, lines come within ms. */
const LIVE_LAST_LINES_MS = 50;
const LIVE_STREAM_MS = 200;
/** Pause before a process's followed output that failed or ended is opened again. */
const RESUME_MS = 500;
/** Longest a build is followed: the builder's 20-minute limit plus publishing. */
const FOLLOW_LIMIT_MS = 30 * 60_000;

/** Error context for a call about one app's deployments. */
export function aboutDeployments(what: string, app: string, runtime: string = "static"): Call {
  return {
    what,
    hints: {
      APP_NOT_FOUND: `no app "${app}" in this account: create it with \`svc apps create --name ${app} --runtime ${runtime}\`, or see \`svc apps list\``,
      DEPLOYMENT_NOT_FOUND: `\`svc deployments list --app ${app}\` shows the app's deployments (the last 10 are kept)`,
      DEPLOYMENT_NOT_READY: `only a ready deployment can be served: \`svc deployments list --app ${app}\` shows their status`,
      UPLOAD_INCOMPLETE: "the source did not fully arrive: run svc deploy again",
      PRESIGNED_URL_EXPIRED: "the upload took longer than its link is valid (1 hour): run svc deploy again",
      PAYLOAD_TOO_LARGE: "leave build output, media and archives out of the source with .gitignore",
    },
  };
}

const kib = (n: number | null) => (n === null ? "-" : formatBytes(n));

/** A few paths by name, and how many more. */
function listed(paths: readonly string[], shown = 5): string {
  return paths.slice(0, shown).join(", ") + (paths.length > shown ? ` and ${paths.length - shown} more` : "");
}

/** The key/value block of one deployment. */
export function describeDeployment(d: Deployment): string {
  const site = d.release === null && d.cause === null;
  const rows: [string, string][] = [
    ["id", d.id],
    ["status", d.error ? `${d.status}: ${d.error}` : d.waiting ? `${d.status} (${d.waiting})` : d.status],
    ["active", d.active ? "yes (served now)" : "no"],
    ...(d.cause ? ([["cause", d.cause]] as [string, string][]) : []),
    ...(site
      ? ([
          ["framework", d.framework ?? "-"],
          ["output", d.outputDir ? `${d.outputDir}${d.spa ? " (spa)" : ""}` : "-"],
          ["files", d.fileCount === null ? "-" : `${d.fileCount} (${kib(d.totalBytes)}), ${d.uploadedBlobs ?? 0} uploaded`],
        ] as [string, string][])
      : ([
          ["release", d.release ? `${d.release.type}, start: ${d.release.startCommand}${d.release.port === null ? "" : `, port ${d.release.port}`}` : "-"],
          ["files", d.fileCount === null ? "-" : `${d.fileCount} (${kib(d.totalBytes)})`],
          ["process", d.processId ?? "-"],
        ] as [string, string][])),
    ...(d.peakMemoryBytes ? ([["peak memory", kib(d.peakMemoryBytes)]] as [string, string][]) : []),
    ["build time", d.buildMs === null ? "-" : `${(d.buildMs / 1000).toFixed(1)} s`],
    ["url", d.url ?? "- (a worker takes no HTTP traffic)"],
    ["created", when(d.createdAt)],
    ["finished", when(d.finishedAt, "-")],
  ];
  const excerpt = d.logExcerpt && d.logExcerpt.length > 0 ? `\nlast log lines:\n${d.logExcerpt.map((line) => `  ${line}`).join("\n")}` : "";
  return fields(rows) + excerpt;
}

/** Whether `path` (relative to the source) is among what packing left out (folders end in `/`). */
function leftOut(path: string, ignored: readonly string[]): boolean {
  return ignored.some((entry) => entry === path || (entry.endsWith("/") && (path === entry.slice(0, -1) || path.startsWith(entry))));
}

/** The fix-it line for what the build would refuse, by what the plan says. */
function planHint(error: string): string {
  if (/no lockfile/.test(error)) return "run npm install (or yarn / pnpm install) in the project and commit the lockfile it writes";
  if (/no start command|needs a start command/.test(error)) return "`svc init --force --start-command <command>` writes it into svc.json";
  if (/svc\.json says "runtime"/.test(error)) return 'make "runtime" in svc.json the app\'s (`svc apps info <app>` shows it)';
  if (/needs a package\.json/.test(error)) return "add package.json, or deploy to an app created with --runtime custom";
  if (/the project root/.test(error)) return 'set "outputDir" in svc.json to the folder the build writes';
  if (/not a static site|server runtime/.test(error)) return "svc init says what it finds; or set outputDir (and buildCommand) in svc.json";
  return "fix the project and deploy again";
}

/**
 * Refuses, before the upload, a source the build would refuse: the builder's
 * own plan over the folder (for an app that runs, jobs/release-plan.ts: svc.json
 * agreeing with the app's runtime, lockfile present, a start command found),
 * then what packing left out (a lockfile or requirements file that
 * `.gitignore` keeps from being uploaded).
 */
async function preflight(source: string, config: SvcJson | null, ignored: readonly string[], runtime: Runtime): Promise<ServedAt> {
  const cannot = (detail: string, hint: string) => new CliError(`cannot deploy ${source}`, [detail], hint);
  if (runtime === "static") return preflightSite(source, config, ignored);
  const planned = await planRelease(folderFiles(source), config, runtime);
  if (!planned.ok) throw cannot(planned.error, planHint(planned.error));
  const { install } = planned.value;
  if (install !== null && leftOut(install.lockfile, ignored)) {
    throw cannot(`${install.lockfile} is left out by .gitignore, so the build would install without it`, `remove it from .gitignore and commit it`);
  }
  return () => null; // an app that runs serves what its code serves
}

/**
 * A static site's checks: the builder's own plan (detect.ts: static site
 * found, output folder allowed, lockfile present), then what packing left
 * out: a lockfile or an output folder that `.gitignore` keeps from being
 * uploaded, and an output folder that does not exist when nothing builds it.
 */
async function preflightSite(source: string, config: SvcJson | null, ignored: readonly string[]): Promise<ServedAt> {
  const cannot = (detail: string, hint: string) => new CliError(`cannot deploy ${source}`, [detail], hint);
  const mismatch = runtimeMismatch(config, "static");
  if (mismatch !== null) throw cannot(mismatch, planHint(mismatch));
  const planned = await planSite(folderFiles(source), config);
  if (!planned.ok) throw cannot(planned.error, planHint(planned.error));
  const { install, buildCommand, outputDir } = planned.value;
  if (install !== null && leftOut(install.lockfile, ignored)) {
    throw cannot(`${install.lockfile} is left out by .gitignore, so the build would install without it`, `remove it from .gitignore and commit it`);
  }
  if (buildCommand === null && outputDir !== PROJECT_ROOT) {
    if (leftOut(outputDir, ignored)) {
      throw cannot(`outputDir "${outputDir}" is left out by .gitignore and nothing builds it`, `take it out of .gitignore, or set "buildCommand" in svc.json`);
    }
    if (!(await stat(join(source, outputDir)).catch(() => null))?.isDirectory()) {
      throw cannot(`outputDir "${outputDir}" does not exist and nothing builds it`, 'set "outputDir" to the folder holding the site, or "buildCommand" to what writes it');
    }
  }
  // What is served as uploaded: the output folder when nothing builds it; else what frameworks copy verbatim.
  if (buildCommand === null) return servedFrom([outputDir === PROJECT_ROOT ? "" : `${outputDir.replace(/\/+$/, "")}/`]);
  return servedFrom(["public/", "static/"]);
}

/** Warns, before the upload, of secrets and archives the deploy would carry and (for archives) publish. */
function warnExposed(out: Output, files: PackedSource["files"], served: ServedAt, app: string): void {
  const exposed = exposedFiles(files, served);
  if (exposed.length === 0) return;
  for (const file of exposed.slice(0, 10)) {
    const where = file.servedAt === null ? "is uploaded with the source (the build can read it)" : `would be public at ${file.servedAt}`;
    const what = file.kind === "secret" ? "looks like secrets" : "is an archive";
    out.note(`Warning: ${file.path} (${formatBytes(file.size)}) ${what} and ${where}`);
  }
  if (exposed.length > 10) out.note(`Warning: and ${exposed.length - 10} more like them`);
  const secrets = exposed.some((file) => file.kind === "secret");
  out.note(
    `  Leave them out with .gitignore (svc deploy packs what git would commit)${secrets ? `; give secrets to the app with \`svc env set KEY=VALUE --app ${app}\`` : ""}.`,
  );
}

/** Streams the archive to the presigned URL with exactly its size as Content-Length. */
async function uploadSource(url: string, file: string, size: number): Promise<void> {
  const progress = new Progress("Uploading", size);
  async function* body(): AsyncGenerator<Buffer> {
    for await (const chunk of createReadStream(file)) {
      const data = chunk as Buffer;
      progress.add(data.length);
      yield data;
    }
  }
  let res: Response;
  try {
    res = await fetch(url, { method: "PUT", body: body(), headers: { "Content-Length": String(size) }, duplex: "half" } as RequestInit);
  } catch (err) {
    const cause = err instanceof Error && err.cause instanceof Error ? err.cause.message : String(err);
    throw new CliError("could not upload the source", [cause], "check the connection to the API and run svc deploy again");
  } finally {
    progress.end();
  }
  if (!res.ok) {
    const text = (await res.text().catch(() => "")).trim();
    throw new CliError("could not upload the source", [`HTTP ${res.status}: ${text.slice(0, 300) || "(empty body)"}`], "run svc deploy again: it asks for a fresh upload link");
  }
  await res.body?.cancel();
}

/**
 * Shows a deployment's build log as it is written and resolves to the
 * deployment once its build has ended: final (ready, failed or cancelled), or
 * an app's release `deploying` (followRollout narrates what comes next). The
 * log is followed live; if the stream ends while the build still runs (a
 * dropped connection), it is opened again and what was shown is skipped. At
 * the end the stored log fills in anything the live stream missed.
 */
export async function followBuild(client: ApiClient, app: string, id: string, write: (text: string) => void): Promise<Deployment> {
  const call = aboutDeployments(`follow the build of deployment ${id}`, app);
  const route = path`/v1/apps/${app}/deployments/${id}`;
  const get = () => client.data<Deployment>("GET", route, undefined, call);
  let shown = "";
  const show = (text: string) => {
    shown += text;
    write(text);
  };
  /**
   * Reads the log from its start; when following, passes on what was not shown
   * yet (a reconnect skips what an earlier read showed, and shows nothing more if
   * the log no longer begins with it). Returns the whole text read.
   */
  const readLog = async (follow: boolean): Promise<string> => {
    const res = await client.stream(`${route}/logs${follow ? "?follow=true" : ""}`, call);
    const already = shown;
    let state: "catching-up" | "live" | "diverged" = already === "" ? "live" : "catching-up";
    const decoder = new TextDecoder();
    let text = "";
    try {
      for await (const chunk of res.body ?? []) {
        const piece = decoder.decode(chunk as Uint8Array, { stream: true });
        text += piece;
        if (!follow || state === "diverged") continue;
        if (state === "live") {
          show(piece);
        } else if (text.length >= already.length) {
          state = text.startsWith(already) ? "live" : "diverged";
          if (state === "live") show(text.slice(already.length));
        }
      }
    } catch {
      // The connection dropped: the caller polls and reads again.
    }
    return text;
  };
  const deadline = Date.now() + FOLLOW_LIMIT_MS;
  let deployment = await get();
  let warned = false;
  const building = (d: Deployment) => d.status === "queued" || d.status === "building";
  while (building(deployment) && Date.now() < deadline) {
    await readLog(true).catch((err: unknown) => {
      // The log is a convenience: the build's outcome is still polled and reported.
      if (!warned) process.stderr.write(`Note: the build log cannot be followed (${why(err)}); waiting for the build to end\n`);
      warned = true;
    });
    deployment = await get();
    if (building(deployment)) await sleep(POLL_MS);
  }
  // A static site is published after its build: it is done once ready (an app that runs goes on in followRollout).
  while (deployment.status === "deploying" && deployment.release === null && Date.now() < deadline) {
    await sleep(POLL_MS);
    deployment = await get();
  }
  if (building(deployment)) {
    throw new CliError(`deployment ${id} is still ${deployment.status} after ${FOLLOW_LIMIT_MS / 60_000} minutes`, [], `\`svc deployments info --app ${app} ${id}\` shows where it is`);
  }
  const stored = await readLog(false).catch(() => "");
  if (stored.length > shown.length && stored.startsWith(shown)) show(stored.slice(shown.length));
  if (shown !== "" && !shown.endsWith("\n")) write("\n");
  return deployment;
}

/**
 * Whether a deployment whose build is over has a rollout to narrate: one under
 * way, or one that already ended (a release that starts and switches within
 * a poll of the build's end) with its process's output and progress unshown.
 */
export const hasRollout = (deployment: Deployment) => deployment.status === "deploying" || deployment.processId !== null;

/**
 * Narrates a deployment of an app that runs once its release exists (after a
 * build, or at once for a configuration change): what the control plane did
 * (its `progress`) and the new process's own output and phases (its lines of
 * the runtime log), until the deployment is ready (every request goes to the
 * new release), failed or cancelled.
 */
export async function followRollout(client: ApiClient, app: string, id: string, write: (text: string) => void): Promise<Deployment> {
  const call = aboutDeployments(`follow deployment ${id}`, app);
  const route = path`/v1/apps/${app}/deployments/${id}`;
  const get = () => client.data<Deployment>("GET", route, undefined, call);
  const deadline = Date.now() + FOLLOW_LIMIT_MS;
  let deployment = await get();
  let shownSteps = 0;
  let output: { stop(): Promise<void> } | null = null;
  for (;;) {
    for (const step of deployment.progress.slice(shownSteps)) write(`${step.at} svc ${step.text}\n`);
    shownSteps = deployment.progress.length;
    if (output === null && deployment.processId !== null) output = followProcess(client, app, deployment.processId, deployment.createdAt, write);
    if (FINAL.has(deployment.status) || Date.now() > deadline) break;
    await sleep(ROLLOUT_POLL_MS);
    deployment = await get();
  }
  await output?.stop();
  for (const step of deployment.progress.slice(shownSteps)) write(`${step.at} svc ${step.text}\n`);
  return deployment;
}

/**
 * Streams one process's lines of the app's runtime log, from `since`, as
 * `<time> <stream> <text>`, until stopped. A stream that could not open (a
 * node busy for a moment answers 503) or ended early is opened again from the
 * last line's time, and the lines of that moment already shown are not shown
 * twice.
 */
function followProcess(client: ApiClient, app: string, processId: string, since: string, write: (text: string) => void): { stop(): Promise<void> } {
  const stopping = new AbortController();
  let from = since;
  /** The lines already shown whose time is `from` (a resumed stream starts with them). */
  let shownAt = new Set<string>();
  /** When the stream now open answered; null while none is. */
  let openedAt: number | null = null;
  const show = (line: string) => {
    const time = line.slice(0, line.indexOf(" "));
    if (time < from || (time === from && shownAt.has(line))) return;
    if (time !== from) shownAt = new Set();
    from = time;
    shownAt.add(line);
    // The process is this deployment's: its release/process tag says nothing more here.
    write(`${line.replace(/^(\S+ \S+) \S+\/prc_\w+ /, "$1 ")}\n`);
  };
  const follow = async () => {
    const query = `?follow=true&process=${processId}&since=${encodeURIComponent(from)}`;
    const res = await client.stream(`${path`/v1/apps/${app}/runtime-logs`}${query}`, aboutDeployments(`follow process ${processId}`, app));
    const reader = res.body?.getReader();
    if (!reader) return;
    const cancel = () => void reader.cancel().catch(() => undefined);
    stopping.signal.addEventListener("abort", cancel, { once: true });
    openedAt = Date.now();
    try {
      const decoder = new TextDecoder();
      let partial = "";
      for (;;) {
        const { done: ended, value } = await reader.read();
        if (ended) break;
        partial += decoder.decode(value, { stream: true });
        const lines = partial.split("\n");
        partial = lines.pop() ?? "";
        for (const line of lines) show(line);
      }
    } finally {
      openedAt = null;
      stopping.signal.removeEventListener("abort", cancel);
    }
  };
  const done = (async () => {
    while (!stopping.signal.aborted) {
      await follow().catch(() => undefined);
      if (!stopping.signal.aborted) await sleep(RESUME_MS, undefined, { signal: stopping.signal }).catch(() => undefined);
    }
  })();
  return {
    async stop() {
      // Lines written just before the end still arrive: a moment to read them (longer while the stream is opening), then it is cut.
      const live = openedAt !== null && Date.now() - openedAt >= LIVE_STREAM_MS;
      await Promise.race([done, sleep(live ? LIVE_LAST_LINES_MS : LAST_LINES_MS)]);
      stopping.abort();
      await done;
    },
  };
}

/** The gist of a failed request, for a one-line note. */
function why(err: unknown): string {
  if (err instanceof RequestFailed) {
    const { failure } = err;
    if (failure.kind === "api") return `${failure.error.code}: ${failure.error.message}`;
    if (failure.kind === "network") return failure.message;
    return `HTTP ${failure.status}`;
  }
  return err instanceof Error ? err.message : String(err);
}

/** What to do about a failed build, recognised from the builder's message. */
function buildFailureHint(error: string, app: string, id: string): string {
  if (/OOMKilled|memory limit .* exceeded/.test(error)) return "the build needs more memory than the app's limit: slim the build (fewer parallel workers, no source maps) or give the app more memory";
  if (/no lockfile/.test(error)) return "run npm install (or yarn / pnpm install) in the project and commit the lockfile it writes";
  if (/no start command|needs a start command/.test(error)) return "add a start script to package.json, startCommand to svc.json or a Procfile (`svc init --force` writes svc.json)";
  if (/BUILDER_PIP_/.test(error)) return "the builder has no python package index: its operator sets BUILDER_PIP_INDEX_URL or BUILDER_PIP_FIND_LINKS (see docs/apps.md)";
  if (/links? leading outside/.test(error)) return "links in a release must stay inside the app's folder: make them relative, or remove them in the build command";
  if (/^install failed/.test(error)) return `the quote above is the package manager's own reason; \`svc logs --app ${app} --deployment ${id}\` shows all it printed`;
  if (/^the build failed: .+ \(exit code \d+/.test(error)) {
    return `the quote above is the build tool's first error: fix it, try \`npm run build\` locally, and deploy again; \`svc logs --app ${app} --deployment ${id}\` shows all it printed`;
  }
  if (/outputDir/.test(error)) return "set outputDir in svc.json to the folder the build writes";
  if (/svc\.json/.test(error)) return "fix svc.json (`svc init --force` writes a fresh one)";
  return `\`svc logs --app ${app} --deployment ${id}\` shows the whole build log`;
}

/** Ends a followed deployment: the URL when it is ready, the error (exit 1) when not. */
async function finish(out: Output, client: ApiClient, app: string, d: Deployment): Promise<void> {
  if (d.status === "ready") {
    const files = d.fileCount === null ? "" : `: ${d.fileCount} file${d.fileCount === 1 ? "" : "s"} (${kib(d.totalBytes)})${d.uploadedBlobs === undefined ? "" : `, ${d.uploadedBlobs ?? 0} uploaded`}`;
    const built = d.buildMs === null ? "" : `, built in ${(d.buildMs / 1000).toFixed(1)} s`;
    const where =
      d.url === null ? `Deployed: worker running (a worker takes no HTTP traffic; its output: svc logs --runtime --app ${app})` : `Deployed: ${d.url}`;
    out.result(d, `Deployment ${d.id} is ready${files}${built}\n${where}`);
    return;
  }
  if (out.json) out.result(d);
  if (d.status === "cancelled") {
    throw new CliError(`deployment ${d.id} was cancelled`, d.error ? [d.error] : [], `the app still serves its previous deployment; \`svc deployments list --app ${app}\` shows them`);
  }
  const excerpt = d.logExcerpt ?? [];
  if (excerpt.length > 0 && !out.json) process.stderr.write(`last log lines of the new release:\n${excerpt.map((line) => `  ${line}`).join("\n")}\n`);
  throw new CliError(`deployment ${d.id} failed`, [d.error ?? "no reason recorded"], await failureHint(client, d, app));
}

/**
 * What to do about a failed deployment: for a build, what its message calls
 * for; for a release that did not start, where its output is, and whether the
 * app still serves its previous release.
 */
async function failureHint(client: ApiClient, d: Deployment, app: string): Promise<string> {
  // No release: the build failed (or it is a static site's); with one, the release did not start.
  if (d.release === null) return buildFailureHint(d.error ?? "", app, d.id);
  const now = await client.data<App>("GET", path`/v1/apps/${app}`, undefined, { what: `look at app ${app}` }).catch(() => null);
  const serving =
    now?.activeDeploymentId && now.activeDeploymentId !== d.id && now.status !== "stopped"
      ? `the previous release (${now.activeDeploymentId}) still serves the app`
      : "nothing serves the app now";
  return `the build succeeded; the new release did not start, and ${serving}. Its output: svc logs --runtime --app ${app}${d.processId ? ` (process ${d.processId})` : ""}`;
}

export const deploy = defineCommand({
  name: "deploy",
  summary: "Build and deploy a static site or an app that runs from a source folder",
  description: `Packs the folder (default: the current one) into a .tar.gz, leaving out what .gitignore files
exclude and always node_modules, .git, .venv, __pycache__ and tools' caches; refuses a source over
100 MB compressed before uploading anything. The app is --app, else "name" in the folder's svc.json.
Its runtime (static, node, python or custom) is the app's; before uploading, the build's own checks
run on the folder (svc.json agreeing with the app's runtime, a lockfile for dependencies, a start
command for an app that runs). Then uploads, starts the build and streams its log; for an app that
runs, then the new release's start: its own output and each phase (starting, waiting for its port,
healthy, switching traffic, the old release draining). Prints "Deployed: <url>" once every request
goes to the new release, or the error in one line with the release's last log lines (exit 1; the
previous release, if any, keeps serving). With --no-follow it prints the deployment and returns at once.`,
  optionalArg: { ...APP_ARG, description: 'app name or id (default: "name" in svc.json)' },
  options: {
    source: { type: "string", value: "path", description: "the project folder to deploy (default: the current folder)" },
    "no-follow": { type: "boolean", description: "start the build and return without waiting for it" },
  },
  examples: ["svc deploy", "svc deploy --source ./site --app my-site", "svc deploy --no-follow --json | jq -r .id"],
  async run({ args, opts, out, api, env }) {
    const source = resolve(opts.source ?? ".");
    const info = await stat(source).catch(() => null);
    if (!info?.isDirectory()) {
      throw new CliError(`cannot deploy ${source}`, [info ? "it is not a folder" : "no such folder"], "pass the project folder with --source <path>");
    }
    const config = readSvcJson(source);
    const app = args.app ?? config?.name;
    if (!app) {
      const why = config ? `${join(source, "svc.json")} has no "name"` : `${source} has no svc.json`;
      throw new CliError("no app to deploy to", [why], "pass --app <app>, or run `svc init` to write svc.json");
    }

    const client = await api();
    const packed = await packSource(source, { maxBytes: MAX_UPLOAD_BYTES });
    let deployment: Deployment;
    const call = aboutDeployments(`deploy to app ${app}`, app, config?.runtime);
    try {
      // What the folder says it is (svc.json, else a static site detected) is checked before any request;
      // the app's own runtime, once the API has answered, decides.
      const offline: Runtime | null = config?.runtime ?? ((await detectProject(folderFiles(source))) ? "static" : null);
      let served: ServedAt = offline === null ? () => null : await preflight(source, config, packed.ignored, offline);
      const skipped = [
        packed.excluded.length > 0 ? `; never uploaded (the build installs dependencies; caches are not source): ${listed(packed.excluded)}` : "",
        packed.ignored.length > 0 ? `; left out by .gitignore: ${listed(packed.ignored)}` : "",
      ].join("");
      out.step(`Packed ${packed.fileCount} file${packed.fileCount === 1 ? "" : "s"} (${formatBytes(packed.totalBytes)}) into ${formatBytes(packed.sizeBytes)}${skipped}`);
      const target = await client.data<App>("GET", path`/v1/apps/${app}`, undefined, call);
      const runtime = RUNTIMES.find((known) => known === target.runtime);
      if (runtime === undefined) {
        throw new CliError(
          `could not deploy to app ${app}`,
          [`its runtime is ${target.runtime}; svc deploy builds static sites and node, python and custom apps`],
          `create an app with one of those: svc apps create --name <name> --runtime node (or ${RUNTIMES.filter((r) => r !== "node").join(", ")})`,
        );
      }
      if (runtime !== offline) served = await preflight(source, config, packed.ignored, runtime);
      warnExposed(out, packed.files, served, app);
      const created = await client.data<Created>(
        "POST",
        path`/v1/apps/${app}/deployments`,
        { sizeBytes: packed.sizeBytes },
        call,
      );
      await uploadSource(created.uploadUrl, packed.file, packed.sizeBytes);
      out.step(`Uploaded the source of deployment ${created.deployment.id}`);
      deployment = await client.data<Deployment>("POST", path`/v1/apps/${app}/deployments/${created.deployment.id}/start`, undefined, call);
    } finally {
      await packed.remove();
    }

    const waiting = deployment.status === "queued" && deployment.waiting ? ` (${deployment.waiting})` : "";
    if (opts["no-follow"]) {
      out.result(
        deployment,
        `Deployment ${deployment.id} ${deployment.status}${waiting}\nFollow it: svc logs --app ${app} --deployment ${deployment.id} --follow`,
      );
      return;
    }
    // The build starts when the account (or the builder) has a free slot; the log follows from then.
    if (waiting) out.step(`Deployment ${deployment.id} is queued${waiting}`);
    const id = deployment.id;
    const onInterrupt = () => {
      process.stderr.write(`\nStopped following; the build goes on. Follow it again: svc logs --app ${app} --deployment ${id} --follow\n`);
      process.exit(130);
    };
    process.once("SIGINT", onInterrupt);
    try {
      // With --json stdout carries only the result, so the log goes to stderr.
      const stream = out.json ? process.stderr : process.stdout;
      const plain = (text: string) => void stream.write(text);
      const write = colourWanted(stream, env) ? colouredLines(plain) : plain;
      deployment = await followBuild(client, app, id, write);
      if (hasRollout(deployment)) deployment = await followRollout(client, app, id, write);
    } finally {
      process.off("SIGINT", onInterrupt);
    }
    await finish(out, client, app, deployment);
  },
});

const DEPLOYMENT_ARGS = [APP_ARG, { name: "deployment", description: "deployment id (dep_…), from svc deployments list", flag: {} }] as const;

const list = defineCommand({
  name: "list",
  summary: "List an app's deployments, newest first",
  args: [APP_ARG],
  options: {},
  async run({ args, out, api }) {
    const items = await (await api()).data<Deployment[]>("GET", path`/v1/apps/${args.app}/deployments`, undefined, aboutDeployments(`list deployments of app ${args.app}`, args.app));
    const human =
      items.length === 0
        ? `No deployments of app ${args.app} yet. Deploy one: svc deploy --app ${args.app}`
        : table(items, [
            ["ID", (d) => d.id],
            ["STATUS", (d) => d.status],
            ["ACTIVE", (d) => (d.active ? "*" : "")],
            ["FRAMEWORK", (d) => d.framework ?? "-"],
            ["FILES", (d) => (d.fileCount === null ? "-" : String(d.fileCount))],
            ["UPLOADED", (d) => (d.uploadedBlobs === null ? "-" : String(d.uploadedBlobs))],
            ["CREATED", (d) => ago(d.createdAt)],
            ["ERROR", (d) => d.error ?? ""],
          ]);
    out.result(items, human);
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show one deployment: status, error, files, timings",
  args: DEPLOYMENT_ARGS,
  options: {},
  async run({ args, out, api }) {
    const d = await (await api()).data<Deployment>(
      "GET",
      path`/v1/apps/${args.app}/deployments/${args.deployment}`,
      undefined,
      aboutDeployments(`show deployment ${args.deployment}`, args.app),
    );
    out.result(d, describeDeployment(d));
  },
});

const rollback = defineCommand({
  name: "rollback",
  summary: "Serve an earlier ready deployment again (instant, no rebuild)",
  args: DEPLOYMENT_ARGS,
  options: {},
  examples: ["svc deployments list --app my-site", "svc deployments rollback --app my-site dep_0aB1cD2eF3gH4iJ5kL6mN7oP"],
  async run({ args, out, api }) {
    const app = await (await api()).data<App>(
      "POST",
      path`/v1/apps/${args.app}/deployments/${args.deployment}/activate`,
      undefined,
      aboutDeployments(`roll app ${args.app} back to deployment ${args.deployment}`, args.app),
    );
    out.result(app, `App ${app.name} now serves deployment ${args.deployment} at ${app.url} (visible within a few seconds)`);
  },
});

const cancel = defineCommand({
  name: "cancel",
  summary: "Cancel a deployment that is still building",
  args: DEPLOYMENT_ARGS,
  options: {},
  async run({ args, out, api }) {
    const d = await (await api()).data<Deployment>(
      "POST",
      path`/v1/apps/${args.app}/deployments/${args.deployment}/cancel`,
      undefined,
      aboutDeployments(`cancel deployment ${args.deployment}`, args.app),
    );
    out.result(d, `Deployment ${d.id} is ${d.status}`);
  },
});

/** `svc deployments …`: an app's deployment history and rollback. */
export const deployments: Group = {
  name: "deployments",
  summary: "List, inspect, roll back and cancel an app's deployments",
  commands: [list, info, rollback, cancel],
};
