import { describe, expect, it } from "vitest";
import { compressible, gzip, prefersGzip } from "../../worker/sites/encoding";
import { get, HTML, newSite, sha256 } from "./sites-helpers";

const JS = "text/javascript; charset=utf-8";
/** 8 KiB of script that gzip shrinks. */
const script = Array.from({ length: 200 }, (_, i) => `export const value${i} = "${String(i).repeat(20)}";`).join("\n").slice(0, 8192);

/** What goes on the wire for it: a reader in the same process gets the body decoded, so the length tells. */
const gzipLength = async (text: string) => String((await gzip(new TextEncoder().encode(text))).byteLength);

describe("which clients get gzip (the edge's own rule)", () => {
  it("picks the first of gzip and br by weight, then order; identity first or q=0 means none", () => {
    expect(prefersGzip("gzip, deflate, br")).toBe(true); // Node's fetch
    expect(prefersGzip("gzip, deflate, br, zstd")).toBe(true); // Chromium
    expect(prefersGzip("br, gzip")).toBe(false);
    expect(prefersGzip("gzip;q=0.5, br")).toBe(false);
    expect(prefersGzip("br;q=0, gzip;q=0.1")).toBe(true);
    expect(prefersGzip("gzip;q=0")).toBe(false);
    expect(prefersGzip("identity, gzip")).toBe(false);
    expect(prefersGzip("deflate")).toBe(false);
    expect(prefersGzip("GZIP")).toBe(true);
    expect(prefersGzip(" ,;q=1, gzip;q=abc, br;q=1.5")).toBe(false);
    expect(prefersGzip("br;q=0.9, gzip;q=1.000")).toBe(true);
    expect(prefersGzip("")).toBe(false);
    expect(prefersGzip(null)).toBe(false);
  });

  it("compresses the types Cloudflare compresses, nothing else", () => {
    for (const type of [JS, HTML, "text/css", "application/json", "image/svg+xml", "application/wasm"]) expect(compressible(type), type).toBe(true);
    for (const type of ["image/png", "font/woff2", "application/octet-stream", "application/gzip", "video/mp4"]) expect(compressible(type), type).toBe(false);
  });
});

describe("a hot text file, gzip-encoded once and sent as it is", () => {
  it("goes out gzip to a client whose first choice is gzip: the same bytes, a weak ETag, Vary, the encoded length", async () => {
    const site = await newSite(false, { "/app.js": [JS, script] });
    const etag = `"${await sha256(script)}"`;
    for (let i = 0; i < 2; i++) {
      // The second answer comes from the copy kept in the isolate.
      const res = await get(site.name, "/app.js", { headers: { "Accept-Encoding": "gzip, deflate, br" } });
      expect(res.status).toBe(200);
      expect(res.headers.get("Content-Encoding")).toBe("gzip");
      expect(res.headers.get("Vary")).toBe("Accept-Encoding");
      expect(res.headers.get("ETag")).toBe(`W/${etag}`);
      expect(res.headers.get("Content-Length")).toBe(await gzipLength(script));
      expect(Number(res.headers.get("Content-Length"))).toBeLessThan(script.length / 2);
      expect(await res.text()).toBe(script);
    }
  });

  it("goes out as it is to every other client, with Vary: to br-first, identity, none", async () => {
    const site = await newSite(false, { "/app.js": [JS, script] });
    for (const accept of ["br, gzip", "identity", "gzip;q=0", undefined]) {
      const res = await get(site.name, "/app.js", accept === undefined ? {} : { headers: { "Accept-Encoding": accept } });
      expect(res.headers.get("Content-Encoding"), String(accept)).toBeNull();
      expect(res.headers.get("Vary")).toBe("Accept-Encoding");
      expect(res.headers.get("ETag")).toBe(`"${await sha256(script)}"`);
      expect(await res.text()).toBe(script);
    }
  });

  it("takes the client's own Accept-Encoding from cf where the edge rewrote the header", async () => {
    const site = await newSite(false, { "/app.js": [JS, script] });
    const res = await get(site.name, "/app.js", { headers: { "Accept-Encoding": "gzip" }, cf: { clientAcceptEncoding: "br" } });
    expect(res.headers.get("Content-Encoding")).toBeNull();
    expect(await res.text()).toBe(script);
  });

  it("answers 304 for either validator, HEAD with the encoded length, a range as it is", async () => {
    const site = await newSite(false, { "/app.js": [JS, script] });
    const etag = `"${await sha256(script)}"`;
    for (const validator of [etag, `W/${etag}`]) {
      const res = await get(site.name, "/app.js", { headers: { "Accept-Encoding": "gzip", "If-None-Match": validator } });
      expect(res.status, validator).toBe(304);
      expect(res.headers.get("Vary")).toBe("Accept-Encoding");
    }
    const head = await get(site.name, "/app.js", { method: "HEAD", headers: { "Accept-Encoding": "gzip" } });
    expect(head.headers.get("Content-Encoding")).toBe("gzip");
    expect(head.headers.get("Content-Length")).toBe(await gzipLength(script));
    expect(await head.text()).toBe("");
    const range = await get(site.name, "/app.js", { headers: { "Accept-Encoding": "gzip", Range: "bytes=0-9" } });
    expect(range.status).toBe(206);
    expect(range.headers.get("Content-Encoding")).toBeNull();
    expect(await range.text()).toBe(script.slice(0, 10));
  });

  it("leaves small files, other types and the site's own Vary alone", async () => {
    const png = "\x89PNG".padEnd(4096, "x");
    const site = await newSite(false, { "/tiny.js": [JS, "export {};"], "/logo.png": ["image/png", png], "/page.html": [HTML, `<p>${"x".repeat(4096)}</p>`] }, [
      { pattern: "/page.html", headers: [["Vary", "Cookie"]] },
    ]);
    const accept = { headers: { "Accept-Encoding": "gzip" } };
    const tiny = await get(site.name, "/tiny.js", accept);
    expect([tiny.headers.get("Content-Encoding"), tiny.headers.get("Vary"), await tiny.text()]).toEqual([null, "Accept-Encoding", "export {};"]);
    const logo = await get(site.name, "/logo.png", accept);
    expect([logo.headers.get("Content-Encoding"), logo.headers.get("Vary")]).toEqual([null, null]);
    const page = await get(site.name, "/page.html", accept);
    expect([page.headers.get("Content-Encoding"), page.headers.get("Vary")]).toEqual(["gzip", "Cookie, Accept-Encoding"]);
  });
});
