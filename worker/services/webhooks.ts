import { and, desc, eq, inArray, type SQL, sql } from "drizzle-orm";
import { Webhook } from "standardwebhooks";
import type { Db } from "../db/client";
import { openDb } from "../db/client";
import { accounts, apps, backups, type DeliveryRow, deployments, disks, type WebhookEvent, type WebhookRow, webhookDeliveries, webhooks } from "../db/schema";
import { type Config, configOf, type Env } from "../env";
import { ApiError } from "../lib/errors";
import { newId } from "../lib/ids";
import { iso, isoOrNull } from "../lib/time";

/**
 * Alerts as webhooks (docs/webhooks.md): an event of an account (a deploy
 * failed, an app went into a crash loop, a cron job failed…) becomes one
 * delivery row per webhook that asked for it and one message on the WEBHOOKS
 * queue; the queue's consumer (this Worker's `queue()`) sends it, signed as
 * the Standard Webhooks specification says (`webhook-id`,
 * `webhook-timestamp`, `webhook-signature`, signed by the `standardwebhooks`
 * library), and asks the queue to bring it back after a growing delay until
 * the target takes it (2xx) or 24 hours have passed. At least once: a target
 * may get a delivery twice (the same `webhook-id`), never lose one it was
 * reachable for.
 */

/** Webhooks one account may have. */
export const MAX_WEBHOOKS = 20;
/** Deliveries kept per webhook (the newest). */
const DELIVERIES_KEPT = 100;
/** How long a delivery is tried. */
const DELIVERY_WINDOW_MS = 24 * 60 * 60 * 1000;
/** Seconds before each next attempt: quick at first (a receiver restarting), then hourly. */
const BACKOFF_SECONDS = [5, 10, 30, 60, 120, 300, 600, 1800, 3600];
/** One attempt waits this long for the target's answer. */
const ATTEMPT_TIMEOUT_MS = 10_000;
/** After a secret is rolled, deliveries are signed with both for this long. */
const ROLL_GRACE_MS = 24 * 60 * 60 * 1000;
/** The test event `POST /v1/webhooks/{id}/test` sends (to any webhook, whatever it subscribed to). */
const TEST_EVENT = "webhook.test";

export type WebhookView = {
  id: string;
  url: string;
  events: WebhookEvent[];
  description: string | null;
  /** Whether deliveries are also signed with the secret before the last roll (until `previousSecretExpiresAt`). */
  previousSecretExpiresAt: string | null;
  createdAt: string;
  updatedAt: string;
};

export type DeliveryView = {
  id: string;
  webhookId: string;
  event: string;
  status: DeliveryRow["status"];
  attempts: number;
  responseStatus: number | null;
  error: string | null;
  createdAt: string;
  lastAttemptAt: string | null;
  nextAttemptAt: string | null;
  payload: unknown;
};

export function webhookView(row: WebhookRow, now = Date.now()): WebhookView {
  return {
    id: row.id,
    url: row.url,
    events: row.events,
    description: row.description,
    previousSecretExpiresAt: row.previousSecret && row.previousUntil && row.previousUntil > now ? iso(row.previousUntil) : null,
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
  };
}

export function deliveryView(row: DeliveryRow): DeliveryView {
  return {
    id: row.id,
    webhookId: row.webhookId,
    event: row.event,
    status: row.status,
    attempts: row.attempts,
    responseStatus: row.responseStatus,
    error: row.error,
    createdAt: iso(row.createdAt),
    lastAttemptAt: isoOrNull(row.lastAttemptAt),
    nextAttemptAt: isoOrNull(row.nextAttemptAt),
    payload: JSON.parse(row.payload) as unknown,
  };
}

/** A new secret: `whsec_` and 32 random bytes in base64, as Standard Webhooks writes them. */
function newSecret(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return `whsec_${btoa(String.fromCharCode(...bytes))}`;
}

// ---------------------------------------------------------------------------
// Targets: hostile input
// ---------------------------------------------------------------------------

/** Whether an IPv4 address (dotted) is private, loopback, link-local, shared, reserved or multicast. */
function privateV4(address: string): boolean {
  const parts = address.split(".").map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) return true;
  const [a, b] = parts as [number, number, number, number];
  return (
    a === 0 ||
    a === 10 ||
    a === 127 ||
    (a === 100 && b >= 64 && b < 128) ||
    (a === 169 && b === 254) ||
    (a === 172 && b >= 16 && b < 32) ||
    (a === 192 && b === 168) ||
    (a === 192 && b === 0 && parts[2] === 0) ||
    (a === 198 && (b === 18 || b === 19)) ||
    a >= 224
  );
}

/** Whether an IPv6 address is loopback, unspecified, unique-local, link-local, multicast, or an IPv4 one that is private. */
function privateV6(address: string): boolean {
  const lower = address.toLowerCase().replace(/^\[|\]$/g, "");
  const embedded = /^(?:::ffff:|64:ff9b::)(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
  if (embedded) return privateV4(embedded[1]!);
  // The URL parser writes mapped and NAT64 addresses in hex: ::ffff:7f00:1.
  const hexEmbedded = /^(?:::ffff:|64:ff9b::)([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(lower);
  if (hexEmbedded) {
    const high = Number.parseInt(hexEmbedded[1]!, 16);
    const low = Number.parseInt(hexEmbedded[2]!, 16);
    return privateV4(`${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`);
  }
  if (lower === "::" || lower === "::1") return true;
  const first = Number.parseInt(lower.split(":")[0] || "0", 16);
  return (first & 0xfe00) === 0xfc00 || (first & 0xffc0) === 0xfe80 || (first & 0xff00) === 0xff00;
}

/** Whether a host (a URL's hostname) is an address or a name that never leaves the machine or its network. */
export function privateHost(hostname: string): boolean {
  const host = hostname.toLowerCase().replace(/\.$/, "");
  if (host.startsWith("[")) return privateV6(host);
  if (/^\d+\.\d+\.\d+\.\d+$/.test(host)) return privateV4(host);
  return host === "localhost" || /\.(localhost|local|internal|lan|home\.arpa)$/.test(host);
}

/**
 * Why a webhook URL is refused, or null: http(s) only, no credentials in it,
 * at most 2,048 characters; with private targets refused (production), https
 * only and no private, loopback or link-local address or local name.
 */
export function targetProblem(config: Config, raw: string): string | null {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return "must be an absolute URL (https://…)";
  }
  if (raw.length > 2048) return "must be at most 2,048 characters";
  if (url.protocol !== "https:" && url.protocol !== "http:") return "must be an http or https URL";
  if (url.username || url.password) return "must not hold credentials (put a token in the path or query instead)";
  if (config.WEBHOOK_PRIVATE_TARGETS === "allow") return null;
  if (url.protocol !== "https:") return "must be an https URL";
  if (privateHost(url.hostname)) return `must not point at a private, loopback or link-local address (${url.hostname})`;
  return null;
}

/** At delivery, in production: the addresses the target's name resolves to now (DNS over HTTPS), refused if any is private. */
async function resolvesPrivate(config: Config, hostname: string): Promise<string | null> {
  if (config.WEBHOOK_PRIVATE_TARGETS === "allow" || hostname.startsWith("[") || /^\d+\.\d+\.\d+\.\d+$/.test(hostname)) return null;
  const found: string[] = [];
  for (const type of ["A", "AAAA"]) {
    const url = new URL(config.DNS_OVER_HTTPS_URL);
    url.searchParams.set("name", hostname);
    url.searchParams.set("type", type);
    const res = await fetch(url, { headers: { Accept: "application/dns-json" }, signal: AbortSignal.timeout(5_000) });
    if (!res.ok) throw new Error(`the DNS lookup of ${hostname} failed (HTTP ${res.status})`);
    const answer = (await res.json()) as { Answer?: { type: number; data: string }[] };
    for (const record of answer.Answer ?? []) if (record.type === 1 || record.type === 28) found.push(record.data);
  }
  const bad = found.find((address) => (address.includes(":") ? privateV6(address) : privateV4(address)));
  return bad ? `${hostname} resolves to ${bad}, a private, loopback or link-local address` : null;
}

// ---------------------------------------------------------------------------
// Webhooks of an account
// ---------------------------------------------------------------------------

export async function listWebhooks(db: Db, accountId: string): Promise<WebhookRow[]> {
  return db.select().from(webhooks).where(eq(webhooks.accountId, accountId)).orderBy(desc(webhooks.createdAt), desc(webhooks.id));
}

/** The account's webhook `id`; 404 WEBHOOK_NOT_FOUND otherwise (never another account's). */
export async function webhookOf(db: Db, accountId: string, id: string): Promise<WebhookRow> {
  const row = await db
    .select()
    .from(webhooks)
    .where(and(eq(webhooks.accountId, accountId), eq(webhooks.id, id)))
    .get();
  if (!row) throw new ApiError("WEBHOOK_NOT_FOUND", `no webhook ${id} in this account`);
  return row;
}

function refuseTarget(config: Config, url: string): void {
  const problem = targetProblem(config, url);
  if (problem) throw new ApiError("VALIDATION_ERROR", `url ${problem}`, [{ field: "url", message: problem }]);
}

/** A new webhook, at most {@link MAX_WEBHOOKS} per account (checked by the statement that inserts); its secret, shown once. */
/** The operator's events: the fleet's nodes, heard only by accounts the operator flagged (`operatorEvents`). */
export const OPERATOR_EVENTS: readonly WebhookEvent[] = ["node.unreachable", "node.lost"];

async function refuseOperatorEvents(db: Db, accountId: string, events: WebhookEvent[]): Promise<void> {
  const asked = events.filter((e) => OPERATOR_EVENTS.includes(e));
  if (asked.length === 0) return;
  const account = await db.select({ operatorEvents: accounts.operatorEvents }).from(accounts).where(eq(accounts.id, accountId)).get();
  if (!account?.operatorEvents) {
    throw new ApiError("FORBIDDEN", `${asked.join(" and ")} are the operator's events: only an account the operator created with operatorEvents may subscribe to them`);
  }
}

/** Sends an operator's event to the webhooks of every account flagged for them (never throws). */
export async function emitOperator(env: Env, event: WebhookEvent, data: Record<string, unknown>): Promise<void> {
  const operators = openDb(env.DB).select({ id: accounts.id }).from(accounts).where(eq(accounts.operatorEvents, true));
  await emitTo(env, inArray(webhooks.accountId, operators), event, data, {});
}

export async function createWebhook(
  db: Db,
  config: Config,
  accountId: string,
  input: { url: string; events: WebhookEvent[]; description?: string | null },
): Promise<{ row: WebhookRow; secret: string }> {
  refuseTarget(config, input.url);
  await refuseOperatorEvents(db, accountId, input.events);
  const now = Date.now();
  const row: WebhookRow = {
    id: newId("webhook"),
    accountId,
    url: input.url,
    events: [...new Set(input.events)],
    description: input.description ?? null,
    secret: newSecret(),
    previousSecret: null,
    previousUntil: null,
    createdAt: now,
    updatedAt: now,
  };
  const inserted = await db.run(sql`
    insert into webhooks (id, account_id, url, events, description, secret, created_at, updated_at)
    select ${row.id}, ${accountId}, ${row.url}, ${JSON.stringify(row.events)}, ${row.description}, ${row.secret}, ${now}, ${now}
    where (select count(*) from webhooks where account_id = ${accountId}) < ${MAX_WEBHOOKS}`);
  if (inserted.meta.changes !== 1) throw new ApiError("PLAN_LIMIT_EXCEEDED", `an account may have ${MAX_WEBHOOKS} webhooks; remove one first`);
  return { row, secret: row.secret };
}

export async function updateWebhook(
  db: Db,
  config: Config,
  row: WebhookRow,
  changes: { url?: string; events?: WebhookEvent[]; description?: string | null },
): Promise<WebhookRow> {
  if (changes.url !== undefined) refuseTarget(config, changes.url);
  if (changes.events !== undefined) await refuseOperatorEvents(db, row.accountId, changes.events);
  const [updated] = await db
    .update(webhooks)
    .set({
      ...(changes.url !== undefined ? { url: changes.url } : {}),
      ...(changes.events !== undefined ? { events: [...new Set(changes.events)] } : {}),
      ...(changes.description !== undefined ? { description: changes.description } : {}),
      updatedAt: Date.now(),
    })
    .where(eq(webhooks.id, row.id))
    .returning();
  return updated ?? row;
}

/** A new secret, shown once; the old one still signs (beside it) for a day, so receivers can switch without losing a delivery. */
export async function rollSecret(db: Db, row: WebhookRow): Promise<{ row: WebhookRow; secret: string }> {
  const secret = newSecret();
  const now = Date.now();
  const [updated] = await db
    .update(webhooks)
    .set({ secret, previousSecret: row.secret, previousUntil: now + ROLL_GRACE_MS, updatedAt: now })
    .where(eq(webhooks.id, row.id))
    .returning();
  return { row: updated ?? row, secret };
}

export async function deleteWebhook(db: Db, row: WebhookRow): Promise<void> {
  await db.delete(webhooks).where(eq(webhooks.id, row.id));
}

export async function listDeliveries(db: Db, row: WebhookRow): Promise<DeliveryRow[]> {
  return db
    .select()
    .from(webhookDeliveries)
    .where(eq(webhookDeliveries.webhookId, row.id))
    .orderBy(desc(webhookDeliveries.createdAt), desc(webhookDeliveries.id))
    .limit(DELIVERIES_KEPT);
}

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

/**
 * Tells every webhook of the account that asked for `event`: one delivery
 * row each (the exact body, `{type, timestamp, data}`), then one message each
 * on the queue. Never throws: an alert that cannot be queued is logged, and
 * what caused it goes on.
 */
export async function emit(env: Env, accountId: string, event: WebhookEvent, data: Record<string, unknown>): Promise<void> {
  await emitTo(env, eq(webhooks.accountId, accountId), event, data, { accountId });
}

/** Queues the event to every webhook of the accounts `whose` picks that asked for it; a failure is logged (with `about`), never thrown. */
async function emitTo(env: Env, whose: SQL, event: WebhookEvent, data: Record<string, unknown>, about: Record<string, string>): Promise<void> {
  try {
    const db = openDb(env.DB);
    const targets = await db
      .select({ id: webhooks.id })
      .from(webhooks)
      .where(and(whose, sql`exists (select 1 from json_each(${webhooks.events}) where value = ${event})`));
    if (targets.length === 0) return;
    await queueDeliveries(env, db, targets.map((t) => t.id), event, data);
  } catch (err) {
    console.error(JSON.stringify({ event: "webhook.emit_failed", ...about, type: event, error: err instanceof Error ? err.message : String(err) }));
  }
}

/** `deploy.succeeded` or `deploy.failed` of a deployment, with its app, cause and error. */
export async function deploymentEvent(env: Env, deploymentId: string, outcome: "succeeded" | "failed"): Promise<void> {
  const found = await openDb(env.DB)
    .select({ deployment: deployments, app: { id: apps.id, name: apps.name, accountId: apps.accountId } })
    .from(deployments)
    .innerJoin(apps, eq(apps.id, deployments.appId))
    .where(eq(deployments.id, deploymentId))
    .get()
    .catch(() => undefined);
  if (!found) return;
  const { deployment, app } = found;
  await emit(env, app.accountId, outcome === "succeeded" ? "deploy.succeeded" : "deploy.failed", {
    app: { id: app.id, name: app.name },
    deployment: { id: deployment.id, status: deployment.status, cause: deployment.cause, error: deployment.error },
  });
}

/** `backup.failed` of a backup, with its disk and why. */
export async function backupFailed(env: Env, backupId: string): Promise<void> {
  const found = await openDb(env.DB)
    .select({ backup: backups, disk: { id: disks.id, name: disks.name } })
    .from(backups)
    .innerJoin(disks, eq(disks.id, backups.diskId))
    .where(eq(backups.id, backupId))
    .get()
    .catch(() => undefined);
  if (!found) return;
  await emit(env, found.backup.accountId, "backup.failed", {
    disk: found.disk,
    backup: { id: found.backup.id, description: found.backup.description, automatic: found.backup.automatic, error: found.backup.failureReason },
  });
}

/** Sends the test event to one webhook now (whatever it subscribed to); the delivery, as queued. */
export async function sendTest(env: Env, row: WebhookRow): Promise<DeliveryRow> {
  const db = openDb(env.DB);
  const [id] = await queueDeliveries(env, db, [row.id], TEST_EVENT, { webhookId: row.id, message: "a test event from svc" });
  return (await db.select().from(webhookDeliveries).where(eq(webhookDeliveries.id, id!)).get())!;
}

async function queueDeliveries(env: Env, db: Db, webhookIds: string[], event: string, data: Record<string, unknown>): Promise<string[]> {
  const now = Date.now();
  const rows = webhookIds.map((webhookId) => ({
    id: newId("message"),
    webhookId,
    event,
    payload: JSON.stringify({ type: event, timestamp: iso(now), data }),
    status: "pending" as const,
    attempts: 0,
    createdAt: now,
    nextAttemptAt: now,
  }));
  await db.insert(webhookDeliveries).values(rows);
  await env.WEBHOOKS.sendBatch(rows.map((row) => ({ body: { deliveryId: row.id } })));
  return rows.map((row) => row.id);
}

// ---------------------------------------------------------------------------
// Delivery (the queue's consumer)
// ---------------------------------------------------------------------------

/**
 * One attempt of a delivery: signed with the webhook's secret (and the one
 * before a roll, for a day), POSTed without following redirects, 2xx taking
 * it. Answers how many seconds to wait before the next attempt, or null when
 * there is none (taken, given up after 24 hours, or gone).
 */
export async function deliver(env: Env, deliveryId: string): Promise<number | null> {
  const db = openDb(env.DB);
  const config = configOf(env);
  const found = await db
    .select({ delivery: webhookDeliveries, webhook: webhooks })
    .from(webhookDeliveries)
    .innerJoin(webhooks, eq(webhooks.id, webhookDeliveries.webhookId))
    .where(eq(webhookDeliveries.id, deliveryId))
    .get();
  if (found?.delivery.status !== "pending") return null;
  const { delivery, webhook } = found;
  const now = Date.now();
  let responseStatus: number | null = null;
  let error: string | null = null;
  try {
    const problem = targetProblem(config, webhook.url) ?? (await resolvesPrivate(config, new URL(webhook.url).hostname));
    if (problem) throw new Error(`the target ${problem}`);
    const res = await fetch(webhook.url, {
      method: "POST",
      headers: { ...signatureHeaders(webhook, delivery, now), "Content-Type": "application/json", "User-Agent": "svc-webhooks/1" },
      body: delivery.payload,
      redirect: "manual",
      signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS),
    });
    responseStatus = res.status;
    await res.body?.cancel();
    if (res.status >= 300 && res.status < 400) error = `redirected (HTTP ${res.status}); redirects are not followed`;
    else if (!res.ok) error = `HTTP ${res.status}`;
  } catch (err) {
    error = err instanceof Error ? err.message : String(err);
  }
  const attempts = delivery.attempts + 1;
  if (error === null) {
    await db
      .update(webhookDeliveries)
      .set({ status: "delivered", attempts, responseStatus, error: null, lastAttemptAt: now, nextAttemptAt: null })
      .where(eq(webhookDeliveries.id, delivery.id));
    await prune(db, webhook.id);
    return null;
  }
  const wait = BACKOFF_SECONDS[Math.min(attempts - 1, BACKOFF_SECONDS.length - 1)]!;
  const givenUp = now + wait * 1000 > delivery.createdAt + DELIVERY_WINDOW_MS;
  await db
    .update(webhookDeliveries)
    .set({
      status: givenUp ? "failed" : "pending",
      attempts,
      responseStatus,
      error: givenUp ? `${error}; given up after ${attempts} attempts in 24 hours` : error,
      lastAttemptAt: now,
      nextAttemptAt: givenUp ? null : now + wait * 1000,
    })
    .where(eq(webhookDeliveries.id, delivery.id));
  return givenUp ? null : wait;
}

/** The three Standard Webhooks headers; `webhook-signature` holds one `v1,…` per secret in use. */
function signatureHeaders(webhook: WebhookRow, delivery: DeliveryRow, now: number): Record<string, string> {
  const at = new Date(now);
  const secrets = [webhook.secret, ...(webhook.previousSecret && webhook.previousUntil && webhook.previousUntil > now ? [webhook.previousSecret] : [])];
  const signatures = secrets.map((secret) => new Webhook(secret).sign(delivery.id, at, delivery.payload));
  return { "webhook-id": delivery.id, "webhook-timestamp": String(Math.floor(now / 1000)), "webhook-signature": signatures.join(" ") };
}

/** Keeps the newest {@link DELIVERIES_KEPT} ended deliveries of a webhook. */
async function prune(db: Db, webhookId: string): Promise<void> {
  await db.run(sql`
    delete from webhook_deliveries where webhook_id = ${webhookId} and status != 'pending' and id not in (
      select id from webhook_deliveries where webhook_id = ${webhookId} order by created_at desc, id desc limit ${DELIVERIES_KEPT})`);
}
