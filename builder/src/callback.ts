/**
 * Completion callbacks: the final JobStatus, POSTed to the URL the Worker gave,
 * signed like the Worker's own requests (path = the URL's pathname + search).
 * Retried with exponential backoff on network errors and non-2xx answers; after
 * the last attempt it gives up, which loses nothing because the Worker can still
 * poll `GET /v1/jobs/:id`.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { JobStatus } from "./protocol/job-status.js";
import type { ProcessStatus } from "./protocol/processes.js";
import type { NodeCredentials } from "./protocol/shared.js";
import { signRequest } from "./protocol/signing.js";

/** Inputs of {@link deliverCallback}; the timings exist so tests and operators can tune them. */
export interface CallbackOptions {
  url: string;
  /** A job's final (or start) status, or an app process's new one. */
  status: JobStatus | ProcessStatus;
  credentials: NodeCredentials;
  attempts?: number;
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Per-attempt time limit. */
  attemptTimeoutMs?: number;
  /** Aborted when the builder shuts down. */
  signal?: AbortSignal;
}

/** Delivers one callback; resolves true once a 2xx answer arrived, false after giving up. */
export async function deliverCallback(options: CallbackOptions): Promise<boolean> {
  const attempts = options.attempts ?? 6;
  const maxDelay = options.maxDelayMs ?? 8_000;
  let delay = options.initialDelayMs ?? 500;
  const url = new URL(options.url);
  const body = JSON.stringify(options.status);
  let lastProblem = "";
  for (let attempt = 1; attempt <= attempts; attempt++) {
    if (options.signal?.aborted) return false;
    try {
      // A fresh timestamp and nonce per attempt: the receiver may have seen the last one.
      const headers = await signRequest({ secret: options.credentials.key, node: options.credentials.node, method: "POST", path: url.pathname + url.search, body });
      const timeout = AbortSignal.timeout(options.attemptTimeoutMs ?? 10_000);
      const response = await fetch(url, {
        method: "POST",
        headers: { ...headers, "Content-Type": "application/json" },
        body,
        signal: options.signal ? AbortSignal.any([options.signal, timeout]) : timeout,
      });
      await response.body?.cancel();
      if (response.ok) return true;
      lastProblem = `HTTP ${response.status}`;
    } catch (error) {
      lastProblem = error instanceof Error ? error.message : String(error);
    }
    if (attempt < attempts) {
      await sleep(delay, undefined, options.signal ? { signal: options.signal } : {}).catch(() => undefined);
      delay = Math.min(delay * 2, maxDelay);
    }
  }
  console.error(`builder: callback for ${options.status.id} to ${url.origin} abandoned after ${attempts} attempts (${lastProblem})`);
  return false;
}
