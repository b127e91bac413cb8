/**
 * Static-site builds: what a build is given, the manifest it makes and the
 * blobs it uploads.
 */
import { z } from "zod";
import { JobSpec, fairShare, key } from "./jobs.js";
import { ReleaseTarget } from "./processes.js";
import { httpUrl, noNul, sha256Hex, TENANT_PATTERN, tenant } from "./shared.js";

// ---------------------------------------------------------------------------
// Static-site builds
// ---------------------------------------------------------------------------
//
// A build is a job like a run (same ids, status, logs, cancel and callback),
// submitted with `POST /v1/builds` (a BuildSpec). It downloads the source,
// decides how to build it (overrides, then svc.json, then framework detection),
// installs with the lockfile's package manager, builds under the memory limit,
// hashes every file of the output folder into a manifest, and uploads the blobs
// the Worker's storage lacks:
//
//     builder → Worker   POST <blobsEndpoint>  {"blobs": [{sha256, size, contentType}, …]}  (signed, ≤ 500 per request)
//     Worker  → builder  200 {"missing": [{"sha256": "…", "url": "<presigned PUT URL>"}, …]}
//     builder → storage  PUT <url>  (the bytes, with the announced Content-Length and Content-Type, and
//                                    x-amz-checksum-sha256: the base64 SHA-256, which the URL signs)
//
// Storage refuses bytes that do not hash to the blob's name. Identical files are announced once. Network errors, 429 and 5xx are retried
// with backoff. A succeeded build reports a BuildResult (with the manifest) in
// JobStatus's `result`; a failed one reports none.

/** Most blobs one blobs-endpoint request names. */
export const BLOB_BATCH_LIMIT = 500;
/** Most files one deployment may hold (Cloudflare Pages' limit); more fails the build. */
export const MAX_MANIFEST_FILES = 20_000;
/**
 * Most bytes the manifest may take as JSON (long paths add up); more fails the
 * build. It bounds a build's completion callback, whose body the Worker accepts
 * up to this plus {@link CALLBACK_OVERHEAD_BYTES}.
 */
export const MAX_MANIFEST_BYTES = 16 * 1024 * 1024;
/** What a completion callback carries besides a manifest: status fields, labels, artifacts. */
export const CALLBACK_OVERHEAD_BYTES = 1024 * 1024;
/**
 * Where the generated Dockerfile expects the generated web-server config: a
 * file of this name beside the Dockerfile, at the root of the project.
 */
export const GENERATED_WEB_SERVER_CONFIG_PATH = "svc-nginx.conf";

/**
 * A folder inside the project in its normal form (`./dist/` → `dist`), or null
 * when the path is absolute, climbs out with `..`, or names the project root
 * (serving that would publish the whole source).
 */
export function projectDir(path: string): string | null {
  if (path.startsWith("/") || path.includes("\\") || path.includes("\0")) return null;
  const segments = path.split("/").filter((segment) => segment !== "" && segment !== ".");
  if (segments.length === 0 || segments.includes("..")) return null;
  return segments.join("/");
}

/** How an output folder names the project root itself (a plain folder's site). */
export const PROJECT_ROOT = ".";

/**
 * An output folder in its normal form: {@link projectDir}, or
 * {@link PROJECT_ROOT} for `.` and `./`. Whether the root may be served depends
 * on the project (detect.ts, `rootOutputProblem`: only a plain folder without
 * package.json or build command), which a schema cannot see, so the build
 * checks it once it has the files.
 */
export function siteDir(path: string): string | null {
  return path === "." || path === "./" ? PROJECT_ROOT : projectDir(path);
}

const isSiteDir = (path: string) => siteDir(path) !== null;
const PROJECT_DIR_MESSAGE =
  'must be a folder inside the project: relative, without .. (e.g. dist), or "." for a plain folder served as it is';

/** A URL path of the manifest: leading slash, no empty, `.` or `..` segment. */
function isManifestPath(path: string): boolean {
  const segments = path.split("/");
  return segments[0] === "" && !path.includes("\0") && segments.slice(1).every((s) => s !== "" && s !== "." && s !== "..");
}

/** A build to run: what the Worker posts to `POST /v1/builds`. */
export const BuildSpec = z.object({
  key: key.optional(),
  /** The account the build belongs to (its user runs install and build). */
  tenant,
  /** The app the build belongs to: its dependencies are cached on the node for its next build (absent: nothing cached). */
  app: z.string().regex(TENANT_PATTERN, "must be an app id").optional(),
  /** Presigned GET of the project's `.tar.gz`, extracted as the build's working directory. */
  sourceUrl: httpUrl,
  /** The app's variables: the install and build steps see them (install without NODE_ENV). */
  env: JobSpec.shape.env,
  /** Limits install and build alike. */
  memoryMb: JobSpec.shape.memoryMb,
  /** For the whole job: download, install, build, upload. */
  timeoutSeconds: JobSpec.shape.timeoutSeconds,
  /** Signed `POST` here with a {@link BlobsRequest} returns a {@link BlobsResponse}. */
  blobsEndpoint: httpUrl,
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  /** The app's settings, which win over svc.json and detection. */
  overrides: z
    .strictObject({
      buildCommand: z.string().min(1).max(100_000).refine(noNul, "must not contain NUL").optional(),
      outputDir: z.string().max(1024).refine(isSiteDir, PROJECT_DIR_MESSAGE).optional(),
      spa: z.boolean().optional(),
    })
    .optional(),
  ...fairShare,
  /**
   * Present for apps that run (runtimes other than `static`): the build makes
   * a release (see "Releases" below) instead of a site, and `blobsEndpoint` is
   * not used.
   */
  release: z.lazy(() => ReleaseTarget).optional(),
});
export type BuildSpec = z.infer<typeof BuildSpec>;

/** One file of a built site. */
export const ManifestEntry = z.object({
  /** URL path, decoded (`/about/index.html`, `/café.html`): what the edge matches requests against. */
  path: z.string().max(4096).refine(isManifestPath, "must start with / and have no empty, . or .. segment"),
  /** Hex SHA-256 of the bytes: the blob's name in storage. */
  sha256: sha256Hex,
  size: z.int().nonnegative(),
  /** From the extension; text types carry `; charset=utf-8`; unknown ones `application/octet-stream`. */
  contentType: z.string().min(1).max(255),
});
export type ManifestEntry = z.infer<typeof ManifestEntry>;

/** Body of the builder's signed request to the blobs endpoint. */
export const BlobsRequest = z.object({
  blobs: z.array(ManifestEntry.pick({ sha256: true, size: true, contentType: true })).min(1).max(BLOB_BATCH_LIMIT),
});
export type BlobsRequest = z.infer<typeof BlobsRequest>;

/** The Worker's answer: a presigned PUT URL for each blob of the request its storage lacks. */
export const BlobsResponse = z.object({ missing: z.array(z.object({ sha256: sha256Hex, url: httpUrl })) });
export type BlobsResponse = z.infer<typeof BlobsResponse>;

/** What a succeeded build reports in {@link JobStatus}'s `result`. */
export const BuildResult = z.object({
  kind: z.literal("build"),
  /** Detected framework id (`vite`, `nextjs`, `astro`, `sveltekit`, `gatsby`, `nuxt`, `create-react-app`, `eleventy`), or null. */
  framework: z.string().nullable(),
  /** The command that ran, or null when nothing needed building (plain `static/` folder). */
  buildCommand: z.string().nullable(),
  /** Normalised, relative to the project root. */
  outputDir: z.string(),
  spa: z.boolean(),
  /** Null when nothing was installed. */
  packageManager: z.enum(["npm", "yarn", "pnpm"]).nullable(),
  /** Sorted by path. */
  manifest: z.array(ManifestEntry).max(MAX_MANIFEST_FILES),
  /**
   * Generated when the project has no Dockerfile or Containerfile (null when it
   * has one): nginx serving the output with the edge's rules. Store
   * `webServerConfig` as {@link GENERATED_WEB_SERVER_CONFIG_PATH} beside the Dockerfile.
   */
  artifacts: z.object({ dockerfile: z.string(), webServerConfig: z.string() }).nullable(),
  /** Blobs the Worker lacked and that were PUT (0 when it had them all). */
  uploadedBlobs: z.int().nonnegative(),
  /** Highest memory use of the install and build steps. */
  peakMemoryBytes: z.int().nonnegative(),
});
export type BuildResult = z.infer<typeof BuildResult>;
