import { createRoute, z } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import { createAccount } from "../auth/accounts";
import type { AppEnv } from "../context";
import { PLANS } from "../db/schema";
import { ApiError } from "../lib/errors";
import { errorResponse, jsonBody, newRouter } from "../lib/router";

export async function sameSecret(a: string, b: string): Promise<boolean> {
  const enc = new TextEncoder();
  const [da, db] = await Promise.all([
    crypto.subtle.digest("SHA-256", enc.encode(a)),
    crypto.subtle.digest("SHA-256", enc.encode(b)),
  ]);
  return crypto.subtle.timingSafeEqual(da, db);
}

/** Operator-only: `Authorization: Bearer <OPERATOR_TOKEN>`; disabled when the secret is unset. */
export const requireOperator: MiddlewareHandler<AppEnv> = async (c, next) => {
  const token = c.get("config").OPERATOR_TOKEN;
  const presented = /^Bearer\s+(\S+)$/i.exec(c.req.header("Authorization") ?? "")?.[1];
  if (!token || !presented || !(await sameSecret(presented, token))) {
    throw new ApiError("UNAUTHORIZED", "this endpoint requires the operator token");
  }
  await next();
};

const CreateAccountBody = z
  .strictObject({
    name: z.string().trim().min(1).max(100),
    plan: z.enum(PLANS).default("free"),
    operatorEvents: z
      .boolean()
      .default(false)
      .openapi({ description: "The account's webhooks may subscribe to the operator's events (node.unreachable, node.lost): the operator's own account" }),
  })
  .openapi("CreateAccount", { example: { name: "acme", plan: "pro" } });

const AccountCreatedSchema = z
  .object({
    account: z.object({ id: z.string(), name: z.string(), plan: z.enum(PLANS), operatorEvents: z.boolean(), createdAt: z.string() }),
    apiKey: z.object({
      id: z.string(),
      name: z.string(),
      start: z.string(),
      key: z.string(),
      scopes: z.array(z.string()),
      expiresAt: z.string().nullable(),
      createdAt: z.string(),
    }),
  })
  .openapi("AccountCreated");

export const accountRoutes = newRouter();

accountRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Create an account and its first admin key (operator only)",
    tags: ["Accounts"],
    security: [{ operatorToken: [] }],
    middleware: [requireOperator] as const,
    request: { body: jsonBody(CreateAccountBody) },
    responses: {
      201: { description: "Created", content: { "application/json": { schema: AccountCreatedSchema } } },
      400: errorResponse("Invalid request"),
      401: errorResponse("Missing or wrong operator token"),
    },
  }),
  async (c) => c.json(await createAccount(c.get("db"), c.req.valid("json")), 201),
);
