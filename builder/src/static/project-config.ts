/**
 * `svc.json`, the project configuration (spec, "Static-site project
 * configuration", plus the fields of apps that run: DESIGN §9). Strict on
 * purpose: a misspelt field (`outputdir`) silently ignored would build and
 * serve the wrong folder, so unknown fields are refused by name, as are values
 * of the wrong type and fields that do not fit the runtime (`outputDir` on a
 * node app, `startCommand` on a static site, `port` on a worker). The builder
 * and the CLI (`svc init`, `svc deploy`'s checks) share this parser.
 */
import { z } from "zod";
import { ProcessType, ServerRuntime } from "../protocol/processes.js";
import { siteDir } from "../protocol/static.js";

const FIELDS = [
  "name",
  "runtime",
  "type",
  "buildCommand",
  "startCommand",
  "outputDir",
  "spa",
  "port",
  "healthCheckPath",
  "startTimeoutSeconds",
  "minReadySeconds",
  "overlap",
  "instances",
  "keepDevDependencies",
] as const;

/** Every runtime svc.json may name: `static`, or one that runs a process. */
export const RUNTIMES = ["static", ...ServerRuntime.options] as const;
export type Runtime = (typeof RUNTIMES)[number];

const RUNTIME_LIST = RUNTIMES.map((runtime) => `"${runtime}"`).join(", ");
const command = z.string({ error: "must be a string" }).min(1, "must not be empty").max(100_000).refine((value) => !value.includes("\0"), "must not contain NUL");

/** How long a web process may take to become ready (svc.json `startTimeoutSeconds`). */
export const MIN_START_TIMEOUT_SECONDS = 5;
export const MAX_START_TIMEOUT_SECONDS = 600;

/** Fields only a static site has, and fields only a server app has (and, of those, only a web process). */
const STATIC_ONLY = ["outputDir", "spa"] as const;
const SERVER_ONLY = ["type", "startCommand", "healthCheckPath", "startTimeoutSeconds", "minReadySeconds", "overlap", "instances"] as const;
const WEB_ONLY = ["port", "healthCheckPath", "startTimeoutSeconds"] as const;

/** The fields svc.json may hold; `runtime` is the only required one. */
export const SvcJson = z
  .strictObject({
    name: z.string({ error: "must be a string" }).min(1, "must not be empty").max(100).optional(),
    runtime: z.enum(RUNTIMES, {
      error: (issue) =>
        issue.input === undefined ? `is required: one of ${RUNTIME_LIST}` : `must be one of ${RUNTIME_LIST} (got ${JSON.stringify(issue.input)})`,
    }),
    /** Server apps: `web` (listens on `port`, default) or `worker` (no port). */
    type: z.enum(ProcessType.options, { error: 'must be "web" or "worker"' }).optional(),
    buildCommand: command.optional(),
    /** Server apps: what runs, with `/bin/sh -c` in the app's folder. */
    startCommand: command.optional(),
    outputDir: z
      .string({ error: "must be a string" })
      .refine(
        (path) => siteDir(path) !== null,
        'must be a folder inside the project: relative, without .. (e.g. dist), or "." for a plain folder served as it is',
      )
      .optional(),
    /** Static sites: the generated web server's port; web apps: the port the app listens on (given in PORT). */
    port: z.int({ error: "must be an integer" }).min(1, "must be 1–65535").max(65_535, "must be 1–65535").optional(),
    spa: z.boolean({ error: "must be true or false" }).optional(),
    /** Web apps: a path answered with 2xx once the app is ready for traffic. */
    healthCheckPath: z
      .string({ error: "must be a string" })
      .max(1024)
      .regex(/^\/[\x21-\x7e]*$/, "must be a path starting with / (no spaces or control characters), e.g. /healthz")
      .optional(),
    /** Web apps: seconds a starting process has to pass its health check (default 60). */
    startTimeoutSeconds: z
      .int({ error: "must be an integer" })
      .min(MIN_START_TIMEOUT_SECONDS, `must be ${MIN_START_TIMEOUT_SECONDS}–${MAX_START_TIMEOUT_SECONDS}`)
      .max(MAX_START_TIMEOUT_SECONDS, `must be ${MIN_START_TIMEOUT_SECONDS}–${MAX_START_TIMEOUT_SECONDS}`)
      .optional(),
    /**
     * Seconds a new release's process must stay up once ready before it counts
     * as deployed (default 10 for a worker, 0 for a web app); one that dies
     * sooner fails its deploy.
     */
    minReadySeconds: z.int({ error: "must be an integer" }).min(0, "must be 0–600").max(600, "must be 0–600").optional(),
    /** Workers: run the new release beside the old one during a deploy (default: the old one stops first). */
    overlap: z.boolean({ error: "must be true or false" }).optional(),
    /** Apps that run: how many processes serve the app, set on each deploy (default: as the app has it; `svc apps scale`). */
    instances: z.int({ error: "must be an integer" }).min(1, "must be 1–100").max(100, "must be 1–100").optional(),
    /** Node apps: keep devDependencies in the release (default: pruned after the build). */
    keepDevDependencies: z.boolean({ error: "must be true or false" }).optional(),
  })
  .superRefine((config, ctx) => {
    const misplaced = (field: string, why: string) => ctx.addIssue({ code: "custom", path: [field], message: why });
    if (config.runtime === "static") {
      for (const field of SERVER_ONLY) {
        if (config[field] !== undefined) misplaced(field, 'is for apps that run (runtime "node", "python" or "custom"), not static sites');
      }
      return;
    }
    for (const field of STATIC_ONLY) {
      if (config[field] !== undefined) misplaced(field, `is for static sites (runtime "static"); a ${config.runtime} app keeps its whole folder and runs startCommand`);
    }
    if (config.type === "worker") {
      for (const field of WEB_ONLY) {
        if (config[field] !== undefined) misplaced(field, 'is for web processes; a worker ("type": "worker") listens on no port and has no health check');
      }
    } else if (config.overlap !== undefined) {
      misplaced("overlap", 'is for workers ("type": "worker"); a web app\'s new release always starts beside the old one');
    }
    if (config.keepDevDependencies !== undefined && config.runtime !== "node") misplaced("keepDevDependencies", 'is for node apps (runtime "node")');
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

/**
 * Why svc.json cannot build for an app of `runtime` (the app's runtime is
 * chosen when it is created, so svc.json must agree with it), or null.
 */
export function runtimeMismatch(config: SvcJson | null, runtime: Runtime): string | null {
  if (config === null || config.runtime === runtime) return null;
  return (
    `svc.json says "runtime": "${config.runtime}" but the app's runtime is ${runtime}: ` +
    `set "runtime": "${runtime}" in svc.json, or deploy to an app created with --runtime ${config.runtime}`
  );
}
