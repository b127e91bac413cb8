import { createTarPacker } from "modern-tar";
import { isIgnored, parseIgnoreFile, type RuleSet } from "../../builder/src/static/ignore";

/**
 * Packs a project folder chosen in the page into the `.tar.gz` a deployment
 * uploads, the way `svc deploy` does: what git would commit (`.gitignore` files
 * at every level, the CLI's own rules), never `node_modules` or `.git`, and
 * refused as soon as the compressed bytes pass the limit, before anything is
 * uploaded. File contents are streamed from disk; only the compressed archive
 * (at most the limit) is held in memory.
 */

/** The platform's build upload limit (spec: 100 MB tarball), in bytes as the API counts them. */
export const MAX_UPLOAD_BYTES = 100_000_000;

/** One file of the chosen folder: its path relative to the folder, `/`-separated. */
export type SourceFile = { path: string; blob: Blob; lastModified: number };

/** What is packed, and the topmost paths the ignore rules left out (folders end in `/`). */
export type Selection = { files: SourceFile[]; ignored: string[]; totalBytes: number };

/** A packed source: the archive and what went into it. */
export type Packed = { archive: Blob; sizeBytes: number; fileCount: number; totalBytes: number; ignored: string[] };

/** Decimal megabytes, the unit the limit is stated in. */
export const megabytes = (bytes: number) => `${Number((bytes / 1_000_000).toFixed(1))} MB`;

/** Raised once the compressed archive passes the limit; nothing has been uploaded. */
export class SourceTooLarge extends Error {
  constructor(
    readonly limit: number,
    readonly selection: Selection,
  ) {
    super(
      `packed and compressed, the source is over the build upload limit of ${megabytes(limit)}; nothing was uploaded. ` +
        "Leave build output, media and archives out with .gitignore, or choose a smaller folder.",
    );
    this.name = "SourceTooLarge";
  }
}

const parentOf = (path: string) => path.slice(0, Math.max(0, path.lastIndexOf("/")));
const depth = (base: string) => (base === "" ? 0 : base.split("/").length);

/**
 * Applies the `.gitignore` files among `files` as git does: a folder's rules
 * apply below it, deeper files win, and nothing inside an ignored folder comes
 * back (the folder is judged before its contents).
 */
export async function selectSource(files: readonly SourceFile[]): Promise<Selection> {
  const sets: RuleSet[] = await Promise.all(
    files
      .filter((f) => f.path === ".gitignore" || f.path.endsWith("/.gitignore"))
      .map(async (f) => ({ base: parentOf(f.path), rules: parseIgnoreFile(await f.blob.text()) })),
  );
  sets.sort((a, b) => depth(a.base) - depth(b.base));
  const ignored = new Set<string>();
  const verdicts = new Map<string, boolean>();
  /** Whether the folder or one of its ancestors is ignored; the topmost one is recorded. */
  const folderIgnored = (dir: string): boolean => {
    if (dir === "") return false;
    const known = verdicts.get(dir);
    if (known !== undefined) return known;
    let verdict = folderIgnored(parentOf(dir));
    if (!verdict && isIgnored(dir, true, sets)) {
      ignored.add(`${dir}/`);
      verdict = true;
    }
    verdicts.set(dir, verdict);
    return verdict;
  };
  const kept: SourceFile[] = [];
  for (const file of files) {
    if (folderIgnored(parentOf(file.path))) continue;
    if (isIgnored(file.path, false, sets)) ignored.add(file.path);
    else kept.push(file);
  }
  kept.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return { files: kept, ignored: [...ignored].sort(), totalBytes: kept.reduce((sum, f) => sum + f.blob.size, 0) };
}

/** Every folder that holds a kept file, parents first, so the archive lists each before its contents. */
function foldersOf(files: readonly SourceFile[]): string[] {
  const folders = new Set<string>();
  for (const file of files) {
    for (let dir = parentOf(file.path); dir !== "" && !folders.has(dir); dir = parentOf(dir)) folders.add(dir);
  }
  return [...folders].sort();
}

/**
 * Packs the selection into a `.tar.gz` Blob; throws {@link SourceTooLarge} as
 * soon as the compressed bytes pass `maxBytes`. `onProgress` hears the content
 * bytes read so far.
 */
export async function packSource(
  selection: Selection,
  options: { maxBytes?: number; onProgress?: (readBytes: number) => void } = {},
): Promise<Packed> {
  const maxBytes = options.maxBytes ?? MAX_UPLOAD_BYTES;
  const { readable, controller } = createTarPacker();
  const tooLarge = new SourceTooLarge(maxBytes, selection);

  const chunks: Uint8Array<ArrayBuffer>[] = [];
  let sizeBytes = 0;
  const collect = readable.pipeThrough(new CompressionStream("gzip")).pipeTo(
    new WritableStream<Uint8Array<ArrayBuffer>>({
      write(chunk) {
        sizeBytes += chunk.byteLength;
        if (sizeBytes > maxBytes) throw tooLarge;
        chunks.push(chunk);
      },
    }),
  );

  const packedAt = new Date();
  const write = async () => {
    for (const dir of foldersOf(selection.files)) {
      await controller.add({ name: `${dir}/`, type: "directory", size: 0, mode: 0o755, mtime: packedAt, uid: 0, gid: 0 }).close();
    }
    let read = 0;
    for (const file of selection.files) {
      const body = controller.add({
        name: file.path,
        type: "file",
        size: file.blob.size,
        mode: 0o644,
        mtime: new Date(file.lastModified),
        uid: 0,
        gid: 0,
      });
      await file.blob.stream().pipeTo(body);
      read += file.blob.size;
      options.onProgress?.(read);
    }
    controller.finalize();
  };
  // The writer stops with the reader's error when the limit is passed; report that one.
  const [written, collected] = await Promise.allSettled([write(), collect]);
  if (collected.status === "rejected") throw collected.reason;
  if (written.status === "rejected") throw written.reason;
  return {
    archive: new Blob(chunks, { type: "application/gzip" }),
    sizeBytes,
    fileCount: selection.files.length,
    totalBytes: selection.totalBytes,
    ignored: selection.ignored,
  };
}
