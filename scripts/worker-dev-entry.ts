/**
 * The Worker as the local stack runs it (scripts/worker-dev.ts bundles this
 * file): worker/index.ts unchanged, plus one route for the local cron
 * triggers. `GET /__scheduled?cron=<expr>` runs `scheduled()` as Cloudflare's
 * trigger does (`controller.cron` is the expression), waits for the work it
 * handed to `waitUntil`, and answers `ok`, or 500 with what failed. This is
 * `wrangler dev --test-scheduled`'s route, answered honestly (wrangler says
 * "Ran scheduled event" whatever happened); Miniflare's own
 * `/cdn-cgi/handler/scheduled` reaches only the assets router in front of a
 * Worker with `run_worker_first`, which has no `scheduled()`.
 *
 * And a small request body the Worker did not read (a refusal before the body
 * mattered, a route that takes none) is read to its end before the answer:
 * local workerd otherwise closes the kept-alive connection under the client's
 * next request (undici "other side closed", ECONNRESET: 6 of 200 POSTs to one
 * connection). A large one is left unread and its connection ends, as any
 * server does after refusing a body. In production Cloudflare's edge holds the
 * client's connection, so neither is in the Worker `wrangler deploy` ships.
 */
import type { Env, WebhookMessage } from "../worker/env";
import worker from "../worker/index";
import { SCHEDULED_PATH } from "./scheduled-route";

export * from "../worker/index";

/** The largest request body read to its end when the Worker did not read it. */
const UNREAD_BODY_DRAIN_BYTES = 64 * 1024;

/** `scheduled()` for the cron in `url`, its `waitUntil` work waited for: `ok`, or 500 with what failed. */
async function runScheduled(url: URL, env: Env, ctx: ExecutionContext): Promise<Response> {
  const pending: Promise<unknown>[] = [];
  const controller: ScheduledController = { cron: url.searchParams.get("cron") ?? "", scheduledTime: Date.now(), noRetry() {} };
  // The request's context, but the work handed to waitUntil is waited for here.
  const waiting: ExecutionContext = Object.create(ctx, { waitUntil: { value: (promise: Promise<unknown>) => void pending.push(promise) } });
  worker.scheduled(controller, env, waiting);
  const failed = (await Promise.allSettled(pending)).filter((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed.length === 0) return new Response("ok");
  for (const f of failed) console.error("scheduled() failed:", f.reason);
  return new Response(`scheduled() failed: ${failed.map((f) => String(f.reason)).join("; ")}`, { status: 500 });
}

export default {
  ...worker,
  async fetch(request: Request, env: Env, ctx: ExecutionContext): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname === SCHEDULED_PATH) return runScheduled(url, env, ctx);
    const response = await worker.fetch(request, env, ctx);
    const length = Number(request.headers.get("Content-Length") ?? Number.POSITIVE_INFINITY);
    if (request.body && !request.bodyUsed && length <= UNREAD_BODY_DRAIN_BYTES) await request.arrayBuffer().catch(() => undefined);
    return response;
  },
} satisfies ExportedHandler<Env, WebhookMessage>;
