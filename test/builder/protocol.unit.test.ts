import { describe, expect, it } from "vitest";
import { JobSpec, parseLogLine } from "../../builder/src/protocol/jobs.js";
import { HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, NonceCache, SIGNATURE_WINDOW_SECONDS, signRequest, verifyRequest } from "../../builder/src/protocol/signing.js";

const secret = "unit-test-secret-0123456789";
const asHeaders = (record: Record<string, string>) => new Headers(record);

describe("signRequest / verifyRequest", () => {
  it("accepts a request signed with the same secret, method, path and body", async () => {
    const headers = await signRequest({ secret, method: "POST", path: "/v1/jobs?x=1", body: '{"a":1}' });
    expect(Object.keys(headers).sort()).toEqual([HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP].sort());
    expect(headers[HEADER_NONCE]).toMatch(/^[0-9a-f]{32}$/);
    const result = await verifyRequest({ secret, method: "post", path: "/v1/jobs?x=1", body: '{"a":1}', headers: asHeaders(headers) });
    expect(result).toMatchObject({ ok: true, nonce: headers[HEADER_NONCE] });
  });

  it("treats a string body and its UTF-8 bytes alike", async () => {
    const headers = await signRequest({ secret, method: "PUT", path: "/v1/disks/d", body: "ünïcode" });
    const bytes = new TextEncoder().encode("ünïcode");
    expect(await verifyRequest({ secret, method: "PUT", path: "/v1/disks/d", body: bytes, headers: asHeaders(headers) })).toMatchObject({
      ok: true,
    });
  });

  it("rejects a changed body, path, method or secret", async () => {
    const headers = asHeaders(await signRequest({ secret, method: "POST", path: "/v1/jobs", body: "a" }));
    const base = { secret, method: "POST", path: "/v1/jobs", body: "a", headers };
    for (const change of [{ body: "b" }, { path: "/v1/jobs?x" }, { method: "PUT" }, { secret: "another-secret-0123456789" }]) {
      expect(await verifyRequest({ ...base, ...change })).toEqual({ ok: false, reason: "signature does not match" });
    }
  });

  it("rejects missing headers and timestamps outside the window", async () => {
    expect(await verifyRequest({ secret, method: "GET", path: "/", headers: asHeaders({}) })).toMatchObject({ ok: false });
    const now = 2_000_000_000;
    const stale = asHeaders(await signRequest({ secret, method: "GET", path: "/", timestamp: now - SIGNATURE_WINDOW_SECONDS - 1 }));
    expect(await verifyRequest({ secret, method: "GET", path: "/", headers: stale, now })).toEqual({
      ok: false,
      reason: "timestamp outside the 300 s window",
    });
    const edge = asHeaders(await signRequest({ secret, method: "GET", path: "/", timestamp: now - SIGNATURE_WINDOW_SECONDS }));
    expect(await verifyRequest({ secret, method: "GET", path: "/", headers: edge, now })).toMatchObject({ ok: true });
  });
});

describe("NonceCache", () => {
  it("refuses a nonce seen inside the window and forgets it afterwards", () => {
    const cache = new NonceCache();
    expect(cache.use("a", 1000, 1000)).toBe(true);
    expect(cache.use("a", 1000, 1100)).toBe(false);
    expect(cache.use("a", 1000, 1000 + SIGNATURE_WINDOW_SECONDS + 1)).toBe(true);
  });

  it("evicts expired entries and stays within its capacity", () => {
    const cache = new NonceCache(3);
    for (const nonce of ["a", "b", "c"]) cache.use(nonce, 1000, 1000);
    cache.use("d", 1000, 1000);
    expect(cache.size).toBe(3);
    cache.use("e", 2000, 2000);
    expect(cache.size).toBe(1);
  });
});

describe("JobSpec", () => {
  it("rejects env names a shell cannot take and limits outside their ranges", () => {
    const base = { tenant: "acct_1", command: "true", env: {}, timeoutSeconds: 10, memoryMb: 64 };
    expect(JobSpec.safeParse(base).success).toBe(true);
    expect(JobSpec.safeParse({ ...base, tenant: "../x" }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, disk: { id: "d", mountPath: "/data/../etc", sizeBytes: 1 } }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, env: { "1BAD": "x" } }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, timeoutSeconds: 43_201 }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, memoryMb: 8 }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, disk: { id: "../etc", mountPath: "/data", sizeBytes: 1 } }).success).toBe(false);
    expect(JobSpec.safeParse({ ...base, sourceUrl: "file:///etc/passwd" }).success).toBe(false);
  });
});

describe("parseLogLine", () => {
  it("splits a record into time, stream and text", () => {
    expect(parseLogLine("2026-11-21T10:00:00.000Z err sh: 1: x: not found")).toEqual({
      time: "2026-11-21T10:00:00.000Z",
      stream: "err",
      text: "sh: 1: x: not found",
    });
    expect(parseLogLine("garbage")).toBeNull();
  });
});
