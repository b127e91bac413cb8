import { describe, expect, it } from "vitest";
import { enter, REPORT_EVERY_MS } from "../../worker/sites/load-meter";

describe("the edge's load meter (scaling on load)", () => {
  it("reports the average of requests in flight over the time since its last report, once per interval", () => {
    const app = `app-${crypto.randomUUID()}`;
    const t0 = 1_000_000;
    // Two requests in flight for the whole first interval, one for half of it.
    const a = enter(app, t0);
    const b = enter(app, t0);
    const c = enter(app, t0);
    expect(c(t0 + REPORT_EVERY_MS / 2)).toBeNull();
    const report = b(t0 + REPORT_EVERY_MS);
    expect(report).toBeCloseTo(2.5, 5);
    // The next interval starts from there: one request for all of it.
    expect(a(t0 + 2 * REPORT_EVERY_MS)).toBeCloseTo(1, 5);
    // Idle since: a request after a long quiet time reports the quiet in its average.
    const d = enter(app, t0 + 10 * REPORT_EVERY_MS);
    expect(d(t0 + 10 * REPORT_EVERY_MS + 10)).toBeCloseTo(10 / (8 * REPORT_EVERY_MS + 10), 5);
  });
});
