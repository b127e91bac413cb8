import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "../../openapi/v1";
import { session } from "./session";

/**
 * The one place the dashboard talks to the API: the client generated from
 * `/v1/openapi.json` (openapi/v1.d.ts, the same types the CLI compiles
 * against), with the tab's key on every request. Nothing else calls `/v1`.
 */

/** The API's named schemas: App, Disk, Backup, Cron, Deployment, … */
export type Schemas = components["schemas"];

/** One field-level problem of a VALIDATION_ERROR. */
export type ErrorDetail = { field: string; message: string };

/** A failed call: the API's error code and message, or NETWORK when nothing answered. */
export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
    readonly details: ErrorDetail[] = [],
  ) {
    super(message);
    this.name = "ApiError";
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The `{error:{code,message,details}}` envelope of a failed response, whatever the family wraps around it. */
export function errorOf(status: number, body: unknown, text = ""): ApiError {
  const error = isRecord(body) ? body.error : undefined;
  if (isRecord(error) && typeof error.code === "string" && typeof error.message === "string") {
    const details = Array.isArray(error.details)
      ? error.details.filter(isRecord).map((d) => ({ field: String(d.field ?? ""), message: String(d.message ?? "") }))
      : [];
    return new ApiError(error.code, error.message, status, details);
  }
  return new ApiError(`HTTP_${status}`, text.trim().slice(0, 300) || `the server answered HTTP ${status}`, status);
}

async function errorFromResponse(response: Response): Promise<ApiError> {
  const text = await response.text().catch(() => "");
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return errorOf(response.status, body, text);
}

const withKey: Middleware = {
  onRequest({ request }) {
    const key = session.key();
    if (key !== null) request.headers.set("Authorization", `Bearer ${key}`);
    return request;
  },
  async onResponse({ request, response }) {
    // A deleted or expired key is refused at once: back to sign-in with the API's reason.
    if (response.status === 401 && request.headers.has("Authorization")) {
      const error = await errorFromResponse(response.clone());
      session.expire({ code: error.code, message: error.message });
    }
    return response;
  },
};

export const api = createClient<paths>({ baseUrl: location.origin });
api.use(withKey);

type Outcome = { data?: unknown; error?: unknown; response: Response };

/**
 * Resolves to the body of a successful call, else throws {@link ApiError}
 * carrying the API's code and message (NETWORK when the request never got an
 * answer), for the page to show next to what caused it.
 */
export async function ok<R extends Outcome>(call: Promise<R>): Promise<NonNullable<R["data"]>> {
  let outcome: R;
  try {
    outcome = await call;
  } catch (err) {
    throw new ApiError("NETWORK", `the API could not be reached: ${err instanceof Error ? err.message : String(err)}`, 0);
  }
  if (!outcome.response.ok) {
    const { error } = outcome;
    throw errorOf(outcome.response.status, error, typeof error === "string" ? error : "");
  }
  return outcome.data as NonNullable<R["data"]>;
}

/** An error of any kind as an {@link ApiError}, so every failure shows the same way. */
export function asApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  return new ApiError(err instanceof Error ? err.name : "ERROR", err instanceof Error ? err.message : String(err), 0);
}
