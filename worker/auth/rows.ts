import type { AccountRow, ApiKeyRow, Plan, Scope } from "../db/schema";
import { newId } from "../lib/ids";
import { displayPrefix, generateSecret, hashSecret } from "./secret";

/**
 * Pure row builders for accounts and keys, free of any database handle so the
 * operator script (Node, wrangler d1 execute) and the Worker build identical rows.
 */

/** Name of the first key every account gets. */
export const FIRST_KEY_NAME = "admin";

/** Builds a key row and its secret; callers insert the row (alone or in a batch). */
export async function newKeyRow(input: {
  accountId: string;
  name: string;
  scopes: Scope[];
  expiresAt: number | null;
  now: number;
}): Promise<{ row: ApiKeyRow; secret: string }> {
  const secret = generateSecret();
  const row: ApiKeyRow = {
    id: newId("key"),
    accountId: input.accountId,
    name: input.name,
    hash: await hashSecret(secret),
    start: displayPrefix(secret),
    scopes: [...new Set(input.scopes)],
    expiresAt: input.expiresAt,
    lastUsedAt: null,
    createdAt: input.now,
    deletedAt: null,
  };
  return { row, secret };
}

/** Builds an account and its first admin key; shared by the HTTP route and the operator script. */
export async function newAccountRows(input: { name: string; plan: Plan; operatorEvents?: boolean; now: number }) {
  const account: AccountRow = { id: newId("account"), name: input.name, plan: input.plan, operatorEvents: input.operatorEvents ?? false, createdAt: input.now };
  const key = await newKeyRow({
    accountId: account.id,
    name: FIRST_KEY_NAME,
    scopes: ["admin", "deploy", "db", "registry"],
    expiresAt: null,
    now: input.now,
  });
  return { account, key };
}

