/**
 * Which files of a build may be cached for a year as immutable: those whose
 * URL changes whenever their content does. A file wrongly called immutable
 * stays stale in browsers for a year after the site replaces it, so the rules
 * prefer missing a hash to imagining one. Checked against real outputs of
 * Vite (Rollup and Rolldown), webpack, esbuild, Parcel, Astro, Next.js
 * (Turbopack) and SvelteKit in test/fixtures/hashed-assets.json.
 */

/**
 * Folders whose every file the framework names by content (or by build id):
 * trusted for that framework's builds only. Vite's `assets/` is not one of
 * them: files of `public/assets/` are copied there unhashed.
 */
const FRAMEWORK_FOLDERS = new Map<string, readonly string[]>([
  ["nextjs", ["/_next/static/"]],
  ["astro", ["/_astro/"]],
  ["sveltekit", ["/_app/immutable/"]],
]);

/** Never immutable: pages, and source maps (named after their script's hash, not their own content). */
const NEVER = /\.(html?|map)$/i;

/**
 * What bundlers emit under hashed names: scripts, styles, images, fonts,
 * media, wasm. A name is read for a hash only with one of these extensions;
 * documents and downloads (`report-…pdf`, `setup-…zip`) are named by people.
 */
const ASSET_EXTENSIONS = new Set(
  "js mjs cjs css png jpg jpeg gif svg webp avif ico bmp woff woff2 ttf otf eot wasm mp4 webm mp3 ogg wav".split(" "),
);

/**
 * A lowercase hex digest (webpack, Parcel, Create React App, Gatsby), 8 to 64
 * characters, with letters and digits; a short one that is one run of letters
 * and one of digits reads as a word and a number (`cafe2024`), and is refused.
 */
function isHexDigest(token: string): boolean {
  if (!/^[0-9a-f]{8,64}$/.test(token) || !/[0-9]/.test(token) || !/[a-f]/.test(token)) return false;
  return token.length >= 16 || !/^([a-f]+[0-9]+|[0-9]+[a-f]+)$/.test(token);
}

/**
 * An 8-character base64url hash (Rollup, Rolldown and so Vite, Astro and
 * SvelteKit; esbuild's base32 too). Refused when it reads as words or an id:
 * no capital, capitals only (`FEBRUARY`), four small letters in a row or a
 * capital and three (`x64Setup`, `Vue3Demo`), capitalised words (`OpenSans`,
 * `myWidget`), letters then digits (`IMG_1234`, `SECTION1`) or digits then
 * letters. About a quarter of real hashes are refused with them: served
 * `no-cache`, which costs a revalidation, not a stale file.
 */
function isShortHash(token: string): boolean {
  if (!/^[A-Za-z0-9_-]{8}$/.test(token) || !/[A-Z]/.test(token) || !/[a-z0-9]/.test(token)) return false;
  if (/[a-z]{4}|[A-Z][a-z]{3}/.test(token) || /^[a-z]*([A-Z][a-z]+)+$/.test(token)) return false;
  return !/^[A-Za-z]+[_-]?[0-9]+$/.test(token) && !/^[0-9]+[_-]?[A-Za-z]+$/.test(token);
}

/**
 * Whether an asset's file name carries a content hash in one of the forms
 * bundlers write: `<hex>.<ext>` (webpack's asset modules),
 * `<name>[-.]<hex>.<ext>`, `<name>[-.]<8-character hash>.<ext>`, each
 * optionally with webpack's `.chunk` before the extension.
 */
export function hasContentHash(name: string): boolean {
  const dot = name.lastIndexOf(".");
  if (dot <= 0 || !ASSET_EXTENSIONS.has(name.slice(dot + 1).toLowerCase())) return false;
  let base = name.slice(0, dot);
  if (base.endsWith(".chunk")) base = base.slice(0, -".chunk".length);
  if (/^[0-9a-f]{16,64}$/.test(base)) return isHexDigest(base);
  const hex = /[-.]([0-9a-f]{8,64})$/.exec(base);
  if (hex && hex.index > 0 && isHexDigest(hex[1]!)) return true;
  return base.length > 9 && /[-.]/.test(base.charAt(base.length - 9)) && isShortHash(base.slice(-8));
}

/**
 * Whether a file of a build by `framework` (detect.ts's id, null when none)
 * is fingerprinted: in the framework's immutable folder, or named with a
 * content hash.
 */
export function isImmutable(path: string, framework: string | null): boolean {
  const name = path.slice(path.lastIndexOf("/") + 1);
  if (NEVER.test(name)) return false;
  const folders = framework === null ? undefined : FRAMEWORK_FOLDERS.get(framework);
  if (folders?.some((folder) => path.startsWith(folder))) return true;
  return hasContentHash(name);
}
