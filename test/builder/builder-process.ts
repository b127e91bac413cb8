/**
 * Runs the real builder as a child process for tests and benchmarks (builder,
 * CLI and end-to-end suites share it), and talks to it the way the Worker does:
 * every request signed with the shared secret.
 */
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import type { JobSpec } from "../../builder/src/protocol/jobs.js";
import { signRequest } from "../../builder/src/protocol/signing.js";
import { launchBuilder } from "../../scripts/builder-process.js";

/** Options of {@link startBuilder}; everything has a throwaway default. */
export interface StartBuilderOptions {
  /** Shared HMAC secret; random by default. */
  secret?: string;
  /** Data directory; a fresh temporary one (removed by stop()) by default. */
  dataDir?: string;
  /** Extra environment for the builder (BUILDER_MAX_CONCURRENT_JOBS, NPM_CONFIG_REGISTRY, …). */
  env?: Record<string, string>;
}

/** A running builder. */
export interface BuilderProcess {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  url: string;
  secret: string;
  dataDir: string;
  pid: number;
  /** Everything the builder printed so far (stdout and stderr). */
  output(): string;
  /** SIGTERM (the builder ends its jobs), SIGKILL after 15 s; removes a temporary data dir. */
  stop(): Promise<void>;
}

/** Starts `builder/src/server.ts` on a free port (see scripts/builder-process.ts) and resolves once it listens. */
export async function startBuilder(options: StartBuilderOptions = {}): Promise<BuilderProcess> {
  const ownDataDir = options.dataDir === undefined;
  const dataDir = options.dataDir ?? (await mkdtemp(join(tmpdir(), "svc-builder-")));
  const secret = options.secret ?? randomBytes(24).toString("hex");
  // Tests end running jobs at once on stop unless they ask for a grace period.
  const env = { BUILDER_SHUTDOWN_GRACE_SECONDS: "0", ...options.env };
  const builder = await launchBuilder({ secret, dataDir, env });
  return {
    ...builder,
    secret,
    dataDir,
    async stop() {
      await builder.stop();
      if (ownDataDir) await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** Where and how to reach a builder. */
export interface BuilderTarget {
  url: string;
  secret: string;
}

/** Options of {@link signedFetch}: an object body is sent as JSON. */
export interface SignedFetchInit {
  method?: string;
  body?: string | object;
  headers?: Record<string, string>;
}

/** Sends one request signed like the Worker's. */
export async function signedFetch(target: BuilderTarget, path: string, init: SignedFetchInit = {}): Promise<Response> {
  const method = init.method ?? "GET";
  const body = init.body === undefined ? undefined : typeof init.body === "string" ? init.body : JSON.stringify(init.body);
  const signature = await signRequest({ secret: target.secret, method, path, body: body ?? "" });
  return fetch(target.url + path, {
    method,
    body,
    headers: { ...(body === undefined ? {} : { "Content-Type": "application/json" }), ...signature, ...init.headers },
  });
}

/** Host path of a disk's data, whichever way the builder keeps disks (a filesystem of their own when root, else a folder). */
export function diskDataPath(dataDir: string, id: string): string {
  const mounted = join(dataDir, "disks", id, "mnt", "data");
  return existsSync(join(dataDir, "disks", id, "disk.img")) ? mounted : join(dataDir, "disks", id, "data");
}

/** What a disk's folder holds when no restore is under way: its record and its data (image and mount point, or a folder). */
export function diskFolderAtRest(dataDir: string, id: string): string[] {
  return existsSync(join(dataDir, "disks", id, "disk.img")) ? ["disk.img", "disk.json", "mnt"] : ["data", "disk.json"];
}

/** The tenant (account) test jobs and disks belong to unless a test names another. */
export const TEST_TENANT = "acct_test";

/** Creates a disk (or changes its quota) for a tenant, as the Worker does. */
export function putDisk(target: BuilderTarget, id: string, sizeBytes: number, tenant = TEST_TENANT): Promise<Response> {
  return signedFetch(target, `/v1/disks/${id}`, { method: "PUT", body: { sizeBytes, tenant } });
}

/** Submits a job; throws unless the builder accepted it. */
export async function submitJob(target: BuilderTarget, spec: Partial<JobSpec> & { command: string }): Promise<JobStatus> {
  const response = await signedFetch(target, "/v1/jobs", {
    method: "POST",
    body: { tenant: TEST_TENANT, env: {}, timeoutSeconds: 60, memoryMb: 512, ...spec },
  });
  if (response.status !== 201) throw new Error(`submit failed: ${response.status} ${await response.text()}`);
  return JobStatus.parse(await response.json());
}

/** Reads the job's log (following it, so this returns when the job has ended). */
export async function followLog(target: BuilderTarget, id: string, offset = 0): Promise<string> {
  const response = await signedFetch(target, `/v1/jobs/${id}/logs?offset=${offset}&follow=1`);
  if (response.status !== 200) throw new Error(`log failed: ${response.status} ${await response.text()}`);
  return response.text();
}

/** The job's current status. */
export async function jobStatus(target: BuilderTarget, id: string): Promise<JobStatus> {
  const response = await signedFetch(target, `/v1/jobs/${id}`);
  if (response.status !== 200) throw new Error(`status failed: ${response.status} ${await response.text()}`);
  return JobStatus.parse(await response.json());
}

/** Submits a job and waits for its end: final status plus the whole log. */
export async function runToEnd(
  target: BuilderTarget,
  spec: Partial<JobSpec> & { command: string },
): Promise<{ status: JobStatus; log: string }> {
  const submitted = await submitJob(target, spec);
  const log = await followLog(target, submitted.id);
  return { status: await jobStatus(target, submitted.id), log };
}
