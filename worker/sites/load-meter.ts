/**
 * What scaling on load measures (docs/apps.md, "Scaling on load"): per app,
 * the requests this isolate has in flight to its processes, averaged over
 * time. Counted in the isolate with no I/O per request; every
 * {@link REPORT_EVERY_MS} a request of the app carries the average since the
 * last report to the app's object, off the request (`waitUntil`). An isolate
 * that gets no more requests sends nothing: the object counts a silent
 * isolate's last report as stale after a while, so load that stops is seen to.
 */

/** How often an isolate reports an app's load (at most; only while it has requests). */
export const REPORT_EVERY_MS = 2_000;
/** Apps metered at once per isolate (a flood of apps cannot grow it without bound). */
const MAX_METERED = 10_000;

/** An isolate's name in its reports: the object keeps one report per isolate (made on first use: not at global scope, where Workers refuse randomness). */
let isolate: string | null = null;
export function isolateName(): string {
  isolate ??= crypto.randomUUID();
  return isolate;
}

type Meter = { inFlight: number; area: number; changedAt: number; since: number };

const meters = new Map<string, Meter>();

function meter(appId: string, now: number): Meter {
  let found = meters.get(appId);
  if (!found) {
    if (meters.size >= MAX_METERED) meters.delete(meters.keys().next().value!);
    found = { inFlight: 0, area: 0, changedAt: now, since: now };
    meters.set(appId, found);
  }
  return found;
}

function change(found: Meter, by: number, now: number): void {
  found.area += found.inFlight * (now - found.changedAt);
  found.changedAt = now;
  found.inFlight += by;
}

/**
 * A request of the app starts; the answer is called when it ends, with the
 * average in flight since the last report when one is due (else null).
 */
export function enter(appId: string, now = Date.now()): (end?: number) => number | null {
  const found = meter(appId, now);
  change(found, 1, now);
  return (end = Date.now()) => {
    change(found, -1, end);
    if (end - found.since < REPORT_EVERY_MS) return null;
    const average = found.area / (end - found.since);
    found.area = 0;
    found.since = end;
    return average;
  };
}
