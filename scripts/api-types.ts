import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import openapiTS, { astToString, COMMENT_HEADER } from "openapi-typescript";
import { ROOT } from "./local-stack.js";

/**
 * `npm run api:types`: the TypeScript types of the `/v1` API, generated from
 * the OpenAPI document the Worker serves. The Worker suite keeps
 * `openapi/v1.json` equal to `GET /v1/openapi.json` (the script's first step
 * rewrites it); this turns it into `openapi/v1.d.ts`, which the CLI and the
 * dashboard import, and test/dashboard/api-types.test.ts fails when the two
 * files disagree.
 */

export const OPENAPI_JSON = join(ROOT, "openapi", "v1.json");
export const OPENAPI_TYPES = join(ROOT, "openapi", "v1.d.ts");

/** The generated module for an OpenAPI document's text. */
export async function renderApiTypes(document: string): Promise<string> {
  const ast = await openapiTS(document, { alphabetize: true });
  return `${COMMENT_HEADER.trimEnd()}\n// Source: openapi/v1.json. Regenerate with \`npm run api:types\`.\n\n${astToString(ast)}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await writeFile(OPENAPI_TYPES, await renderApiTypes(await readFile(OPENAPI_JSON, "utf8")));
  console.log(`Wrote ${OPENAPI_TYPES}`);
}
