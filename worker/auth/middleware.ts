import type { MiddlewareHandler } from "hono";
import type { AppEnv } from "../context";
import type { Scope } from "../db/schema";
import { ApiError } from "../lib/errors";
import { authenticate, needsTouch, touchKey } from "./authenticate";

/**
 * Rejects the request with 401 unless it carries a live API key, and with 429
 * once that key is over its rate limit (the Workers Rate Limiting binding);
 * sets `principal`.
 */
export const requireKey: MiddlewareHandler<AppEnv> = async (c, next) => {
  const now = Date.now();
  const db = c.get("db");
  const result = await authenticate(db, c.req.header("Authorization"), now);
  if (!result.ok) throw new ApiError("UNAUTHORIZED", result.message);
  const { success } = await c.env.API_RATE_LIMITER.limit({ key: result.principal.keyId });
  if (!success) {
    const period = c.get("config").API_RATE_LIMIT_PERIOD_SECONDS;
    throw new ApiError("RATE_LIMITED", `too many requests with this API key; retry in ${period} s`, undefined, undefined, {
      "Retry-After": String(period),
    });
  }
  c.set("principal", result.principal);
  if (needsTouch(result.lastUsedAt, now)) {
    c.executionCtx.waitUntil(
      touchKey(db, result.principal.keyId, now).catch((err: unknown) => {
        console.error(`[${c.get("requestId")}] lastUsedAt update failed`, err);
      }),
    );
  }
  await next();
};

/** Route middleware: 403 naming the missing scope. Runs before body validation. */
export function requireScope(scope: Scope): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (!c.get("principal").scopes.includes(scope)) {
      throw new ApiError("INSUFFICIENT_SCOPE", `this operation requires an API key with the "${scope}" scope`);
    }
    await next();
  };
}
