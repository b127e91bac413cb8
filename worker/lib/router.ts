import { OpenAPIHono, z } from "@hono/zod-openapi";
import type { AppEnv } from "../context";
import { ApiError, type ErrorCode, type ErrorDetail } from "./errors";

const LOCATIONS: Record<string, string> = { json: "", query: "query.", param: "path.", header: "header." };

/** Turns zod issues into `details`, one entry per failing field. */
export function detailsOf(target: string, issues: readonly z.core.$ZodIssue[]): ErrorDetail[] {
  const prefix = LOCATIONS[target] ?? `${target}.`;
  return issues.map((issue) => ({
    field: `${prefix}${issue.path.map(String).join(".")}` || "body",
    message: issue.message,
  }));
}

/**
 * A refinement whose failure has its own error code (e.g. INVALID_CRON_EXPRESSION)
 * rather than VALIDATION_ERROR; `prefix` starts the error message.
 */
export function codedIssue(code: ErrorCode, prefix: string, message: string) {
  return { code: "custom" as const, message, params: { apiCode: code, prefix } };
}

function codedOf(issues: readonly z.core.$ZodIssue[]): { code: ErrorCode; prefix: string; message: string } | null {
  for (const issue of issues) {
    if (issue.code === "custom" && typeof issue.params?.apiCode === "string") {
      return { code: issue.params.apiCode as ErrorCode, prefix: String(issue.params.prefix), message: issue.message };
    }
  }
  return null;
}

/**
 * Every router is built here so that validation failures of body, query and
 * path parameters become the same 400 envelope: VALIDATION_ERROR, or the code
 * a refinement asked for through {@link codedIssue}.
 */
export function newRouter(): OpenAPIHono<AppEnv> {
  return new OpenAPIHono<AppEnv>({
    defaultHook: (result) => {
      if (!result.success) {
        const details = detailsOf(result.target, result.error.issues);
        const coded = codedOf(result.error.issues);
        if (coded) throw new ApiError(coded.code, `${coded.prefix}: ${coded.message}`, details);
        const summary = details.map((d) => `${d.field}: ${d.message}`).join("; ");
        throw new ApiError("VALIDATION_ERROR", `invalid request: ${summary}`, details);
      }
    },
  });
}

export const ErrorSchema = z
  .object({
    error: z.object({
      code: z.string().openapi({ example: "VALIDATION_ERROR" }),
      message: z.string(),
      details: z.array(z.object({ field: z.string(), message: z.string() })).optional(),
    }),
  })
  .openapi("Error");

const errorResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: ErrorSchema } },
});

/** Error responses shared by authenticated routes, for the OpenAPI document. */
export const authErrors = {
  400: errorResponse("Invalid request (VALIDATION_ERROR)"),
  401: errorResponse("Missing, malformed, unknown, deleted or expired API key (UNAUTHORIZED)"),
  403: errorResponse("The key lacks the required scope (INSUFFICIENT_SCOPE)"),
  429: errorResponse("Too many requests with this key (RATE_LIMITED); Retry-After says when to try again"),
} as const;

export { errorResponse };

export const jsonBody = <T extends z.ZodType>(schema: T) => ({
  required: true,
  content: { "application/json": { schema } },
});

/**
 * Headers of a response streamed as it is produced (a followed log). Cloudflare's
 * edge, and Miniflare imitating it, gzip text for clients that accept it, and
 * the compressor holds the stream until it has a block to send, so lines would
 * arrive all at once at the end. A response that already names its encoding is
 * left alone, and `no-transform` asks every proxy on the way to do the same.
 */
export const UNCOMPRESSED_STREAM = {
  "Content-Encoding": "identity",
  "Cache-Control": "no-store, no-transform",
  "X-Accel-Buffering": "no",
} as const;

/** The 403 of a creation the account's plan may refuse, beside the scope refusal. */
export const planLimited = {
  403: errorResponse("The key lacks the required scope (INSUFFICIENT_SCOPE), or the plan's limit is reached (PLAN_LIMIT_EXCEEDED)"),
} as const;
