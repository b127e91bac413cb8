import type { Db } from "../db/client";
import { accounts, apiKeys, type Plan } from "../db/schema";
import { iso } from "../lib/time";
import { type CreatedApiKey, viewOf } from "./keys";
import { newAccountRows } from "./rows";

export type AccountView = { id: string; name: string; plan: Plan; operatorEvents: boolean; createdAt: string };

export async function createAccount(
  db: Db,
  input: { name: string; plan: Plan; operatorEvents?: boolean },
): Promise<{ account: AccountView; apiKey: CreatedApiKey }> {
  const { account, key } = await newAccountRows({ ...input, now: Date.now() });
  await db.batch([db.insert(accounts).values(account), db.insert(apiKeys).values(key.row)]);
  const { lastUsedAt: _omitted, ...keyView } = viewOf(key.row);
  return {
    account: { id: account.id, name: account.name, plan: account.plan, operatorEvents: account.operatorEvents, createdAt: iso(account.createdAt) },
    apiKey: { ...keyView, key: key.secret },
  };
}
