import type { components, paths } from "./v1";

/**
 * Shorthands over the types generated from the OpenAPI document (v1.d.ts), for
 * code that names a response rather than letting a typed client infer it (the
 * CLI's own HTTP client).
 */

/** The API's named schemas: App, Disk, Backup, Cron, Deployment, … */
export type Schemas = components["schemas"];

type Method = "get" | "post" | "put" | "patch" | "delete";

/** The JSON body `method path` answers with `status`. */
export type ResponseJson<P extends keyof paths, M extends Method, S extends number> = paths[P][M] extends { responses: infer R }
  ? S extends keyof R
    ? R[S] extends { content: { "application/json": infer B } }
      ? B
      : never
    : never
  : never;

/** What a `{data}` (or disk-backup `{data, status}`) answer carries. */
export type ResponseData<P extends keyof paths, M extends Method, S extends number> = ResponseJson<P, M, S> extends { data: infer D } ? D : never;
