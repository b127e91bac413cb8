import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { configOf } from "../../worker/env";
import { presign } from "../../worker/storage/presign";

const config = () => configOf(env);
const send = (url: string, init: RequestInit = {}) => exports.default.fetch(new Request(url, init));
const bytes = (n: number, seed = 7) => Uint8Array.from({ length: n }, (_, i) => (i * seed + 3) % 251);

async function errorCode(res: Response): Promise<string> {
  return ((await res.json()) as { error: { code: string } }).error.code;
}

describe("/storage gateway (presigned URLs over the R2 binding)", () => {
  it("accepts a presigned PUT of exactly the signed size, then serves GET, HEAD and Range", async () => {
    const key = `test/${crypto.randomUUID()}.bin`;
    const body = bytes(1000);
    const put = await presign(config(), { method: "PUT", key, expiresInSeconds: 3600, contentLength: body.byteLength });
    const stored = await send(put.url, { method: "PUT", body, headers: { "Content-Length": "1000" } });
    expect(stored.status).toBe(200);
    expect(stored.headers.get("ETag")).toMatch(/^".+"$/);
    expect((await env.BUCKET.get(key))?.size).toBe(1000);

    const get = await presign(config(), { method: "GET", key, expiresInSeconds: 3600 });
    const whole = await send(get.url);
    expect(whole.status).toBe(200);
    expect(new Uint8Array(await whole.arrayBuffer())).toEqual(body);
    const part = await send(get.url, { headers: { Range: "bytes=10-19" } });
    expect(part.status).toBe(206);
    expect(part.headers.get("Content-Range")).toBe("bytes 10-19/1000");
    expect(new Uint8Array(await part.arrayBuffer())).toEqual(body.slice(10, 20));
    const suffix = await send(get.url, { headers: { Range: "bytes=-5" } });
    expect(suffix.headers.get("Content-Range")).toBe("bytes 995-999/1000");

    const head = await presign(config(), { method: "HEAD", key, expiresInSeconds: 3600 });
    const headRes = await send(head.url, { method: "HEAD" });
    expect(headRes.status).toBe(200);
    expect(headRes.headers.get("Content-Length")).toBe("1000");
  });

  it("answers an expired URL (signed two hours ago) with 403 PRESIGNED_URL_EXPIRED", async () => {
    const key = `test/${crypto.randomUUID()}`;
    await env.BUCKET.put(key, "data");
    const old = await presign(config(), { method: "GET", key, expiresInSeconds: 3600, now: Date.now() - 2 * 3_600_000 });
    const res = await send(old.url);
    expect(res.status).toBe(403);
    expect(await errorCode(res)).toBe("PRESIGNED_URL_EXPIRED");
  });

  it("refuses a tampered signature, another key, another method, and a wrong Content-Length with 403", async () => {
    const key = `test/${crypto.randomUUID()}`;
    await env.BUCKET.put(key, "secret");
    const get = await presign(config(), { method: "GET", key, expiresInSeconds: 3600 });
    const sig = new URL(get.url).searchParams.get("X-Amz-Signature")!;
    const flipped = get.url.replace(sig, `${sig.slice(0, -1)}${sig.endsWith("0") ? "1" : "0"}`);
    const otherKey = get.url.replace(encodeURIComponent(key.split("/")[1]!), "other");
    const put = await presign(config(), { method: "PUT", key: `test/${crypto.randomUUID()}`, expiresInSeconds: 3600, contentLength: 4 });
    const attempts: [string, Promise<Response>][] = [
      ["tampered signature", send(flipped)],
      ["other key", send(otherKey)],
      ["GET URL used to PUT", send(get.url, { method: "PUT", body: "abcd" })],
      ["PUT URL used to GET", send(put.url)],
      ["wrong Content-Length", send(put.url, { method: "PUT", body: "abcde" })],
      ["no signature", send(get.url.split("?")[0]!)],
      ["longer expiry than signed", send(get.url.replace("X-Amz-Expires=3600", "X-Amz-Expires=7200"))],
    ];
    for (const [label, pending] of attempts) {
      const res = await pending;
      expect(res.status, label).toBe(403);
      expect(await errorCode(res), label).toBe("FORBIDDEN");
    }
    expect(await (await env.BUCKET.get(key))!.text()).toBe("secret");
  });

  it("uploads multipart parts through part URLs", async () => {
    const key = `test/${crypto.randomUUID()}`;
    const upload = await env.BUCKET.createMultipartUpload(key);
    const first = bytes(5 * 1024 * 1024, 3);
    const second = bytes(1234, 5);
    const etags: { partNumber: number; etag: string }[] = [];
    for (const [i, part] of [first, second].entries()) {
      const { url } = await presign(config(), {
        method: "PUT",
        key,
        expiresInSeconds: 3600,
        contentLength: part.byteLength,
        query: { partNumber: String(i + 1), uploadId: upload.uploadId },
      });
      const res = await send(url, { method: "PUT", body: part });
      expect(res.status).toBe(200);
      etags.push({ partNumber: i + 1, etag: res.headers.get("ETag")!.replaceAll('"', "") });
    }
    await upload.complete(etags);
    expect((await env.BUCKET.head(key))?.size).toBe(first.byteLength + second.byteLength);
  });

  it("stores bytes under a content address only when they hash to it (signed x-amz-checksum-sha256)", async () => {
    const key = `blobs/acct_x/${crypto.randomUUID()}`;
    const good = new TextEncoder().encode("the real bytes");
    const digest = [...new Uint8Array(await crypto.subtle.digest("SHA-256", good))].map((b) => b.toString(16).padStart(2, "0")).join("");
    const base64 = btoa(String.fromCharCode(...new Uint8Array(await crypto.subtle.digest("SHA-256", good))));
    const put = await presign(config(), { method: "PUT", key, expiresInSeconds: 3600, contentLength: good.byteLength, sha256: digest });
    expect(new URL(put.url).searchParams.get("X-Amz-SignedHeaders")).toBe("content-length;host;x-amz-checksum-sha256");

    const planted = new TextEncoder().encode("planted bytes!");
    expect(planted.byteLength).toBe(good.byteLength);
    const forged = await send(put.url, { method: "PUT", body: planted, headers: { "x-amz-checksum-sha256": base64 } });
    expect(forged.status).toBe(400);
    expect(await errorCode(forged)).toBe("CHECKSUM_MISMATCH");
    const relabelled = await send(put.url, {
      method: "PUT",
      body: planted,
      headers: { "x-amz-checksum-sha256": btoa(String.fromCharCode(...new Uint8Array(await crypto.subtle.digest("SHA-256", planted)))) },
    });
    expect(relabelled.status, "a checksum other than the signed one breaks the signature").toBe(403);
    const missing = await send(put.url, { method: "PUT", body: planted });
    expect(missing.status, "the signed checksum header cannot be left out").toBe(403);
    expect(await env.BUCKET.head(key)).toBeNull();

    const stored = await send(put.url, { method: "PUT", body: good, headers: { "x-amz-checksum-sha256": base64 } });
    expect(stored.status).toBe(200);
    expect(await (await env.BUCKET.get(key))!.text()).toBe("the real bytes");
  });
});
