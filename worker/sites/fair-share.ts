/**
 * Each app's and each account's share of the edge (issue 28): requests to
 * apps that run wait in this isolate for their answer's head, and one app's
 * flood must not hold every connection and subrequest of the isolate while
 * another account's requests wait behind it. Past {@link EDGE_SHARE} the edge
 * answers 503 with Retry-After at once, without a lookup or a subrequest more.
 *
 * Counted per isolate (no shared state per request); the node behind each
 * app bounds the same app's requests and WebSockets over all isolates
 * (builder/src/processes/proxy.ts).
 */
export const EDGE_SHARE = {
  /** An app's requests waiting for their answer in one isolate. */
  perApp: 256,
  /** An account's, over all its apps. */
  perAccount: 512,
  /** Seconds a refused client is told to wait. */
  retryAfterSeconds: 1,
} as const;

const byApp = new Map<string, number>();
const byAccount = new Map<string, number>();

const count = (map: Map<string, number>, key: string, change: number) => {
  const next = (map.get(key) ?? 0) + change;
  if (next <= 0) map.delete(key);
  else map.set(key, next);
};

/**
 * Takes a slot for one request of `appId` (owned by `accountId`): the
 * function that gives it back, or the refusal to answer.
 */
export function takeSlot(appId: string, accountId: string): (() => void) | Response {
  const app = byApp.get(appId) ?? 0;
  const account = byAccount.get(accountId) ?? 0;
  if (app >= EDGE_SHARE.perApp || account >= EDGE_SHARE.perAccount) {
    const which = app >= EDGE_SHARE.perApp ? `this app has ${app} requests` : `this app's account has ${account} requests`;
    return new Response(`${which} waiting for an answer, as many as it may; retry in a moment\n`, {
      status: 503,
      headers: { "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store", "Retry-After": String(EDGE_SHARE.retryAfterSeconds) },
    });
  }
  count(byApp, appId, 1);
  count(byAccount, accountId, 1);
  let given = false;
  return () => {
    if (given) return;
    given = true;
    count(byApp, appId, -1);
    count(byAccount, accountId, -1);
  };
}
