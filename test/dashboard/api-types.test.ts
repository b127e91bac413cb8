import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { OPENAPI_JSON, OPENAPI_TYPES, renderApiTypes } from "../../scripts/api-types.js";

/**
 * The CLI and the dashboard compile against openapi/v1.d.ts. The Worker suite
 * checks that openapi/v1.json is the document the Worker serves; this checks
 * that the committed types are what that document generates, so neither
 * client can drift from the API.
 */
describe("openapi/v1.d.ts", () => {
  it("is what openapi-typescript generates from openapi/v1.json (else run npm run api:types)", async () => {
    const [document, committed] = await Promise.all([readFile(OPENAPI_JSON, "utf8"), readFile(OPENAPI_TYPES, "utf8")]);
    expect(committed, "openapi/v1.d.ts is stale: run npm run api:types").toBe(await renderApiTypes(document));
  });
});
