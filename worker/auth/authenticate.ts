import { and, eq, isNull, lt, or } from "drizzle-orm";
import type { Principal } from "../context";
import type { Db } from "../db/client";
import { apiKeys } from "../db/schema";
import { hashSecret, isWellFormedSecret } from "./secret";

/** lastUsedAt is refreshed at most this often per key. */
export const LAST_USED_RESOLUTION_MS = 60_000;

export type AuthResult =
  | { ok: true; principal: Principal; lastUsedAt: number | null }
  | { ok: false; message: string };

/**
 * Resolves a `Authorization: Bearer svc_…` header to a principal: structural
 * check, SHA-256, one indexed lookup (the unique index on the hash; the row
 * carries everything a route needs about the caller, so nothing else is read),
 * then deleted/expired checks. Nothing is cached, so a deleted key fails on
 * its very next request.
 */
export async function authenticate(db: Db, header: string | undefined, now: number): Promise<AuthResult> {
  if (!header) return { ok: false, message: "missing Authorization header; send `Authorization: Bearer <API key>`" };
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  if (!match) return { ok: false, message: "malformed Authorization header; expected `Bearer <API key>`" };
  const secret = match[1]!;
  if (!isWellFormedSecret(secret)) return { ok: false, message: "invalid API key" };
  const row = await keyByHash(db, await hashSecret(secret));
  if (!row) return { ok: false, message: "invalid API key" };
  // Only the holder of the exact secret learns what became of it.
  if (row.deletedAt !== null) return { ok: false, message: "this API key was deleted; sign in with another key" };
  if (row.expiresAt !== null && row.expiresAt <= now) {
    return { ok: false, message: `this API key expired at ${new Date(row.expiresAt).toISOString()}; create a new one` };
  }
  return {
    ok: true,
    principal: { keyId: row.id, keyName: row.name, accountId: row.accountId, scopes: row.scopes },
    lastUsedAt: row.lastUsedAt,
  };
}

/** The one read authentication makes: the key with this hash, by its unique index, with all a route needs about the caller. */
export function keyByHash(db: Db, hash: string) {
  return db
    .select({
      id: apiKeys.id,
      name: apiKeys.name,
      accountId: apiKeys.accountId,
      scopes: apiKeys.scopes,
      expiresAt: apiKeys.expiresAt,
      deletedAt: apiKeys.deletedAt,
      lastUsedAt: apiKeys.lastUsedAt,
    })
    .from(apiKeys)
    .where(eq(apiKeys.hash, hash))
    .get();
}

export function needsTouch(lastUsedAt: number | null, now: number): boolean {
  return lastUsedAt === null || now - lastUsedAt >= LAST_USED_RESOLUTION_MS;
}

/** Records use of a key; the guard keeps concurrent requests from writing more than once a minute. */
export async function touchKey(db: Db, keyId: string, now: number): Promise<void> {
  await db
    .update(apiKeys)
    .set({ lastUsedAt: now })
    .where(
      and(
        eq(apiKeys.id, keyId),
        or(isNull(apiKeys.lastUsedAt), lt(apiKeys.lastUsedAt, now - LAST_USED_RESOLUTION_MS)),
      ),
    );
}
