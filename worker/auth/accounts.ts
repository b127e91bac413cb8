import type { Db } from "../db/client";
import { type AccountRow, accounts, apiKeys, type Plan } from "../db/schema";
import { newId } from "../lib/ids";
import { iso } from "../lib/time";
import { type CreatedApiKey, newKeyRow, viewOf } from "./keys";

/** Name of the first key every account gets. */
export const FIRST_KEY_NAME = "admin";

export type AccountView = { id: string; name: string; plan: Plan; createdAt: string };

/** Builds an account and its first admin key; shared by the HTTP route and the operator script. */
export async function newAccountRows(input: { name: string; plan: Plan; now: number }) {
  const account: AccountRow = { id: newId("account"), name: input.name, plan: input.plan, createdAt: input.now };
  const key = await newKeyRow({
    accountId: account.id,
    name: FIRST_KEY_NAME,
    scopes: ["admin", "deploy", "db", "registry"],
    expiresAt: null,
    now: input.now,
  });
  return { account, key };
}

export async function createAccount(
  db: Db,
  input: { name: string; plan: Plan },
): Promise<{ account: AccountView; apiKey: CreatedApiKey }> {
  const { account, key } = await newAccountRows({ ...input, now: Date.now() });
  await db.batch([db.insert(accounts).values(account), db.insert(apiKeys).values(key.row)]);
  const { lastUsedAt: _omitted, ...keyView } = viewOf(key.row);
  return {
    account: { id: account.id, name: account.name, plan: account.plan, createdAt: iso(account.createdAt) },
    apiKey: { ...keyView, key: key.secret },
  };
}
