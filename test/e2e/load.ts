import { randomBytes } from "node:crypto";
import type { LocalStack } from "../../scripts/local-stack.js";

/**
 * A load run against the stack (issue 10): clients spread over three
 * accounts create, list and delete keys, apps, cron jobs and backups as fast
 * as they can. Each client remembers what the API told it (created, deleted);
 * afterwards the lists the API reads from D1 must match exactly, and must
 * hold nothing of another account. Shared by the test (small) and
 * bench/load-run.ts (32 clients, 60 s).
 */

type Kind = "key" | "app" | "cron" | "backup";
type Account = { id: string; adminKey: string; adminKeyId: string; diskId: string; seedAppId: string };

export type LoadReport = {
  requests: number;
  /** Answers by status class: 2xx, 4xx other than 429, 429 (rate limited), 5xx. */
  ok: number;
  refused: number;
  rateLimited: number;
  serverErrors: number;
  /** Requests that failed without an answer (connection errors). */
  transportErrors: number;
  /** Per account and kind: ids the API said exist at the end but the clients do not know, and the reverse. */
  mismatches: string[];
  /** Ids listed for one account that another account's clients created. */
  crossAccount: string[];
  serverErrorSamples: string[];
};

type Told = { created: Map<Kind, Set<string>>; deleted: Map<Kind, Set<string>> };

const KINDS: Kind[] = ["key", "app", "cron", "backup"];
const emptyTold = (): Told => ({
  created: new Map(KINDS.map((k) => [k, new Set<string>()])),
  deleted: new Map(KINDS.map((k) => [k, new Set<string>()])),
});

async function operator<T>(stack: LocalStack, method: string, path: string, key: string, body?: unknown): Promise<T> {
  const res = await fetch(`${stack.apiUrl}${path}`, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return (await res.json()) as T;
}

async function setUpAccount(stack: LocalStack, name: string): Promise<Account> {
  const created = await operator<{ account: { id: string }; apiKey: { key: string } }>(stack, "POST", "/v1/accounts", stack.secrets.OPERATOR_TOKEN, {
    name,
    plan: "business",
  });
  const key = created.apiKey.key;
  const [admin] = await operator<{ id: string }[]>(stack, "GET", "/v1/api-keys", key);
  const app = await operator<{ data: { id: string } }>(stack, "POST", "/v1/apps", key, { name: `seed-${randomBytes(4).toString("hex")}`, runtime: "node" });
  const disk = await operator<{ data: { id: string } }>(stack, "POST", "/v1/disks", key, { name: "load", sizeGb: 1 });
  return { id: created.account.id, adminKey: key, adminKeyId: admin!.id, diskId: disk.data.id, seedAppId: app.data.id };
}

/** Runs `clients` clients for `seconds` seconds against three new accounts, then checks what D1 holds. */
export async function runLoad(stack: LocalStack, options: { clients: number; seconds: number }): Promise<LoadReport> {
  const accounts = await Promise.all([0, 1, 2].map((i) => setUpAccount(stack, `load-${i}-${randomBytes(3).toString("hex")}`)));
  const told = new Map(accounts.map((a) => [a.id, emptyTold()]));
  const report: LoadReport = {
    requests: 0,
    ok: 0,
    refused: 0,
    rateLimited: 0,
    serverErrors: 0,
    transportErrors: 0,
    mismatches: [],
    crossAccount: [],
    serverErrorSamples: [],
  };
  // Each client has a key of its own (its rate limit is per key), made by its account's admin key.
  const clientKeys = await Promise.all(
    Array.from({ length: options.clients }, async (_, i) => {
      const account = accounts[i % accounts.length]!;
      const key = await operator<{ id: string; key: string }>(stack, "POST", "/v1/api-keys", account.adminKey, {
        name: `client-${i}`,
        scopes: ["deploy", "admin"],
      });
      told.get(account.id)!.created.get("key")!.add(key.id);
      return { account, key: key.key, keyId: key.id };
    }),
  );

  const deadline = Date.now() + options.seconds * 1000;
  const call = async (key: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> => {
    report.requests++;
    let res: Response;
    try {
      res = await fetch(`${stack.apiUrl}${path}`, {
        method,
        headers: { Authorization: `Bearer ${key}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch {
      report.transportErrors++;
      return { status: 0, json: null };
    }
    const text = await res.text();
    if (res.status >= 500) {
      report.serverErrors++;
      if (report.serverErrorSamples.length < 5) report.serverErrorSamples.push(`${method} ${path}: ${res.status} ${text.slice(0, 300)}`);
    } else if (res.status === 429) report.rateLimited++;
    else if (res.status >= 400) report.refused++;
    else report.ok++;
    if (res.status === 429) await new Promise((r) => setTimeout(r, Number(res.headers.get("Retry-After") ?? 1) * 1000));
    try {
      return { status: res.status, json: text ? (JSON.parse(text) as unknown) : null };
    } catch {
      // Every API answer is JSON; one that is not is the server's fault, whatever its status.
      report.serverErrors++;
      if (report.serverErrorSamples.length < 5) report.serverErrorSamples.push(`${method} ${path}: ${res.status} not JSON: ${text.slice(0, 300)}`);
      return { status: res.status, json: null };
    }
  };

  const client = async ({ account, key }: (typeof clientKeys)[number]): Promise<void> => {
    const mine = told.get(account.id)!;
    const live = new Map<Kind, string[]>(KINDS.map((k) => [k, []]));
    const pick = (kind: Kind) => {
      const list = live.get(kind)!;
      return list.length > 0 ? list.splice(Math.floor(Math.random() * list.length), 1)[0]! : null;
    };
    while (Date.now() < deadline) {
      const kind = KINDS[Math.floor(Math.random() * KINDS.length)]!;
      const roll = Math.random();
      if (roll < 0.4) {
        // create
        const created =
          kind === "key"
            ? await call(key, "POST", "/v1/api-keys", { name: "churn", scopes: ["deploy"] })
            : kind === "app"
              ? await call(key, "POST", "/v1/apps", { name: `l-${randomBytes(5).toString("hex")}`, runtime: "node" })
              : kind === "cron"
                ? await call(key, "POST", "/v1/crons", {
                    appId: account.seedAppId,
                    name: `c-${randomBytes(5).toString("hex")}`,
                    schedule: "0 0 1 1 *",
                    command: "true",
                  })
                : await call(key, "POST", `/v1/disks/${account.diskId}/backups`, { description: "load" });
        if (created.status === 201) {
          const body = created.json as { id?: string; data?: { id: string } };
          const id = body.data?.id ?? body.id!;
          mine.created.get(kind)!.add(id);
          live.get(kind)!.push(id);
        }
      } else if (roll < 0.7) {
        // delete one this client made (a creating backup cannot be deleted yet: 409, it stays)
        const id = pick(kind);
        if (!id) continue;
        const path =
          kind === "key" ? `/v1/api-keys/${id}` : kind === "app" ? `/v1/apps/${id}` : kind === "cron" ? `/v1/crons/${id}` : `/v1/disks/${account.diskId}/backups/${id}`;
        const deleted = await call(key, "DELETE", path);
        if (deleted.status === 200 || deleted.status === 204) mine.deleted.get(kind)!.add(id);
        else live.get(kind)!.push(id);
      } else {
        // list, and every item must be this account's
        const path = kind === "key" ? "/v1/api-keys" : kind === "app" ? "/v1/apps" : kind === "cron" ? "/v1/crons" : `/v1/disks/${account.diskId}/backups`;
        const listed = await call(key, "GET", path);
        if (listed.status === 200) checkOwnership(kind, listed.json, account.id);
      }
    }
  };

  /** Any id another account's clients created, showing up in this account's list, is a cross-account row. */
  const checkOwnership = (kind: Kind, body: unknown, accountId: string) => {
    for (const id of idsOf(body)) {
      for (const [other, record] of told) {
        if (other !== accountId && record.created.get(kind)!.has(id)) report.crossAccount.push(`${kind} ${id} of ${other} listed for ${accountId}`);
      }
    }
  };

  await Promise.all(clientKeys.map(client));

  // Backups still being created settle first; then what the API lists (from D1) must be exactly what clients were told.
  for (const account of accounts) {
    for (let i = 0; i < 240; i++) {
      const list = await operator<{ data: { status: string }[] }>(stack, "GET", `/v1/disks/${account.diskId}/backups`, account.adminKey);
      if (list.data.every((b) => b.status !== "creating")) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const record = told.get(account.id)!;
    const lists: Record<Kind, string> = { key: "/v1/api-keys", app: "/v1/apps", cron: "/v1/crons", backup: `/v1/disks/${account.diskId}/backups` };
    for (const kind of KINDS) {
      const listed = new Set(idsOf(await operator<unknown>(stack, "GET", lists[kind], account.adminKey)));
      checkOwnership(kind, { data: [...listed].map((id) => ({ id })) }, account.id);
      const expected = new Set([...record.created.get(kind)!].filter((id) => !record.deleted.get(kind)!.has(id)));
      // Things set up before the load (the admin key, the seed app) are the account's, not the clients'.
      const setUp = new Set(kind === "app" ? [account.seedAppId] : kind === "key" ? [account.adminKeyId] : []);
      for (const id of expected) if (!listed.has(id)) report.mismatches.push(`${account.id}: ${kind} ${id} was created and not deleted, but is gone`);
      for (const id of listed) {
        if (!expected.has(id) && !setUp.has(id)) {
          report.mismatches.push(`${account.id}: ${kind} ${id} is listed, but ${record.deleted.get(kind)!.has(id) ? "was deleted" : "no client made it"}`);
        }
      }
    }
  }
  return report;
}

function idsOf(body: unknown): string[] {
  const items = Array.isArray(body) ? body : (body as { data?: unknown }).data;
  return Array.isArray(items) ? items.map((item) => (item as { id: string }).id) : [];
}
