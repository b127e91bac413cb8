import { createRoute, z } from "@hono/zod-openapi";
import { requireScope } from "../auth/middleware";
import { DELIVERY_STATUSES, WEBHOOK_EVENTS } from "../db/schema";
import { authErrors, errorResponse, jsonBody, newRouter, planLimited } from "../lib/router";
import { Deleted, dataOf } from "../lib/schemas";
import {
  createWebhook,
  deleteWebhook,
  deliveryView,
  listDeliveries,
  listWebhooks,
  rollSecret,
  sendTest,
  updateWebhook,
  webhookOf,
  webhookView,
} from "../services/webhooks";

const WebhookSchema = z
  .object({
    id: z.string().openapi({ example: "whk_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    url: z.string().openapi({ example: "https://hooks.example.com/svc" }),
    events: z.array(z.enum(WEBHOOK_EVENTS)),
    description: z.string().nullable(),
    previousSecretExpiresAt: z
      .string()
      .nullable()
      .openapi({ description: "After a roll: until when deliveries are also signed with the secret before it (a second `v1,` signature)" }),
    createdAt: z.string(),
    updatedAt: z.string(),
  })
  .openapi("Webhook");

const WithSecret = WebhookSchema.extend({
  secret: z.string().openapi({
    description: "The signing secret (`whsec_…`), shown only here: verify `webhook-signature` with it as the Standard Webhooks specification says",
    example: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  }),
}).openapi("WebhookWithSecret");

const DeliverySchema = z
  .object({
    id: z.string().openapi({ description: "The delivery's `webhook-id` header (the same on every attempt)", example: "msg_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    webhookId: z.string(),
    event: z.string(),
    status: z.enum(DELIVERY_STATUSES).openapi({ description: "`pending` while it is tried (for 24 hours), `delivered` once answered 2xx, `failed` when given up" }),
    attempts: z.number().int(),
    responseStatus: z.number().int().nullable().openapi({ description: "The HTTP status of the last attempt (null: no answer)" }),
    error: z.string().nullable(),
    createdAt: z.string(),
    lastAttemptAt: z.string().nullable(),
    nextAttemptAt: z.string().nullable(),
    payload: z.unknown().openapi({ description: "The body sent: `{type, timestamp, data}`" }),
  })
  .openapi("WebhookDelivery");

const Url = z.string().min(1).max(2048).openapi({ description: "Where events are POSTed; https, never a private, loopback or link-local address in production" });
const Events = z
  .array(z.enum(WEBHOOK_EVENTS))
  .min(1)
  .max(WEBHOOK_EVENTS.length * 2)
  .openapi({ description: `Which events it gets: ${WEBHOOK_EVENTS.join(", ")}` });
const Description = z.string().max(200).nullable();

const CreateBody = z
  .strictObject({ url: Url, events: Events, description: Description.optional() })
  .openapi("CreateWebhook", { example: { url: "https://hooks.example.com/svc", events: ["deploy.failed", "app.crash_loop"] } });
const UpdateBody = z
  .strictObject({ url: Url.optional(), events: Events.optional(), description: Description.optional() })
  .refine((b) => Object.keys(b).length > 0, "give at least one of url, events, description")
  .openapi("UpdateWebhook");

const Param = z.object({ webhook: z.string().regex(/^whk_[0-9A-Za-z]{24}$/, "must be a webhook id (whk_…)") });
const security = [{ bearerAuth: [] }];
const notFound = { 404: errorResponse("No such webhook in this account (WEBHOOK_NOT_FOUND)") };
const one = (description: string) => ({ description, content: { "application/json": { schema: dataOf(WebhookSchema) } } });
const withSecret = (description: string) => ({ description, content: { "application/json": { schema: dataOf(WithSecret) } } });

/** Node events asked for by an account the operator did not flag (its scope's 403 is the other). */
const operatorOnly = {
  403: errorResponse(
    "The key lacks the required scope (INSUFFICIENT_SCOPE), or the events include the operator's node.unreachable or node.lost and the account is not the operator's (FORBIDDEN)",
  ),
};

export const webhookRoutes = newRouter();
webhookRoutes.use("*", requireScope("deploy"));

webhookRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Add a webhook",
    description: "Events go to `url` as signed POSTs (docs/webhooks.md). The answer holds the signing secret, the only time it is shown. An account has at most 20 webhooks.",
    tags: ["Webhooks"],
    security,
    request: { body: jsonBody(CreateBody) },
    responses: { 201: withSecret("Added, with its secret"), ...authErrors, ...operatorOnly, ...planLimited },
  }),
  async (c) => {
    const { row, secret } = await createWebhook(c.get("db"), c.get("config"), c.get("principal").accountId, c.req.valid("json"));
    return c.json({ data: { ...webhookView(row), secret } }, 201);
  },
);

webhookRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List webhooks",
    tags: ["Webhooks"],
    security,
    responses: { 200: { description: "The account's webhooks, newest first (no secrets)", content: { "application/json": { schema: dataOf(z.array(WebhookSchema)) } } }, ...authErrors },
  }),
  async (c) => c.json({ data: (await listWebhooks(c.get("db"), c.get("principal").accountId)).map((row) => webhookView(row)) }, 200),
);

webhookRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{webhook}",
    summary: "Show a webhook",
    tags: ["Webhooks"],
    security,
    request: { params: Param },
    responses: { 200: one("The webhook"), ...authErrors, ...notFound },
  }),
  async (c) => c.json({ data: webhookView(await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook)) }, 200),
);

webhookRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{webhook}",
    summary: "Change a webhook's URL, events or description",
    tags: ["Webhooks"],
    security,
    request: { params: Param, body: jsonBody(UpdateBody) },
    responses: { 200: one("The webhook after the change"), ...authErrors, ...operatorOnly, ...notFound },
  }),
  async (c) => {
    const row = await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook);
    return c.json({ data: webhookView(await updateWebhook(c.get("db"), c.get("config"), row, c.req.valid("json"))) }, 200);
  },
);

webhookRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{webhook}",
    summary: "Remove a webhook",
    description: "Its pending deliveries are dropped with it.",
    tags: ["Webhooks"],
    security,
    request: { params: Param },
    responses: { 200: { description: "Removed", content: { "application/json": { schema: dataOf(Deleted) } } }, ...authErrors, ...notFound },
  }),
  async (c) => {
    const row = await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook);
    await deleteWebhook(c.get("db"), row);
    return c.json({ data: { id: row.id, deleted: true as const } }, 200);
  },
);

webhookRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{webhook}/roll-secret",
    summary: "Roll a webhook's signing secret",
    description: "A new secret, shown only here. For 24 hours deliveries carry two signatures (the new secret's and the old one's), so a receiver can switch without missing one.",
    tags: ["Webhooks"],
    security,
    request: { params: Param },
    responses: { 200: withSecret("The webhook with its new secret"), ...authErrors, ...notFound },
  }),
  async (c) => {
    const row = await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook);
    const rolled = await rollSecret(c.get("db"), row);
    return c.json({ data: { ...webhookView(rolled.row), secret: rolled.secret } }, 200);
  },
);

webhookRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{webhook}/test",
    summary: "Send a test event",
    description: "Queues a `webhook.test` event to this webhook now, whatever events it asked for; the answer is the delivery (`GET …/deliveries` shows how it went).",
    tags: ["Webhooks"],
    security,
    request: { params: Param },
    responses: { 202: { description: "Queued", content: { "application/json": { schema: dataOf(DeliverySchema) } } }, ...authErrors, ...notFound },
  }),
  async (c) => {
    const row = await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook);
    return c.json({ data: deliveryView(await sendTest(c.env, row)) }, 202);
  },
);

webhookRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{webhook}/deliveries",
    summary: "A webhook's deliveries",
    description: "The newest 100: each event sent, its status, attempts and the last answer's HTTP status or error.",
    tags: ["Webhooks"],
    security,
    request: { params: Param },
    responses: { 200: { description: "Newest first", content: { "application/json": { schema: dataOf(z.array(DeliverySchema)) } } }, ...authErrors, ...notFound },
  }),
  async (c) => {
    const row = await webhookOf(c.get("db"), c.get("principal").accountId, c.req.valid("param").webhook);
    return c.json({ data: (await listDeliveries(c.get("db"), row)).map(deliveryView) }, 200);
  },
);
