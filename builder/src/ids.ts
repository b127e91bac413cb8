/**
 * Prefixed ids, like every id on the platform (DESIGN §3): `job_…` for jobs,
 * `prc_…` for app processes, each followed by 24 random base62 characters.
 */
import { randomBytes } from "node:crypto";

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `<prefix>_` + 24 random base62 characters. */
export function newId(prefix: string): string {
  let id = "";
  while (id.length < 24) {
    for (const byte of randomBytes(32)) {
      // 248 = 4 × 62: rejecting the rest keeps every character equally likely.
      if (byte < 248 && id.length < 24) id += BASE62[byte % 62];
    }
  }
  return `${prefix}_${id}`;
}

/** Whether `id` is one {@link newId} made with `prefix`. */
export function isId(prefix: string, id: string): boolean {
  return id.length === prefix.length + 25 && id.startsWith(`${prefix}_`) && /^[0-9A-Za-z]{24}$/.test(id.slice(prefix.length + 1));
}
