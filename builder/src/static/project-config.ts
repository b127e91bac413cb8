/**
 * `svc.json`, the static-site project configuration (spec, "Static-site project
 * configuration"). Strict on purpose: a misspelt field (`outputdir`) silently
 * ignored would build and serve the wrong folder, so unknown fields are refused
 * by name, as are values of the wrong type.
 */
import { z } from "zod";
import { siteDir } from "../protocol.js";

const FIELDS = ["name", "runtime", "buildCommand", "outputDir", "port", "spa"] as const;

/** The fields svc.json may hold; `runtime` is the only required one. */
export const SvcJson = z.strictObject({
  name: z.string({ error: "must be a string" }).min(1, "must not be empty").max(100).optional(),
  runtime: z.literal("static", {
    error: (issue) =>
      issue.input === undefined ? 'is required and must be "static"' : `must be "static" (got ${JSON.stringify(issue.input)})`,
  }),
  buildCommand: z.string({ error: "must be a string" }).min(1, "must not be empty").max(100_000).optional(),
  outputDir: z
    .string({ error: "must be a string" })
    .refine(
      (path) => siteDir(path) !== null,
      'must be a folder inside the project: relative, without .. (e.g. dist), or "." for a plain folder served as it is',
    )
    .optional(),
  port: z.int({ error: "must be an integer" }).min(1, "must be 1–65535").max(65_535, "must be 1–65535").optional(),
  spa: z.boolean({ error: "must be true or false" }).optional(),
});
export type SvcJson = z.infer<typeof SvcJson>;

/** Parses svc.json's text; the error names the file and the field, and says what is accepted. */
export function parseSvcJson(text: string): { ok: true; config: SvcJson } | { ok: false; error: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { ok: false, error: `svc.json is not valid JSON (${error instanceof Error ? error.message : String(error)})` };
  }
  const parsed = SvcJson.safeParse(value);
  if (parsed.success) return { ok: true, config: parsed.data };
  const problems = parsed.error.issues.map((issue) => {
    if (issue.code === "unrecognized_keys") {
      const names = issue.keys.map((key) => `"${key}"`).join(", ");
      return `unknown field${issue.keys.length > 1 ? "s" : ""} ${names} (allowed: ${FIELDS.join(", ")})`;
    }
    if (issue.path.length === 0) return "must be a JSON object";
    return `field "${issue.path.join(".")}" ${issue.message}`;
  });
  return { ok: false, error: `svc.json: ${problems.join("; ")}` };
}
