/**
 * Content types of static-site files, decided once at build time and stored in
 * the manifest, so the edge serves each blob with its type without guessing.
 * The extension table is mime-types' (mime-db, kept current by its
 * maintainers); the policy here is ours: text types carry `charset=utf-8`
 * (build tools write UTF-8, and without it a browser may pick another encoding
 * for a page that does not declare one), and what the table does not know is
 * served as bytes to download.
 */
import { lookup } from "mime-types";

/** Served when the extension is unknown: browsers then download rather than sniff and render. */
export const DEFAULT_CONTENT_TYPE = "application/octet-stream";

/** Text, and the structured-text families (`+json`, `+xml`, SVG, JavaScript) browsers decode as text. */
const TEXTUAL = /^text\/|^application\/(json|xml|javascript)$|\+(json|xml)$/;

/** The Content-Type for a file path, from its extension (case-insensitive). */
export function contentTypeFor(path: string): string {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const dot = name.lastIndexOf(".");
  if (dot <= 0) return DEFAULT_CONTENT_TYPE; // no extension, or a dotfile such as `.nojekyll`
  const type = lookup(name.slice(dot + 1).toLowerCase());
  if (type === false) return DEFAULT_CONTENT_TYPE;
  return TEXTUAL.test(type) ? `${type}; charset=utf-8` : type;
}
