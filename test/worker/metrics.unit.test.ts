import { describe, expect, it } from "vitest";
import { LATENCY_BOUNDS_MS, latencyBucket, percentile } from "../../durable-objects/app-metrics";
import { minuteBuckets } from "../../worker/sites/request-log";

describe("request metrics: buckets and percentiles", () => {
  it("puts each duration in the first bucket whose bound holds it, and reads percentiles at most one bucket high", () => {
    expect(latencyBucket(0)).toBe(0);
    expect(latencyBucket(1)).toBe(0);
    expect(LATENCY_BOUNDS_MS[latencyBucket(1.1)]).toBeGreaterThanOrEqual(1.1);
    for (const ms of [3, 17, 250, 1234, 50_000]) {
      const i = latencyBucket(ms);
      expect(LATENCY_BOUNDS_MS[i]).toBeGreaterThanOrEqual(ms);
      if (i > 0) expect(LATENCY_BOUNDS_MS[i - 1]).toBeLessThan(ms);
      expect(LATENCY_BOUNDS_MS[i]! / ms).toBeLessThan(1.2);
    }
    expect(latencyBucket(10_000_000)).toBe(LATENCY_BOUNDS_MS.length - 1);
    const histogram = new Array<number>(LATENCY_BOUNDS_MS.length).fill(0);
    // 90 fast requests (5 ms), 9 at 100 ms, 1 at 2 s.
    histogram[latencyBucket(5)] = 90;
    histogram[latencyBucket(100)] = 9;
    histogram[latencyBucket(2000)] = 1;
    expect(percentile(histogram, 0.5)).toBe(LATENCY_BOUNDS_MS[latencyBucket(5)]);
    expect(percentile(histogram, 0.95)).toBe(LATENCY_BOUNDS_MS[latencyBucket(100)]);
    expect(percentile(histogram, 0.999)).toBe(LATENCY_BOUNDS_MS[latencyBucket(2000)]);
    expect(percentile(new Array<number>(LATENCY_BOUNDS_MS.length).fill(0), 0.5)).toBeNull();
  });

  it("sums a flush's requests per app and minute, by status class, with their bytes", () => {
    const at = Date.UTC(2026, 10, 29, 5, 0, 30);
    const entry = (appId: string, offset: number, status: number, bytes = 10, durationMs = 3) => ({ appId, at: at + offset, method: "GET", path: "/", status, bytes, durationMs });
    const buckets = minuteBuckets([entry("a", 0, 200), entry("a", 1, 304, 0), entry("a", 2, 404), entry("a", 40_000, 503), entry("b", 0, 101)]);
    expect([...buckets.keys()].sort()).toEqual(["a", "b"]);
    const [first, second] = buckets.get("a")!;
    expect(first).toMatchObject({ at: Date.UTC(2026, 10, 29, 5, 0), requests: 3, s2xx: 1, s3xx: 1, s4xx: 1, s5xx: 0, bytes: 20 });
    expect(second).toMatchObject({ at: Date.UTC(2026, 10, 29, 5, 1), requests: 1, s5xx: 1 });
    expect(first!.latency[latencyBucket(3)]).toBe(3);
    expect(buckets.get("b")![0]).toMatchObject({ requests: 1, s2xx: 1 });
  });
});
