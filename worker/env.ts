import { z } from "zod";
import type { AppMetrics } from "../durable-objects/app-metrics";
import type { AppRuntime } from "../durable-objects/app-runtime";
import type { BackupJob } from "../durable-objects/backup-job";
import type { CronJob } from "../durable-objects/cron-job";
import type { Deployment } from "../durable-objects/deployment";
import type { Fleet } from "../durable-objects/fleet";
import type { RestoreJob } from "../durable-objects/restore-job";

/** A queued webhook delivery: the row (webhook_deliveries) to send. */
export type WebhookMessage = { deliveryId: string };

/** Bindings and vars the Worker is deployed with (wrangler.toml + secrets). */
export interface Env {
  DB: D1Database;
  BUCKET: R2Bucket;
  CRON_JOB: DurableObjectNamespace<CronJob>;
  BACKUP_JOB: DurableObjectNamespace<BackupJob>;
  RESTORE_JOB: DurableObjectNamespace<RestoreJob>;
  DEPLOYMENT: DurableObjectNamespace<Deployment>;
  APP_RUNTIME: DurableObjectNamespace<AppRuntime>;
  /** The fleet's one object: membership, heartbeat deadlines, node loss. */
  FLEET: DurableObjectNamespace<Fleet>;
  /** One object per app: its request metrics in minute and hour buckets. */
  APP_METRICS: DurableObjectNamespace<AppMetrics>;
  /** Webhook deliveries, one message per event and webhook ([[queues]] in wrangler.toml; the consumer is this Worker). */
  WEBHOOKS: Queue<WebhookMessage>;
  /** Requests per API key ([[ratelimits]] in wrangler.toml). */
  API_RATE_LIMITER: RateLimit;
  /** The dashboard's static assets (`[assets]` in wrangler.toml). */
  ASSETS: Fetcher;
  /** Where the builder can reach this Worker (completion callbacks). */
  PUBLIC_URL: string;
  APPS_DOMAIN: string;
  APPS_URL_SCHEME: string;
  /**
   * The request header that carries the client's address as the edge itself
   * knows it (`CF-Connecting-IP`, which Cloudflare sets); unset locally, where a
   * client may send any value in it: apps then get no X-Forwarded-For.
   */
  CLIENT_IP_HEADER?: string;
  S3_ENDPOINT: string;
  S3_BUCKET: string;
  /** A lone builder holding BUILDER_SECRET itself, used while no node has joined (tests, single-host setups); unset in production. */
  BUILDER_URL?: string;
  NODE_HEARTBEAT_SECONDS: string;
  NODE_LOST_AFTER_SECONDS: string;
  /** How long a lost node's disks wait for it to return before they are restored from backup elsewhere. */
  DISK_FAILOVER_GRACE_SECONDS: string;
  /** Scaling on load: how long an app must need more instances before one is added (default 15). */
  AUTOSCALE_UP_SECONDS?: string;
  /** Scaling on load: how long an app must need fewer instances before one is drained (default 60). */
  AUTOSCALE_DOWN_SECONDS?: string;
  /** Request metrics (AppMetrics, docs/metrics.md): "on" (default), or "off" to record none, the request log kept (bench/metrics-cost.ts measures the difference). */
  METRICS?: string;
  /** How long a heartbeat's answer lets a node hold its disks: a node that cannot renew it stops their writers (docs/fleet.md, "Leases"). */
  NODE_LEASE_SECONDS: string;
  /** The most a node is believed to have, whatever it reports, unless its join token (or the operator) says otherwise. */
  NODE_MAX_CORES: string;
  NODE_MAX_MEMORY_MB: string;
  NODE_MAX_DISK_GB: string;
  MAX_REQUEST_BODY_BYTES: string;
  MAX_BUILD_UPLOAD_BYTES: string;
  BUILD_MEMORY_MB: string;
  BUILD_TIMEOUT_SECONDS: string;
  MAX_LOG_BYTES: string;
  MAX_RESTORE_ARCHIVE_BYTES: string;
  PRESIGNED_URL_TTL_SECONDS: string;
  KEY_ROLL_MAX_GRACE_SECONDS: string;
  API_RATE_LIMIT_PERIOD_SECONDS: string;
  OPERATOR_TOKEN?: string;
  BUILDER_SECRET?: string;
  ENV_ENCRYPTION_KEY?: string;
  R2_ACCESS_KEY_ID?: string;
  R2_SECRET_ACCESS_KEY?: string;
  /**
   * Custom domains (docs/domains.md): how ownership is proven, `dns` (a TXT
   * record, read through DNS_OVER_HTTPS_URL) in production, `http` (a token
   * our own edge answers, fetched from DOMAIN_CHECK_ORIGIN with the domain's
   * Host header) on a local stack.
   */
  DOMAIN_VERIFICATION?: string;
  DOMAIN_CHECK_ORIGIN?: string;
  DNS_OVER_HTTPS_URL?: string;
  /** What a custom domain's CNAME points at: the SaaS zone's fallback origin in production. */
  DOMAIN_CNAME_TARGET?: string;
  /** "on" where the edge terminates TLS for custom domains (production): `httpsOnly` domains then redirect http to https. */
  CUSTOM_DOMAIN_TLS?: string;
  /** `allow`: webhook targets may be private, loopback or link-local addresses (a local stack); `refuse` (default) in production. */
  WEBHOOK_PRIVATE_TARGETS?: string;
  /** Cloudflare for SaaS: the zone whose custom hostnames carry the certificates, and a token that may edit them. */
  CF_ZONE_ID?: string;
  CF_API_TOKEN?: string;
  CF_API_URL?: string;
  /** Hosts the control plane answers on besides PUBLIC_URL's (comma-separated); any other host that is no app's gets a 404. */
  API_HOSTS?: string;
  /** "on" only in bench/api-auth.ts's stack: serves the floor it measures authentication against (app.ts). */
  BENCH_FLOOR_ROUTES?: string;
}

const positiveInt = z.coerce.number().int().positive();

const configSchema = z.object({
  APPS_DOMAIN: z.string().min(1),
  APPS_URL_SCHEME: z.enum(["http", "https"]),
  CLIENT_IP_HEADER: z.string().regex(/^[A-Za-z0-9-]*$/).default(""),
  PUBLIC_URL: z.url(),
  S3_ENDPOINT: z.url(),
  S3_BUCKET: z.string().min(1),
  BUILDER_URL: z.url().optional(),
  NODE_HEARTBEAT_SECONDS: positiveInt,
  NODE_LOST_AFTER_SECONDS: positiveInt,
  DISK_FAILOVER_GRACE_SECONDS: z.coerce.number().int().nonnegative(),
  AUTOSCALE_UP_SECONDS: positiveInt.default(15),
  AUTOSCALE_DOWN_SECONDS: positiveInt.default(60),
  METRICS: z.enum(["on", "off"]).default("on"),
  NODE_LEASE_SECONDS: positiveInt,
  NODE_MAX_CORES: positiveInt,
  NODE_MAX_MEMORY_MB: positiveInt,
  NODE_MAX_DISK_GB: positiveInt,
  MAX_REQUEST_BODY_BYTES: positiveInt,
  MAX_BUILD_UPLOAD_BYTES: positiveInt,
  BUILD_MEMORY_MB: positiveInt,
  BUILD_TIMEOUT_SECONDS: positiveInt,
  MAX_LOG_BYTES: positiveInt,
  MAX_RESTORE_ARCHIVE_BYTES: positiveInt,
  PRESIGNED_URL_TTL_SECONDS: positiveInt,
  KEY_ROLL_MAX_GRACE_SECONDS: positiveInt,
  API_RATE_LIMIT_PERIOD_SECONDS: z.enum(["10", "60"]).transform(Number),
  OPERATOR_TOKEN: z.string().min(16).optional(),
  BUILDER_SECRET: z.string().min(16).optional(),
  ENV_ENCRYPTION_KEY: z.string().optional(),
  R2_ACCESS_KEY_ID: z.string().optional(),
  R2_SECRET_ACCESS_KEY: z.string().optional(),
  DOMAIN_VERIFICATION: z.enum(["dns", "http"]).default("dns"),
  DOMAIN_CHECK_ORIGIN: z.url().optional(),
  DNS_OVER_HTTPS_URL: z.url().default("https://cloudflare-dns.com/dns-query"),
  DOMAIN_CNAME_TARGET: z.string().min(1).optional(),
  CUSTOM_DOMAIN_TLS: z.enum(["on", "off"]).default("off"),
  WEBHOOK_PRIVATE_TARGETS: z.enum(["allow", "refuse"]).default("refuse"),
  CF_ZONE_ID: z.string().min(1).optional(),
  CF_API_TOKEN: z.string().min(1).optional(),
  CF_API_URL: z.url().default("https://api.cloudflare.com/client/v4"),
  API_HOSTS: z
    .string()
    .default("")
    .transform((hosts) => hosts.split(",").map((host) => host.trim().toLowerCase()).filter((host) => host !== "")),
})
  // Made once per isolate (configOf): every request asks whether its host is the control plane's.
  .transform((config) => ({
    ...config,
    /** Hosts the API and dashboard answer on: PUBLIC_URL's, API_HOSTS, and loopback; any other is an app's or nothing. */
    CONTROL_PLANE_HOSTS: new Set(["localhost", "127.0.0.1", "[::1]", new URL(config.PUBLIC_URL).hostname, ...config.API_HOSTS]),
  }));

export type Config = z.infer<typeof configSchema>;

const parsed = new WeakMap<Env, Config>();

/**
 * Parses vars and secrets once per isolate (STYLE 5): a misconfigured deployment
 * fails loudly on its first request instead of deep inside a handler.
 */
export function configOf(env: Env): Config {
  let config = parsed.get(env);
  if (!config) {
    const result = configSchema.safeParse(env);
    if (!result.success) {
      const fields = result.error.issues.map((i) => i.path.join(".")).join(", ");
      throw new Error(`invalid Worker configuration: ${fields}`);
    }
    config = result.data;
    parsed.set(env, config);
  }
  return config;
}
