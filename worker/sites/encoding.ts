/**
 * Gzip for the small static files served from memory. Cloudflare's edge
 * compresses a Worker's text responses on every request (gzip or brotli, by
 * the client's Accept-Encoding); a file kept in the isolate is compressed
 * here once instead, kept beside its bytes, and sent already encoded
 * (`encodeBody: "manual"`), which the edge passes through. Brotli stays the
 * edge's: CompressionStream has no brotli, and a client that puts br before
 * gzip gets the file as it is, for the edge to encode as before.
 */

/**
 * The content types Cloudflare compresses (its list, "Content compression"
 * in the Speed docs). Only these are sent encoded: for any other type the
 * edge would not compress either.
 */
const COMPRESSIBLE = new Set([
  "text/html",
  "text/richtext",
  "text/plain",
  "text/css",
  "text/x-script",
  "text/x-component",
  "text/x-java-source",
  "text/x-markdown",
  "application/javascript",
  "application/x-javascript",
  "text/javascript",
  "text/js",
  "image/x-icon",
  "image/vnd.microsoft.icon",
  "text/xml",
  "application/xml",
  "application/rss+xml",
  "application/vnd.api+json",
  "application/json",
  "application/xhtml+xml",
  "font/ttf",
  "font/otf",
  "image/svg+xml",
  "application/vnd.ms-fontobject",
  "application/wasm",
  "application/manifest+json",
  "application/ld+json",
  "application/geo+json",
]);

/** Below this a file is sent as it is: the header costs more than gzip saves. */
export const MIN_GZIP_BYTES = 1024;

export function compressible(contentType: string): boolean {
  return COMPRESSIBLE.has(contentType.split(";")[0]!.trim().toLowerCase());
}

/**
 * Whether the client's Accept-Encoding picks gzip, by the edge's own rule:
 * codings by descending q (ties keep their order), the first gzip or br with
 * q > 0 wins; identity before both means no encoding.
 */
export function prefersGzip(acceptEncoding: string | null): boolean {
  if (!acceptEncoding) return false;
  const codings = acceptEncoding
    .split(",")
    .map((element, order) => {
      const [coding = "", ...params] = element.trim().toLowerCase().split(";");
      const q = params.map((p) => p.trim()).find((p) => p.startsWith("q="));
      // A weight that is not one (RFC 9110 qvalue) drops its coding, as the edge does.
      const weight = q === undefined ? 1 : /^q=(0(\.\d{0,3})?|1(\.0{0,3})?)$/.test(q) ? Number(q.slice(2)) : Number.NaN;
      return { coding: coding.trim(), weight, order };
    })
    .filter((c) => c.coding !== "" && !Number.isNaN(c.weight))
    .sort((a, b) => b.weight - a.weight || a.order - b.order);
  for (const { coding, weight } of codings) {
    if (weight === 0) continue;
    if (coding === "gzip" || coding === "br") return coding === "gzip";
    if (coding === "identity") return false;
  }
  return false;
}

export async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
