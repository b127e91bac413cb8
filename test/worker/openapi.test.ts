import { describe, expect, it } from "vitest";
import { createApp } from "../../worker/app";
import { call, json } from "./helpers";

type OpenApiDoc = { openapi: string; info: { title: string }; paths: Record<string, Record<string, unknown>> };

/** Every route Hono knows about, in OpenAPI path syntax. */
function registeredRoutes(): string[] {
  const skip = new Set(["/v1/openapi.json", "/healthz"]);
  return createApp()
    .routes.filter((r) => r.method !== "ALL" && r.path.startsWith("/v1/") && !skip.has(r.path))
    .map((r) => `${r.method.toLowerCase()} ${r.path.replace(/:([A-Za-z]+)/g, "{$1}").replace(/\/$/, "")}`);
}

describe("GET /v1/openapi.json", () => {
  it("is an OpenAPI 3.1 document listing every route", async () => {
    const res = await call("/v1/openapi.json");
    expect(res.status).toBe(200);
    const doc = await json<OpenApiDoc>(res);
    expect(doc.openapi).toBe("3.1.0");
    expect(doc.info.title).toBeTruthy();
    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((method) => `${method} ${path.replace(/\/$/, "")}`),
    );
    const routes = registeredRoutes();
    expect(routes.length).toBeGreaterThan(4);
    for (const route of routes) expect(documented).toContain(route);
    for (const op of Object.values(doc.paths).flatMap((ops) => Object.values(ops))) {
      expect(op).toHaveProperty("responses");
    }
  });

  it("is the document committed in openapi/v1.json, from which the CLI's and dashboard's types are generated", async () => {
    const { servers: _origin, ...doc } = await json<OpenApiDoc & { servers: unknown }>(await call("/v1/openapi.json"));
    // `npm run api:types` rewrites the file (and openapi/v1.d.ts) after a route or schema changes.
    await expect(`${JSON.stringify(doc, null, 2)}\n`).toMatchFileSnapshot("../../openapi/v1.json");
  });
});
