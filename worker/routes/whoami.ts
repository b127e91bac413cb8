import { createRoute, z } from "@hono/zod-openapi";
import { SCOPES } from "../db/schema";
import { authErrors, newRouter } from "../lib/router";

const WhoAmISchema = z
  .object({
    keyId: z.string().openapi({ example: "key_3hY8aQ0mVfK2pR7sT1uW9xZc" }),
    keyName: z.string().openapi({ example: "ci-deploy" }),
    accountId: z.string().openapi({ example: "acct_8fK2pR7sT1uW9xZc3hY8aQ0m" }),
    scopes: z.array(z.enum(SCOPES)).openapi({ example: ["deploy"] }),
  })
  .openapi("WhoAmI");

export const whoamiRoutes = newRouter();

whoamiRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "The API key making the request",
    description:
      "Any valid key. Answers from the authentication itself (one indexed read, no other): what a CLI shows after login, and the cheapest way to check a key.",
    tags: ["API keys"],
    security: [{ bearerAuth: [] }],
    responses: {
      200: { description: "The key and its account", content: { "application/json": { schema: WhoAmISchema } } },
      ...authErrors,
    },
  }),
  (c) => {
    const { keyId, keyName, accountId, scopes } = c.get("principal");
    return c.json({ keyId, keyName, accountId, scopes }, 200);
  },
);
