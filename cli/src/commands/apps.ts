import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, fields, table, when } from "../output.js";
import { positiveInteger } from "../parse.js";
import { confirmOrRefuse } from "../prompt.js";
import { applyQuery, ROLLOUT_OPTIONS, type Rollout, reportRollout } from "../rollout.js";
import { buildLogs } from "./logs.js";

/** An application as the API returns it. */
export type App = Schemas["App"];
type Deleted = ResponseData<"/v1/apps/{app}", "delete", 200>;

/** The runtimes `svc deploy` builds and the platform runs (docs/apps.md). */
const RUNTIMES = "static, node, python, custom";

/** Error context for a call about one app, so "not found" names the list command and the app. */
function aboutApp(what: string, app: string): Call {
  return { what, hints: { APP_NOT_FOUND: `no app "${app}" in this account: \`svc apps list\` shows the names and ids` } };
}

function describe(app: App): string {
  const disks = app.disks.length
    ? app.disks.map((d) => `${d.name} (${d.id}) ${d.sizeGb} GB at ${d.mountPath}`).join("\n")
    : "none";
  const optional = (label: string, value: string | null): [string, string][] => (value === null ? [] : [[label, value]]);
  const text = fields([
    ["id", app.id],
    ["name", app.name],
    ["runtime", app.type ? `${app.runtime} (${app.type})` : app.runtime],
    ["status", app.status],
    ["url", app.url ?? "- (a worker takes no HTTP traffic)"],
    ["memory", `${app.memoryMb} MB`],
    ...optional("start command", app.startCommand),
    ...optional("health check", app.healthCheckPath && `GET ${app.healthCheckPath}`),
    ["deployment", app.activeDeploymentId ?? "none yet"],
    ...optional("not applied", app.pendingChanges.length > 0 ? `${app.pendingChanges.join(", ")} (svc apps apply ${app.name})` : null),
    ...(app.instances === undefined || app.instances.length < 2
      ? app.process === undefined
        ? []
        : ([["process", processLine(app.process)]] as [string, string][])
      : []),
    ...(app.runtime === "static" ? [] : ([["instances", instancesText(app)]] as [string, string][])),
    ...(app.autoscaling ? ([["autoscaling", autoscalingText(app)]] as [string, string][]) : []),
    ["disks", disks],
    ["created", when(app.createdAt)],
    ["updated", when(app.updatedAt)],
  ]);
  return text + reachFromCode(app.url);
}

/**
 * How to reach a local app from code: `<app>.localhost` resolves in browsers
 * and curl, not in Node's fetch or Python (they ask DNS, which has no such
 * name), so code sends its request to 127.0.0.1 with the app's Host.
 */
function reachFromCode(url: string | null): string {
  const parsed = url === null ? null : new URL(url);
  if (!parsed?.hostname.endsWith(".localhost")) return "";
  const target = `http://127.0.0.1${parsed.port ? `:${parsed.port}` : ""}/`;
  return (
    `\nFrom code: ${parsed.hostname} resolves in browsers and curl, not in Node's fetch or Python; send requests to ${target} ` +
    `with the header "Host: ${parsed.host}" (curl -H 'Host: ${parsed.host}' ${target})`
  );
}

/** The app's process as its node reports it: state, readiness, restarts, and why the last one ended. */
function processLine(process: App["process"]): string {
  if (!process) return "none running";
  const head = `${process.state}${process.ready ? ", ready" : ""}${process.restarts > 0 ? `, ${process.restarts} restart${process.restarts === 1 ? "" : "s"}` : ""}`;
  const exit = process.lastExit ? `\nlast exit ${when(process.lastExit.at)}: ${process.lastExit.message}` : "";
  const lines = process.lastLines.length > 0 ? `\n${process.lastLines.join("\n")}` : "";
  return head + exit + lines;
}

/** How many processes should serve the app, and each one that does: node, state, release, start, restarts, last exit. */
function instancesText(app: App): string {
  const wanted = `${app.instanceCount} wanted`;
  if (app.instances === undefined || app.instances.length < 2) return wanted;
  const rows = app.instances.map((i) => {
    const restarts = i.restarts > 0 ? `, ${i.restarts} restart${i.restarts === 1 ? "" : "s"}` : "";
    const exit = i.lastExit ? `, last exit ${when(i.lastExit.at)}: ${i.lastExit.message}` : "";
    return `${i.id} on ${i.nodeName}: ${i.state}${i.ready ? ", ready" : ""}, release ${i.deploymentId ?? "-"}, started ${i.startedAt ? ago(i.startedAt) : "-"}${restarts}${exit}`;
  });
  return [`${wanted}, ${app.instances.length} running`, ...rows].join("\n");
}

/** Scaling on load's bounds and its last decisions (newest first), each with its reason. */
function autoscalingText(app: App): string {
  const { minInstances, maxInstances, targetConcurrency } = app.autoscaling!;
  const head = `${minInstances}–${maxInstances} instances, ${targetConcurrency} requests in flight each`;
  const events = app.scaleEvents.slice(0, 5).map((e) => `${when(e.at)}: ${e.from} → ${e.to}: ${e.reason}`);
  return [head, ...events].join("\n");
}

const create = defineCommand({
  name: "create",
  summary: "Create an app",
  description: `Runtimes: ${RUNTIMES} (custom: any start command the platform's image can run; see
docs/apps.md). The name becomes the app's subdomain, so it is unique across the whole service:
lower-case letters, digits and hyphens.`,
  options: {
    name: { type: "string", value: "name", description: "app name (a DNS label, e.g. my-site)", required: true },
    runtime: { type: "string", value: "runtime", description: RUNTIMES, required: true },
    memory: { type: "string", value: "MB", description: "memory limit in MB (default chosen by the API)" },
  },
  examples: ["svc apps create --name my-site --runtime static", "svc apps create --name api --runtime node --memory 1024"],
  async run({ opts, out, api, fail }) {
    const memoryMb = opts.memory === undefined ? undefined : positiveInteger(opts.memory, "--memory", fail);
    const app = await (await api()).data<App>(
      "POST",
      "/v1/apps",
      { name: opts.name, runtime: opts.runtime, ...(memoryMb ? { memoryMb } : {}) },
      {
        what: `create app ${opts.name}`,
        flags: { name: "--name", runtime: "--runtime", memoryMb: "--memory" },
        hints: { NAME_TAKEN: "app names are subdomains, unique across the whole service: choose another --name" },
      },
    );
    out.result(app, `Created app ${app.name}\n${describe(app)}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List your apps",
  options: {},
  async run({ out, api }) {
    const apps = await (await api()).data<App[]>("GET", "/v1/apps", undefined, { what: "list apps" });
    const human =
      apps.length === 0
        ? "No apps yet. Create one: svc apps create --name <name> --runtime <runtime>"
        : table(apps, [
            ["NAME", (a) => a.name],
            ["ID", (a) => a.id],
            ["RUNTIME", (a) => a.runtime],
            ["STATUS", (a) => a.status],
            ["MEMORY", (a) => `${a.memoryMb} MB`],
            ["INSTANCES", (a) => (a.runtime === "static" ? "-" : String(a.instanceCount))],
            ["URL", (a) => a.url ?? "- (worker)"],
            ["CREATED", (a) => ago(a.createdAt)],
          ]);
    out.result(apps, human);
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show an app's details",
  args: [APP_ARG],
  options: {},
  async run({ args, out, api }) {
    const app = await (await api()).data<App>("GET", path`/v1/apps/${args.app}`, undefined, aboutApp(`show app ${args.app}`, args.app));
    out.result(app, describe(app));
  },
});

const stop = defineCommand({
  name: "stop",
  summary: "Stop an app (its cron jobs stop running too)",
  args: [APP_ARG],
  options: {},
  async run({ args, out, api }) {
    const app = await (await api()).data<App>("POST", path`/v1/apps/${args.app}/stop`, undefined, aboutApp(`stop app ${args.app}`, args.app));
    out.result(app, `Stopped app ${app.name} (status: ${app.status})`);
  },
});

const restart = defineCommand({
  name: "restart",
  summary: "Restart an app, starting it if stopped",
  args: [APP_ARG],
  options: {},
  async run({ args, out, api }) {
    const app = await (await api()).data<App>(
      "POST",
      path`/v1/apps/${args.app}/restart`,
      undefined,
      aboutApp(`restart app ${args.app}`, args.app),
    );
    out.result(app, `Restarted app ${app.name} (status: ${app.status})`);
  },
});

const remove = defineCommand({
  name: "delete",
  summary: "Delete an app with its env vars and cron jobs (disks are detached, not deleted)",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: [APP_ARG],
  options: { yes: YES_OPTION },
  examples: ["svc apps delete --app my-site", "svc apps delete --app my-site --yes"],
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `delete app ${args.app}`,
      question: `Delete app ${args.app} with its env vars and cron jobs (attached disks are only detached)? This cannot be undone.`,
      retry: `svc apps delete --app ${args.app}`,
    });
    const deleted = await (await api()).data<Deleted>(
      "DELETE",
      path`/v1/apps/${args.app}`,
      undefined,
      aboutApp(`delete app ${args.app}`, args.app),
    );
    out.result(deleted, `Deleted app ${args.app} (${deleted.id})`);
  },
});

type Changed = { data: App; rollout: Rollout };

const update = defineCommand({
  name: "update",
  summary: "Change an app's memory, start command or health check; the change rolls out like a deploy",
  description: `The app starts its release again with the change (without downtime for a web app without a disk;
stop-then-start with a disk), recorded in its deployments as "config: …", and this command follows it
like svc deploy. --start-command and --health-check-path win over svc.json for this and later releases
("default" goes back to svc.json's). With --no-apply the change waits for \`svc apps apply\`.`,
  args: [APP_ARG],
  options: {
    memory: { type: "string", value: "MB", description: "memory limit in MB" },
    "start-command": { type: "string", value: "command|default", description: "what runs (with /bin/sh -c in the app's folder)" },
    "health-check-path": { type: "string", value: "path|default", description: "a path answering 2xx once the app is ready" },
    ...ROLLOUT_OPTIONS,
  },
  examples: ["svc apps update api --memory 1024", 'svc apps update api --start-command "node dist/server.js" --no-apply', "svc apps update api --health-check-path default"],
  async run({ args, opts, out, api, env, fail }) {
    const setting = (value: string | undefined) => (value === undefined ? undefined : value === "default" ? null : value);
    const body = {
      ...(opts.memory === undefined ? {} : { memoryMb: positiveInteger(opts.memory, "--memory", fail) }),
      ...(opts["start-command"] === undefined ? {} : { startCommand: setting(opts["start-command"]) }),
      ...(opts["health-check-path"] === undefined ? {} : { healthCheckPath: setting(opts["health-check-path"]) }),
    };
    if (Object.keys(body).length === 0) throw fail("say what to change: --memory, --start-command or --health-check-path");
    const client = await api();
    const changed = await client.json<Changed>("PATCH", `${path`/v1/apps/${args.app}`}${applyQuery(opts)}`, body, {
      ...aboutApp(`update app ${args.app}`, args.app),
      flags: { memoryMb: "--memory", startCommand: "--start-command", healthCheckPath: "--health-check-path" },
    });
    await reportRollout(out, client, changed.data.name, changed.rollout, { follow: !opts["no-follow"], env });
    out.result(changed.data);
  },
});

const COUNT_ARG = { name: "count", description: "how many processes serve the app (1 to the plan's limit)" } as const;
/** How long `svc apps scale` waits for the instances to be ready. */
const SCALE_WAIT_MS = 5 * 60_000;

const scale = defineCommand({
  name: "scale",
  summary: "Run an app as this many processes, spread over nodes, or scale it on load",
  description: `With a count: starts processes one at a time (each health-checked before it takes traffic) or drains
the extra ones, without restarting the others, then waits until that many run and are ready (--no-follow
returns at once). With --max (and --min, --target): the app scales on load between the bounds, aiming at
--target requests in flight per instance as the edge measures them; --no-autoscaling turns it off. The edge
balances requests over the instances. An app with a disk runs one instance (one writer per disk).`,
  args: [APP_ARG],
  optionalArg: COUNT_ARG,
  options: {
    min: { type: "string", value: "n", description: "scaling on load: fewest instances (default 1)" },
    max: { type: "string", value: "n", description: "scaling on load: most instances (turns it on)" },
    target: { type: "string", value: "n", description: "scaling on load: requests in flight per instance to aim at (default 10)" },
    "no-autoscaling": { type: "boolean", description: "turn scaling on load off (the count stays)" },
    "no-follow": ROLLOUT_OPTIONS["no-follow"],
  },
  examples: ["svc apps scale web 3", "svc apps scale web --min 1 --max 3 --target 8", "svc apps scale web 1 --no-autoscaling"],
  async run({ args, opts, out, api, fail }) {
    const count = args.count === undefined ? undefined : positiveInteger(args.count, "<count>", fail);
    const bounds = opts.max !== undefined || opts.min !== undefined || opts.target !== undefined;
    if (bounds && opts.max === undefined) throw fail("scaling on load needs --max (and may take --min and --target)");
    if (bounds && opts["no-autoscaling"]) throw fail("--no-autoscaling turns scaling on load off: give it without --min, --max and --target");
    if (count === undefined && !bounds && !opts["no-autoscaling"]) throw fail("say how many instances (svc apps scale <app> 3), or the bounds of scaling on load (--max)");
    const autoscaling = bounds
      ? {
          maxInstances: positiveInteger(opts.max!, "--max", fail),
          ...(opts.min === undefined ? {} : { minInstances: positiveInteger(opts.min, "--min", fail) }),
          ...(opts.target === undefined ? {} : { targetConcurrency: positiveInteger(opts.target, "--target", fail) }),
        }
      : opts["no-autoscaling"]
        ? null
        : undefined;
    const client = await api();
    const changed = await client.json<Changed>(
      "PATCH",
      path`/v1/apps/${args.app}`,
      { ...(count === undefined ? {} : { instances: count }), ...(autoscaling === undefined ? {} : { autoscaling }) },
      {
        ...aboutApp(`scale app ${args.app}`, args.app),
        flags: { instances: "<count>", "autoscaling.minInstances": "--min", "autoscaling.maxInstances": "--max", "autoscaling.targetConcurrency": "--target" },
        hints: { APP_HAS_DISK: "detach the app's disk to run more than one instance (`svc disk detach <disk>`)" },
      },
    );
    out.step(changed.rollout.message);
    let app = changed.data;
    const wanted = app.instanceCount;
    const ready = (a: App) => (a.instances ?? []).filter((i) => i.ready && i.state === "running").length;
    if (!opts["no-follow"]) {
      const deadline = Date.now() + SCALE_WAIT_MS;
      let said = -1;
      while (!(app.instances?.length === wanted && ready(app) === wanted)) {
        if (Date.now() > deadline) throw fail(`${app.name} has ${ready(app)} of ${wanted} instances ready after ${SCALE_WAIT_MS / 60_000} minutes: \`svc apps info ${app.name}\` shows each`);
        if (ready(app) !== said) {
          said = ready(app);
          out.step(`${said}/${wanted} instances ready`);
        }
        await new Promise((resolve) => setTimeout(resolve, 500));
        app = await client.data<App>("GET", path`/v1/apps/${args.app}`, undefined, aboutApp(`show app ${args.app}`, args.app));
      }
    }
    const nodes = [...new Set((app.instances ?? []).map((i) => i.nodeName))].join(", ");
    out.result(app, `${app.name} runs ${wanted} instance${wanted === 1 ? "" : "s"}${nodes && !opts["no-follow"] ? ` on ${nodes}` : ""}`);
  },
});

const apply = defineCommand({
  name: "apply",
  summary: "Roll out an app's pending configuration changes (those made with --no-apply) together",
  args: [APP_ARG],
  options: { "no-follow": ROLLOUT_OPTIONS["no-follow"] },
  examples: ["svc env set A=1 B=2 --app api --no-apply && svc disk attach data --app api --no-apply && svc apps apply api"],
  async run({ args, opts, out, api, env }) {
    const client = await api();
    const applied = await client.json<Changed>("POST", path`/v1/apps/${args.app}/apply`, undefined, aboutApp(`apply the changes of app ${args.app}`, args.app));
    await reportRollout(out, client, applied.data.name, applied.rollout, { follow: !opts["no-follow"], env });
    out.result(applied.data);
  },
});

/** `svc apps …`: the application lifecycle. */
export const apps: Group = { name: "apps", summary: "Manage apps", commands: [create, list, info, update, scale, apply, stop, restart, remove, buildLogs] };
