import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/local-stack.js";
import { statusOf, type ErrorCode } from "../../worker/lib/errors.js";

/**
 * Issue 14, point 4: a clone carries its own reference. docs/ describes every
 * route the Worker serves and every error code it can answer, and nothing a
 * user reads points outside the repository.
 */

const read = (path: string) => readFile(join(ROOT, path), "utf8");

/** The markdown files a user reads: the READMEs and docs/. */
async function userDocs(): Promise<string[]> {
  const docs = (await readdir(join(ROOT, "docs"))).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`);
  return ["README.md", "cli/README.md", "builder/README.md", ...docs];
}

describe("docs/", () => {
  it("lists every route of the OpenAPI document with its success status", async () => {
    const api = await read("docs/api.md");
    const openapi = JSON.parse(await read("openapi/v1.json")) as { paths: Record<string, Record<string, { responses: Record<string, unknown> }>> };
    const routes = Object.entries(openapi.paths).flatMap(([path, methods]) => Object.entries(methods).map(([method, op]) => ({ path, method, op })));
    expect(routes.length).toBeGreaterThan(40);
    for (const { path, method, op } of routes) {
      const success = Object.keys(op.responses).find((code) => code < "400");
      const row = new RegExp(`^\\| \`${method.toUpperCase()} ${path.replace(/[{}]/g, "\\$&")}\` \\| ${success} \\|`, "m");
      expect(api, `${method.toUpperCase()} ${path}`).toMatch(row);
    }
  });

  it("explains every error code with its status", async () => {
    const errors = await read("docs/errors.md");
    const source = await read("worker/lib/errors.ts");
    const codes = [...(/export type ErrorCode =([^;]+);/.exec(source)?.[1] ?? "").matchAll(/"([A-Z_]+)"/g)].map((m) => m[1] as ErrorCode);
    expect(codes.length).toBeGreaterThan(25);
    for (const code of codes) {
      expect(errors, code).toMatch(new RegExp(`^\\| \`${code}\` \\| ${statusOf(code)}\\b`, "m"));
    }
  });

  it("keeps users inside the repository: no link to ../shared, and every relative link resolves", async () => {
    for (const file of await userDocs()) {
      const text = await read(file);
      expect(text, file).not.toContain("../shared");
      const prose = text.replace(/``[\s\S]*?``|`[^`\n]*`/g, ""); // code spans hold brackets that are not links
      for (const [, target] of prose.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
        if (/^[a-z]+:/.test(target!)) continue;
        expect(existsSync(resolve(ROOT, dirname(file), target!)), `${file} → ${target}`).toBe(true);
      }
    }
  });
});
