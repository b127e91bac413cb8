import { DiskInfo, type DiskSpec, type RestoreSpec, type SnapshotSpec } from "../../builder/src/protocol/disks";
import { JobStatus } from "../../builder/src/protocol/job-status";
import type { JobSpec } from "../../builder/src/protocol/jobs";
import { QuarantinedDisk, nodeKey } from "../../builder/src/protocol/node";
import { type ProcessSpec, ProcessStatus } from "../../builder/src/protocol/processes";
import { BuilderError } from "../../builder/src/protocol/shared";
import { signRequest } from "../../builder/src/protocol/signing";
import type { BuildSpec } from "../../builder/src/protocol/static";
import { z } from "zod";
import type { Config } from "../env";
import { ApiError } from "./errors";

/**
 * Signed HTTP to the nodes of the data plane. A node holds no cloud
 * credentials and trusts only requests signed with its own key (derived from
 * BUILDER_SECRET and its id, so a request signed for one node is refused by
 * every other). Which node to ask is placement's answer (placement.ts).
 */
export type BuilderResult<T> = { ok: true; value: T } | { ok: false; status: number; code: string; message: string };

/**
 * Why calls to a node are not made now: it missed a call's deadline
 * (`unreachable`) or went silent past the heartbeat threshold (`lost`), at
 * `since`; the fleet's view, at most 2 s old (fleet.ts).
 */
export type NodeSickness = { state: "unreachable" | "lost"; since: number; reason: string };

/** A node to talk to: its id (whose key signs), where it is reached, and whether the fleet holds it sick. */
export type NodeRef = { id: string; address: string; name?: string; sick?: NodeSickness | null };

/** The id of the lone builder at BUILDER_URL, which signs with BUILDER_SECRET itself (a control plane without joined nodes). */
export const LONE_BUILDER_ID = "builder";

/**
 * How long each kind of call may wait for a node's answer (its headers)
 * before the node counts as unreachable. A healthy node answers every call
 * but a disk's making in milliseconds (it queues jobs and starts processes
 * in the background), so these are seconds: a hung node costs the API call
 * that found it at most this, and the calls after it nothing (they answer
 * NODE_UNREACHABLE at once).
 */
export const DEADLINES_MS = {
  /** Submissions, lookups, status reads, stops, cancels, a stream's first byte. */
  call: 1_000,
  /**
   * After a missed deadline, the node's /healthz gets this long to show it is
   * alive (busy on that one call) before it is marked unreachable: the call
   * that found a hung node still answers within 2 s.
   */
  confirm: 500,
  /** Making a disk (a filesystem image on the node) or removing one. */
  disk: 10_000,
  /** A stream's body that is complete on the node (not followed): silence this long ends it. */
  streamIdle: 10_000,
  /** A followed stream's silence after which the node is asked whether it is alive (a quiet log is no fault). */
  followIdle: 15_000,
} as const;

/** How long a client is told to wait before asking again about a sick node's resources. */
const RETRY_AFTER_SECONDS = 10;

/**
 * Who hears that a node missed a deadline: the Fleet object, registered
 * once per isolate by worker/services/fleet.ts (the module that hands out
 * NodeRefs). A node missing one is marked unreachable at once.
 */
let unreachableListener: ((node: NodeRef, reason: string, at: number) => Promise<void>) | null = null;

export function onNodeUnreachable(listener: (node: NodeRef, reason: string, at: number) => Promise<void>): void {
  unreachableListener = listener;
}

export { nodeKey };

/** The key requests to `nodeId` are signed with. */
export function signingKey(config: Config, nodeId: string): Promise<string> {
  if (!config.BUILDER_SECRET) throw new ApiError("INTERNAL", "the data plane is not configured (BUILDER_SECRET unset)");
  return nodeId === LONE_BUILDER_ID ? Promise.resolve(config.BUILDER_SECRET) : nodeKey(config.BUILDER_SECRET, nodeId);
}

/**
 * 503 NODE_UNREACHABLE for a call about something on a sick node: what is
 * known (since when, why) and when to ask again. `next` says what happens
 * to the resource meanwhile (placement.ts words it for a disk).
 */
function nodeUnreachable(node: NodeRef, sick: NodeSickness, next?: string): ApiError {
  const label = node.name ?? node.id;
  const what =
    sick.state === "lost"
      ? `node ${label} was declared lost at ${new Date(sick.since).toISOString()} (${sick.reason})`
      : `node ${label} stopped answering at ${new Date(sick.since).toISOString()} (${sick.reason})`;
  return new ApiError("NODE_UNREACHABLE", `${what}${next ? `; ${next}` : ""}`, undefined, undefined, { "Retry-After": String(RETRY_AFTER_SECONDS) });
}

/** Errors for calls never sent (the node was already held sick): nothing can have started there. */
const unsent = new WeakSet<Error>();

/** A call about something on a sick node, refused without calling it: 503 NODE_UNREACHABLE, known not to have reached the node. */
export function refuseSick(node: NodeRef, sick: NodeSickness, next?: string): ApiError {
  const error = nodeUnreachable(node, sick, next);
  unsent.add(error);
  return error;
}

/** Whether `err` refused a call before it was sent (a retry later cannot find it started). */
export function neverSent(err: unknown): boolean {
  return err instanceof Error && unsent.has(err);
}

/**
 * A call missed its deadline: unless the node shows at once that it is alive
 * (only busy on that call), it is marked unreachable (the Fleet object hears
 * it); either way the call that found it answers NODE_UNREACHABLE now.
 */
async function missed(node: NodeRef, reason: string, alreadyProbed = false): Promise<ApiError> {
  const at = Date.now();
  const sick: NodeSickness = { state: "unreachable", since: at, reason };
  if (!alreadyProbed && (await probe(node, DEADLINES_MS.confirm))) {
    const message = `node ${node.name ?? node.id} is busy (${reason}, though it answers its health check); try again`;
    return new ApiError("NODE_UNREACHABLE", message, undefined, undefined, { "Retry-After": "2" });
  }
  await unreachableListener?.(node, reason, at).catch((err: unknown) => console.error(`marking node ${node.id} unreachable failed`, err));
  return nodeUnreachable(node, sick);
}

type CallOptions = { body?: unknown; deadlineMs?: number; signal?: AbortSignal; what: string };

/**
 * One signed call to a node, bounded: no answer (headers) within its
 * deadline marks the node unreachable and answers 503 NODE_UNREACHABLE; a
 * node already held sick is not called at all. A refused connection (a node
 * restarting) stays BUILDER_UNAVAILABLE: it is quick, and says nothing of a
 * hang. The deadline ends with the headers: a body is read under the
 * caller's own bound (streams: {@link idleBounded}).
 */
async function builderFetch(config: Config, node: NodeRef, method: string, path: string, options: CallOptions): Promise<Response> {
  if (node.sick) throw refuseSick(node, node.sick);
  const deadlineMs = options.deadlineMs ?? DEADLINES_MS.call;
  const text = options.body === undefined ? "" : JSON.stringify(options.body);
  const headers = await signRequest({ secret: await signingKey(config, node.id), method, path, body: text });
  const deadline = new AbortController();
  const timer = setTimeout(() => deadline.abort(), deadlineMs);
  try {
    return await fetch(new URL(path, node.address), {
      method,
      headers: options.body === undefined ? headers : { ...headers, "Content-Type": "application/json" },
      body: options.body === undefined ? undefined : text,
      signal: options.signal ? AbortSignal.any([deadline.signal, options.signal]) : deadline.signal,
    });
  } catch (err) {
    if (deadline.signal.aborted && !options.signal?.aborted) throw await missed(node, `${options.what}: no answer within ${deadlineMs / 1000} s`);
    throw new ApiError("BUILDER_UNAVAILABLE", `node ${node.id} (${node.address}) could not be reached: ${err instanceof Error ? err.message : err}`);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether the node answers at all (its unauthenticated /healthz) within a
 * call's deadline: the Fleet object's probe of an unreachable node, and a
 * followed stream's check after a silence.
 */
export async function probe(node: Pick<NodeRef, "address">, deadlineMs: number = DEADLINES_MS.call): Promise<boolean> {
  try {
    const res = await fetch(new URL("/healthz", node.address), { signal: AbortSignal.timeout(deadlineMs) });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

/**
 * A stream's body passed on under an idle bound: silent for
 * `streamIdle` (complete on the node, not followed) it ends in an error;
 * followed, a silence of `followIdle` asks the node whether it is alive, and
 * one that does not answer is marked unreachable and the stream ends.
 */
export function idleBounded(
  node: NodeRef,
  res: Response,
  follow: boolean,
  what: string,
  idleMs: number = follow ? DEADLINES_MS.followIdle : DEADLINES_MS.streamIdle,
): Response {
  if (!res.ok || !res.body) return res;
  const reader = res.body.getReader();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const silent = () =>
    new Promise<"silent">((resolve) => {
      timer = setTimeout(() => resolve("silent"), idleMs);
    });
  // A read outlives a silence the probe excuses: it is awaited again, never doubled (a stream takes one pending read).
  let reading: Promise<ReadableStreamReadResult<Uint8Array>> | null = null;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      for (;;) {
        reading ??= reader.read();
        const next = await Promise.race([reading, silent()]);
        clearTimeout(timer);
        if (next !== "silent") {
          reading = null;
          if (next.done) controller.close();
          else controller.enqueue(next.value);
          return;
        }
        if (follow && (await probe(node))) continue;
        const error = follow ? await missed(node, `${what}: silent ${idleMs / 1000} s and no answer to a probe`, true) : new Error(`${what}: silent for ${idleMs / 1000} s`);
        await reader.cancel(error).catch(() => undefined);
        controller.error(error);
        return;
      }
    },
    cancel(reason) {
      clearTimeout(timer);
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: res.status, headers: res.headers });
}

/**
 * Posts a submission, retrying when the builder cannot be reached or answers
 * 5xx: every submission carries its owner's key, so a retry after a lost
 * reply returns the job that already runs instead of starting a second one.
 */
async function submit(config: Config, node: NodeRef, path: string, spec: { key?: string | undefined }): Promise<BuilderResult<JobStatus>> {
  let lastError: unknown;
  for (const pause of [0, 200, 800]) {
    if (pause > 0) await new Promise((resolve) => setTimeout(resolve, pause));
    try {
      const res = await builderFetch(config, node, "POST", path, { body: spec, what: `submitting to ${path}` });
      if (res.ok) return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
      if (res.status < 500 || spec.key === undefined) return failure(node, res);
      lastError = new ApiError("BUILDER_UNAVAILABLE", `the builder answered HTTP ${res.status}`);
      await res.body?.cancel();
    } catch (err) {
      // A node that missed the deadline is not asked again: it is marked unreachable, and the caller hears it now.
      if (spec.key === undefined || (err instanceof ApiError && err.code === "NODE_UNREACHABLE")) throw err;
      lastError = err;
    }
  }
  throw lastError;
}

/**
 * A node's answer read as `schema`; anything else (a node out of date, or one
 * that is not what it claims) is the node failing, 502 with the node named,
 * never an internal error of ours.
 */
async function answer<T>(node: NodeRef, res: Response, schema: z.ZodType<T>, what: string): Promise<T> {
  const parsed = schema.safeParse(await res.json().catch(() => undefined));
  if (parsed.success) return parsed.data;
  throw new ApiError("BUILDER_UNAVAILABLE", `node ${node.id} (${node.address}) answered something that is not ${what}`);
}

/**
 * A node's refusal as a value: its own code and words for what it refused
 * (DISK_BUSY, INSUFFICIENT_STORAGE, UNAVAILABLE…); a node failing (an
 * internal error, or an answer that is not one of ours) is named, so the
 * operator knows which.
 */
async function failure(node: NodeRef, res: Response): Promise<{ ok: false; status: number; code: string; message: string }> {
  const parsed = BuilderError.safeParse(await res.json().catch(() => null));
  if (parsed.success && parsed.data.error.code !== "INTERNAL") return { ok: false, status: res.status, code: parsed.data.error.code, message: parsed.data.error.message };
  const said = parsed.success ? `: ${parsed.data.error.message}` : "";
  return { ok: false, status: res.status, code: parsed.success ? parsed.data.error.code : "INTERNAL", message: `node ${node.id} (${node.address}) answered HTTP ${res.status}${said}` };
}

/** Creates the disk's directory on the builder, or changes its quota. */
export async function provisionDisk(config: Config, node: NodeRef, id: string, spec: DiskSpec): Promise<BuilderResult<DiskInfo>> {
  const res = await builderFetch(config, node, "PUT", `/v1/disks/${id}`, { body: spec, deadlineMs: DEADLINES_MS.disk, what: `making disk ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, DiskInfo, "a disk's description") };
}

/** Removes the disk's data on the builder; an unknown disk counts as removed. */
export async function destroyDisk(config: Config, node: NodeRef, id: string): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, node, "DELETE", `/v1/disks/${id}`, { deadlineMs: DEADLINES_MS.disk, what: `removing disk ${id}` });
  if (res.ok || res.status === 404) return { ok: true, value: null };
  return failure(node, res);
}

/** Starts a job on the builder (or, by its key, finds the one a lost reply already started). */
export function submitJob(config: Config, node: NodeRef, spec: JobSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, node, "/v1/jobs", spec);
}

/** The job submitted with this idempotency key (404 when the builder never got it). */
export async function findJob(config: Config, node: NodeRef, key: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs?key=${encodeURIComponent(key)}`, { what: "finding a job by its key" });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

export async function getJob(config: Config, node: NodeRef, id: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}`, { what: `status of ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

export async function cancelJob(config: Config, node: NodeRef, id: string, options: { unstarted?: boolean } = {}): Promise<BuilderResult<JobStatus>> {
  // `unstarted`: only if its command has not started (a staged run); the status says which it was.
  const query = options.unstarted ? "?unstarted=true" : "";
  const res = await builderFetch(config, node, "POST", `/v1/jobs/${encodeURIComponent(id)}/cancel${query}`, { what: `cancelling ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

/** The job's complete log so far (the builder keeps at most 10 MiB). */
export async function jobLog(config: Config, node: NodeRef, id: string): Promise<BuilderResult<string>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0`, { what: `log of ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await res.text() };
}

/** The disk's size and current usage on the builder; `signal` bounds the wait (a display can do without). */
export async function diskUsage(config: Config, node: NodeRef, id: string, signal?: AbortSignal): Promise<BuilderResult<DiskInfo>> {
  const res = await builderFetch(config, node, "GET", `/v1/disks/${encodeURIComponent(id)}`, { signal, what: `usage of disk ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, DiskInfo, "a disk's description") };
}

/** Starts a snapshot (tar.gz of the disk streamed in parts to presigned URLs). */
export function submitSnapshot(config: Config, node: NodeRef, spec: SnapshotSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, node, "/v1/snapshots", spec);
}

/** Starts a restore (download, validate, extract to staging, swap in). */
export function submitRestore(config: Config, node: NodeRef, spec: RestoreSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, node, "/v1/restores", spec);
}

/** Starts a static-site build. */
export function submitBuild(config: Config, node: NodeRef, spec: BuildSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, node, "/v1/builds", spec);
}

/** The job's log as a stream; with `follow` it stays open until the job ends. */
export async function jobLogStream(config: Config, node: NodeRef, id: string, follow: boolean): Promise<Response> {
  const what = `log of ${id}`;
  return idleBounded(node, await builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0${follow ? "&follow=1" : ""}`, { what }), follow, what);
}

/**
 * Why a queued job waits, in words for the API's `waiting` fields (null when
 * it does not wait): its account runs as many jobs as its plan allows, or the
 * builder has no free slot; it starts when one of those ends.
 */
export function describeWait(status: Pick<JobStatus, "status" | "waiting">): string | null {
  const waiting = status.status === "queued" ? status.waiting : null;
  if (!waiting) return status.status === "queued" ? "waiting for a free slot on the builder" : null;
  if (waiting.reason === "scheduled") return "staged on its node: the sandbox is made, the command starts at its second";
  const ahead = waiting.ahead > 0 ? `; ${waiting.ahead} of the account's jobs are queued ahead of it` : "";
  if (waiting.reason === "tenant_limit") {
    return `waiting for a slot: ${waiting.tenantRunning} of ${waiting.tenantLimit} concurrent jobs of the account's plan running${ahead}`;
  }
  return `waiting for a free slot on the builder: every slot is busy${ahead}`;
}

/** Starts an app process on `node` (or, by its key, finds the one a lost reply already started). */
export async function startProcess(config: Config, node: NodeRef, spec: ProcessSpec): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, node, "POST", "/v1/processes", { body: spec, what: "starting a process" });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, ProcessStatus, "a process's status") };
}

/** A process's status; 404 (PROCESS_NOT_FOUND) when the node has no such process. */
export async function getProcess(config: Config, node: NodeRef, id: string): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/processes/${encodeURIComponent(id)}`, { what: `status of ${id}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, ProcessStatus, "a process's status") };
}

/** Stops a process after serving `drainSeconds` more; stopping one that is gone counts as done. */
export async function stopProcess(config: Config, node: NodeRef, id: string, drainSeconds: number, successor?: string): Promise<BuilderResult<null>> {
  const body = successor === undefined ? { drainSeconds } : { drainSeconds, successor };
  const res = await builderFetch(config, node, "POST", `/v1/processes/${encodeURIComponent(id)}/stop`, { body, what: `stopping ${id}` });
  if (res.ok || res.status === 404) {
    await res.body?.cancel();
    return { ok: true, value: null };
  }
  return failure(node, res);
}

/** Which part of an app's runtime log to read: the last bytes or lines, or since a time (epoch ms); one process's lines only. */
export type LogWindow = ({ tail: number } | { lines: number } | { since: number }) & { process?: string };

/** The app's runtime log on `node` (the part `window` says), and with `follow` what is written next. */
export async function appLogStream(config: Config, node: NodeRef, appId: string, window: LogWindow, follow: boolean): Promise<Response> {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(window)) query.set(name, String(value));
  if (follow) query.set("follow", "1");
  const what = `runtime log of ${appId}`;
  return idleBounded(node, await builderFetch(config, node, "GET", `/v1/app-logs/${encodeURIComponent(appId)}?${query}`, { what }), follow, what);
}

/** Stale disk copies the node set aside (fencing). */
export async function listQuarantine(config: Config, node: NodeRef): Promise<BuilderResult<QuarantinedDisk[]>> {
  const res = await builderFetch(config, node, "GET", "/v1/quarantine", { what: "its quarantine" });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: (await answer(node, res, z.object({ quarantined: z.array(QuarantinedDisk) }), "a quarantine listing")).quarantined };
}

/** Deletes a quarantined copy (the operator's decision). */
export async function removeQuarantined(config: Config, node: NodeRef, name: string): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, node, "DELETE", `/v1/quarantine/${encodeURIComponent(name)}`, { what: `removing quarantined ${name}` });
  if (!res.ok) return failure(node, res);
  return { ok: true, value: null };
}
