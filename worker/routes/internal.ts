import { Hono } from "hono";
import { JobStatus, NonceCache, verifyRequest } from "../../builder/src/protocol";
import type { AppEnv } from "../context";
import { ApiError } from "../lib/errors";
import { cronStub } from "../services/crons";

/** Nonces of accepted callbacks, per isolate; handlers are idempotent, so this only trims replays. */
const seen = new NonceCache(10_000);

/**
 * Endpoints the builder calls back; not part of the public API (no API key,
 * not in the OpenAPI document). Every request must carry a valid HMAC signature.
 */
export const internalRoutes = new Hono<AppEnv>();

internalRoutes.post("/builder/callback", async (c) => {
  const secret = c.get("config").BUILDER_SECRET;
  const body = await c.req.text();
  const url = new URL(c.req.url);
  const verdict = secret
    ? await verifyRequest({ secret, method: "POST", path: url.pathname + url.search, body, headers: c.req.raw.headers })
    : { ok: false as const, reason: "BUILDER_SECRET unset" };
  if (!verdict.ok || !seen.use(verdict.nonce, verdict.timestamp)) {
    throw new ApiError("UNAUTHORIZED", `invalid builder signature${verdict.ok ? " (replayed)" : `: ${verdict.reason}`}`);
  }
  const parsed = JobStatus.safeParse(JSON.parse(body));
  if (!parsed.success) throw new ApiError("VALIDATION_ERROR", "callback body is not a job status");
  const { kind, cronId } = parsed.data.labels;
  if (kind === "cron" && cronId) await cronStub(c.env, cronId).jobFinished(parsed.data);
  return c.body(null, 204);
});
