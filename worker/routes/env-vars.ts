import { createRoute, z } from "@hono/zod-openapi";
import { requireScope } from "../auth/middleware";
import { ApiError } from "../lib/errors";
import { authErrors, errorResponse, jsonBody, newRouter } from "../lib/router";
import { ApplyQuery, dataOf, Ref, RolloutSchema, withRollout } from "../lib/schemas";
import { resolveApp } from "../services/apps";
import { configChanged } from "../services/rollout";
import { listEnvVars, setEnvVars, unsetEnvVars } from "../services/env-vars";

/** Why a variable name cannot be set, or null when it can. */
function envNameProblem(name: string): string | null {
  if (name.length > 255) return "must be at most 255 characters";
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) return "must be a shell variable name (letters, digits, underscores)";
  if (name.toUpperCase().startsWith("SVC_")) return "the SVC_ prefix is reserved for the platform";
  return null;
}

const EnvName = z.string().superRefine((name, context) => {
  const problem = envNameProblem(name);
  if (problem) context.addIssue({ code: "custom", message: problem });
});

const EnvVarSchema = z
  .object({
    name: z.string().openapi({ example: "DATABASE_URL" }),
    updatedAt: z.string(),
    value: z.string().optional().openapi({ description: "Only with ?reveal=true" }),
  })
  .openapi("EnvVar");

const SetEnvBody = z
  .strictObject({
    // Names are checked one by one, so an error names the variable and says what is wrong with it.
    vars: z
      .record(z.string(), z.string().max(32_768, "must be at most 32 KiB").refine((v) => !v.includes("\0"), "must not contain NUL"))
      .superRefine((vars, context) => {
        for (const name of Object.keys(vars)) {
          const problem = envNameProblem(name);
          if (problem) context.addIssue({ code: "custom", path: [name], message: `${name}: ${problem}` });
        }
      })
      .refine((v) => Object.keys(v).length > 0, "must set at least one variable")
      .refine((v) => Object.keys(v).length <= 200, "at most 200 variables per request"),
  })
  .openapi("SetEnvVars", { example: { vars: { GREETING: "hello", VITE_API_URL: "https://api.example.com" } } });

const AppParam = z.object({ app: Ref.openapi({ description: "App id or name" }) });
const security = [{ bearerAuth: [] }];
const listResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: dataOf(z.array(EnvVarSchema)) } },
});

export const envVarRoutes = newRouter();
envVarRoutes.use("*", requireScope("deploy"));

envVarRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/env",
    summary: "List an app's env vars",
    description: "Names and update times; values only with `reveal=true`. Values are encrypted at rest.",
    tags: ["Env vars"],
    security,
    request: {
      params: AppParam,
      query: z.object({ reveal: z.enum(["true", "false"]).optional() }),
    },
    responses: { 200: listResponse("Variables by name"), ...authErrors, 404: errorResponse("app not found") },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    const reveal = c.req.valid("query").reveal === "true";
    return c.json({ data: await listEnvVars(c.get("db"), c.get("config"), app.id, reveal) }, 200);
  },
);

envVarRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{app}/env",
    summary: "Set env vars (merge)",
    description:
      "Adds or replaces the given variables; others are kept. All are written or none. The change reaches the app: an app that runs starts its release again with them (without downtime unless it has a disk, recorded as a deployment `config: NAME set`); a static site is built again from the same source. With `apply=false` it waits for `POST /v1/apps/{app}/apply`.",
    tags: ["Env vars"],
    security,
    request: { params: AppParam, query: ApplyQuery, body: jsonBody(SetEnvBody) },
    responses: {
      200: withRollout(z.array(EnvVarSchema), "All variables after the change, and its rollout to the app"),
      ...authErrors,
      404: errorResponse("app not found"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const app = await resolveApp(db, c.get("principal").accountId, c.req.valid("param").app);
    const vars = c.req.valid("json").vars;
    await setEnvVars(db, c.get("config"), app.id, vars);
    const rollout = await configChanged(c.env, db, app, `${Object.keys(vars).join(", ")} set`, c.req.valid("query").apply !== "false");
    return c.json({ data: await listEnvVars(db, c.get("config"), app.id, false), rollout }, 200);
  },
);

envVarRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{app}/env/{name}",
    summary: "Unset an env var",
    tags: ["Env vars"],
    security,
    request: { params: AppParam.extend({ name: EnvName }), query: ApplyQuery },
    responses: {
      200: {
        description: "Removed, and the change's rollout to the app",
        content: { "application/json": { schema: dataOf(z.object({ name: z.string(), deleted: z.literal(true), rollout: RolloutSchema })) } },
      },
      ...authErrors,
      404: errorResponse("app not found, or the variable is not set (ENV_VAR_NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { app: ref, name } = c.req.valid("param");
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, ref);
    if ((await unsetEnvVars(c.get("db"), app.id, [name])).length > 0) {
      throw new ApiError("ENV_VAR_NOT_FOUND", `env var ${name} is not set on app ${app.name}`);
    }
    const rollout = await configChanged(c.env, c.get("db"), app, `${name} unset`, c.req.valid("query").apply !== "false");
    return c.json({ data: { name, deleted: true as const, rollout } }, 200);
  },
);
