/**
 * Content types of static-site files, decided once at build time and stored in
 * the manifest, so the edge serves each blob with its type without guessing.
 * Text types carry `charset=utf-8`: build tools write UTF-8, and without it a
 * browser may pick another encoding for a page that does not declare one.
 */

const TEXT = "; charset=utf-8";

/** Extension (lower case, no dot) → Content-Type. A Map, so `x.constructor` finds nothing. */
const CONTENT_TYPES = new Map<string, string>(
  Object.entries({
    html: `text/html${TEXT}`,
    htm: `text/html${TEXT}`,
    css: `text/css${TEXT}`,
    js: `text/javascript${TEXT}`,
    mjs: `text/javascript${TEXT}`,
    cjs: `text/javascript${TEXT}`,
    json: `application/json${TEXT}`,
    map: `application/json${TEXT}`,
    webmanifest: `application/manifest+json${TEXT}`,
    txt: `text/plain${TEXT}`,
    md: `text/markdown${TEXT}`,
    csv: `text/csv${TEXT}`,
    xml: `application/xml${TEXT}`,
    rss: `application/rss+xml${TEXT}`,
    atom: `application/atom+xml${TEXT}`,
    svg: `image/svg+xml${TEXT}`,
    ics: `text/calendar${TEXT}`,
    png: "image/png",
    jpg: "image/jpeg",
    jpeg: "image/jpeg",
    gif: "image/gif",
    webp: "image/webp",
    avif: "image/avif",
    ico: "image/x-icon",
    bmp: "image/bmp",
    woff: "font/woff",
    woff2: "font/woff2",
    ttf: "font/ttf",
    otf: "font/otf",
    eot: "application/vnd.ms-fontobject",
    wasm: "application/wasm",
    pdf: "application/pdf",
    zip: "application/zip",
    gz: "application/gzip",
    mp4: "video/mp4",
    webm: "video/webm",
    ogv: "video/ogg",
    mov: "video/quicktime",
    mp3: "audio/mpeg",
    ogg: "audio/ogg",
    wav: "audio/wav",
    m4a: "audio/mp4",
    flac: "audio/flac",
    vtt: `text/vtt${TEXT}`,
  }),
);

/** Served when the extension is unknown: browsers then download rather than sniff and render. */
export const DEFAULT_CONTENT_TYPE = "application/octet-stream";

/** The Content-Type for a file path, from its extension (case-insensitive). */
export function contentTypeFor(path: string): string {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const dot = name.lastIndexOf(".");
  if (dot <= 0) return DEFAULT_CONTENT_TYPE; // no extension, or a dotfile such as `.nojekyll`
  return CONTENT_TYPES.get(name.slice(dot + 1).toLowerCase()) ?? DEFAULT_CONTENT_TYPE;
}
