import { createRoute, z } from "@hono/zod-openapi";
import { and, desc, eq, gt } from "drizzle-orm";
import { requireScope } from "../auth/middleware";
import { DEPLOYMENT_STATUSES, requestLogs } from "../db/schema";
import { jobLogStream } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { authErrors, errorResponse, jsonBody, newRouter, UNCOMPRESSED_STREAM } from "../lib/router";
import { dataOf, Ref } from "../lib/schemas";
import { iso } from "../lib/time";
import { appView, resolveApp } from "../services/apps";
import { appChanged } from "../services/cron-targets";
import { nodeRef } from "../services/fleet";
import {
  ARTIFACTS,
  activateDeployment,
  artifactKey,
  buildLogKey,
  createDeployment,
  deploymentStub,
  deploymentView,
  deploymentViews,
  listDeployments,
  resolveAppDeployment,
  resolveDeployment,
  startDeployment,
} from "../services/deployments";
import { AppSchema } from "./apps";

const DeploymentSchema = z
  .object({
    id: z.string().openapi({ example: "dep_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    appId: z.string(),
    status: z.enum(DEPLOYMENT_STATUSES).openapi({
      description:
        "`queued` until the builder starts the build (also while the account runs as many jobs as its plan allows, or the builder is full), then `building`, `deploying` and `ready`, or `failed`/`cancelled`",
    }),
    waiting: z.string().nullable().openapi({
      description:
        "Why a queued deployment has not started building, e.g. `waiting for a slot: 2 of 2 concurrent jobs of the account's plan running`; null otherwise",
    }),
    active: z.boolean().openapi({ description: "Whether the app serves this deployment now" }),
    cause: z.string().nullable().openapi({
      description: "Why it exists when not a build of new source: `config: GREETING set` (a configuration change rolled out), `rollback`; null for a build",
      example: "config: GREETING set",
    }),
    error: z.string().nullable().openapi({
      description: "Why it failed, in one line (`process exited with code 3 during start`, `listens on 127.0.0.1:8080 only; …`); the log lines that go with it are `logExcerpt`",
    }),
    logExcerpt: z.array(z.string()).nullable().openapi({ description: "With a failed start: the process's last log lines" }),
    progress: z
      .array(z.object({ at: z.string(), text: z.string() }))
      .openapi({ description: "Apps that run: what happened after the build (starting, ready, switching traffic, the old release draining, serving), oldest first" }),
    processId: z.string().nullable().openapi({ description: "Apps that run: the process started for it; its lines of the runtime log are `?process=<id>`" }),
    framework: z.string().nullable().optional().openapi({ description: "Static sites only" }),
    outputDir: z.string().nullable().optional().openapi({ description: "Static sites only" }),
    spa: z.boolean().nullable().optional().openapi({ description: "Static sites only" }),
    fileCount: z.number().int().nullable().openapi({ description: "Files served (a static site) or in the release (an app that runs)" }),
    totalBytes: z.number().int().nullable(),
    uploadedBlobs: z.number().int().nullable().optional().openapi({ description: "Static sites only: files whose content storage did not have yet" }),
    peakMemoryBytes: z.number().int().nullable(),
    release: z
      .object({
        type: z.enum(["web", "worker"]),
        startCommand: z.string(),
        port: z.number().int().nullable(),
        healthCheckPath: z.string().nullable(),
        sizeBytes: z.number().int(),
      })
      .nullable()
      .openapi({ description: "Apps that run: the release the build made and how it runs; null for static sites and before the build ends" }),
    url: z.string().nullable().openapi({ description: "Where the app answers; null for a worker" }),
    createdAt: z.string(),
    startedAt: z.string().nullable().openapi({ description: "When the builder started the build (null while queued)" }),
    builtAt: z.string().nullable(),
    finishedAt: z.string().nullable(),
    buildMs: z.number().int().nullable(),
  })
  .openapi("Deployment");

const AppParam = z.object({ app: Ref.openapi({ description: "App id or name" }) });
const DeploymentParam = AppParam.extend({ id: z.string().regex(/^dep_[0-9A-Za-z]{24}$/, "must be a deployment id (dep_…)") });
const security = [{ bearerAuth: [] }];
const json = <T extends z.ZodType>(description: string, schema: T) => ({
  description,
  content: { "application/json": { schema } },
});
const notFound = { 404: errorResponse("app not found, or no such deployment (DEPLOYMENT_NOT_FOUND)") };

export const deploymentRoutes = newRouter();
deploymentRoutes.use("*", requireScope("deploy"));

deploymentRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/deployments",
    summary: "Create a deployment and get a presigned URL to upload its source (.tar.gz, ≤ 100 MB)",
    description: "PUT the archive to `uploadUrl` with exactly `sizeBytes` bytes, then POST …/start.",
    tags: ["Deployments"],
    security,
    request: {
      params: AppParam,
      body: jsonBody(z.strictObject({ sizeBytes: z.number().int().min(1) }).openapi("CreateDeployment", { example: { sizeBytes: 48213 } })),
    },
    responses: {
      201: json("Created", dataOf(z.object({ deployment: DeploymentSchema, uploadUrl: z.string(), expiresAt: z.string() }))),
      ...authErrors,
      ...notFound,
      413: errorResponse("Source archive over the limit (PAYLOAD_TOO_LARGE)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    const created = await createDeployment(db, c.get("config"), app, c.req.valid("json").sizeBytes);
    return c.json(
      {
        data: {
          deployment: deploymentView(c.get("config"), app, created.row),
          uploadUrl: created.uploadUrl,
          expiresAt: iso(created.expiresAt),
        },
      },
      201,
    );
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/deployments/{id}/start",
    summary: "Start building an uploaded deployment",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam },
    responses: {
      202: json("Building, or queued for a build slot", dataOf(DeploymentSchema)),
      ...authErrors,
      ...notFound,
      409: errorResponse("The source was not uploaded, or differs in size (UPLOAD_INCOMPLETE)"),
      410: errorResponse("The upload URL expired unused (PRESIGNED_URL_EXPIRED)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id } = c.req.valid("param");
    const found = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    const row = await startDeployment(db, c.env, found.row);
    const [view] = await deploymentViews(c.env, c.get("config"), found.app, [row]);
    return c.json({ data: view! }, 202);
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/deployments",
    summary: "List an app's deployments (the last 10 are kept)",
    tags: ["Deployments"],
    security,
    request: { params: AppParam },
    responses: { 200: json("Newest first", dataOf(z.array(DeploymentSchema))), ...authErrors, ...notFound },
  }),
  async (c) => {
    const db = c.get("db");
    const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    return c.json({ data: await deploymentViews(c.env, c.get("config"), app, await listDeployments(db, app.id)) }, 200);
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/deployments/{id}",
    summary: "Get a deployment: status, error, timings",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam },
    responses: { 200: json("The deployment", dataOf(DeploymentSchema)), ...authErrors, ...notFound },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id } = c.req.valid("param");
    const { app, row } = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    const [view] = await deploymentViews(c.env, c.get("config"), app, [row]);
    return c.json({ data: view! }, 200);
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/deployments/{id}/logs",
    summary: "A deployment's build log; with follow=true it streams until the build ends",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam, query: z.object({ follow: z.enum(["true", "false"]).optional() }) },
    responses: {
      200: { description: "text/plain log lines: `<time> <out|err|svc> <text>`" },
      ...authErrors,
      ...notFound,
    },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id } = c.req.valid("param");
    const { row } = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    const headers = { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store" };
    const stored = await c.env.BUCKET.get(buildLogKey(row.id));
    if (stored) return c.body(stored.body, 200, headers);
    if (!row.builderJobId) return c.body("", 200, headers);
    const nodeId = await deploymentStub(c.env, row.id).nodeId();
    const node = nodeId ? await nodeRef(c.env, nodeId).catch(() => null) : null;
    if (!node) return c.body("", 200, headers);
    const live = await jobLogStream(c.get("config"), node, row.builderJobId, c.req.valid("query").follow === "true");
    if (!live.ok) throw new ApiError("BUILDER_UNAVAILABLE", `the builder could not return the log (HTTP ${live.status})`);
    return c.body(live.body ?? "", 200, { ...headers, ...UNCOMPRESSED_STREAM });
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/deployments/{id}/activate",
    summary: "Serve this (older) ready deployment: instant rollback",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam },
    responses: {
      200: json("The app, now serving the deployment", dataOf(AppSchema)),
      ...authErrors,
      ...notFound,
      409: errorResponse("The deployment is not ready (DEPLOYMENT_NOT_READY)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id } = c.req.valid("param");
    const { app, row } = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    const updated = await activateDeployment(db, c.env, app, row);
    // The app's cron runs work in the active deployment's source.
    await appChanged(c.env, db, app.id);
    return c.json({ data: await appView(db, c.env, await resolveApp(db, updated.accountId, updated.id)) }, 200);
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/deployments/{id}/cancel",
    summary: "Cancel a build in progress",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam },
    responses: { 200: json("The deployment", dataOf(DeploymentSchema)), ...authErrors, ...notFound },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id } = c.req.valid("param");
    const { app, row } = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    if (row.status === "building" || row.status === "queued") await deploymentStub(c.env, row.id).cancel();
    const [view] = await deploymentViews(c.env, c.get("config"), app, [await resolveDeployment(db, app, id)]);
    return c.json({ data: view! }, 200);
  },
);

deploymentRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/deployments/{id}/artifacts/{name}",
    summary: "A generated container build file of the deployment (Dockerfile, svc-nginx.conf)",
    description: "Generated when the project has no Dockerfile or Containerfile: nginx serving the output with the same SPA/404 rules as the edge.",
    tags: ["Deployments"],
    security,
    request: { params: DeploymentParam.extend({ name: z.enum(ARTIFACTS) }) },
    responses: {
      200: { description: "text/plain file" },
      ...authErrors,
      404: errorResponse("No such deployment, or the project had its own container build file (NOT_FOUND)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const { app: ref, id, name } = c.req.valid("param");
    const { row } = await resolveAppDeployment(db, c.get("principal").accountId, ref, id);
    const object = await c.env.BUCKET.get(artifactKey(row.id, name));
    if (!object) throw new ApiError("NOT_FOUND", `deployment ${row.id} has no generated ${name}`);
    return c.body(object.body, 200, { "Content-Type": "text/plain; charset=utf-8" });
  },
);

const RequestLogSchema = z
  .object({
    id: z.number().int().openapi({ description: "Increasing; pass the last one as `after` to follow" }),
    time: z.string(),
    method: z.string(),
    path: z.string(),
    status: z.number().int(),
    bytes: z.number().int(),
    durationMs: z.number().int(),
  })
  .openapi("RequestLog");

deploymentRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/logs",
    summary: "The app's web-server log: recent requests and their status codes",
    description: "Oldest first. To follow, poll with `after` = the last id seen.",
    tags: ["Deployments"],
    security,
    request: {
      params: AppParam,
      query: z.object({
        after: z.coerce.number().int().min(0).optional(),
        limit: z.coerce.number().int().min(1).max(1000).default(100),
      }),
    },
    responses: { 200: json("Requests", dataOf(z.array(RequestLogSchema))), ...authErrors, 404: errorResponse("app not found") },
  }),
  async (c) => {
    const db = c.get("db");
    const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    const { after, limit } = c.req.valid("query");
    const rows = await db
      .select()
      .from(requestLogs)
      .where(after === undefined ? eq(requestLogs.appId, app.id) : and(eq(requestLogs.appId, app.id), gt(requestLogs.id, after)))
      .orderBy(after === undefined ? desc(requestLogs.id) : requestLogs.id)
      .limit(limit);
    const ordered = after === undefined ? rows.reverse() : rows;
    return c.json(
      {
        data: ordered.map((r) => ({
          id: r.id,
          time: iso(r.at),
          method: r.method,
          path: r.path,
          status: r.status,
          bytes: r.bytes,
          durationMs: r.durationMs,
        })),
      },
      200,
    );
  },
);
