import { and, desc, eq, isNull } from "drizzle-orm";
import type { Db } from "../db/client";
import { type ApiKeyRow, apiKeys, type Scope } from "../db/schema";
import { iso, isoOrNull } from "../lib/time";
import { newKeyRow } from "./rows";

export type ApiKeyView = {
  id: string;
  name: string;
  start: string;
  scopes: Scope[];
  expiresAt: string | null;
  createdAt: string;
  lastUsedAt: string | null;
};

export type CreatedApiKey = Omit<ApiKeyView, "lastUsedAt"> & { key: string };

export function viewOf(row: ApiKeyRow): ApiKeyView {
  return {
    id: row.id,
    name: row.name,
    start: row.start,
    scopes: row.scopes,
    expiresAt: isoOrNull(row.expiresAt),
    createdAt: iso(row.createdAt),
    lastUsedAt: isoOrNull(row.lastUsedAt),
  };
}

function createdView(row: ApiKeyRow, secret: string): CreatedApiKey {
  const { lastUsedAt: _omitted, ...rest } = viewOf(row);
  return { ...rest, key: secret };
}

export async function createKey(
  db: Db,
  input: { accountId: string; name: string; scopes: Scope[]; expiresAt: number | null },
): Promise<CreatedApiKey> {
  const { row, secret } = await newKeyRow({ ...input, now: Date.now() });
  await db.insert(apiKeys).values(row);
  return createdView(row, secret);
}

export async function listKeys(db: Db, accountId: string): Promise<ApiKeyView[]> {
  const rows = await db
    .select()
    .from(apiKeys)
    .where(and(eq(apiKeys.accountId, accountId), isNull(apiKeys.deletedAt)))
    .orderBy(desc(apiKeys.createdAt), desc(apiKeys.id));
  return rows.map(viewOf);
}

function liveKey(accountId: string, id: string) {
  return and(eq(apiKeys.id, id), eq(apiKeys.accountId, accountId), isNull(apiKeys.deletedAt));
}

/** Soft delete; returns false when the key does not exist in this account (→ KEY_NOT_FOUND). */
export async function deleteKey(db: Db, accountId: string, id: string): Promise<boolean> {
  const deleted = await db
    .update(apiKeys)
    .set({ deletedAt: Date.now() })
    .where(liveKey(accountId, id))
    .returning({ id: apiKeys.id });
  return deleted.length > 0;
}

export type RolledApiKey = CreatedApiKey & { previousKey: { id: string; expiresAt: string } };

/**
 * Issues a new secret with the same name, scopes and expiry. The old key keeps
 * working for `graceSeconds` (never past its own expiry); with no grace it is
 * deleted in the same batch, so there is no moment with two or zero live keys
 * beyond what the caller asked for.
 */
export async function rollKey(
  db: Db,
  accountId: string,
  id: string,
  graceSeconds: number,
): Promise<RolledApiKey | null> {
  const old = await db.select().from(apiKeys).where(liveKey(accountId, id)).get();
  if (!old) return null;
  const now = Date.now();
  const { row, secret } = await newKeyRow({
    accountId,
    name: old.name,
    scopes: old.scopes,
    expiresAt: old.expiresAt,
    now,
  });
  const graceEnd = now + graceSeconds * 1000;
  const oldEnd = old.expiresAt === null ? graceEnd : Math.min(old.expiresAt, graceEnd);
  const retire =
    graceSeconds === 0
      ? db.update(apiKeys).set({ deletedAt: now }).where(liveKey(accountId, id))
      : db.update(apiKeys).set({ expiresAt: oldEnd }).where(liveKey(accountId, id));
  await db.batch([db.insert(apiKeys).values(row), retire]);
  return { ...createdView(row, secret), previousKey: { id: old.id, expiresAt: iso(oldEnd) } };
}
