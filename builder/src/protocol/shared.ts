/**
 * Pieces of the wire contract every room's messages use: ids and names, the
 * URLs and digests in specs, and the node's error envelope.
 */
import { z } from "zod";

/** Disk ids become directory names, so they are restricted to a safe alphabet. */
export const DISK_ID_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
/** Tenant (account) ids: each tenant's jobs run as its own user and own its disks. */
export const TENANT_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
/** Names a POSIX shell accepts as environment variables. */
export const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;

export const httpUrl = z.url({ protocol: /^https?$/ });
export const noNul = (value: string) => !value.includes("\0");

export const tenant = z.string().regex(TENANT_PATTERN, "must be a tenant (account) id");

/**
 * Fencing: the disk's generation in the control plane's record, bumped each time
 * its copy of record moves to another node. A node holding an older one refuses
 * the request (`DISK_FENCED`) and never uses that copy again; absent from a
 * control plane that predates nodes.
 */
export const diskGeneration = z.int().positive().optional();

export const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, "must be 64 lowercase hex characters");

/** What a node signs its requests to the Worker with: its key, and its id once it joined (null: a builder holding BUILDER_SECRET itself). */
export type NodeCredentials = { key: string; node: string | null };

/** Every error code the builder answers with. */
export const BuilderErrorCode = z.enum([
  "UNAUTHORIZED",
  "VALIDATION_ERROR",
  "NOT_FOUND",
  "METHOD_NOT_ALLOWED",
  "JOB_NOT_FOUND",
  "PROCESS_NOT_FOUND",
  "DISK_NOT_FOUND",
  "DISK_BUSY",
  /** 409: the request names a newer generation of the disk than this node holds (its copy is stale, fenced off), or an older one. */
  "DISK_FENCED",
  "TENANT_QUEUE_FULL",
  /** 507: the builder's host cannot hold the disk (or the larger quota, or a process's working tree) asked for. */
  "INSUFFICIENT_STORAGE",
  /** 507: the builder's host cannot hold a process's memory limit beside what it promised already. */
  "INSUFFICIENT_MEMORY",
  "PAYLOAD_TOO_LARGE",
  "INTERNAL",
  "UNAVAILABLE",
]);
export type BuilderErrorCode = z.infer<typeof BuilderErrorCode>;

/** Error envelope shared with the Worker's API (DESIGN §3). */
export const BuilderError = z.object({
  error: z.object({ code: BuilderErrorCode, message: z.string(), details: z.unknown().optional() }),
});
export type BuilderError = z.infer<typeof BuilderError>;
