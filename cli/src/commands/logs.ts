import { setTimeout as sleep } from "node:timers/promises";
import type { Schemas } from "../../../openapi/types.js";
import { path } from "../api.js";
import { colouredLines, colourWanted } from "../colour.js";
import { APP_ARG, type BaseContext, defineCommand } from "../command.js";
import { CliError, type Output } from "../output.js";
import { isoTime, positiveInteger } from "../parse.js";
import type { App } from "./apps.js";
import { aboutDeployments, type Deployment, followBuild } from "./deploy.js";

/** One request the app's web server answered. */
type RequestLog = Schemas["RequestLog"];

/** How often `svc logs --follow` asks for new requests. */
const FOLLOW_INTERVAL_MS = 1000;
/** Lines of the runtime log shown (before following) unless --tail or --since says otherwise. */
const DEFAULT_TAIL_LINES = 100;

/** A whole number ≥ 0, e.g. `--tail 0` (nothing before following). */
function nonNegative(value: string, flag: string, fail: (message: string) => Error): number {
  if (!/^\d{1,7}$/.test(value.trim())) throw fail(`${flag} must be a whole number of lines, got "${value}"`);
  return Number(value);
}

/** `time method path status bytes duration`, one request per line. */
export function formatRequest(r: RequestLog): string {
  return `${r.time} ${r.method} ${r.path} ${r.status} ${r.bytes} ${r.durationMs}ms`;
}

/** Prints a deployment's build log (the newest by default); with `follow`, streams it until the build ends. */
async function showBuildLog({ app, deployment, follow, out, api, env }: { app: string; deployment: string | undefined; follow: boolean } & Pick<BaseContext, "api" | "env"> & { out: Output }) {
  const client = await api();
  const call = aboutDeployments(`show the build log of app ${app}`, app);
  let id = deployment;
  if (id === undefined) {
    const list = await client.data<Deployment[]>("GET", path`/v1/apps/${app}/deployments`, undefined, call);
    if (list.length === 0) throw new CliError(`app ${app} has no deployments yet`, [], `deploy it: svc deploy --app ${app}`);
    id = list[0]!.id;
  }
  if (follow && !out.json) {
    const plain = (text: string) => void process.stdout.write(text);
    const finished = await followBuild(client, app, id, colourWanted(process.stdout, env) ? colouredLines(plain) : plain);
    if (finished.status === "deploying") {
      out.note(`Deployment ${finished.id} is built; its release is starting: svc logs --runtime --follow --app ${app}`);
      return;
    }
    // Like svc deploy: a build that did not make it is exit 1, so scripts can wait on this command.
    if (finished.status !== "ready") throw new CliError(`deployment ${finished.id} ${finished.status}`, finished.error ? [finished.error] : []);
    out.note(`Deployment ${finished.id} is ready`);
    return;
  }
  const res = await client.stream(path`/v1/apps/${app}/deployments/${id}/logs`, call);
  const log = await res.text();
  if (out.json) out.result({ deploymentId: id, log });
  else if (log === "") out.note(`The build log of deployment ${id} is empty (the build has not started yet?)`);
  else process.stdout.write(log.endsWith("\n") ? log : `${log}\n`);
}

/** `svc apps logs <app>`: the spec's name for the build log, the same as `svc logs --build`. */
export const buildLogs = defineCommand({
  name: "logs",
  summary: "Show the build log of an app's deployment (the same as svc logs --build)",
  description: "Log lines read `<time> <out|err|svc> <text>`. --follow streams a build in progress until it ends\n(exit 1 if the deployment failed or was cancelled).",
  args: [APP_ARG],
  options: {
    deployment: { type: "string", value: "id", description: "the deployment whose build log to show (dep_…; default: the newest)" },
    follow: { type: "boolean", short: "f", description: "keep streaming while the build runs" },
  },
  examples: ["svc apps logs --app my-site", "svc apps logs --app my-site --deployment dep_0aB1cD2eF3gH4iJ5kL6mN7oP --follow"],
  async run({ args, opts, out, api, env }) {
    await showBuildLog({ app: args.app, deployment: opts.deployment, follow: opts.follow, out, api, env });
  },
});

/** `svc logs <app>`: every log of an app in one place: requests (the default), a build's, the processes' output. */
export const logs = defineCommand({
  name: "logs",
  summary: "Show an app's logs: requests (default), a build (--build, --deployment) or its processes' output (--runtime)",
  description:
    "Three logs, one command:\n" +
    "  requests (default)   `<time> <method> <path> <status> <bytes> <duration>`, oldest first; --follow asks every second for new ones.\n" +
    "  --build              the newest deployment's build log, or the one --deployment names, as `<time> <out|err|svc> <text>`;\n" +
    "                       --follow streams a build in progress and exits 1 if it fails.\n" +
    "  --runtime            what an app that runs (node, python, custom) printed, across restarts and deploys, as\n" +
    "                       `<time> <out|err|svc> <deployment>/<process> <text>` (which release and which process wrote it);\n" +
    "                       `svc` lines say what the platform did (started, ready, exited, OOMKilled, restarting). The last\n" +
    "                       --tail lines (default 100), or those since --since; --follow then streams until Ctrl-C.\n" +
    "                       After the app moved to another node (a failover, a drain), the old node's lines come first.\n" +
    "A worker takes no HTTP traffic: its log is the runtime log, the default for a worker.",
  args: [APP_ARG],
  options: {
    build: { type: "boolean", description: "the build log of the newest deployment (or of --deployment)" },
    deployment: { type: "string", value: "id", description: "the deployment whose build log to show (dep_…; implies --build)" },
    runtime: { type: "boolean", description: "the app's runtime log (stdout and stderr of its processes)" },
    follow: { type: "boolean", short: "f", description: "keep printing new lines (a build's until it ends, the others until Ctrl-C)" },
    limit: { type: "string", value: "N", description: "how many recent requests to show first (default 100, at most 1000)" },
    tail: { type: "string", value: "N", description: "--runtime: the last N lines (default 100)" },
    since: { type: "string", value: "duration|time", description: "--runtime: the lines since then, e.g. 10m, 2h, 1d or 2026-11-28T09:00:00Z" },
  },
  examples: [
    "svc logs --app my-site",
    "svc logs --app my-site --follow",
    "svc logs --app my-site --build --follow",
    "svc logs --app my-site --deployment dep_0aB1cD2eF3gH4iJ5kL6mN7oP",
    "svc logs --app my-api --runtime --follow",
    "svc logs --app my-api --runtime --tail 20",
    "svc logs --app my-api --runtime --since 10m",
    "svc logs --app my-site --json --limit 1000 | jq '.[] | select(.status >= 400)'",
  ],
  async run({ args, opts, out, api, env, fail }) {
    const build = opts.build || opts.deployment !== undefined;
    if (build && opts.runtime) throw fail("--runtime and --build (or --deployment) are different logs: choose one");
    if (opts.limit !== undefined && (build || opts.runtime)) {
      throw fail(`--limit counts requests: the ${build ? "build log is shown whole" : "runtime log (--runtime) takes --tail N or --since"}`);
    }
    if (build) {
      await showBuildLog({ app: args.app, deployment: opts.deployment, follow: opts.follow, out, api, env });
      return;
    }
    if ((opts.tail !== undefined || opts.since !== undefined) && !opts.runtime && (build || opts.limit !== undefined)) {
      throw fail("--tail and --since are for the runtime log (--runtime); the request log takes --limit");
    }
    if (opts.tail !== undefined && opts.since !== undefined) throw fail("--tail and --since both say where to start: give one");
    const client = await api();
    // A worker takes no HTTP traffic: what it has to show is its runtime log.
    const runtime =
      opts.runtime ||
      ((opts.tail !== undefined || opts.since !== undefined || opts.limit === undefined) &&
        (await client.data<App>("GET", path`/v1/apps/${args.app}`, undefined, aboutDeployments(`look at app ${args.app}`, args.app))).type === "worker");
    if (runtime) {
      const call = aboutDeployments(`show the runtime log of app ${args.app}`, args.app);
      const query = new URLSearchParams();
      if (opts.since !== undefined) query.set("since", /^\d+\s*[smhd]$/.test(opts.since.trim()) ? opts.since.trim() : isoTime(opts.since, "--since", fail));
      else query.set("lines", String(opts.tail === undefined ? DEFAULT_TAIL_LINES : nonNegative(opts.tail, "--tail", fail)));
      if (opts.follow) query.set("follow", "true");
      const res = await client.stream(`${path`/v1/apps/${args.app}/runtime-logs`}?${query}`, call);
      if (!res.body) return;
      for await (const chunk of res.body) process.stdout.write(chunk);
      return;
    }
    const limit = opts.limit === undefined ? 100 : positiveInteger(opts.limit, "--limit", fail);
    if (limit > 1000) throw fail(`--limit must be at most 1000, got ${limit}`);
    const call = aboutDeployments(`show the request log of app ${args.app}`, args.app);
    const route = path`/v1/apps/${args.app}/logs`;
    const recent = await client.data<RequestLog[]>("GET", `${route}?limit=${limit}`, undefined, call);
    if (!opts.follow) {
      out.result(recent, recent.length === 0 ? `No requests to app ${args.app} logged yet` : recent.map(formatRequest).join("\n"));
      return;
    }
    // Following: one line per request, JSON Lines with --json, so the output can be piped as it grows.
    const print = (r: RequestLog) => out.text(out.json ? JSON.stringify(r) : formatRequest(r));
    for (const r of recent) print(r);
    let after = recent.at(-1)?.id ?? 0;
    for (;;) {
      await sleep(FOLLOW_INTERVAL_MS);
      const fresh = await client.data<RequestLog[]>("GET", `${route}?after=${after}&limit=1000`, undefined, call);
      for (const r of fresh) print(r);
      after = fresh.at(-1)?.id ?? after;
    }
  },
});
