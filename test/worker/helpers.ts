import { env, exports } from "cloudflare:workers";
import { createAccount } from "../../worker/auth/accounts";
import { createKey } from "../../worker/auth/keys";
import { openDb } from "../../worker/db/client";
import type { Plan, Scope } from "../../worker/db/schema";

export const BASE = "http://api.test";

export const db = () => openDb(env.DB);

/** A fresh account with its admin key; every test gets its own tenant. */
export async function newAccount(plan: Plan = "free") {
  const { account, apiKey } = await createAccount(db(), { name: `acct-${crypto.randomUUID().slice(0, 8)}`, plan });
  return { accountId: account.id, adminKey: apiKey.key };
}

export async function keyWith(accountId: string, scopes: Scope[], expiresAt: number | null = null) {
  return (await createKey(db(), { accountId, name: `k-${scopes.join("-")}`, scopes, expiresAt })).key;
}

type CallInit = { method?: string; key?: string; body?: unknown; headers?: Record<string, string> };

/** One request through the real Worker entry (same createApp as production). */
export async function call(path: string, init: CallInit = {}): Promise<Response> {
  const headers: Record<string, string> = { ...init.headers };
  if (init.key) headers.Authorization = `Bearer ${init.key}`;
  let body: BodyInit | undefined;
  if (init.body !== undefined) {
    body = typeof init.body === "string" ? init.body : JSON.stringify(init.body);
    headers["Content-Type"] ??= "application/json";
  }
  return exports.default.fetch(new Request(`${BASE}${path}`, { method: init.method ?? "GET", headers, body }));
}

export async function json<T = Record<string, unknown>>(res: Response): Promise<T> {
  return (await res.json()) as T;
}

export type ErrorJson = { error: { code: string; message: string; details?: { field: string; message: string }[] } };

/**
 * The shared security check (STYLE 11): a route answers 401 without a key,
 * with a garbage key, and 403 naming the scope for a key lacking it.
 */
export async function expectAuthEnforced(
  path: string,
  init: Omit<CallInit, "key">,
  scope: Scope | null,
  accountId: string,
): Promise<{ unauthenticated: number; garbage: number; wrongScope: ErrorJson | null }> {
  const unauthenticated = (await call(path, init)).status;
  const garbage = (await call(path, { ...init, key: "svc_not-a-real-key" })).status;
  let wrongScope: ErrorJson | null = null;
  if (scope) {
    const others = (["deploy", "db", "registry", "admin"] as Scope[]).filter((s) => s !== scope);
    const res = await call(path, { ...init, key: await keyWith(accountId, others) });
    wrongScope = res.status === 403 ? await json<ErrorJson>(res) : { error: { code: String(res.status), message: "" } };
  }
  return { unauthenticated, garbage, wrongScope };
}
