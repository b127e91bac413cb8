/**
 * The builder's HTTP API in one request handler, shared by the entry point and
 * anything that embeds the builder. Every route but `GET /healthz` requires a
 * valid signature (protocol/signing.ts), except apps' proxied traffic (`/v1/proxy/…`,
 * processes/proxy.ts), which carries its own; answers are JSON except logs.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { z } from "zod";
import type { DiskLeases } from "./disks/leases.js";
import type { DiskLease } from "./node/lease.js";
import { DiskFenced, DiskOwnedElsewhere, DiskStore } from "./disks/store.js";
import { InsufficientStorage } from "./sandbox/host-room.js";
import type { Admission, JobManager } from "./jobs/manager.js";
import { streamLog } from "./logs.js";
import { isId } from "./ids.js";
import type { LogWindow } from "./processes/app-log.js";
import type { ProcessAdmission, ProcessManager } from "./processes/manager.js";
import { type AppProxy, PROXY_PREFIX } from "./processes/proxy.js";
import { DiskSpec, RestoreSpec, SnapshotSpec } from "./protocol/disks.js";
import { JOB_KEY_PATTERN, JobSpec } from "./protocol/jobs.js";
import { ProcessSpec, ProcessStop, processSpecProblems } from "./protocol/processes.js";
import { type BuilderError, type BuilderErrorCode, TENANT_PATTERN } from "./protocol/shared.js";
import { type NonceCache, verifyRequest } from "./protocol/signing.js";
import { BuildSpec } from "./protocol/static.js";

/** Largest request body accepted (a JobSpec holds at most a 100k-character command plus env). */
const MAX_BODY_BYTES = 1024 * 1024;
/** After a 413, what the client still sends is dropped up to this much, or for this long, before the connection closes. */
const LINGER_BYTES = 16 * 1024 * 1024;
const LINGER_MS = 5_000;

/** What the handler works with. */
export interface BuilderServices {
  /** The key requests must be signed with: the node's own, or BUILDER_SECRET for a builder that did not join. */
  secret: string;
  jobs: JobManager;
  disks: DiskStore;
  nonces: NonceCache;
  /** Who uses which disk (jobs and app processes): deleting a disk in use is refused. */
  leases: DiskLeases;
  /** The node's lease on its disks: without it, disk work is refused (node/lease.ts). */
  lease: DiskLease;
  processes: ProcessManager;
  /** App traffic (`/v1/proxy/…`), authenticated by its own headers, streamed, never read here. */
  proxy: AppProxy;
}

interface RouteContext {
  params: string[];
  url: URL;
  body: Buffer;
  response: ServerResponse;
}

interface Route {
  method: string;
  pattern: RegExp;
  handle: (context: RouteContext) => Promise<void>;
}

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  response.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(text) });
  response.end(text);
}

function sendError(response: ServerResponse, status: number, code: BuilderErrorCode, message: string, details?: unknown): void {
  const body: BuilderError = { error: { code, message, ...(details === undefined ? {} : { details }) } };
  sendJson(response, status, body);
}

const ADMISSION_STATUS = { DISK_BUSY: 409, TENANT_QUEUE_FULL: 429, UNAVAILABLE: 503, INSUFFICIENT_MEMORY: 507, INSUFFICIENT_STORAGE: 507 } as const;

/** Answers a job submission: 201 with the new job's status (200 when its key named one already), or the refusal's error. */
function sendAdmission(response: ServerResponse, admission: Admission): void {
  if (admission.ok) sendJson(response, admission.existing ? 200 : 201, admission.status);
  else sendError(response, ADMISSION_STATUS[admission.code], admission.code, admission.message);
}

/** Answers a process start: 201 (200 when its key named one already), or the refusal's error. */
function sendProcessAdmission(response: ServerResponse, admission: ProcessAdmission): void {
  if (admission.ok) sendJson(response, admission.existing ? 200 : 201, admission.status);
  else sendError(response, ADMISSION_STATUS[admission.code], admission.code, admission.message);
}

/** Parses and validates a JSON body; on failure the 400 is already sent and null returned. */
function parseBody<T extends z.ZodType>(schema: T, context: RouteContext): z.infer<T> | null {
  let value: unknown;
  try {
    value = JSON.parse(context.body.toString("utf8"));
  } catch {
    sendError(context.response, 400, "VALIDATION_ERROR", "body is not valid JSON");
    return null;
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const details = parsed.error.issues.map((issue) => ({ path: issue.path.join("."), message: issue.message }));
    sendError(context.response, 400, "VALIDATION_ERROR", "body does not match the schema", details);
    return null;
  }
  return parsed.data;
}

function diskId(context: RouteContext): string | null {
  const id = context.params[0] ?? "";
  if (DiskStore.isValidId(id)) return id;
  sendError(context.response, 400, "VALIDATION_ERROR", "disk id must match ^[A-Za-z0-9_-]{1,64}$", [
    { path: "id", message: "invalid disk id" },
  ]);
  return null;
}

function routes({ jobs, disks, leases, lease, processes }: BuilderServices): Route[] {
  const jobNotFound = (response: ServerResponse) => sendError(response, 404, "JOB_NOT_FOUND", "job not found");
  /**
   * Refuses (true) work on a disk while the node holds no lease on its disks (503 UNAVAILABLE), or a request
   * naming another generation of a disk than the copy here (409 DISK_FENCED).
   */
  const fenced = async (response: ServerResponse, disk: { id: string; generation?: number | undefined } | undefined): Promise<boolean> => {
    const unleased = disk ? lease.problem() : null;
    if (unleased !== null) {
      sendError(response, 503, "UNAVAILABLE", unleased);
      return true;
    }
    const problem = disk ? await disks.fenceProblem(disk.id, disk.generation) : null;
    if (problem !== null) sendError(response, 409, "DISK_FENCED", problem);
    return problem !== null;
  };
  const processNotFound = (response: ServerResponse) => sendError(response, 404, "PROCESS_NOT_FOUND", "process not found");
  return [
    {
      method: "POST",
      pattern: /^\/v1\/jobs$/,
      async handle(context) {
        const spec = parseBody(JobSpec, context);
        if (!spec || (await fenced(context.response, spec.disk))) return;
        sendAdmission(context.response, await jobs.submit(spec));
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/builds$/,
      async handle(context) {
        const spec = parseBody(BuildSpec, context);
        if (!spec) return;
        sendAdmission(context.response, await jobs.submitBuild(spec));
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/jobs$/,
      async handle({ url, response }) {
        const key = url.searchParams.get("key");
        if (key === null || !JOB_KEY_PATTERN.test(key)) {
          return sendError(response, 400, "VALIDATION_ERROR", "give the job's key: GET /v1/jobs?key=…", [{ path: "key", message: "invalid key" }]);
        }
        const status = jobs.statusByKey(key);
        if (status) sendJson(response, 200, status);
        else jobNotFound(response);
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/jobs\/([^/]+)$/,
      async handle({ params, response }) {
        const status = jobs.status(params[0] ?? "");
        if (status) sendJson(response, 200, status);
        else jobNotFound(response);
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/jobs\/([^/]+)\/logs$/,
      async handle({ params, url, response }) {
        const source = jobs.logSource(params[0] ?? "");
        if (!source) return jobNotFound(response);
        const offsetParam = url.searchParams.get("offset") ?? "0";
        if (!/^\d{1,15}$/.test(offsetParam)) {
          return sendError(response, 400, "VALIDATION_ERROR", "offset must be a non-negative integer", [
            { path: "offset", message: "expected a non-negative integer" },
          ]);
        }
        const follow = ["1", "true"].includes(url.searchParams.get("follow") ?? "");
        response.writeHead(200, {
          "Content-Type": "text/plain; charset=utf-8",
          "Cache-Control": "no-store",
          "X-Content-Type-Options": "nosniff",
        });
        await streamLog(source, Number(offsetParam), follow, response);
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/jobs\/([^/]+)\/cancel$/,
      async handle({ params, url, response }) {
        // `?unstarted=true`: only a job whose command has not started (a staged run); a running one is left.
        const status = await jobs.cancel(params[0] ?? "", { unstarted: url.searchParams.get("unstarted") === "true" });
        if (status) sendJson(response, 200, status);
        else jobNotFound(response);
      },
    },
    {
      method: "PUT",
      pattern: /^\/v1\/disks\/([^/]+)$/,
      async handle(context) {
        const id = diskId(context);
        if (id === null) return;
        const spec = parseBody(DiskSpec, context);
        if (!spec || (await fenced(context.response, { id, generation: undefined }))) return;
        try {
          const { info, created } = await disks.put(id, spec.sizeBytes, spec.tenant, spec.generation);
          sendJson(context.response, created ? 201 : 200, info);
        } catch (error) {
          if (error instanceof DiskFenced) return sendError(context.response, 409, "DISK_FENCED", error.message);
          if (error instanceof InsufficientStorage) return sendError(context.response, 507, "INSUFFICIENT_STORAGE", error.message);
          if (!(error instanceof DiskOwnedElsewhere)) throw error;
          sendError(context.response, 409, "DISK_BUSY", error.message);
        }
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/disks\/([^/]+)$/,
      async handle(context) {
        const id = diskId(context);
        if (id === null) return;
        const info = await disks.info(id);
        if (info) sendJson(context.response, 200, info);
        else sendError(context.response, 404, "DISK_NOT_FOUND", "disk not found");
      },
    },
    {
      method: "DELETE",
      pattern: /^\/v1\/disks\/([^/]+)$/,
      async handle(context) {
        const id = diskId(context);
        if (id === null) return;
        const busy = leases.busy(id);
        if (busy !== null) return sendError(context.response, 409, "DISK_BUSY", busy);
        if (!(await disks.remove(id))) return sendError(context.response, 404, "DISK_NOT_FOUND", "disk not found");
        context.response.writeHead(204).end();
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/quarantine$/,
      async handle({ response }) {
        sendJson(response, 200, { quarantined: await disks.quarantined() });
      },
    },
    {
      method: "DELETE",
      pattern: /^\/v1\/quarantine\/([^/]+)$/,
      async handle({ params, response }) {
        if (await disks.removeQuarantined(params[0] ?? "")) response.writeHead(204).end();
        else sendError(response, 404, "NOT_FOUND", "no quarantined copy of that name");
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/snapshots$/,
      async handle(context) {
        const spec = parseBody(SnapshotSpec, context);
        if (!spec || (await fenced(context.response, { id: spec.diskId, generation: spec.generation }))) return;
        sendAdmission(context.response, await jobs.submitSnapshot(spec));
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/restores$/,
      async handle(context) {
        const spec = parseBody(RestoreSpec, context);
        if (!spec || (await fenced(context.response, { id: spec.diskId, generation: spec.generation }))) return;
        sendAdmission(context.response, await jobs.submitRestore(spec));
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/processes$/,
      async handle(context) {
        const spec = parseBody(ProcessSpec, context);
        if (!spec || (await fenced(context.response, spec.disk))) return;
        const problems = processSpecProblems(spec);
        if (problems.length > 0) return sendError(context.response, 400, "VALIDATION_ERROR", "body does not match the schema", problems);
        sendProcessAdmission(context.response, await processes.start(spec));
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/processes$/,
      async handle({ url, response }) {
        const key = url.searchParams.get("key");
        if (key === null || !JOB_KEY_PATTERN.test(key)) {
          return sendError(response, 400, "VALIDATION_ERROR", "give the process's key: GET /v1/processes?key=…", [{ path: "key", message: "invalid key" }]);
        }
        const status = processes.statusByKey(key);
        if (status) sendJson(response, 200, status);
        else processNotFound(response);
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/processes\/([^/]+)$/,
      async handle({ params, response }) {
        const status = processes.status(params[0] ?? "");
        if (status) sendJson(response, 200, status);
        else processNotFound(response);
      },
    },
    {
      method: "POST",
      pattern: /^\/v1\/processes\/([^/]+)\/stop$/,
      async handle(context) {
        // An empty body is a stop without drain.
        if (context.body.length === 0) context.body = Buffer.from("{}");
        const stop = parseBody(ProcessStop, context);
        if (!stop) return;
        const status = processes.stop(context.params[0] ?? "", stop.drainSeconds, stop.successor ?? null);
        if (!status) return processNotFound(context.response);
        // Answered once no new request reaches the stopping process (a successor takes them), as the edge expects.
        await processes.routed();
        sendJson(context.response, 202, status);
      },
    },
    {
      method: "GET",
      pattern: /^\/v1\/app-logs\/([^/]+)$/,
      async handle({ params, url, response }) {
        const appId = params[0] ?? "";
        if (!TENANT_PATTERN.test(appId)) {
          return sendError(response, 400, "VALIDATION_ERROR", "app id must match ^[A-Za-z0-9_-]{1,64}$", [{ path: "appId", message: "invalid app id" }]);
        }
        const window: LogWindow = {};
        for (const [name, key] of [["tail", "tailBytes"], ["lines", "tailLines"], ["since", "since"]] as const) {
          const value = url.searchParams.get(name);
          if (value === null) continue;
          if (!/^\d{1,15}$/.test(value)) {
            const what = name === "since" ? "epoch milliseconds" : name === "lines" ? "lines" : "bytes";
            return sendError(response, 400, "VALIDATION_ERROR", `${name} must be a non-negative integer (${what})`, [{ path: name, message: "expected a non-negative integer" }]);
          }
          window[key] = Number(value);
        }
        const process = url.searchParams.get("process");
        if (process !== null) {
          if (!isId("prc", process)) return sendError(response, 400, "VALIDATION_ERROR", "process must be a process id (prc_…)", [{ path: "process", message: "invalid process id" }]);
          window.process = process;
        }
        const follow = ["1", "true"].includes(url.searchParams.get("follow") ?? "");
        const log = await processes.appLogs.get(appId);
        response.writeHead(200, {
          "Content-Type": "text/plain; charset=utf-8",
          "Cache-Control": "no-store",
          "X-Content-Type-Options": "nosniff",
        });
        // Followers must see lines the moment they are written.
        if (follow) response.flushHeaders();
        await log.stream(window, follow, response);
      },
    },
  ];
}

/** Reads the body up to `limit` bytes; "too_large" as soon as it is exceeded. */
function readBody(request: IncomingMessage, limit: number): Promise<Buffer | "too_large"> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    request.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        request.pause();
        resolve("too_large");
      } else {
        chunks.push(chunk);
      }
    });
    request.on("end", () => resolve(Buffer.concat(chunks)));
    request.on("error", reject);
  });
}

/**
 * 413, with what the client still sends read and dropped, up to
 * {@link LINGER_BYTES} more or for {@link LINGER_MS} (past that the
 * connection is cut). Closing on unread bytes resets the connection, and a
 * client (or HAProxy in front, passing the reset on) can lose the answer
 * with it.
 */
function tooLarge(request: IncomingMessage, response: ServerResponse): void {
  let dropped = 0;
  const cut = setTimeout(() => request.destroy(), LINGER_MS).unref();
  request.on("data", (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > LINGER_BYTES) request.destroy();
  });
  request.once("close", () => clearTimeout(cut));
  request.resume();
  sendError(response, 413, "PAYLOAD_TOO_LARGE", `request body exceeds ${MAX_BODY_BYTES} bytes`);
}

/** Builds the request handler: authentication, routing, error envelope. */
export function createRequestHandler(services: BuilderServices): (request: IncomingMessage, response: ServerResponse) => void {
  const table = routes(services);

  const handle = async (request: IncomingMessage, response: ServerResponse): Promise<void> => {
    const target = request.url ?? "/";
    const method = request.method ?? "GET";
    if (target.startsWith(PROXY_PREFIX)) return services.proxy.handle(request, response);
    const url = new URL(target, "http://builder.invalid");
    if (method === "GET" && url.pathname === "/healthz") return sendJson(response, 200, { ok: true });

    if (Number(request.headers["content-length"] ?? 0) > MAX_BODY_BYTES) return tooLarge(request, response);
    const body = await readBody(request, MAX_BODY_BYTES);
    if (body === "too_large") return tooLarge(request, response);

    const verdict = await verifyRequest({
      secret: services.secret,
      method,
      path: target,
      body,
      headers: {
        get: (name) => {
          const value = request.headers[name.toLowerCase()];
          return typeof value === "string" ? value : null;
        },
      },
    });
    if (!verdict.ok) return sendError(response, 401, "UNAUTHORIZED", verdict.reason);
    if (!services.nonces.use(verdict.nonce, verdict.timestamp)) {
      return sendError(response, 401, "UNAUTHORIZED", "replayed request: nonce already used");
    }

    const matching = table.filter((route) => route.pattern.test(url.pathname));
    const route = matching.find((candidate) => candidate.method === method);
    if (!route) {
      if (matching.length === 0) return sendError(response, 404, "NOT_FOUND", `no route for ${url.pathname}`);
      response.setHeader("Allow", matching.map((candidate) => candidate.method).join(", "));
      return sendError(response, 405, "METHOD_NOT_ALLOWED", `${method} is not allowed on ${url.pathname}`);
    }
    const params = route.pattern.exec(url.pathname)?.slice(1) ?? [];
    await route.handle({ params, url, body, response });
  };

  return (request, response) => {
    handle(request, response).catch((error: unknown) => {
      console.error(`builder: ${request.method} ${request.url} failed:`, error);
      if (!response.headersSent) sendError(response, 500, "INTERNAL", "internal error");
      else response.destroy();
    });
  };
}
