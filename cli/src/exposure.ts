/**
 * Files a deploy should not carry without the user knowing: archives (a
 * backup downloaded into the project, a build zipped for someone) that a
 * static site would publish as they are, and secrets (`.env` files, private
 * keys, credentials) that reach the build, which may inline them into what it
 * publishes (Vite puts `VITE_*` from `.env` into the bundle), or the site
 * itself when it is served as a plain folder.
 */
import { basename } from "node:path";
import { leftOutOfPlainFolder } from "../../builder/src/static/detect.js";

/** Names of files that hold secrets; `.env.example` and the like are templates meant to be committed. */
const SECRET_NAME = /^(?:\.env(?:\.(?!example$|sample$|template$|dist$|defaults$)[^/]+)?|\.netrc|\.pypirc|id_(?:rsa|dsa|ecdsa|ed25519)|.+\.(?:pem|key|p12|pfx))$/i;
/** Archives and database dumps by extension. */
const ARCHIVE_NAME = /\.(?:tar|tgz|tar\.gz|tar\.bz2|tar\.xz|tar\.zst|gz|bz2|xz|zst|zip|7z|rar|sql|sqlite|sqlite3|dump)$/i;

export type ExposedFile = { path: string; size: number; kind: "secret" | "archive"; servedAt: string | null };

/** Where the site serves an uploaded file as it is (`/path`), or null: see {@link servedFrom}. */
export type ServedAt = (path: string) => string | null;

/** Files served from these folders (relative, ending in `/`; `""` is a plain folder served from its root). */
export function servedFrom(roots: readonly string[]): ServedAt {
  return (path) => {
    const root = roots.find((prefix) => path.startsWith(prefix));
    if (root === undefined || (root === "" && leftOutOfPlainFolder(path))) return null;
    return `/${path.slice(root.length)}`;
  };
}

/**
 * What in the upload a user would not want to ship: every secret-looking file
 * (it reaches the build at least), and the archives the site would serve as
 * they are (an archive elsewhere is only uploaded, and is not listed).
 */
export function exposedFiles(files: readonly { path: string; size: number }[], served: ServedAt): ExposedFile[] {
  const exposed: ExposedFile[] = [];
  for (const file of files) {
    const name = basename(file.path);
    const servedAt = served(file.path);
    if (SECRET_NAME.test(name)) exposed.push({ ...file, kind: "secret", servedAt });
    else if (ARCHIVE_NAME.test(name) && servedAt !== null) exposed.push({ ...file, kind: "archive", servedAt });
  }
  return exposed;
}
