import {
  BuilderError,
  type BuildSpec,
  DiskInfo,
  type DiskSpec,
  type JobSpec,
  JobStatus,
  type ProcessSpec,
  ProcessStatus,
  type RestoreSpec,
  type SnapshotSpec,
  signRequest,
} from "../../builder/src/protocol";
import type { Config } from "../env";
import { ApiError } from "./errors";

/**
 * Signed HTTP to the builder (the data plane). The builder holds no cloud
 * credentials and trusts only requests signed with BUILDER_SECRET.
 */
export type BuilderResult<T> = { ok: true; value: T } | { ok: false; status: number; code: string; message: string };

/** `node` is the builder that holds the thing asked about (placement.ts); the configured builder by default. */
async function builderFetch(config: Config, method: string, path: string, body?: unknown, node = config.BUILDER_URL): Promise<Response> {
  if (!config.BUILDER_SECRET) throw new ApiError("INTERNAL", "the builder is not configured (BUILDER_SECRET unset)");
  const text = body === undefined ? "" : JSON.stringify(body);
  const headers = await signRequest({ secret: config.BUILDER_SECRET, method, path, body: text });
  try {
    return await fetch(new URL(path, node), {
      method,
      headers: body === undefined ? headers : { ...headers, "Content-Type": "application/json" },
      body: body === undefined ? undefined : text,
    });
  } catch (err) {
    throw new ApiError("BUILDER_UNAVAILABLE", `the builder could not be reached: ${err instanceof Error ? err.message : err}`);
  }
}

/**
 * Posts a submission, retrying when the builder cannot be reached or answers
 * 5xx: every submission carries its owner's key, so a retry after a lost
 * reply returns the job that already runs instead of starting a second one.
 */
async function submit(config: Config, path: string, spec: { key?: string | undefined }): Promise<BuilderResult<JobStatus>> {
  let lastError: unknown;
  for (const pause of [0, 200, 800]) {
    if (pause > 0) await new Promise((resolve) => setTimeout(resolve, pause));
    try {
      const res = await builderFetch(config, "POST", path, spec);
      if (res.ok) return { ok: true, value: JobStatus.parse(await res.json()) };
      if (res.status < 500 || spec.key === undefined) return failure(res);
      lastError = new ApiError("BUILDER_UNAVAILABLE", `the builder answered HTTP ${res.status}`);
      await res.body?.cancel();
    } catch (err) {
      if (spec.key === undefined) throw err;
      lastError = err;
    }
  }
  throw lastError;
}

async function failure(res: Response): Promise<{ ok: false; status: number; code: string; message: string }> {
  const parsed = BuilderError.safeParse(await res.json().catch(() => null));
  return parsed.success
    ? { ok: false, status: res.status, code: parsed.data.error.code, message: parsed.data.error.message }
    : { ok: false, status: res.status, code: "INTERNAL", message: `builder answered HTTP ${res.status}` };
}

/** Creates the disk's directory on the builder, or changes its quota. */
export async function provisionDisk(config: Config, id: string, spec: DiskSpec): Promise<BuilderResult<DiskInfo>> {
  const res = await builderFetch(config, "PUT", `/v1/disks/${id}`, spec);
  if (!res.ok) return failure(res);
  return { ok: true, value: DiskInfo.parse(await res.json()) };
}

/** Removes the disk's data on the builder; an unknown disk counts as removed. */
export async function destroyDisk(config: Config, id: string): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, "DELETE", `/v1/disks/${id}`);
  if (res.ok || res.status === 404) return { ok: true, value: null };
  return failure(res);
}

/** Starts a job on the builder (or, by its key, finds the one a lost reply already started). */
export function submitJob(config: Config, spec: JobSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, "/v1/jobs", spec);
}

/** The job submitted with this idempotency key (404 when the builder never got it). */
export async function findJob(config: Config, key: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, "GET", `/v1/jobs?key=${encodeURIComponent(key)}`);
  if (!res.ok) return failure(res);
  return { ok: true, value: JobStatus.parse(await res.json()) };
}

export async function getJob(config: Config, id: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, "GET", `/v1/jobs/${encodeURIComponent(id)}`);
  if (!res.ok) return failure(res);
  return { ok: true, value: JobStatus.parse(await res.json()) };
}

export async function cancelJob(config: Config, id: string): Promise<BuilderResult<JobStatus>> {
  const res = await builderFetch(config, "POST", `/v1/jobs/${encodeURIComponent(id)}/cancel`);
  if (!res.ok) return failure(res);
  return { ok: true, value: JobStatus.parse(await res.json()) };
}

/** The job's complete log so far (the builder keeps at most 10 MiB). */
export async function jobLog(config: Config, id: string): Promise<BuilderResult<string>> {
  const res = await builderFetch(config, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0`);
  if (!res.ok) return failure(res);
  return { ok: true, value: await res.text() };
}

/** The disk's size and current usage on the builder. */
export async function diskUsage(config: Config, id: string): Promise<BuilderResult<DiskInfo>> {
  const res = await builderFetch(config, "GET", `/v1/disks/${encodeURIComponent(id)}`);
  if (!res.ok) return failure(res);
  return { ok: true, value: DiskInfo.parse(await res.json()) };
}

/** Starts a snapshot (tar.gz of the disk streamed in parts to presigned URLs). */
export function submitSnapshot(config: Config, spec: SnapshotSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, "/v1/snapshots", spec);
}

/** Starts a restore (download, validate, extract to staging, swap in). */
export function submitRestore(config: Config, spec: RestoreSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, "/v1/restores", spec);
}

/** Starts a static-site build. */
export function submitBuild(config: Config, spec: BuildSpec): Promise<BuilderResult<JobStatus>> {
  return submit(config, "/v1/builds", spec);
}

/** The job's log as a stream; with `follow` it stays open until the job ends. */
export async function jobLogStream(config: Config, id: string, follow: boolean): Promise<Response> {
  return builderFetch(config, "GET", `/v1/jobs/${encodeURIComponent(id)}/logs?offset=0${follow ? "&follow=1" : ""}`);
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
export async function startProcess(config: Config, node: string, spec: ProcessSpec): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, "POST", "/v1/processes", spec, node);
  if (!res.ok) return failure(res);
  return { ok: true, value: ProcessStatus.parse(await res.json()) };
}

/** A process's status; 404 (PROCESS_NOT_FOUND) when the node has no such process. */
export async function getProcess(config: Config, node: string, id: string): Promise<BuilderResult<ProcessStatus>> {
  const res = await builderFetch(config, "GET", `/v1/processes/${encodeURIComponent(id)}`, undefined, node);
  if (!res.ok) return failure(res);
  return { ok: true, value: ProcessStatus.parse(await res.json()) };
}

/** Stops a process after serving `drainSeconds` more; stopping one that is gone counts as done. */
export async function stopProcess(config: Config, node: string, id: string, drainSeconds: number): Promise<BuilderResult<null>> {
  const res = await builderFetch(config, "POST", `/v1/processes/${encodeURIComponent(id)}/stop`, { drainSeconds }, node);
  if (res.ok || res.status === 404) {
    await res.body?.cancel();
    return { ok: true, value: null };
  }
  return failure(res);
}

/** The app's runtime log on `node`: its last `tailBytes`, and with `follow` what is written next. */
export async function appLogStream(config: Config, node: string, appId: string, tailBytes: number, follow: boolean): Promise<Response> {
  return builderFetch(config, "GET", `/v1/app-logs/${encodeURIComponent(appId)}?tail=${tailBytes}${follow ? "&follow=1" : ""}`, undefined, node);
}
