import { VERSION } from "./version.js";

/** One field-level problem of a VALIDATION_ERROR. */
export type ErrorDetail = { field: string; message: string };

/** Why a request failed: the API said no, nothing answered, or something that is not the API answered. */
export type Failure =
  | {
      kind: "api";
      status: number;
      error: { code: string; message: string; details: ErrorDetail[] };
      requestId?: string;
      retryAfter?: string;
    }
  | { kind: "network"; message: string }
  | { kind: "bad-response"; status: number; body: string };

/** Where the key came from, so an UNAUTHORIZED hint can say which one to fix. */
export type KeySource = "env" | "file" | "flag";

/** The API a client talks to and the command it serves. */
export type Target = { apiUrl: string; apiKey: string; keySource: KeySource; command: string };

/** Per-call context for error messages: what was being done, and fix-it hints that know the command's arguments. */
export type Call = {
  /** Completes "could not …", e.g. `create API key`. */
  what: string;
  /** Hints by error code that replace the generic ones (e.g. name the app in a list command). */
  hints?: Partial<Record<string, string>>;
  /** API field name → CLI flag, so VALIDATION_ERROR hints name the flag to fix. */
  flags?: Record<string, string>;
};

/** A failed API call, carrying everything the error report needs. */
export class RequestFailed extends Error {
  constructor(
    readonly what: string,
    readonly failure: Failure,
    readonly call: Call,
    readonly target: Target,
  ) {
    super(`could not ${what}`);
    this.name = "RequestFailed";
  }
}

const TIMEOUT_MS = 30_000;

/**
 * Encodes interpolated values as path segments, so an app name or id typed by
 * the user can never change which route is called: path`/v1/apps/${app}`.
 */
export function path(strings: TemplateStringsArray, ...values: string[]): string {
  return strings.reduce((acc, s, i) => acc + s + (i < values.length ? encodeURIComponent(values[i]!) : ""), "");
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Reads the `{error:{code,message,details}}` envelope, or undefined when the body is not one. */
function errorEnvelope(body: unknown): { code: string; message: string; details: ErrorDetail[] } | undefined {
  if (!isRecord(body) || !isRecord(body.error)) return undefined;
  const { code, message, details } = body.error;
  if (typeof code !== "string" || typeof message !== "string") return undefined;
  const list = Array.isArray(details)
    ? details.filter(isRecord).map((d) => ({ field: String(d.field ?? ""), message: String(d.message ?? "") }))
    : [];
  return { code, message, details: list };
}

/** Describes why fetch threw: connection refused, DNS, timeout. */
function networkMessage(err: unknown): string {
  if (err instanceof Error && err.name === "TimeoutError") return `no answer within ${TIMEOUT_MS / 1000} s`;
  const cause = err instanceof Error ? err.cause : undefined;
  if (cause instanceof Error) return cause.message;
  return err instanceof Error ? err.message : String(err);
}

/** Tries of one call whose connection failed (the API restarting, a kept-alive connection closed under it): 0.5, 1, 2 s apart. */
const NETWORK_ATTEMPTS = 4;

/**
 * Whether a call whose connection failed may go again: a read or an
 * idempotent change whenever the connection dropped without an answer, any
 * call when the connection was never made (nothing reached the API).
 */
function sentAgainSafely(method: string, err: unknown): boolean {
  if (err instanceof Error && err.name === "TimeoutError") return false;
  const code = err instanceof Error && err.cause instanceof Error ? (err.cause as NodeJS.ErrnoException).code : undefined;
  if (code === "ECONNREFUSED") return true;
  return ["GET", "HEAD", "PUT", "DELETE"].includes(method);
}

/**
 * The HTTP client of the platform API. Every call names what it does, so a
 * failure can be reported as "could not <what>" with the API's code and a hint;
 * API-key routes answer bare JSON, the other resources wrap it in `{data}`.
 */
export class ApiClient {
  constructor(readonly target: Target) {}

  /** Sends one request; resolves to the parsed JSON body (undefined for 204), rejects with RequestFailed. */
  async request(method: string, route: string, body: unknown, call: Call): Promise<unknown> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.target.apiKey}`,
      Accept: "application/json",
      "User-Agent": `svc-cli/${VERSION}`,
    };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response | null = null;
    let text = "";
    for (let attempt = 1; res === null; attempt++) {
      try {
        res = await fetch(`${this.target.apiUrl}${route}`, {
          method,
          headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(TIMEOUT_MS),
        });
        text = await res.text();
      } catch (err) {
        res = null;
        if (attempt >= NETWORK_ATTEMPTS || !sentAgainSafely(method, err)) {
          throw new RequestFailed(call.what, { kind: "network", message: networkMessage(err) }, call, this.target);
        }
        await new Promise((resolve) => setTimeout(resolve, 500 * 2 ** (attempt - 1)));
      }
    }
    let parsed: unknown;
    try {
      parsed = text === "" ? undefined : JSON.parse(text);
    } catch {
      throw this.badResponse(res.status, text, call);
    }
    if (res.ok) return parsed;
    const error = errorEnvelope(parsed);
    if (!error) throw this.badResponse(res.status, text, call);
    const failure: Failure = { kind: "api", status: res.status, error };
    const requestId = res.headers.get("X-Request-Id");
    const retryAfter = res.headers.get("Retry-After");
    if (requestId) failure.requestId = requestId;
    if (retryAfter) failure.retryAfter = retryAfter;
    throw new RequestFailed(call.what, failure, call, this.target);
  }

  /**
   * A call whose success body is bare JSON of type T (the API-key routes).
   * The type is the API's documented contract, not checked field by field.
   */
  async json<T>(method: string, route: string, body: unknown, call: Call): Promise<T> {
    return (await this.request(method, route, body, call)) as T;
  }

  /** A call whose success body is `{data: T}` (apps, env vars, disks); unwraps it. */
  async data<T>(method: string, route: string, body: unknown, call: Call): Promise<T> {
    const parsed = await this.request(method, route, body, call);
    if (!isRecord(parsed) || !("data" in parsed)) {
      throw this.badResponse(200, JSON.stringify(parsed) ?? "", call);
    }
    return parsed.data as T;
  }

  /**
   * A call whose success body is read as it arrives (a build log followed
   * live): resolves to the Response once its headers are in, with no time
   * limit on the body; a failure is reported like any other call's.
   */
  async stream(route: string, call: Call): Promise<Response> {
    const connect = new AbortController();
    const timer = setTimeout(() => connect.abort(new DOMException("timed out", "TimeoutError")), TIMEOUT_MS);
    let res: Response;
    try {
      res = await fetch(`${this.target.apiUrl}${route}`, {
        headers: { Authorization: `Bearer ${this.target.apiKey}`, Accept: "text/plain, application/json", "User-Agent": `svc-cli/${VERSION}` },
        signal: connect.signal,
      });
    } catch (err) {
      throw new RequestFailed(call.what, { kind: "network", message: networkMessage(err) }, call, this.target);
    } finally {
      clearTimeout(timer);
    }
    if (res.ok) return res;
    const text = await res.text().catch(() => "");
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      throw this.badResponse(res.status, text, call);
    }
    const error = errorEnvelope(parsed);
    if (!error) throw this.badResponse(res.status, text, call);
    throw new RequestFailed(call.what, { kind: "api", status: res.status, error }, call, this.target);
  }

  private badResponse(status: number, text: string, call: Call): RequestFailed {
    const body = text.length > 300 ? `${text.slice(0, 300)}…` : text;
    return new RequestFailed(call.what, { kind: "bad-response", status, body: body.trim() }, call, this.target);
  }
}
