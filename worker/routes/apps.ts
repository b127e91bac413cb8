import { createRoute, z } from "@hono/zod-openapi";
import { requireScope } from "../auth/middleware";
import { APP_STATUSES, RUNTIMES } from "../db/schema";
import { authErrors, errorResponse, jsonBody, newRouter, planLimited } from "../lib/router";
import { DnsLabel, Deleted, dataOf, Ref } from "../lib/schemas";
import { appChanged } from "../services/cron-targets";
import { deleteAppCrons } from "../services/crons";
import { appView, appViews, createApp, deleteApp, listApps, resolveApp, setAppStatus } from "../services/apps";

export const AppSchema = z
  .object({
    id: z.string().openapi({ example: "app_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    name: z.string().openapi({ example: "my-site" }),
    runtime: z.enum(RUNTIMES),
    status: z.enum(APP_STATUSES),
    url: z.string().openapi({ example: "https://my-site.apps.example.dev" }),
    memoryMb: z.number().int(),
    activeDeploymentId: z.string().nullable(),
    disks: z.array(z.object({ id: z.string(), name: z.string(), mountPath: z.string(), sizeGb: z.number().int() })),
    createdAt: z.string(),
    updatedAt: z.string(),
    restartedAt: z.string().nullable(),
  })
  .openapi("App");

const CreateAppBody = z
  .strictObject({
    name: DnsLabel,
    runtime: z.enum(RUNTIMES),
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
    return c.json({ data: await appView(c.get("db"), c.get("config"), row) }, 201);
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
    return c.json({ data: await appView(c.get("db"), c.get("config"), row) }, 200);
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
      // Its cron jobs hold the app's state: a stopped app's jobs skip their runs.
      await appChanged(c.env, db, app.id);
      return c.json({ data: await appView(db, c.get("config"), await resolveApp(db, app.accountId, app.id)) }, 200);
    },
  );
}

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
    await deleteAppCrons(c.get("db"), c.env, app.id);
    await deleteApp(c.get("db"), app);
    return c.json({ data: { id: app.id, deleted: true as const } }, 200);
  },
);
