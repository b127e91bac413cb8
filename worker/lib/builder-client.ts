import {
  BuilderError,
  type BuildSpec,
  DiskInfo,
  type DiskSpec,
  type JobSpec,
  JobStatus,
  type ProcessSpec,
  ProcessStatus,
  QuarantinedDisk,
  type RestoreSpec,
  type SnapshotSpec,
  nodeKey,
  signRequest,
} from "../../builder/src/protocol";
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

/** A node to talk to: its id (whose key signs) and where it is reached. */
export type NodeRef = { id: string; address: string };

/** The id of the lone builder at BUILDER_URL, which signs with BUILDER_SECRET itself (a control plane without joined nodes). */
export const LONE_BUILDER_ID = "builder";

export { nodeKey };

/** The key requests to `nodeId` are signed with. */
export function signingKey(config: Config, nodeId: string): Promise<string> {
  if (!config.BUILDER_SECRET) throw new ApiError("INTERNAL", "the data plane is not configured (BUILDER_SECRET unset)");
  return nodeId === LONE_BUILDER_ID ? Promise.resolve(config.BUILDER_SECRET) : nodeKey(config.BUILDER_SECRET, nodeId);
}

async function builderFetch(config: Config, node: NodeRef, method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
  const text = body === undefined ? "" : JSON.stringify(body);
  const headers = await signRequest({ secret: await signingKey(config, node.id), method, path, body: text });
  try {
    return await fetch(new URL(path, node.address), {
      method,
      headers: body === undefined ? headers : { ...headers, "Content-Type": "application/json" },
      body: body === undefined ? undefined : text,
      ...(signal ? { signal } : {}),
    });
  } catch (err) {
    throw new ApiError("BUILDER_UNAVAILABLE", `node ${node.id} (${node.address}) could not be reached: ${err instanceof Error ? err.message : err}`);
  }
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
      const res = await builderFetch(config, node, "POST", path, spec);
      if (res.ok) return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
      if (res.status < 500 || spec.key === undefined) return failure(node, res);
      lastError = new ApiError("BUILDER_UNAVAILABLE", `the builder answered HTTP ${res.status}`);
      await res.body?.cancel();
    } catch (err) {
      if (spec.key === undefined) throw err;
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
  const res = await builderFetch(config, node, "PUT", `/v1/disks/${id}`, spec);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, DiskInfo, "a disk's description") };
}

/** Removes the disk's data on the builder; an unknown disk counts as removed. */
export async function destroyDisk(config: Config, node: NodeRef, id: string): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, node, "DELETE", `/v1/disks/${id}`);
  if (res.ok || res.status === 404) return { ok: true, value: null };
  return failure(node, res);
}

/** Starts a job on the builder (or, by its key, finds the one a lost reply already started). */
export function submitJob(config: Config, node: NodeRef, spec: JobSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, node, "/v1/jobs", spec);
}

/** The job submitted with this idempotency key (404 when the builder never got it). */
export async function findJob(config: Config, node: NodeRef, key: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs?key=${encodeURIComponent(key)}`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

export async function getJob(config: Config, node: NodeRef, id: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

export async function cancelJob(config: Config, node: NodeRef, id: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, node, "POST", `/v1/jobs/${encodeURIComponent(id)}/cancel`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, JobStatus, "a job's status") };
}

/** The job's complete log so far (the builder keeps at most 10 MiB). */
export async function jobLog(config: Config, node: NodeRef, id: string): Promise<BuilderResult<string>> {
  const res = await builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await res.text() };
}

/** The disk's size and current usage on the builder; `signal` bounds the wait (a display can do without). */
export async function diskUsage(config: Config, node: NodeRef, id: string, signal?: AbortSignal): Promise<BuilderResult<DiskInfo>> {
  const res = await builderFetch(config, node, "GET", `/v1/disks/${encodeURIComponent(id)}`, undefined, signal);
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
  return builderFetch(config, node, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0${follow ? "&follow=1" : ""}`);
}

/**
 * Why a queued job waits, in words for the API's `waiting` fields (null when
 * it does not wait): its account runs as many jobs as its plan allows, or the
 * builder has no free slot; it starts when one of those ends.
 */
export function describeWait(status: Pick<JobStatus, "status" | "waiting">): string | null {
  const waiting = status.status === "queued" ? status.waiting : null;
  if (!waiting) return status.status === "queued" ? "waiting for a free slot on the builder" : null;
  const ahead = waiting.ahead > 0 ? `; ${waiting.ahead} of the account's jobs are queued ahead of it` : "";
  if (waiting.reason === "tenant_limit") {
    return `waiting for a slot: ${waiting.tenantRunning} of ${waiting.tenantLimit} concurrent jobs of the account's plan running${ahead}`;
  }
  return `waiting for a free slot on the builder: every slot is busy${ahead}`;
}

/** Starts an app process on `node` (or, by its key, finds the one a lost reply already started). */
export async function startProcess(config: Config, node: NodeRef, spec: ProcessSpec): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, node, "POST", "/v1/processes", spec);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, ProcessStatus, "a process's status") };
}

/** A process's status; 404 (PROCESS_NOT_FOUND) when the node has no such process. */
export async function getProcess(config: Config, node: NodeRef, id: string): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, node, "GET", `/v1/processes/${encodeURIComponent(id)}`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: await answer(node, res, ProcessStatus, "a process's status") };
}

/** Stops a process after serving `drainSeconds` more; stopping one that is gone counts as done. */
export async function stopProcess(config: Config, node: NodeRef, id: string, drainSeconds: number): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, node, "POST", `/v1/processes/${encodeURIComponent(id)}/stop`, { drainSeconds });
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
  return builderFetch(config, node, "GET", `/v1/app-logs/${encodeURIComponent(appId)}?${query}`);
}

/** Stale disk copies the node set aside (fencing). */
export async function listQuarantine(config: Config, node: NodeRef): Promise<BuilderResult<QuarantinedDisk[]>> {
  const res = await builderFetch(config, node, "GET", "/v1/quarantine");
  if (!res.ok) return failure(node, res);
  return { ok: true, value: (await answer(node, res, z.object({ quarantined: z.array(QuarantinedDisk) }), "a quarantine listing")).quarantined };
}

/** Deletes a quarantined copy (the operator's decision). */
export async function removeQuarantined(config: Config, node: NodeRef, name: string): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, node, "DELETE", `/v1/quarantine/${encodeURIComponent(name)}`);
  if (!res.ok) return failure(node, res);
  return { ok: true, value: null };
}
