/**
 * Each app's and each account's share of the edge (issue 28): requests to
 * apps that run wait in this isolate for their answer's head, and one app's
 * flood must not hold every connection and subrequest of the isolate while
 * another account's requests wait behind it. Past {@link EDGE_SHARE} the edge
 * answers 503 with Retry-After at once, without a lookup or a subrequest more.
 *
 * Counted per isolate (no shared state per request); the node behind each
 * app bounds the same app's requests and WebSockets over all isolates
 * (builder/src/processes/proxy.ts). A slot is given back when the answer's
 * head is there, when the client goes away (`request.signal`), and in any
 * case once it is older than the longest an edge waits for an answer: an
 * invocation cut short never holds one for good.
 */
export const EDGE_SHARE = {
  /** An app's requests waiting for their answer in one isolate. */
  perApp: 256,
  /** An account's, over all its apps. */
  perAccount: 512,
  /** Seconds a refused client is told to wait. */
  retryAfterSeconds: 1,
  /** Cloudflare gives up on an origin's answer after 100 s: a slot older than this is held by nobody. */
  staleMs: 100_000,
} as const;

/** Slots taken and not given back, per app and per account: when each was taken. */
const byApp = new Map<string, Set<{ at: number }>>();
const byAccount = new Map<string, Set<{ at: number }>>();

function held(map: Map<string, Set<{ at: number }>>, key: string, now: number): Set<{ at: number }> {
  let slots = map.get(key);
  if (!slots) {
    slots = new Set();
    map.set(key, slots);
  }
  if (slots.size > 0) for (const slot of slots) if (now - slot.at > EDGE_SHARE.staleMs) slots.delete(slot);
  return slots;
}

/**
 * Takes a slot for one request of `appId` (owned by `accountId`): the
 * function that gives it back (also called when `signal` aborts), or the
 * refusal to answer.
 */
export function takeSlot(appId: string, accountId: string, signal?: AbortSignal, now = Date.now()): (() => void) | Response {
  const app = held(byApp, appId, now);
  const account = held(byAccount, accountId, now);
  if (app.size >= EDGE_SHARE.perApp || account.size >= EDGE_SHARE.perAccount) {
    const which = app.size >= EDGE_SHARE.perApp ? `this app has ${app.size} requests` : `this app's account has ${account.size} requests`;
    return new Response(`${which} waiting for an answer, as many as it may; retry in a moment\n`, {
      status: 503,
      headers: { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store", "Retry-After": String(EDGE_SHARE.retryAfterSeconds) },
    });
  }
  const slot = { at: now };
  app.add(slot);
  account.add(slot);
  const giveBack = () => {
    app.delete(slot);
    account.delete(slot);
    if (app.size === 0) byApp.delete(appId);
    if (account.size === 0) byAccount.delete(accountId);
    signal?.removeEventListener("abort", giveBack);
  };
  signal?.addEventListener("abort", giveBack, { once: true });
  return giveBack;
}
