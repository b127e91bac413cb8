// How `svc` starts fast without a build step. Compiling the TypeScript
// sources at every start (tsx) took ~0.9 s of CPU per command; instead the
// sources are bundled once with esbuild into node_modules/.cache/svc-cli/, and
// again whenever a file that went into the bundle changed (size or time, read
// from the manifest written beside it, ~1 ms to check). The bundle runs as a
// CommonJS script with V8's code cache: ~0.3 s per command, of which bare
// Node is ~0.12 s. Where the cache cannot be written, the bundle runs from
// memory. Plain JavaScript: this file runs before anything could compile it.
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { constants, Script } from "node:vm";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const ENTRY = join(ROOT, "cli", "src", "main.ts");
/** One folder per checkout: a node_modules linked into another checkout (the README's test does) holds both. */
const CACHE = join(ROOT, "node_modules", ".cache", "svc-cli", createHash("sha256").update(ROOT).digest("hex").slice(0, 12));
const BUNDLE = join(CACHE, "main.cjs");
const MANIFEST = join(CACHE, "inputs.json");
const CODE_CACHE = join(CACHE, "main.cjs.v8");

/** @typedef {{ source: string; hash: string }} Bundle */

/**
 * The bundle when every file that went into it is as it was, else null.
 * @returns {Bundle | null}
 */
function freshBundle() {
  try {
    /** @type {{ node: string; hash: string; inputs: Record<string, string> }} */
    const manifest = JSON.parse(readFileSync(MANIFEST, "utf8"));
    if (manifest.node !== process.version || typeof manifest.hash !== "string") return null;
    for (const [file, stamp] of Object.entries(manifest.inputs)) if (stampOf(file) !== stamp) return null;
    return { source: readFileSync(BUNDLE, "utf8"), hash: manifest.hash };
  } catch {
    return null;
  }
}

/** @param {string} file */
function stampOf(file) {
  const st = statSync(file);
  return `${st.size}:${st.mtimeMs}`;
}

/**
 * Writes `data` to `file` whole or not at all (commands started at once may write the same file).
 * @param {string} file
 * @param {string | Uint8Array} data
 */
function writeWhole(file, data) {
  const temp = `${file}.${process.pid}.tmp`;
  writeFileSync(temp, data);
  renameSync(temp, file);
}

/**
 * Bundles the sources, keeps the bundle and its manifest when the cache can be written, and returns it.
 * @returns {Promise<Bundle>}
 */
async function bundle() {
  const { build } = await import("esbuild");
  const result = await build({
    entryPoints: [ENTRY],
    absWorkingDir: ROOT,
    bundle: true,
    write: false,
    outfile: BUNDLE,
    platform: "node",
    format: "cjs",
    target: "node20",
    metafile: true,
    logLevel: "silent",
    plugins: [
      {
        // Each source file keeps its own import.meta.url: the CLI finds package.json and .svc/ relative to itself.
        name: "own-url",
        setup(builder) {
          builder.onLoad({ filter: /\/(cli|builder)\/src\/.*\.ts$/ }, ({ path }) => ({
            contents: readFileSync(path, "utf8").replaceAll("import.meta.url", JSON.stringify(pathToFileURL(path).href)),
            loader: "ts",
          }));
        },
      },
    ],
  });
  const source = result.outputFiles[0].text;
  const hash = createHash("sha256").update(source).digest("hex");
  try {
    const inputs = Object.fromEntries(Object.keys(result.metafile.inputs).map((input) => [join(ROOT, input), stampOf(join(ROOT, input))]));
    mkdirSync(CACHE, { recursive: true });
    writeWhole(BUNDLE, source);
    writeWhole(MANIFEST, JSON.stringify({ node: process.version, hash, inputs }));
  } catch {
    // A read-only install: run from memory.
  }
  return { source, hash };
}

/**
 * V8's compiled code for the bundle whose hash is `hash`, or undefined. V8 checks a code cache
 * against its source's length only, so the file starts with the hash of the bundle it was made
 * from: an edit that keeps the bundle's length must not run the code compiled before it.
 * @param {string} hash
 * @returns {Buffer | undefined}
 */
function codeCacheFor(hash) {
  try {
    const file = readFileSync(CODE_CACHE);
    return file.subarray(0, hash.length).toString("latin1") === hash ? file.subarray(hash.length) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Runs the CLI's `main` with `args`, resolving to its exit code.
 * @param {string[]} args
 * @returns {Promise<number>}
 */
export async function runCli(args) {
  const { source, hash } = freshBundle() ?? (await bundle());
  const cachedData = codeCacheFor(hash);
  const script = new Script(`(function (exports, require, module, __filename, __dirname) {${source}\n})`, { filename: BUNDLE, cachedData, importModuleDynamically: constants.USE_MAIN_CONTEXT_DEFAULT_LOADER });
  /** @type {{ exports: { main?: (args: string[]) => Promise<number> } }} */
  const module = { exports: {} };
  script.runInThisContext()(module.exports, createRequire(BUNDLE), module, BUNDLE, dirname(BUNDLE));
  const main = module.exports.main;
  if (typeof main !== "function") throw new Error(`${BUNDLE} exports no main`);
  const code = await main(args);
  // Once run, the script holds the functions the command compiled too: a later start skips compiling them.
  if (cachedData === undefined || script.cachedDataRejected) {
    try {
      writeWhole(CODE_CACHE, Buffer.concat([Buffer.from(hash, "latin1"), script.createCachedData()]));
    } catch {
      // A read-only install: the next start compiles again.
    }
  }
  return code;
}
