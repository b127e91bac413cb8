import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { requestId } from "hono/request-id";
import { CALLBACK_OVERHEAD_BYTES, MAX_MANIFEST_BYTES } from "../builder/src/protocol/static";
import { keyByHash } from "./auth/authenticate";
import { requireKey } from "./auth/middleware";
import type { AppEnv } from "./context";
import { isDashboardRequest, serveDashboard } from "./dashboard";
import { openDb } from "./db/client";
import { configOf } from "./env";
import { ApiError, type ErrorCode, errorBody } from "./lib/errors";
import { newRouter } from "./lib/router";
import { accountRoutes } from "./routes/accounts";
import { apiKeyRoutes } from "./routes/api-keys";
import { appRoutes } from "./routes/apps";
import { backupRoutes } from "./routes/backups";
import { cronRoutes } from "./routes/crons";
import { deploymentRoutes } from "./routes/deployments";
import { diskRoutes } from "./routes/disks";
import { serveCustomHost, serveSite, siteName } from "./sites/serve";
import { CHECK_HOST_HEADER, HTTP_CHECK_PATH } from "./services/domains";
import { domainRoutes } from "./routes/domains";
import { webhookRoutes } from "./routes/webhooks";
import { storageRoutes } from "./storage/gateway";
import { envVarRoutes } from "./routes/env-vars";
import { internalRoutes } from "./routes/internal";
import { joinTokenRoutes, nodeRoutes, operatorNodeRoutes } from "./routes/nodes";
import { whoamiRoutes } from "./routes/whoami";

/** Routes under /v1 reachable without an API key (the operator route checks its own token). */
const PUBLIC_PATHS = new Set(["/v1/openapi.json", "/v1/accounts", "/v1/nodes/join"]);
/** The operator's own routes (the fleet) check the operator token instead of an API key. */
const OPERATOR_PREFIX = "/v1/operator/";

/** Disk-backup responses are wrapped in `{data, status}`, errors included (spec, "Endpoints"). */
const BACKUP_PATH = /^\/v1\/disks\/[^/]+\/backups(\/|$)/;

function errorResponse(c: Context<AppEnv>, err: ApiError): Response {
  const body = BACKUP_PATH.test(c.req.path) ? { ...errorBody(err), status: err.status, data: null } : errorBody(err);
  const headers: Record<string, string> = { ...err.headers };
  if (err.code === "UNAUTHORIZED") headers["WWW-Authenticate"] = 'Bearer realm="svc"';
  return c.json(body, err.status, headers);
}

/** Hono raises HTTPException for malformed JSON and wrong Content-Type; keep our envelope. */
function fromHttpException(err: HTTPException): ApiError {
  const byStatus: Partial<Record<number, ErrorCode>> = {
    400: "VALIDATION_ERROR",
    401: "UNAUTHORIZED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "VALIDATION_ERROR",
  };
  const code = byStatus[err.status] ?? "INTERNAL";
  if (code === "VALIDATION_ERROR") {
    const message = err.status === 415 ? "Content-Type must be application/json" : err.message;
    return new ApiError(code, `invalid request body: ${message}`, [{ field: "body", message }]);
  }
  return new ApiError(code, code === "INTERNAL" ? "internal error" : err.message);
}

/**
 * The one app factory (STYLE 1): the entry point and every test run exactly
 * this wiring of request ids, config, body limit, routes and error handling.
 */
export function createApp() {
  const app = newRouter();

  app.use("*", async (c, next) => {
    const config = configOf(c.env);
    // Requests for <app>.<APPS_DOMAIN> are static sites, answered before any API machinery.
    const host = c.req.header("Host") ?? new URL(c.req.url).host;
    const waitUntil = (p: Promise<unknown>) => c.executionCtx.waitUntil(p);
    const site = siteName(host, config.APPS_DOMAIN);
    if (site) return serveSite(c.req.raw, c.env, waitUntil, { name: site });
    // Any host but the control plane's own is a custom domain or nothing: never the API or the dashboard.
    const checked = c.req.path.startsWith(`${HTTP_CHECK_PATH}/`) ? c.req.header(CHECK_HOST_HEADER) : undefined;
    const hostname = (checked ?? host).toLowerCase().replace(/:\d+$/, "");
    if (!config.CONTROL_PLANE_HOSTS.has(hostname)) return serveCustomHost(c.req.raw, c.env, waitUntil, hostname);
    c.set("config", config);
    c.set("db", openDb(c.env.DB));
    await next();
  });
  app.use("*", requestId({ headerName: "X-Request-Id" }));
  const limitBody =
    (maxSize: (c: Context<AppEnv>) => number): MiddlewareHandler<AppEnv> =>
    (c, next) =>
      bodyLimit({
        maxSize: maxSize(c),
        onError: () => {
          throw new ApiError("PAYLOAD_TOO_LARGE", `request body exceeds ${maxSize(c)} bytes`);
        },
      })(c, next);
  const apiLimit = limitBody((c) => c.get("config").MAX_REQUEST_BODY_BYTES);
  app.use("/v1/*", apiLimit);
  // A build's completion carries its whole manifest, which the builder bounds (MAX_MANIFEST_BYTES).
  app.use("/internal/builder/callback", limitBody(() => MAX_MANIFEST_BYTES + CALLBACK_OVERHEAD_BYTES));
  app.use("/internal/*", (c, next) => (c.req.path === "/internal/builder/callback" ? next() : apiLimit(c, next)));

  // Authentication happens once here; routers only check scopes.
  app.use("/v1/*", (c, next) => (PUBLIC_PATHS.has(c.req.path) || `${c.req.path}/`.startsWith(OPERATOR_PREFIX) ? next() : requireKey(c, next)));

  app.get("/healthz", (c) => c.json({ ok: true }));
  // The floor bench/api-auth.ts holds authentication to: the same indexed read of a key by its hash and
  // nothing else. Served only where BENCH_FLOOR_ROUTES is "on" (the bench's own stack); 404 anywhere else.
  app.get("/__bench/key-read", async (c) => {
    if (c.env.BENCH_FLOOR_ROUTES !== "on") return c.notFound();
    const row = await keyByHash(c.get("db"), c.req.query("hash") ?? "");
    return c.json({ found: row !== undefined }, 200);
  });

  app.route("/v1/accounts", accountRoutes);
  app.route("/v1/api-keys", apiKeyRoutes);
  app.route("/v1/apps", appRoutes);
  app.route("/v1/apps", envVarRoutes);
  app.route("/v1/apps", deploymentRoutes);
  app.route("/v1/apps", domainRoutes);
  app.route("/v1/disks", diskRoutes);
  app.route("/v1/disks", backupRoutes);
  app.route("/v1/crons", cronRoutes);
  app.route("/v1/webhooks", webhookRoutes);
  app.route("/v1/whoami", whoamiRoutes);
  app.route("/v1/nodes", nodeRoutes);
  app.route("/v1/operator/nodes", operatorNodeRoutes);
  app.route("/v1/operator/join-tokens", joinTokenRoutes);
  app.route("/internal", internalRoutes);
  app.route("/storage", storageRoutes);

  app.openAPIRegistry.registerComponent("securitySchemes", "bearerAuth", {
    type: "http",
    scheme: "bearer",
    description: "An API key: `Authorization: Bearer svc_…`",
  });
  app.openAPIRegistry.registerComponent("securitySchemes", "operatorToken", {
    type: "http",
    scheme: "bearer",
    description: "The deployment's OPERATOR_TOKEN secret",
  });
  app.openAPIRegistry.registerComponent("securitySchemes", "joinToken", {
    type: "http",
    scheme: "bearer",
    description: "A join token minted by the operator (`svc admin nodes token`): admits new nodes only",
  });
  app.doc31("/v1/openapi.json", (c) => ({
    openapi: "3.1.0",
    info: {
      title: "svc platform API",
      version: "1.0.0",
      description: "Control plane of the svc application-hosting platform.",
    },
    servers: [{ url: new URL(c.req.url).origin }],
  }));

  app.notFound((c) => {
    // The API origin's other pages are the dashboard (app hosts were answered by the first middleware).
    if (isDashboardRequest(c.req.method, c.req.path)) return serveDashboard(c.req.raw, c.env, c.get("config"));
    return errorResponse(c, new ApiError("NOT_FOUND", `no route for ${c.req.method} ${c.req.path}`));
  });

  app.onError((err, c) => {
    if (err instanceof ApiError) return errorResponse(c, err);
    if (err instanceof HTTPException) return errorResponse(c, fromHttpException(err));
    console.error(`[${c.get("requestId")}] unhandled error`, err);
    return errorResponse(c, new ApiError("INTERNAL", `internal error (request id ${c.get("requestId")})`));
  });

  return app;
}
