import { createRoute, z } from "@hono/zod-openapi";
import { requireScope } from "../auth/middleware";
import { DOMAIN_REDIRECTS, DOMAIN_STATUSES } from "../db/schema";
import { authErrors, errorResponse, jsonBody, newRouter } from "../lib/router";
import { dataOf, Ref } from "../lib/schemas";
import { resolveApp } from "../services/apps";
import { addDomain, domainOf, domainView, listDomains, removeDomain, updateDomain, verifyDomain } from "../services/domains";

const DomainSchema = z
  .object({
    id: z.string(),
    app: z.string().openapi({ description: "The app's name" }),
    hostname: z.string().openapi({ example: "www.example.com" }),
    status: z.enum(DOMAIN_STATUSES).openapi({
      description:
        "`pending_verification` until ownership is proven (`reason` says what the last check found), `pending_certificate` while the certificate is issued (production), `active` once it serves, `failed` when another account proved it first or the certificate was refused (`reason`)",
    }),
    reason: z.string().nullable(),
    redirect: z.enum(DOMAIN_REDIRECTS).openapi({ description: "`to-www`: the apex redirects to www (308); `to-apex`: www redirects to the apex" }),
    httpsOnly: z.boolean().openapi({ description: "Plain-HTTP requests redirect to HTTPS (308) where the edge has a certificate (production)" }),
    records: z
      .array(z.object({ type: z.enum(["TXT", "CNAME"]), name: z.string(), value: z.string(), purpose: z.string() }))
      .openapi({ description: "The DNS records to create, exactly" }),
    verification: z.object({ method: z.enum(["dns", "http"]), checkedAt: z.string().nullable(), verifiedAt: z.string().nullable() }),
    certificate: z.enum(["none", "pending", "active"]),
    createdAt: z.string(),
  })
  .openapi("Domain");

const Hostname = z
  .string()
  .min(1)
  .max(253)
  .transform((h) => h.trim().toLowerCase().replace(/\.$/, ""))
  .openapi({ description: "A full domain name (lowercase; an international name in its punycode form)", example: "www.example.com" });

const AddDomainBody = z
  .strictObject({
    hostname: Hostname,
    redirect: z.enum(DOMAIN_REDIRECTS).default("none"),
    httpsOnly: z.boolean().default(true),
  })
  .openapi("AddDomain", { example: { hostname: "www.example.com" } });

const UpdateDomainBody = z
  .strictObject({ redirect: z.enum(DOMAIN_REDIRECTS).optional(), httpsOnly: z.boolean().optional() })
  .refine((b) => b.redirect !== undefined || b.httpsOnly !== undefined, "set redirect or httpsOnly")
  .openapi("UpdateDomain");

const AppParam = z.object({ app: Ref.openapi({ description: "App id or name" }) });
const DomainParam = AppParam.extend({ hostname: Hostname });
const security = [{ bearerAuth: [] }];
const one = (description: string) => ({ description, content: { "application/json": { schema: dataOf(DomainSchema) } } });
const notFound = errorResponse("app not found, or no such domain of the app (DOMAIN_NOT_FOUND)");

export const domainRoutes = newRouter();
domainRoutes.use("*", requireScope("deploy"));

domainRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/domains",
    summary: "List an app's custom domains",
    tags: ["Domains"],
    security,
    request: { params: AppParam },
    responses: { 200: { description: "The app's domains, oldest first", content: { "application/json": { schema: dataOf(z.array(DomainSchema)) } } }, ...authErrors, 404: notFound },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    const rows = await listDomains(c.get("db"), app);
    return c.json({ data: rows.map((row) => domainView(row, app, c.get("config"))) }, 200);
  },
);

domainRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/domains",
    summary: "Add a custom domain",
    description:
      "The domain serves nothing until its owner proves it: create the TXT record `records` names, then `POST …/verify`. A hostname another account has verified is refused (409 DOMAIN_TAKEN); one only claimed elsewhere can be added, and the first account to prove it keeps it.",
    tags: ["Domains"],
    security,
    request: { params: AppParam, body: jsonBody(AddDomainBody) },
    responses: {
      201: one("Added, pending verification, with the records to create"),
      ...authErrors,
      404: notFound,
      409: errorResponse("Verified by another account, or already a domain of one of this account's apps (DOMAIN_TAKEN)"),
    },
  }),
  async (c) => {
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, c.req.valid("param").app);
    const row = await addDomain(c.get("db"), c.get("config"), app, c.req.valid("json"));
    return c.json({ data: domainView(row, app, c.get("config")) }, 201);
  },
);

domainRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{app}/domains/{hostname}",
    summary: "Show a custom domain",
    tags: ["Domains"],
    security,
    request: { params: DomainParam },
    responses: { 200: one("The domain, as its last check left it"), ...authErrors, 404: notFound },
  }),
  async (c) => {
    const { app: ref, hostname } = c.req.valid("param");
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, ref);
    return c.json({ data: domainView(await domainOf(c.get("db"), app, hostname), app, c.get("config")) }, 200);
  },
);

domainRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{app}/domains/{hostname}/verify",
    summary: "Check a custom domain now",
    description:
      "Checks ownership (the TXT record; a local stack asks its own edge over HTTP) and then the certificate, and answers the domain as the check left it: `status` and `reason` say what was found.",
    tags: ["Domains"],
    security,
    request: { params: DomainParam },
    responses: { 200: one("The domain after the check"), ...authErrors, 404: notFound },
  }),
  async (c) => {
    const { app: ref, hostname } = c.req.valid("param");
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, ref);
    const row = await verifyDomain(c.get("db"), c.get("config"), await domainOf(c.get("db"), app, hostname));
    return c.json({ data: domainView(row, app, c.get("config")) }, 200);
  },
);

domainRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{app}/domains/{hostname}",
    summary: "Change a custom domain's redirect or HTTPS setting",
    tags: ["Domains"],
    security,
    request: { params: DomainParam, body: jsonBody(UpdateDomainBody) },
    responses: { 200: one("The domain after the change"), ...authErrors, 404: notFound },
  }),
  async (c) => {
    const { app: ref, hostname } = c.req.valid("param");
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, ref);
    const row = await updateDomain(c.get("db"), await domainOf(c.get("db"), app, hostname), c.req.valid("json"));
    return c.json({ data: domainView(row, app, c.get("config")) }, 200);
  },
);

domainRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{app}/domains/{hostname}",
    summary: "Remove a custom domain",
    description: "It stops serving within seconds and the hostname is free for any account again.",
    tags: ["Domains"],
    security,
    request: { params: DomainParam },
    responses: { 204: { description: "Removed" }, ...authErrors, 404: notFound },
  }),
  async (c) => {
    const { app: ref, hostname } = c.req.valid("param");
    const app = await resolveApp(c.get("db"), c.get("principal").accountId, ref);
    await removeDomain(c.get("db"), c.get("config"), await domainOf(c.get("db"), app, hostname));
    return c.body(null, 204);
  },
);
