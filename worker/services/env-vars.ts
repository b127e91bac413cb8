import { and, asc, eq, inArray } from "drizzle-orm";
import type { Db } from "../db/client";
import { envVars } from "../db/schema";
import type { Config } from "../env";
import { decrypt, encrypt } from "../lib/crypto";
import { ApiError } from "../lib/errors";
import { iso } from "../lib/time";

export type EnvVarView = { name: string; updatedAt: string; value?: string };

function encryptionKey(config: Config): string {
  if (!config.ENV_ENCRYPTION_KEY) throw new ApiError("INTERNAL", "env var encryption is not configured (ENV_ENCRYPTION_KEY unset)");
  return config.ENV_ENCRYPTION_KEY;
}

/** The ciphertext is bound to its app and name, so rows cannot be swapped. */
const context = (appId: string, name: string) => `env:${appId}:${name}`;

export async function listEnvVars(db: Db, config: Config, appId: string, reveal: boolean): Promise<EnvVarView[]> {
  const rows = await db.select().from(envVars).where(eq(envVars.appId, appId)).orderBy(asc(envVars.name));
  if (!reveal) return rows.map((r) => ({ name: r.name, updatedAt: iso(r.updatedAt) }));
  const key = encryptionKey(config);
  return Promise.all(
    rows.map(async (r) => ({
      name: r.name,
      updatedAt: iso(r.updatedAt),
      value: await decrypt(key, r.value, context(appId, r.name)),
    })),
  );
}

/** Decrypted name → value map, for injecting into builds and cron runs. */
export async function envOf(db: Db, config: Config, appId: string): Promise<Record<string, string>> {
  const vars = await listEnvVars(db, config, appId, true);
  return Object.fromEntries(vars.map((v) => [v.name, v.value ?? ""]));
}

/** Decrypts the ciphertexts a cron object keeps (name → value as stored in D1), at dispatch only. */
export async function decryptEnv(config: Config, appId: string, ciphertexts: Record<string, string>): Promise<Record<string, string>> {
  const key = encryptionKey(config);
  const entries = await Promise.all(
    Object.entries(ciphertexts).map(async ([name, value]) => [name, await decrypt(key, value, context(appId, name))] as const),
  );
  return Object.fromEntries(entries);
}

/** Merges `vars` into the app's variables in one batch: all are written or none. */
export async function setEnvVars(db: Db, config: Config, appId: string, vars: Record<string, string>): Promise<void> {
  const key = encryptionKey(config);
  const now = Date.now();
  const rows = await Promise.all(
    Object.entries(vars).map(async ([name, value]) => ({
      appId,
      name,
      value: await encrypt(key, value, context(appId, name)),
      updatedAt: now,
    })),
  );
  const [first, ...rest] = rows.map((row) =>
    db
      .insert(envVars)
      .values(row)
      .onConflictDoUpdate({ target: [envVars.appId, envVars.name], set: { value: row.value, updatedAt: now } }),
  );
  if (first) await db.batch([first, ...rest]);
}

/** Removes the named variables; false when any of them was not set (nothing removed then). */
export async function unsetEnvVars(db: Db, appId: string, names: string[]): Promise<string[]> {
  const existing = await db
    .select({ name: envVars.name })
    .from(envVars)
    .where(and(eq(envVars.appId, appId), inArray(envVars.name, names)));
  const missing = names.filter((n) => !existing.some((e) => e.name === n));
  if (missing.length > 0) return missing;
  await db.delete(envVars).where(and(eq(envVars.appId, appId), inArray(envVars.name, names)));
  return [];
}
