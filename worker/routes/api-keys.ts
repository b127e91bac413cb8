import { createRoute, z } from "@hono/zod-openapi";
import { createKey, deleteKey, listKeys, rollKey } from "../auth/keys";
import { requireScope } from "../auth/middleware";
import { SCOPES } from "../db/schema";
import { ApiError } from "../lib/errors";
import { authErrors, errorResponse, jsonBody, newRouter } from "../lib/router";

const KeyId = z.string().regex(/^key_[0-9A-Za-z]{24}$/, "must be an API key id (key_…)");

const Scope = z.enum(SCOPES).openapi({ example: "deploy" });

const CreateKeyBody = z
  .strictObject({
    name: z.string().trim().min(1, "must not be empty").max(100, "must be at most 100 characters"),
    scopes: z.array(Scope).min(1, "must name at least one scope").max(SCOPES.length * 4),
    expiresAt: z.iso
      .datetime({ offset: true, message: "must be an ISO 8601 timestamp, e.g. 2027-01-01T00:00:00Z" })
      .refine((v) => Date.parse(v) > Date.now(), "must be in the future")
      .nullish(),
  })
  .openapi("CreateApiKey", { example: { name: "ci-deploy", scopes: ["deploy"], expiresAt: "2027-01-01T00:00:00Z" } });

const ApiKeySchema = z
  .object({
    id: z.string().openapi({ example: "key_3hY8aQ0mVfK2pR7sT1uW9xZc" }),
    name: z.string(),
    start: z.string().openapi({ description: "First characters of the secret, to tell keys apart", example: "svc_Ab3dE6" }),
    scopes: z.array(Scope),
    expiresAt: z.string().nullable(),
    createdAt: z.string(),
    lastUsedAt: z.string().nullable(),
  })
  .openapi("ApiKey");

const CreatedKeySchema = ApiKeySchema.omit({ lastUsedAt: true })
  .extend({ key: z.string().openapi({ description: "The secret. Shown only once.", example: "svc_…" }) })
  .openapi("CreatedApiKey");

const RollBody = z
  .strictObject({
    gracePeriodSeconds: z
      .number()
      .int()
      .min(0)
      .max(86_400)
      .optional()
      .openapi({ description: "How long the old secret keeps working (default 0, max 24 h)" }),
  })
  .openapi("RollApiKey");

const RolledKeySchema = CreatedKeySchema.extend({
  previousKey: z.object({ id: z.string(), expiresAt: z.string() }),
}).openapi("RolledApiKey");

const security = [{ bearerAuth: [] }];

export const apiKeyRoutes = newRouter();

apiKeyRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Create an API key",
    description: "Requires the `admin` scope. The `key` field is returned only here, once.",
    tags: ["API keys"],
    security,
    middleware: [requireScope("admin")] as const,
    request: { body: jsonBody(CreateKeyBody) },
    responses: {
      201: { description: "Created", content: { "application/json": { schema: CreatedKeySchema } } },
      ...authErrors,
    },
  }),
  async (c) => {
    const body = c.req.valid("json");
    const created = await createKey(c.get("db"), {
      accountId: c.get("principal").accountId,
      name: body.name,
      scopes: body.scopes,
      expiresAt: body.expiresAt ? Date.parse(body.expiresAt) : null,
    });
    return c.json(created, 201);
  },
);

apiKeyRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List the account's API keys",
    description: "Any valid key of the account may list. Secrets are never returned.",
    tags: ["API keys"],
    security,
    responses: {
      200: { description: "Keys, newest first", content: { "application/json": { schema: z.array(ApiKeySchema) } } },
      ...authErrors,
    },
  }),
  async (c) => c.json(await listKeys(c.get("db"), c.get("principal").accountId), 200),
);

apiKeyRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{id}",
    summary: "Delete an API key",
    description: "Requires the `admin` scope. Takes effect on the key's very next request.",
    tags: ["API keys"],
    security,
    middleware: [requireScope("admin")] as const,
    request: { params: z.object({ id: KeyId }) },
    responses: {
      204: { description: "Deleted" },
      ...authErrors,
      404: errorResponse("No such key in this account (KEY_NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { id } = c.req.valid("param");
    if (!(await deleteKey(c.get("db"), c.get("principal").accountId, id))) {
      throw new ApiError("KEY_NOT_FOUND", `API key ${id} not found`);
    }
    return c.body(null, 204);
  },
);

apiKeyRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{id}/roll",
    summary: "Roll an API key",
    description:
      "Requires the `admin` scope. Issues a new secret (new id) with the same name, scopes and expiry; the old secret keeps working for `gracePeriodSeconds`.",
    tags: ["API keys"],
    security,
    middleware: [requireScope("admin")] as const,
    request: {
      params: z.object({ id: KeyId }),
      body: { required: false, content: { "application/json": { schema: RollBody } } },
    },
    responses: {
      201: { description: "New key", content: { "application/json": { schema: RolledKeySchema } } },
      ...authErrors,
      404: errorResponse("No such key in this account (KEY_NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { id } = c.req.valid("param");
    const { gracePeriodSeconds = 0 } = c.req.valid("json") ?? {};
    const rolled = await rollKey(c.get("db"), c.get("principal").accountId, id, gracePeriodSeconds);
    if (!rolled) throw new ApiError("KEY_NOT_FOUND", `API key ${id} not found`);
    return c.json(rolled, 201);
  },
);
