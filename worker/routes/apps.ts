import { createRoute, z } from "@hono/zod-openapi";
import { ProcessExitReason, ProcessState } from "../../builder/src/protocol/processes";
import { requireScope } from "../auth/middleware";
import { eq } from "drizzle-orm";
import { type AppRow, disks, RUNTIMES, SUPPORTED_RUNTIMES } from "../db/schema";
import { configOf, type Env } from "../env";
import { appLogStream } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { authErrors, errorResponse, jsonBody, newRouter, planLimited, UNCOMPRESSED_STREAM } from "../lib/router";
import { ApplyQuery, DnsLabel, Deleted, dataOf, MetricsQuery, Ref, withRollout } from "../lib/schemas";
import { appRuntimeStub, liveInstancesOf, runsProcess } from "../services/app-runtime";
import { appChanged } from "../services/cron-targets";
import { fleet, nodeRef } from "../services/fleet";
import { movedLine } from "../../durable-objects/shipped-log";
import { deleteAppCrons } from "../services/crons";
import { removeAppDomains } from "../services/domains";
import { APP_STATES, appView, appViews, createApp, deleteApp, listApps, resolveApp, scaleApp, setAppStatus, setAutoscaling, updateAppSettings } from "../services/apps";
import { applyPending, configChanged } from "../services/rollout";
import { appMetrics, metricsStub } from "../services/metrics";

/** What a change of an app's instances or scaling on load does, in words. */
function scaleMessage(app: AppRow): string {
  const count = `${app.instances} instance${app.instances === 1 ? "" : "s"}`;
  if (!app.autoscaling) return `scaling ${app.name} to ${count}`;
  const { minInstances, maxInstances, targetConcurrency } = app.autoscaling;
  return `${app.name} scales on load between ${minInstances} and ${maxInstances} instances, at ${targetConcurrency} requests in flight each; it runs ${count} now`;
}

/** A process serving an app, as its node reports it. */
const ProcessViewSchema = z
  .object({
    state: z.enum([...ProcessState.options, "unknown"]).openapi({ description: "The supervisor's state on the node; unknown when it cannot be asked" }),
    ready: z.boolean().openapi({ description: "Passed its health check and takes traffic" }),
    restarts: z.number().int(),
    lastExit: z
      .object({
        at: z.string(),
        reason: ProcessExitReason,
        exitCode: z.number().int().nullable(),
        signal: z.string().nullable(),
        message: z.string().openapi({ example: "memory limit 256 MiB exceeded (OOMKilled)" }),
      })
      .nullable(),
    lastLines: z.array(z.string()).openapi({ description: "The runtime log's last lines when the last instance ended badly" }),
    startedAt: z.string().nullable(),
    readyAt: z.string().nullable(),
  });

export const AppSchema = z
  .object({
    id: z.string().openapi({ example: "app_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    name: z.string().openapi({ example: "my-site" }),
    runtime: z.enum(RUNTIMES),
    type: z.enum(["web", "worker"]).nullable().openapi({ description: "An app that runs: as its release says (web or worker); null for a static site or before any release" }),
    status: z.enum(APP_STATES).openapi({
      description:
        "From what runs, never a wish: not_deployed (nothing deployed yet), deploying (a deployment is under way), running, crash_loop (its process keeps exiting), failed (its only deploys failed, or its process could not run), stopped. A static site: not_deployed, running or stopped.",
    }),
    url: z.string().nullable().openapi({ example: "https://my-site.apps.example.dev", description: "Null for a worker: it takes no HTTP traffic" }),
    memoryMb: z.number().int(),
    startCommand: z.string().nullable().openapi({ description: "The app's start command, over svc.json's (null: svc.json's)" }),
    healthCheckPath: z.string().nullable().openapi({ description: "The app's health check path, over svc.json's (null: svc.json's)" }),
    activeDeploymentId: z.string().nullable(),
    pendingChanges: z.array(z.string()).openapi({ description: "Changes made with apply=false, not running yet: `POST /v1/apps/{app}/apply` rolls them out" }),
    disks: z.array(z.object({ id: z.string(), name: z.string(), mountPath: z.string(), sizeGb: z.number().int() })),
    createdAt: z.string(),
    updatedAt: z.string(),
    restartedAt: z.string().nullable(),
    process: ProcessViewSchema
      .nullable()
      .optional()
      .openapi({ description: "Apps that run, in GET /v1/apps/{app}: the first process serving the app (null while none runs); `instances` lists them all" }),
    instanceCount: z.number().int().openapi({ description: "Apps that run: how many processes serve it (`instances` in PATCH); an app with a disk runs one" }),
    autoscaling: z
      .object({ minInstances: z.number().int(), maxInstances: z.number().int(), targetConcurrency: z.number().int() })
      .nullable()
      .openapi({ description: "Scaling on load, when on; null: the count changes only when asked" }),
    scaleEvents: z
      .array(z.object({ at: z.string(), from: z.number().int(), to: z.number().int(), reason: z.string() }))
      .openapi({ description: "What scaling on load decided, newest first (the last 20), each with its reason" }),
    instances: z
      .array(
        ProcessViewSchema.extend({
          id: z.string().openapi({ example: "prc_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
          node: z.string().openapi({ description: "The node's id" }),
          nodeName: z.string(),
          deploymentId: z.string().nullable().openapi({ description: "The release it runs (null when its node cannot be asked)" }),
        }),
      )
      .optional()
      .openapi({ description: "Apps that run, in GET /v1/apps/{app}: every process serving the app, as its node reports it" }),
  })
  .openapi("App");

const CreateAppBody = z
  .strictObject({
    name: DnsLabel,
    runtime: z
      .enum(SUPPORTED_RUNTIMES, {
        error: (issue) =>
          `${issue.input === undefined ? "is required" : `${JSON.stringify(issue.input)} is not supported`}: choose static (a site built and served at the edge), node, python, or custom (any start command the builder image can run, e.g. a binary your buildCommand makes)`,
      })
      .openapi({ description: "static, node, python or custom; docs/apps.md describes each" }),
    memoryMb: z
      .number()
      .int()
      .min(128)
      .max(16_384)
      .default(1024)
      .openapi({ description: "Memory limit of the app, its cron runs and its builds (OOMKilled above)" }),
  })
  .openapi("CreateApp", { example: { name: "my-site", runtime: "static" } });

const AppParam = z.object({ app: Ref.openapi({ description: "App id or name" }) });
const security = [{ bearerAuth: [] }];
const notFound = { 404: errorResponse("No such app in this account (APP_NOT_FOUND, `app not found`)") };
const appResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: dataOf(AppSchema) } },
});

export const appRoutes = newRouter();
appRoutes.use("*", requireScope("deploy"));

appRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Create an app",
    description: "App names are subdomains, so they are unique across the whole service.",
    tags: ["Apps"],
    security,
    request: { body: jsonBody(CreateAppBody) },
    responses: { 201: appResponse("Created"), ...authErrors, ...planLimited, 409: errorResponse("Name taken (NAME_TAKEN)") },
  }),
  async (c) => {
    const row = await createApp(c.get("db"), c.get("principal").accountId, c.req.valid("json"));
    return c.json({ data: await appView(c.get("db"), c.env, row) }, 201);
  },
);

appRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List apps",
    tags: ["Apps"],
    security,
    responses: {
      200: { description: "Apps, newest first", content: { "application/json": { schema: dataOf(z.array(AppSchema)) } } },
      ...authErrors,
    },
  }),
  async (c) => {
    const rows = await listApps(c.get("db"), c.get("principal").accountId);
    return c.json({ data: await appViews(c.get("db"), c.get("config"), rows) }, 200);
  },
);

appRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}",
    summary: "Get an app",
    tags: ["Apps"],
    security,
    request: { params: AppParam },
    responses: { 200: appResponse("The app"), ...authErrors, ...notFound },
  }),
  async (c) => {
    const row = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    return c.json({ data: await appView(c.get("db"), c.env, row) }, 200);
  },
);

const UpdateAppBody = z
  .strictObject({
    memoryMb: z.number().int().min(128).max(16_384).optional().openapi({ description: "Memory limit of the app, its cron runs and its builds" }),
    startCommand: z
      .string()
      .min(1)
      .max(100_000)
      .refine((value) => !value.includes("\0"), "must not contain NUL")
      .nullable()
      .optional()
      .openapi({ description: "Runs with /bin/sh -c in the app's folder, over svc.json's startCommand; null: svc.json's again" }),
    healthCheckPath: z
      .string()
      .max(1024)
      .regex(/^\/[\x21-\x7e]*$/, "must be a path starting with / (no spaces or control characters), e.g. /healthz")
      .nullable()
      .optional()
      .openapi({ description: "Web apps: a path answering 2xx once ready, over svc.json's; null: svc.json's again" }),
    instances: z
      .number()
      .int()
      .min(1)
      .max(100)
      .optional()
      .openapi({
        description:
          "Apps that run: how many processes serve it, spread over nodes (the plan bounds it, and each reserves the app's memory). Scaling starts or drains processes without restarting the others; an app with a disk runs one (APP_HAS_DISK).",
      }),
    autoscaling: z
      .strictObject({
        minInstances: z.number().int().min(1).max(100).default(1),
        maxInstances: z.number().int().min(1).max(100),
        targetConcurrency: z.number().int().min(1).max(10_000).default(10).openapi({ description: "Requests in flight per instance to aim at, measured at the edge" }),
      })
      .nullable()
      .optional()
      .openapi({
        description:
          "Apps that run: scaling on load between minInstances and maxInstances (the plan's instances at most), aiming at targetConcurrency requests in flight per instance; null turns it off (the count stays). While on, `instances` must be within the bounds.",
      }),
  })
  .refine((body) => Object.keys(body).length > 0, "give at least one of memoryMb, startCommand, healthCheckPath, instances, autoscaling")
  .openapi("UpdateApp", { example: { memoryMb: 512, healthCheckPath: "/healthz" } });

appRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{app}",
    summary: "Change an app's memory, start settings or instances",
    description:
      "The change reaches the app as a configuration change does: an app that runs starts its release again with it (recorded as a deployment `config: memory 512 MB`), unless `apply=false`. Start settings win over svc.json for this and later releases. `instances` alone starts or drains processes at once (no new deployment, whatever `apply` says).",
    tags: ["Apps"],
    security,
    request: { params: AppParam, query: ApplyQuery, body: jsonBody(UpdateAppBody) },
    responses: {
      200: withRollout(AppSchema, "The app after the change, and its rollout"),
      ...authErrors,
      ...planLimited,
      ...notFound,
      409: errorResponse("A static site has no start command, health check or instances (APP_IS_STATIC); an app with a disk runs one instance (APP_HAS_DISK)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    let current = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    const { instances, autoscaling, ...settings } = c.req.valid("json");
    const bounds = autoscaling === undefined ? current.autoscaling : autoscaling;
    if (instances !== undefined && bounds && (instances < bounds.minInstances || instances > bounds.maxInstances)) {
      throw new ApiError("VALIDATION_ERROR", `${current.name} scales on load between ${bounds.minInstances} and ${bounds.maxInstances} instances: ask for a count within them, or turn it off ("autoscaling": null)`);
    }
    const scaled = (instances !== undefined && instances !== current.instances) || autoscaling !== undefined;
    if (autoscaling !== undefined) current = await setAutoscaling(db, current, autoscaling);
    if (instances !== undefined && (instances !== current.instances || !runsProcess(current.runtime))) current = await scaleApp(db, current, instances);
    if (scaled && current.status !== "stopped") await appRuntimeStub(c.env, current.id).scale(current.id);
    const { app, cause } = await updateAppSettings(db, current, settings);
    const rollout =
      cause !== null
        ? await configChanged(c.env, db, app, cause, c.req.valid("query").apply !== "false")
        : scaled
          ? { applied: true, deploymentId: null, message: scaleMessage(app) }
          : { applied: true, deploymentId: null, message: `nothing changed: ${app.name} already has these settings` };
    return c.json({ data: await appView(db, c.env, await resolveApp(db, app.accountId, app.id)), rollout }, 200);
  },
);

appRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/apply",
    summary: "Roll out the app's pending configuration changes",
    description: "Changes made with `apply=false` (env vars, disk, memory, start settings) roll out together, as one deployment.",
    tags: ["Apps"],
    security,
    request: { params: AppParam },
    responses: { 200: withRollout(AppSchema, "The app, and the rollout of what was pending"), ...authErrors, ...notFound },
  }),
  async (c) => {
    const db = c.get("db");
    const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    const rollout = await applyPending(c.env, db, app);
    return c.json({ data: await appView(db, c.env, await resolveApp(db, app.accountId, app.id)), rollout }, 200);
  },
);

for (const [verb, status, summary] of [
  ["stop", "stopped", "Stop an app: its site answers 503 and its cron jobs do not run"],
  ["restart", "running", "Restart an app (also starts a stopped one)"],
] as const) {
  appRoutes.openapi(
    createRoute({
      method: "post",
      path: `/{app}/${verb}`,
      summary,
      tags: ["Apps"],
      security,
      request: { params: AppParam },
      responses: { 200: appResponse("The app after the change"), ...authErrors, ...notFound },
    }),
    async (c) => {
      const db = c.get("db");
      const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
      await setAppStatus(db, app, status);
      // Its process really stops or starts (a restart starts a new one beside the old).
      if (runsProcess(app.runtime)) {
        const runtime = appRuntimeStub(c.env, app.id);
        await (status === "stopped" ? runtime.stop(app.id) : runtime.start(app.id));
      }
      // Its cron jobs hold the app's state: a stopped app's jobs skip their runs.
      await appChanged(c.env, db, app.id);
      return c.json({ data: await appView(db, c.env, await resolveApp(db, app.accountId, app.id)) }, 200);
    },
  );
}

appRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/runtime-logs",
    summary: "The app's runtime log: its processes' stdout and stderr, and what the platform did to them",
    description:
      "Apps that run: the output of the app's processes across restarts and deploys (the newest 10 MiB are kept), with `svc` lines for each start, readiness, exit, OOMKilled and restart. Each line is `<time> <out|err|svc> <deployment>/<process> <text>`: which release and which process wrote it. Where it starts: `lines` (the last N lines), `since` (an ISO time, or a duration back from now: `10m`, `2h`, `1d`), else `tail` bytes from the end (default 64 KiB); `process` keeps one process's lines; `follow=true` then streams new lines until the client goes away. After the app moved to another node (a failover, a drain), the lines the old node shipped come first, then a line `svc -/fleet the app moved from node A to node B`; while the app's node does not answer, what it shipped and a line saying so.",
    tags: ["Apps"],
    security,
    request: {
      params: AppParam,
      query: z.object({
        follow: z.enum(["true", "false"]).optional(),
        tail: z.coerce.number().int().min(0).max(10_485_760).default(65_536),
        lines: z.coerce.number().int().min(0).max(1_000_000).optional(),
        since: z
          .string()
          .transform((value, ctx) => {
            const at = sinceTime(value);
            if (at === null) ctx.addIssue({ code: "custom", message: "must be an ISO 8601 time or a duration such as 30s, 10m, 2h, 1d" });
            return at ?? 0;
          })
          .optional(),
        process: z.string().regex(/^prc_[A-Za-z0-9]{24}$/, "must be a process id (prc_…)").optional(),
      }),
    },
    responses: {
      200: { description: "text/plain log lines: `<time> <out|err|svc> <text>`" },
      ...authErrors,
      ...notFound,
      409: errorResponse("A static site has no runtime log (APP_IS_STATIC): its request log is `GET /v1/apps/{app}/logs`"),
      502: errorResponse("The app's node could not be reached (BUILDER_UNAVAILABLE)"),
      503: errorResponse("The app's node is not answering and shipped nothing of the log yet (NODE_UNREACHABLE); Retry-After says when to ask again"),
    },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    if (!runsProcess(app.runtime)) {
      throw new ApiError("APP_IS_STATIC", `${app.name} is a static site: it has no process; its request log is \`svc logs --app ${app.name}\``);
    }
    const { follow, tail, lines, since, process } = c.req.valid("query");
    const runtime = appRuntimeStub(c.env, app.id);
    const window = since !== undefined ? { since } : lines !== undefined ? { lines } : { tail };
    const names = Object.fromEntries((await fleet(c.env)).nodes.map((n) => [n.id, n.name]));
    const instances = liveInstancesOf(app);
    if (instances.length > 1 && !process) {
      const nodeIds = [...new Set(instances.map((i) => i.node))];
      return instancesLog(c.env, app.id, nodeIds, window, follow === "true", names, (promise) => c.executionCtx.waitUntil(promise));
    }
    // The log lives on the node that runs (or last ran, or is starting) the process; else on the node holding the app's disk.
    const nodeId =
      (await runtime.logNode(process)) ?? (await c.get("db").select({ nodeId: disks.nodeId }).from(disks).where(eq(disks.appId, app.id)).get())?.nodeId ?? null;
    const node = nodeId ? await nodeRef(c.env, nodeId).catch(() => null) : null;
    const scope = { ...window, ...(process ? { process } : {}) };
    // What other nodes wrote (a failover or a drain moved the app) comes from what they shipped, then the
    // lines of the node the log lives on now. A node not answering: what it shipped, and a line saying so.
    const live = node ? await appLogStream(c.get("config"), node, app.id, scope, follow === "true").catch(unlessUnreachable) : null;
    // The node's own log has its lines; what it shipped is left out of the history.
    const history = await runtime.logHistory(live instanceof Response && live.ok ? [node!.id] : [], scope, names);
    if (live instanceof ApiError) {
      if (history.text === "") throw live;
      const silent = `${new Date().toISOString()} svc -/fleet node ${names[node!.id] ?? node!.id} is not answering (${live.message}); lines it wrote after those above are on it\n`;
      return c.body(history.text + silent, 200, PLAIN_TEXT);
    }
    if (live && !live.ok && live.status !== 404) throw new ApiError("BUILDER_UNAVAILABLE", `the app's node could not return the log (HTTP ${live.status})`);
    // No node has the log (nothing ever ran, or its node left the fleet), or it has none yet: what was shipped, if anything.
    if (!live?.ok || !live.body) return c.body(history.text, 200, PLAIN_TEXT);
    if (!history.last) return c.body(live.body, 200, { ...PLAIN_TEXT, ...UNCOMPRESSED_STREAM });
    // Before the live node's lines; stamped with the last shipped line's time: the move came after it.
    const head = `${history.text}${movedLine(history.last.time, names[history.last.node] ?? history.last.node, names[node!.id] ?? node!.id)}\n`;
    const joined = new TransformStream<Uint8Array, Uint8Array>();
    const writer = joined.writable.getWriter();
    c.executionCtx.waitUntil(
      (async () => {
        await writer.write(new TextEncoder().encode(head));
        writer.releaseLock();
        await live.body!.pipeTo(joined.writable);
      })().catch(() => undefined),
    );
    return c.body(joined.readable, 200, { ...PLAIN_TEXT, ...UNCOMPRESSED_STREAM });
  },
);

const PLAIN_TEXT = { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store" };

/**
 * The runtime log of an app running several instances: the lines of each
 * instance's node and what nodes that no longer run it shipped, merged by
 * time (each line names its release and process), cut to the window; a node
 * not answering gives what it shipped and a line saying so. Following, the
 * nodes' new lines come as each node writes them, line by line.
 */
async function instancesLog(
  env: Env,
  appId: string,
  nodeIds: string[],
  window: { since: number } | { lines: number } | { tail: number },
  follow: boolean,
  names: Record<string, string>,
  waitUntil: (promise: Promise<unknown>) => void,
): Promise<Response> {
  const config = configOf(env);
  const answers = await Promise.all(
    nodeIds.map(async (id) => {
      const node = await nodeRef(env, id).catch(() => null);
      return { id, live: node ? await appLogStream(config, node, appId, window, follow).catch(unlessUnreachable) : null };
    }),
  );
  const reached = answers.flatMap(({ id, live }) => (live instanceof Response && live.ok && live.body ? [{ id, body: live.body }] : []));
  for (const { live } of answers) if (live instanceof Response && !(live.ok && live.body)) await live.body?.cancel();
  const history = await appRuntimeStub(env, appId).logHistory(
    reached.map((r) => r.id),
    window,
    names,
  );
  const now = new Date().toISOString();
  const silent = answers
    .filter(({ live }) => live instanceof ApiError)
    .map(({ id, live }) => `${now} svc -/fleet node ${names[id] ?? id} is not answering (${(live as ApiError).message}); lines it wrote after those above are on it\n`)
    .join("");
  if (!follow) {
    const texts = await Promise.all(reached.map((r) => new Response(r.body).text()));
    const merged = [history.text, ...texts]
      .flatMap((text) => text.split("\n").filter((line) => line !== ""))
      .map((line, order) => ({ line, order }))
      .sort((a, b) => (a.line.slice(0, 24) < b.line.slice(0, 24) ? -1 : a.line.slice(0, 24) > b.line.slice(0, 24) ? 1 : a.order - b.order))
      .map((entry) => entry.line);
    let kept = merged;
    if ("lines" in window) kept = merged.slice(Math.max(0, merged.length - window.lines));
    if ("tail" in window) {
      let bytes = 0;
      let first = merged.length;
      while (first > 0 && bytes + merged[first - 1]!.length + 1 <= window.tail) bytes += merged[--first]!.length + 1;
      kept = merged.slice(first);
    }
    return new Response(kept.map((line) => `${line}\n`).join("") + silent, { headers: PLAIN_TEXT });
  }
  // Following: what was shipped first, then each node's lines as they come (whole lines, never a half of one).
  const joined = new TransformStream<Uint8Array, Uint8Array>();
  const writer = joined.writable.getWriter();
  const encoder = new TextEncoder();
  const readers = reached.map((r) => r.body.pipeThrough(new TextDecoderStream()).getReader());
  waitUntil(
    (async () => {
      await writer.write(encoder.encode(history.text + silent));
      await Promise.all(
        readers.map(async (reader) => {
          let rest = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            rest += value;
            const cut = rest.lastIndexOf("\n");
            if (cut === -1) continue;
            await writer.write(encoder.encode(rest.slice(0, cut + 1)));
            rest = rest.slice(cut + 1);
          }
        }),
      );
      await writer.close();
    })().catch(async () => {
      // The client went away (or a node's stream broke): every node's stream ends with it.
      await Promise.all(readers.map((reader) => reader.cancel().catch(() => undefined)));
      await writer.abort().catch(() => undefined);
    }),
  );
  return new Response(joined.readable, { headers: { ...PLAIN_TEXT, ...UNCOMPRESSED_STREAM } });
}

/** A node that did not answer in time, as a value (what it shipped is read instead); any other failure thrown on. */
function unlessUnreachable(error: unknown): ApiError {
  if (error instanceof ApiError && error.code === "NODE_UNREACHABLE") return error;
  throw error;
}

const MetricPointSchema = z.object({
  at: z.string().openapi({ description: "Start of the step" }),
  requests: z.number().int(),
  s2xx: z.number().int().openapi({ description: "Answers 1xx and 2xx" }),
  s3xx: z.number().int(),
  s4xx: z.number().int(),
  s5xx: z.number().int(),
  bytes: z.number().int().openapi({ description: "Bytes of the answers' bodies" }),
  p50Ms: z.number().nullable().openapi({ description: "Latency at the edge, ms (null: no request in the step)" }),
  p95Ms: z.number().nullable(),
  p99Ms: z.number().nullable(),
});

const ProcessMetricsSchema = z.object({
  id: z.string().openapi({ description: "The process (instance)" }),
  memoryLimitBytes: z.number().int(),
  points: z.array(
    z.object({
      at: z.string(),
      cpuSeconds: z.number().nullable().openapi({ description: "CPU time it used in the step (divide by stepSeconds for cores); null: it did not run then" }),
      memoryBytes: z.number().int().nullable().openapi({ description: "The most memory it held in the step (its cgroup's charge)" }),
      restarts: z.number().int().openapi({ description: "Times it was restarted in the step" }),
    }),
  ),
});

appRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/metrics",
    summary: "An app's request metrics",
    description:
      "Requests by status class, bytes out and latency percentiles, measured at the edge (custom domains included) for static sites and apps alike, and each process's CPU, memory against its limit and restarts, read by its node; kept per minute for 7 days and per hour for 30 (docs/metrics.md). `since`: 1h (1-minute steps), 24h (15 minutes), 7d (2 hours), 30d (6 hours). Requests are about a second behind, processes up to 10 s.",
    tags: ["Apps"],
    security,
    request: { params: AppParam, query: MetricsQuery },
    responses: {
      200: {
        description: "Every step of the range, oldest first (empty ones as zero), the range's totals, and each process's usage in the same steps",
        content: {
          "application/json": {
            schema: dataOf(
              z.object({
                since: z.string(),
                stepSeconds: z.number().int(),
                points: z.array(MetricPointSchema),
                totals: MetricPointSchema.omit({ at: true }),
                processes: z.array(ProcessMetricsSchema).openapi({
                  description:
                    "The app's processes (instances) that ran in the range, as their nodes read them from the processes' cgroups every 10 s: the 20 that ran most recently (every deploy starts new ones)",
                }),
              }),
            ),
          },
        },
      },
      ...authErrors,
      ...notFound,
    },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    const since = c.req.valid("query").since;
    return c.json({ data: { since, ...(await appMetrics(c.env, app.id, since)) } }, 200);
  },
);

appRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{app}",
    summary: "Delete an app",
    description: "Removes the app and its env vars. Attached disks are detached, not deleted.",
    tags: ["Apps"],
    security,
    request: { params: AppParam },
    responses: {
      200: { description: "Deleted", content: { "application/json": { schema: dataOf(Deleted) } } },
      ...authErrors,
      ...notFound,
    },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    if (runsProcess(app.runtime)) {
      const runtime = appRuntimeStub(c.env, app.id);
      await runtime.stop(app.id);
      await runtime.dropLog();
    }
    await metricsStub(c.env, app.id).drop();
    await deleteAppCrons(c.get("db"), c.env, app.id);
    await removeAppDomains(c.get("db"), c.get("config"), app);
    await deleteApp(c.get("db"), app);
    return c.json({ data: { id: app.id, deleted: true as const } }, 200);
  },
);

/** `since` of a log read: an ISO time, or a duration back from now (`30s`, `10m`, `2h`, `1d`), as epoch ms; null when neither. */
function sinceTime(value: string, now = Date.now()): number | null {
  const relative = /^(\d{1,9})\s*([smhd])$/.exec(value.trim());
  if (relative) return now - Number(relative[1]) * { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[relative[2] as "s" | "m" | "h" | "d"];
  const at = /^\d{4}-\d{2}-\d{2}T/.test(value) ? Date.parse(value) : Number.NaN;
  return Number.isNaN(at) ? null : at;
}
