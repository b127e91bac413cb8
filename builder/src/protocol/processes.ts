/**
 * Apps that run: their releases (built once, started many times), their
 * long-lived processes on a node, runtime log lines and the proxied traffic
 * the edge sends them.
 */
import { z } from "zod";
import { SNAPSHOT_MAX_PART_BYTES, SNAPSHOT_MIN_PART_BYTES, SnapshotPart } from "./disks.js";
import { JobSpec, type LogStream, key } from "./jobs.js";
import { TENANT_PATTERN, httpUrl, sha256Hex, tenant } from "./shared.js";
import { SIGNATURE_FORMAT, SIGNATURE_WINDOW_SECONDS, TIMESTAMP_FORMAT, encoder, fromHex, hmacKey, toHex } from "./signing.js";

const APP_LOG_LINE = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z) (out|err|svc) ([A-Za-z0-9_-]+)\/([A-Za-z0-9_]+) (.*)$/s;

/**
 * One line of an app's runtime log (`<time> <stream> <deployment>/<process>
 * <text>`: which release and which process wrote it; `-` for a process started
 * without a deployment), split into its parts; null when it is not one.
 */
export function parseAppLogLine(line: string): { time: string; stream: LogStream; release: string; process: string; text: string } | null {
  const match = APP_LOG_LINE.exec(line);
  if (!match) return null;
  return { time: match[1]!, stream: match[2] as LogStream, release: match[3]!, process: match[4]!, text: match[5]! };
}

// ---------------------------------------------------------------------------
// Releases (apps that run)
// ---------------------------------------------------------------------------
//
// An app of runtime `node`, `python` or `custom` is built into a release: the
// project tree after install and build, dependencies included, as one
// `.tar.gz` (paths relative to the tree, `./…`, as snapshots write them) in
// object storage, uploaded in parts exactly as a snapshot is (part URLs from
// `partUrlEndpoint`). A release is immutable and named by its deployment; any
// node can fetch it (presigned GET), verify its SHA-256 and run it, and a
// rollback only starts an older one. Inside the sandbox the tree is the
// working directory, /work, for the app's processes and its cron runs alike.
//
// What to run is decided at build time and travels with the release: svc.json
// (`type`, `startCommand`, `buildCommand`, `port`, `healthCheckPath`) wins,
// then a Procfile's `web:`/`worker:` line, then the runtime's convention
// (node: `npm start` when package.json has a start script, else `node <main>`;
// python: `python3 main.py` or `app.py`). A project with nothing to start
// fails the build with what to add.

/** Runtimes that run a process (everything but `static`). */
export const ServerRuntime = z.enum(["node", "python", "custom"]);
export type ServerRuntime = z.infer<typeof ServerRuntime>;

/** `web` listens on `port` and takes HTTP traffic; `worker` runs without a port or health check. */
export const ProcessType = z.enum(["web", "worker"]);
export type ProcessType = z.infer<typeof ProcessType>;

/** Port a web app is given in PORT when svc.json names none. */
/** Seconds a web process has to pass its health check when svc.json does not say (`startTimeoutSeconds`). */
export const DEFAULT_START_TIMEOUT_SECONDS = 60;

export const DEFAULT_APP_PORT = 8080;

/**
 * PATH of everything that runs in a release (its processes and its cron
 * runs), unless the app's env sets one: the python venv and the node
 * packages' commands first, as `npm run` and an activated venv would.
 */
export const RELEASE_PATH = "/work/.venv/bin:/work/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";

/** What a release build needs besides the BuildSpec. */
export const ReleaseTarget = z.object({
  runtime: ServerRuntime,
  /** Signed `POST` here with a {@link PartUrlRequest} returns a {@link PartUrlResponse} (as for snapshots). */
  partUrlEndpoint: httpUrl,
  /** Every part but the last has exactly this size. */
  partSizeBytes: z.int().min(SNAPSHOT_MIN_PART_BYTES).max(SNAPSHOT_MAX_PART_BYTES),
});
export type ReleaseTarget = z.infer<typeof ReleaseTarget>;

/** A path of the app answered with 2xx when it is ready for traffic (`/healthz`). */
const healthCheckPath = z
  .string()
  .max(1024)
  .regex(/^\/[\x21-\x7e]*$/, "must be a path starting with / (no spaces or control characters)");

/** What a succeeded release build reports in {@link JobStatus}'s `result`. */
export const ReleaseResult = z.object({
  kind: z.literal("release"),
  runtime: ServerRuntime,
  type: ProcessType,
  /** Runs with `/bin/sh -c` in /work. */
  startCommand: z.string().min(1).max(100_000),
  /** The command that ran, or null when nothing needed building. */
  buildCommand: z.string().nullable(),
  /** How dependencies were installed, or null when there were none. */
  packageManager: z.enum(["npm", "yarn", "pnpm", "pip"]).nullable(),
  /** Where a `web` process must listen (it gets it in PORT); null for a worker. */
  port: z.int().min(1).max(65_535).nullable(),
  /** Null: the process is ready once its port accepts connections. */
  healthCheckPath: healthCheckPath.nullable(),
  /** A web process: seconds it has to pass its health check (null: the platform's default). */
  startTimeoutSeconds: z.int().min(1).max(600).nullable().default(null),
  /** Seconds a new process must stay up once ready before it counts as deployed. */
  minReadySeconds: z.int().min(0).max(600).default(0),
  /** A worker: its new release may run beside the old one during a deploy. */
  overlap: z.boolean().default(false),
  /** svc.json's `instances`: how many processes should serve the app; null: as many as it has. */
  instances: z.int().min(1).max(100).nullable().default(null),
  /** Regular files in the release (what its build log and the deployment say). */
  files: z.int().nonnegative().default(0),
  /** Bytes of the whole `.tar.gz` (the sum of the parts). */
  sizeBytes: z.int().positive(),
  /** SHA-256 of the whole `.tar.gz`, hex. */
  sha256: sha256Hex,
  /** In part-number order, 1 to N: what completes the multipart upload. */
  parts: z.array(SnapshotPart).min(1),
  entries: z.int().nonnegative(),
  expandedBytes: z.int().nonnegative(),
  /** Highest memory use of the install and build steps. */
  peakMemoryBytes: z.int().nonnegative(),
});
export type ReleaseResult = z.infer<typeof ReleaseResult>;

// ---------------------------------------------------------------------------
// App processes
// ---------------------------------------------------------------------------
//
// A process is a release running as a long-lived sandbox on a node, made like
// a job's (own user, namespaces, cgroups, run network, only its app's disk at
// its mountPath, the app's env plus PORT and SVC_*), supervised by the node:
//
//     starting ──ready──▶ running ──exit──▶ backoff ──▶ starting …
//        │                                    │ (5 exits without 10 minutes of running between)
//        └──────exit / start timeout──────────┴──▶ crash_loop (still restarted, every 60 s)
//     any ──stop──▶ stopping ──▶ stopped          (release unusable, sandbox impossible) ──▶ failed
//
// `ready` means the health check passed: HTTP 2xx from `healthCheck.path`, or
// (no path) the port accepting a TCP connection; a `worker` is ready once
// started. Restarts wait 0.5 s, doubling up to 30 s, reset after 10 minutes
// of running. Every transition is written to the app's runtime log (`svc`
// lines) with its reason, and reported to `callbackUrl` (signed, like job
// callbacks) with the new {@link ProcessStatus}.
//
//     POST /v1/processes              ProcessSpec → 201 ProcessStatus (200: its key named one already)
//     GET  /v1/processes/:id          → ProcessStatus
//     GET  /v1/processes?key=…        → ProcessStatus
//     POST /v1/processes/:id/stop     {drainSeconds, successor?} → 202 ProcessStatus (stopping); idempotent
//     GET  /v1/app-logs/:appId?tail=N&follow=1   the app's runtime log (job log line format), across
//                                     restarts and releases, bounded (LOG_LIMIT_BYTES kept per app)
//     ANY  /v1/proxy/:id/<path>       the app's own HTTP, WebSocket and SSE traffic (below)
//
// A stop keeps serving proxied requests for `drainSeconds` (the edge caches
// which process serves an app for a second), or sends them to the successor
// it names while that is ready (then also after the drain), then answers new ones with
// 404 PROCESS_NOT_FOUND, lets requests in flight finish (at most 30 s), then
// sends SIGTERM, then SIGKILL after 10 s. In-flight requests finish before
// SIGTERM, so an app without a SIGTERM handler (Node's default is to exit at
// once) loses none of them. A stopped process answers proxied requests with
// 404 PROCESS_NOT_FOUND, which tells the edge to look up the app's process
// again; one that is (re)starting holds them up to 5 s for its readiness,
// then 503 UNAVAILABLE; a failed one, and a worker, answer 503 UNAVAILABLE.
//
// App processes do not survive a restart of the node's builder: afterwards
// the process reads `failed` (lastExit.reason `error`, "the builder
// restarted…"), reported through its callback, and the control plane starts a
// new one (with a new key: a key names one process for good).

export const ProcessState = z.enum(["starting", "running", "backoff", "crash_loop", "stopping", "stopped", "failed"]);
export type ProcessState = z.infer<typeof ProcessState>;

/** Why the last instance of a process ended (or never became ready). */
export const ProcessExitReason = z.enum(["exit_code", "OOMKilled", "health_check", "start_timeout", "port", "error"]);
export type ProcessExitReason = z.infer<typeof ProcessExitReason>;

/** Most lines of the runtime log a status carries when something went wrong. */
export const PROCESS_LAST_LINES = 20;

/** A process to start: what the Worker posts to `POST /v1/processes`. */
export const ProcessSpec = z.object({
  /** Idempotency key chosen by the control plane (`<appId>/<deploymentId>/<n>`). */
  key,
  tenant,
  /** The app the process belongs to: its runtime log is kept under this id. */
  appId: z.string().regex(TENANT_PATTERN, "must be an app id"),
  release: z.object({
    /** Presigned GET of the release's `.tar.gz`; the node keeps a verified copy for restarts. */
    url: httpUrl,
    sha256: sha256Hex,
    sizeBytes: z.int().positive(),
  }),
  type: ProcessType,
  command: JobSpec.shape.command,
  /** The port a `web` process listens on (PORT); null for a worker. */
  port: z.int().min(1).max(65_535).nullable(),
  healthCheck: z
    .object({
      path: healthCheckPath.nullable(),
      /** From each start until ready; past it the instance is ended (`start_timeout`). */
      timeoutSeconds: z.int().min(1).max(600),
    })
    .nullable(),
  env: JobSpec.shape.env,
  memoryMb: JobSpec.shape.memoryMb,
  disk: JobSpec.shape.disk,
  callbackUrl: httpUrl.optional(),
  labels: z.record(z.string(), z.string()).optional(),
});
export type ProcessSpec = z.infer<typeof ProcessSpec>;

/**
 * What the schema cannot say about a {@link ProcessSpec}: a `web` process needs
 * a port; a `worker` has neither port nor health check. The node answers 400
 * VALIDATION_ERROR with these; empty when the spec is coherent. (A web process
 * with `healthCheck: null` is ready once its port accepts connections, within
 * 60 s.)
 */
export function processSpecProblems(spec: ProcessSpec): { path: string; message: string }[] {
  if (spec.type === "web") return spec.port === null ? [{ path: "port", message: "a web process needs the port it listens on" }] : [];
  const problems: { path: string; message: string }[] = [];
  if (spec.port !== null) problems.push({ path: "port", message: "a worker has no port (null)" });
  if (spec.healthCheck !== null) problems.push({ path: "healthCheck", message: "a worker has no health check (null)" });
  return problems;
}

/** What the process routes answer and its callbacks carry. */
export const ProcessStatus = z.object({
  id: z.string(),
  key: z.string(),
  appId: z.string(),
  state: ProcessState,
  /** True while an instance is running and ready (takes traffic). */
  ready: z.boolean(),
  /** Instances started after the first. */
  restarts: z.int().nonnegative(),
  lastExit: z
    .object({
      at: z.iso.datetime(),
      reason: ProcessExitReason,
      exitCode: z.int().nullable(),
      signal: z.string().nullable(),
      /** e.g. "memory limit 256 MiB exceeded (OOMKilled)", "exited with code 1", "health check GET /healthz: 500". */
      message: z.string(),
    })
    .nullable(),
  /** The last lines of the runtime log (at most {@link PROCESS_LAST_LINES}) when the last instance ended badly; else empty. */
  lastLines: z.array(z.string()),
  memoryLimitBytes: z.int().positive(),
  /** A web process: the port its traffic goes to (its spec's, or the one it was found listening on instead); null for a worker. */
  port: z.int().min(1).max(65_535).nullable().default(null),
  createdAt: z.iso.datetime(),
  /** Start of the current (or last) instance. */
  startedAt: z.iso.datetime().nullable(),
  readyAt: z.iso.datetime().nullable(),
  stoppedAt: z.iso.datetime().nullable(),
  labels: z.record(z.string(), z.string()),
});
export type ProcessStatus = z.infer<typeof ProcessStatus>;

/**
 * Body of `POST /v1/processes/:id/stop`. `successor`: the process of the
 * same app on this node that replaces it; while it is ready, new proxied
 * requests for the stopping one go to it (an edge still routing to the old
 * process reaches the new release), and the drain serves only what an
 * unready successor cannot.
 */
export const ProcessStop = z.object({
  drainSeconds: z.int().min(0).max(300).default(0),
  successor: z.string().regex(/^prc_[A-Za-z0-9]{1,64}$/, "must be a process id").optional(),
});
export type ProcessStop = z.infer<typeof ProcessStop>;

// Proxied traffic
// ---------------
// The Worker forwards an app's requests to `ANY /v1/proxy/<processId>/<path>?<query>`
// on the node running it. The body is the client's, streamed, so it cannot be
// part of a signature: the request carries `X-Svc-Proxy-Timestamp` (unix
// seconds) and `X-Svc-Proxy-Signature` = hex HMAC-SHA256(secret,
// `proxy\n<processId>\n<timestamp>`), accepted within the signature window.
// It only proves the Worker sent it: the same process is public at its URL.
// The Worker sets `X-Forwarded-Host` (the app's host, which the node passes
// on as `Host`), `X-Forwarded-For` (only from what the edge itself knows of the
// client) and `X-Forwarded-Proto`, and `X-Svc-Apps-Domain` (the domain apps are
// served under: the node drops an app's cookie set for it or a parent of it);
// the node drops every `X-Svc-*` header and hop-by-hop header before the app
// sees the request, and passes WebSocket upgrades (`Connection: Upgrade`)
// through as a byte stream both ways.

/** Header of a proxied request: unix seconds. */
export const HEADER_PROXY_TIMESTAMP = "X-Svc-Proxy-Timestamp";
/** Header of a proxied request: hex HMAC of `proxy\n<processId>\n<timestamp>`. */
export const HEADER_PROXY_SIGNATURE = "X-Svc-Proxy-Signature";
/**
 * Set on the answers the node itself gives to proxied requests (never on the
 * app's: the node drops every `X-Svc-*` header the app sends), with the error
 * code, so the edge can tell "this process is gone" from an app's own 404.
 */
export const HEADER_PROXY_ERROR = "X-Svc-Proxy-Error";
/** Header of a proxied request: the domain apps are served under (`APPS_DOMAIN`, without a port). */
export const HEADER_APPS_DOMAIN = "X-Svc-Apps-Domain";
/** Largest request body passed to an app (Cloudflare's own limit on request bodies is 100 MB). */
export const MAX_PROXY_BODY_BYTES = 100 * 1024 * 1024;

const proxySigned = (processId: string, timestamp: string) => encoder.encode(`proxy\n${processId}\n${timestamp}`);

/** The two headers that let a node accept a proxied request for `processId`. */
export async function signProxy(secret: string, processId: string, timestamp = Math.floor(Date.now() / 1000)): Promise<Record<string, string>> {
  const data = proxySigned(processId, String(timestamp));
  const signature = toHex(await crypto.subtle.sign("HMAC", await hmacKey(secret), data));
  return { [HEADER_PROXY_TIMESTAMP]: String(timestamp), [HEADER_PROXY_SIGNATURE]: signature };
}

/** Checks a proxied request's headers for `processId` (constant time, within the signature window). */
export async function verifyProxy(
  secret: string,
  processId: string,
  headers: { get(name: string): string | null },
  now = Date.now() / 1000,
): Promise<boolean> {
  const timestamp = headers.get(HEADER_PROXY_TIMESTAMP);
  const signature = headers.get(HEADER_PROXY_SIGNATURE)?.toLowerCase() ?? null;
  if (timestamp === null || signature === null || !TIMESTAMP_FORMAT.test(timestamp) || !SIGNATURE_FORMAT.test(signature)) return false;
  if (Math.abs(now - Number(timestamp)) > SIGNATURE_WINDOW_SECONDS) return false;
  const data = proxySigned(processId, timestamp);
  return crypto.subtle.verify("HMAC", await hmacKey(secret), fromHex(signature), data);
}

// ---------------------------------------------------------------------------
// Runtime logs leave the node as they are written (docs/fleet.md, "Logs that
// outlive their node"): every LOG_SHIP_EVERY_MS a node posts the lines each
// app's log gained since the last round, signed, to
//
//     POST /internal/app-logs        AppLogShipment → 204
//
// The control plane keeps them per app (the newest LOG_LIMIT_BYTES), so after
// a failover or a drain the log still shows what the old node wrote.

/** How often a node ships its apps' new log lines. */
export const LOG_SHIP_EVERY_MS = 3_000;
/** Most bytes of one app's log shipped in one round: an app printing faster keeps the rest on its node only. */
export const LOG_SHIPMENT_APP_BYTES = 64 * 1024;
/** Most bytes of one round's request, as JSON (the control plane's body limit is 1 MiB); the rest waits for the next round. */
export const LOG_SHIPMENT_BYTES = 768 * 1024;
/** Most apps' logs in one round's request. */
export const LOG_SHIPMENT_APPS = 512;

export const AppLogShipment = z.object({
  logs: z
    .array(
      z.object({
        appId: z.string().regex(TENANT_PATTERN, "must be an app id"),
        /** Whole lines in the app log's line format, each ending in a newline. */
        text: z.string().min(1).max(LOG_SHIPMENT_APP_BYTES + 1024),
      }),
    )
    .min(1)
    .max(LOG_SHIPMENT_APPS),
});
export type AppLogShipment = z.infer<typeof AppLogShipment>;
