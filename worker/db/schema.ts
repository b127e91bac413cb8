import { sql } from "drizzle-orm";
import { index, integer, primaryKey, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";

/**
 * D1 schema. camelCase keys in TypeScript, snake_case in SQL; timestamps are
 * epoch milliseconds (integers sort and compare cheaply; the API renders ISO).
 * Every tenant-owned row carries `account_id` and every query filters by it.
 */

export const PLANS = ["free", "pro", "business"] as const;
export type Plan = (typeof PLANS)[number];

export const SCOPES = ["deploy", "db", "registry", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

export const accounts = sqliteTable("accounts", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  plan: text("plan", { enum: PLANS }).notNull().default("free"),
  /** Receives the operator's events (`node.unreachable`, `node.lost`) through its webhooks; set by the operator. */
  operatorEvents: integer("operator_events", { mode: "boolean" }).notNull().default(false),
  createdAt: integer("created_at").notNull(),
});

export const apiKeys = sqliteTable(
  "api_keys",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    /** SHA-256 (hex) of the secret; the secret itself is never stored. */
    hash: text("hash").notNull(),
    /** First characters of the secret, shown in listings. */
    start: text("start").notNull(),
    /** JSON array of scopes. */
    scopes: text("scopes", { mode: "json" }).$type<Scope[]>().notNull(),
    expiresAt: integer("expires_at"),
    lastUsedAt: integer("last_used_at"),
    createdAt: integer("created_at").notNull(),
    deletedAt: integer("deleted_at"),
  },
  (t) => [
    uniqueIndex("api_keys_hash_idx").on(t.hash),
    index("api_keys_account_idx").on(t.accountId, t.createdAt),
  ],
);

/**
 * Database dumps share the account's backup quota with disk backups (spec,
 * "Backup space"). Dumps themselves are out of scope; this table is the usage
 * bookkeeping the quota check sums.
 */
export const databaseDumps = sqliteTable(
  "database_dumps",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    sizeBytes: integer("size_bytes").notNull(),
    createdAt: integer("created_at").notNull(),
    deletedAt: integer("deleted_at"),
  },
  (t) => [index("database_dumps_account_idx").on(t.accountId)],
);

export type ApiKeyRow = typeof apiKeys.$inferSelect;
export type AccountRow = typeof accounts.$inferSelect;

/**
 * Runtimes an app row may hold. `static` is served by this platform's edge;
 * `node`, `python` and `custom` (any start command the builder image can run)
 * are built into releases and run as processes on the builder's hosts. The
 * others were accepted before apps ran and are kept only so such rows still
 * read; creating one is refused ({@link SUPPORTED_RUNTIMES}).
 */
export const RUNTIMES = ["static", "node", "python", "custom", "ruby", "go", "rust", "php", "elixir", "docker"] as const;
export type Runtime = (typeof RUNTIMES)[number];
/** What an app can be created with: every one of these deploys and runs. */
export const SUPPORTED_RUNTIMES = ["static", "node", "python", "custom"] as const satisfies readonly Runtime[];
export type SupportedRuntime = (typeof SUPPORTED_RUNTIMES)[number];

export const APP_STATUSES = ["running", "stopped"] as const;
export type AppStatus = (typeof APP_STATUSES)[number];

/** One process serving an app: its id and the node (fleet id) running it. */
export type LiveInstance = { processId: string; node: string };
/** An app's scaling on load: between `minInstances` and `maxInstances`, aiming at `targetConcurrency` requests in flight per instance. */
export type Autoscaling = { minInstances: number; maxInstances: number; targetConcurrency: number };
/** One decision of scaling on load. */
export type ScaleEvent = { at: number; from: number; to: number; reason: string };
/** Scaling decisions kept per app. */
export const SCALE_EVENTS_KEPT = 20;

export const apps = sqliteTable(
  "apps",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    /** A DNS label: apps are served at <name>.<APPS_DOMAIN>, so names are unique service-wide. */
    name: text("name").notNull(),
    runtime: text("runtime", { enum: RUNTIMES }).notNull(),
    status: text("status", { enum: APP_STATUSES }).notNull().default("running"),
    memoryMb: integer("memory_mb").notNull(),
    activeDeploymentId: text("active_deployment_id"),
    /**
     * Apps that run: the process serving the app's traffic now and the node
     * (builder URL) it runs on, written by the app's AppRuntime object when a
     * process becomes ready and cleared when it stops; the edge forwards to it.
     */
    liveProcessId: text("live_process_id"),
    liveNode: text("live_node"),
    /** The live process's state as its node last reported it (the app's status is derived from it). */
    processState: text("process_state"),
    /**
     * Every process serving the app now, `[{processId, node}]` (the first is
     * also `live_process_id`/`live_node`), written by its AppRuntime object;
     * the edge balances the app's requests over them.
     */
    liveInstances: text("live_instances", { mode: "json" }).$type<LiveInstance[]>(),
    /** Apps that run: how many processes serve it (an app with a disk runs one), as `PATCH /v1/apps/{app}` or svc.json set it. */
    instances: integer("instances").notNull().default(1),
    /** Scaling on load, when on: the bounds of `instances` and the concurrent requests one instance should take (measured at the edge). */
    autoscaling: text("autoscaling", { mode: "json" }).$type<Autoscaling>(),
    /** What scaling on load decided, newest last (the last {@link SCALE_EVENTS_KEPT}): when, from how many to how many, and why. */
    scaleEvents: text("scale_events", { mode: "json" }).$type<ScaleEvent[]>(),
    /**
     * Settings of the app that win over svc.json for its releases (set with
     * `PATCH /v1/apps/{app}`); null: what the build found.
     */
    startCommand: text("start_command"),
    healthCheckPath: text("health_check_path"),
    /** Bumped by every change of the app's configuration (env vars, disk, memory, start settings). */
    configVersion: integer("config_version").notNull().default(0),
    /** Changes made without a rollout, not yet running: `[{version, cause}]`, oldest first. */
    pendingChanges: text("pending_changes", { mode: "json" }).$type<{ version: number; cause: string }[]>(),
    /** Bumped on every restart, so running work can tell it belongs to an older incarnation. */
    restartedAt: integer("restarted_at").notNull(),
    createdAt: integer("created_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [uniqueIndex("apps_name_idx").on(t.name), index("apps_account_idx").on(t.accountId, t.createdAt)],
);

export const DOMAIN_STATUSES = ["pending_verification", "pending_certificate", "active", "failed"] as const;
export type DomainStatus = (typeof DOMAIN_STATUSES)[number];
export const DOMAIN_REDIRECTS = ["none", "to-www", "to-apex"] as const;
export type DomainRedirect = (typeof DOMAIN_REDIRECTS)[number];

/**
 * Custom domains (docs/domains.md). A hostname may be claimed by several
 * accounts while none has proven it (each with its own token), but once one
 * has, it is that account's alone: the partial unique index admits one
 * verified row per hostname, whatever the race.
 */
export const domains = sqliteTable(
  "domains",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    appId: text("app_id")
      .notNull()
      .references(() => apps.id, { onDelete: "cascade" }),
    /** Lowercase ASCII (punycode for international names), no trailing dot. */
    hostname: text("hostname").notNull(),
    status: text("status", { enum: DOMAIN_STATUSES }).notNull(),
    /** Why the last check failed (`failed`), or what it waits for; null when active. */
    reason: text("reason"),
    /** The secret the account proves ownership with (a DNS TXT value, or the local HTTP answer). */
    token: text("token").notNull(),
    redirect: text("redirect", { enum: DOMAIN_REDIRECTS }).notNull().default("none"),
    httpsOnly: integer("https_only", { mode: "boolean" }).notNull().default(true),
    /** Cloudflare for SaaS custom hostname id, once asked for a certificate. */
    certificateId: text("certificate_id"),
    verifiedAt: integer("verified_at"),
    checkedAt: integer("checked_at"),
    createdAt: integer("created_at").notNull(),
  },
  (t) => [
    uniqueIndex("domains_account_hostname_idx").on(t.accountId, t.hostname),
    uniqueIndex("domains_verified_hostname_idx")
      .on(t.hostname)
      .where(sql`status in ('pending_certificate', 'active')`),
    index("domains_app_idx").on(t.appId),
    index("domains_hostname_idx").on(t.hostname, t.status),
  ],
);

export type DomainRow = typeof domains.$inferSelect;

export const envVars = sqliteTable(
  "env_vars",
  {
    appId: text("app_id")
      .notNull()
      .references(() => apps.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    /** AES-GCM ciphertext of the value (`v1.<iv>.<ciphertext>`, base64); never plaintext. */
    value: text("value").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [primaryKey({ columns: [t.appId, t.name] })],
);

export const DISK_STATUSES = ["available", "restoring"] as const;
export type DiskStatus = (typeof DISK_STATUSES)[number];

export const disks = sqliteTable(
  "disks",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    sizeGb: integer("size_gb").notNull(),
    mountPath: text("mount_path").notNull(),
    /** The app the disk is attached to; deleting the app detaches it. */
    appId: text("app_id").references(() => apps.id, { onDelete: "set null" }),
    status: text("status", { enum: DISK_STATUSES }).notNull().default("available"),
    /**
     * The node holding the disk (placement.ts chose it); null for a disk made
     * before nodes joined, claimed by the first node that reports holding it.
     */
    nodeId: text("node_id"),
    /**
     * Fencing: bumped whenever the disk's copy of record moves to another node.
     * Every request about the disk carries it; a node holding an older
     * generation never serves, writes or snapshots that copy again.
     */
    generation: integer("generation").notNull().default(1),
    /** What happened to the disk when its node was lost or drained, in the user's words; null when nothing did. */
    placementNote: text("placement_note"),
    /** `disk.almost_full` goes out when the disk's bytes or files reach this share of its limits (percent). */
    alertAtPercent: integer("alert_at_percent").notNull().default(90),
    /**
     * Automatic snapshots (issue 19): hours between them, 0 when off. A whole
     * number of hours rather than a cron expression: "daily" is what users
     * ask for, and an interval cannot be set to fire every minute.
     */
    snapshotIntervalHours: integer("snapshot_interval_hours").notNull().default(24),
    /** Ready automatic backups of the disk kept; older ones are deleted when a new one is ready. */
    snapshotKeep: integer("snapshot_keep").notNull().default(7),
    /**
     * When the watchdog pass starts the next automatic snapshot; null when
     * they are off. Disks that existed before snapshots get 0: due at the
     * first pass, so every disk has one by the next day.
     */
    nextSnapshotAt: integer("next_snapshot_at").default(0),
    /** Why the last automatic snapshot that was due did not start (quota full, disk busy…); null once one starts. */
    snapshotSkipped: text("snapshot_skipped"),
    createdAt: integer("created_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [
    uniqueIndex("disks_account_name_idx").on(t.accountId, t.name),
    index("disks_app_idx").on(t.appId),
    index("disks_node_idx").on(t.nodeId),
    index("disks_next_snapshot_idx").on(t.nextSnapshotAt),
  ],
);

export const NODE_STATES = ["ready", "cordoned", "draining", "lost"] as const;
export type NodeState = (typeof NODE_STATES)[number];

/**
 * Builder nodes that joined the control plane (DESIGN §10). The row is what
 * is listed and what placement reads; heartbeat deadlines are the Fleet
 * object's alarm. A node's signing key is derived from BUILDER_SECRET and its
 * id, so no key is stored.
 */
export const nodes = sqliteTable(
  "nodes",
  {
    id: text("id").primaryKey(),
    name: text("name").notNull(),
    /** Where the Worker reaches the node. */
    address: text("address").notNull(),
    state: text("state", { enum: NODE_STATES }).notNull().default("ready"),
    cores: integer("cores").notNull().default(0),
    memoryMb: integer("memory_mb").notNull().default(0),
    diskTotalBytes: integer("disk_total_bytes").notNull().default(0),
    diskFreeBytes: integer("disk_free_bytes").notNull().default(0),
    /** Jobs running or queued and app processes on the node, at its last heartbeat. */
    runningJobs: integer("running_jobs").notNull().default(0),
    processes: integer("processes").notNull().default(0),
    /** Memory the node may still promise to app processes, at its last heartbeat. */
    memoryFreeMb: integer("memory_free_mb").notNull().default(0),
    /** The node's process id on its host (shown for nodes `npm start` runs). */
    pid: integer("pid"),
    joinedAt: integer("joined_at").notNull(),
    lastHeartbeatAt: integer("last_heartbeat_at").notNull(),
    lostAt: integer("lost_at"),
    /**
     * When the node first missed a control-plane call's deadline (or refused its
     * connections) without answering one since; null while it answers. An
     * unreachable node takes no new work, and calls about what it holds answer
     * 503 NODE_UNREACHABLE at once; the Fleet object probes it until it answers,
     * and declares it lost after NODE_LOST_AFTER_SECONDS, heartbeats or not.
     */
    unreachableSince: integer("unreachable_since"),
    /** What it missed (`status of job_… : no answer within 1.5 s`), while unreachable. */
    unreachableReason: text("unreachable_reason"),
    /**
     * What the operator allows the node to claim (its join token's caps, or
     * `PATCH /v1/operator/nodes/{node}`); null: the fleet's defaults
     * (NODE_MAX_*). Placement never believes more than this, whatever the node reports.
     */
    maxCores: integer("max_cores"),
    maxMemoryMb: integer("max_memory_mb"),
    maxDiskBytes: integer("max_disk_bytes"),
  },
  (t) => [uniqueIndex("nodes_name_idx").on(t.name)],
);

/**
 * Tokens that admit new nodes (docs/fleet.md, "Joining"): minted by the
 * operator, each good for `usesLeft` more joins until `expiresAt`, stored
 * hashed. A join only ever makes a new node: a node that joined before
 * proves itself with its own key, never with a token.
 */
export const nodeJoinTokens = sqliteTable(
  "node_join_tokens",
  {
    id: text("id").primaryKey(),
    /** SHA-256 (hex) of the token; the token itself is shown once. */
    hash: text("hash").notNull(),
    usesLeft: integer("uses_left").notNull(),
    /** Caps given to the nodes it admits (nodes.max_*); null: the fleet's defaults. */
    maxCores: integer("max_cores"),
    maxMemoryMb: integer("max_memory_mb"),
    maxDiskBytes: integer("max_disk_bytes"),
    note: text("note"),
    createdAt: integer("created_at").notNull(),
    expiresAt: integer("expires_at").notNull(),
    lastUsedAt: integer("last_used_at"),
  },
  (t) => [uniqueIndex("node_join_tokens_hash_idx").on(t.hash)],
);

export type NodeJoinTokenRow = typeof nodeJoinTokens.$inferSelect;

export type NodeRow = typeof nodes.$inferSelect;

export type AppRow = typeof apps.$inferSelect;
export type DiskRow = typeof disks.$inferSelect;

export const CONCURRENCY_POLICIES = ["forbid", "allow", "replace"] as const;
export type ConcurrencyPolicy = (typeof CONCURRENCY_POLICIES)[number];

export const crons = sqliteTable(
  "crons",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    appId: text("app_id")
      .notNull()
      .references(() => apps.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    schedule: text("schedule").notNull(),
    command: text("command").notNull(),
    timezone: text("timezone").notNull().default("UTC"),
    concurrencyPolicy: text("concurrency_policy", { enum: CONCURRENCY_POLICIES }).notNull().default("forbid"),
    timeoutSeconds: integer("timeout_seconds").notNull().default(3600),
    enabled: integer("enabled", { mode: "boolean" }).notNull().default(true),
    /** Disabled by itself after this many failed runs in a row (null: never). */
    disableAfterFailures: integer("disable_after_failures"),
    /** `cron.failed` goes out from this many failed runs in a row on (1: every failure). */
    notifyAfterFailures: integer("notify_after_failures").notNull().default(1),
    /** Why the job disabled itself (cleared when it is enabled again); null when it did not. */
    disabledReason: text("disabled_reason"),
    /** Scheduled time of the most recent run (manual or scheduled). */
    lastRunAt: integer("last_run_at"),
    /** When the job's Durable Object alarm will fire next; null while disabled. Written after each run (the watchdog's input). */
    nextRunAt: integer("next_run_at"),
    /** The app version (`apps.updated_at`) whose target the job's object holds; null before the first push. */
    targetVersion: integer("target_version"),
    createdAt: integer("created_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [uniqueIndex("crons_account_name_idx").on(t.accountId, t.name), index("crons_app_idx").on(t.appId)],
);

export const CRON_RUN_STATUSES = ["running", "success", "failed"] as const;
export type CronRunStatus = (typeof CRON_RUN_STATUSES)[number];

/**
 * Runs as D1 kept them before each job's object owned its runs (issue 11). A
 * job's object imports its rows once, on first use, and deletes them here; the
 * table goes in a later migration, once empty everywhere.
 */
export const cronRuns = sqliteTable(
  "cron_runs",
  {
    cronId: text("cron_id")
      .notNull()
      .references(() => crons.id, { onDelete: "cascade" }),
    /** `<name>-<unix seconds>` (scheduled) or `manual-<suffix>-<unix seconds>`: unique per job, so a duplicate alarm is a no-op. */
    jobName: text("job_name").notNull(),
    trigger: text("trigger", { enum: ["schedule", "manual"] }).notNull(),
    status: text("status", { enum: CRON_RUN_STATUSES }).notNull(),
    scheduledAt: integer("scheduled_at").notNull(),
    startedAt: integer("started_at").notNull(),
    finishedAt: integer("finished_at"),
    exitCode: integer("exit_code"),
    /** Why a failed run failed, in words (exit code, timeout, builder unreachable, cancelled…). */
    error: text("error"),
    builderJobId: text("builder_job_id"),
    /** Set once the complete log is stored in R2. */
    logKey: text("log_key"),
  },
  (t) => [
    primaryKey({ columns: [t.cronId, t.jobName] }),
    index("cron_runs_started_idx").on(t.cronId, t.startedAt),
    index("cron_runs_running_idx").on(t.status),
  ],
);

export type CronRow = typeof crons.$inferSelect;
export type CronRunRow = typeof cronRuns.$inferSelect;

export const BACKUP_STATUSES = ["creating", "ready", "failed"] as const;
export type BackupStatus = (typeof BACKUP_STATUSES)[number];

export const backups = sqliteTable(
  "backups",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    diskId: text("disk_id")
      .notNull()
      .references(() => disks.id, { onDelete: "cascade" }),
    status: text("status", { enum: BACKUP_STATUSES }).notNull(),
    description: text("description").notNull().default(""),
    /** Made by the disk's snapshot schedule, not by a person; only these are pruned to the disk's `snapshot_keep`. */
    automatic: integer("automatic", { mode: "boolean" }).notNull().default(false),
    /** Archive size once ready; 0 before. */
    sizeBytes: integer("size_bytes").notNull().default(0),
    /** Quota held while creating (the disk's used bytes when the backup started). */
    reservedBytes: integer("reserved_bytes").notNull().default(0),
    sha256: text("sha256"),
    objectKey: text("object_key").notNull(),
    failureReason: text("failure_reason"),
    createdAt: integer("created_at").notNull(),
    completedAt: integer("completed_at"),
    /** Deleted by the retention sweep after this time (plan retention from completion). */
    expiresAt: integer("expires_at"),
  },
  (t) => [index("backups_disk_idx").on(t.diskId, t.createdAt), index("backups_account_idx").on(t.accountId, t.status)],
);

/** A presigned restore upload (spec "Restore upload"); the object lives at `objectKey`. */
export const restoreUploads = sqliteTable(
  "restore_uploads",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    diskId: text("disk_id")
      .notNull()
      .references(() => disks.id, { onDelete: "cascade" }),
    sizeBytes: integer("size_bytes").notNull(),
    objectKey: text("object_key").notNull(),
    /** R2 multipart upload id when the archive is uploaded in parts. */
    multipartUploadId: text("multipart_upload_id"),
    /** When the upload URL stops working. */
    expiresAt: integer("expires_at").notNull(),
    /** Set when a restore consumed the upload. */
    usedAt: integer("used_at"),
    createdAt: integer("created_at").notNull(),
  },
  (t) => [index("restore_uploads_expiry_idx").on(t.expiresAt)],
);

export const RESTORE_STATUSES = ["running", "succeeded", "failed"] as const;
export type RestoreStatus = (typeof RESTORE_STATUSES)[number];

export const restores = sqliteTable(
  "restores",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    diskId: text("disk_id")
      .notNull()
      .references(() => disks.id, { onDelete: "cascade" }),
    /** The archive restored: an uploaded object or a ready backup's. */
    objectKey: text("object_key").notNull(),
    sizeBytes: integer("size_bytes").notNull(),
    sha256: text("sha256"),
    uploadId: text("upload_id"),
    backupId: text("backup_id"),
    status: text("status", { enum: RESTORE_STATUSES }).notNull(),
    error: text("error"),
    builderJobId: text("builder_job_id"),
    createdAt: integer("created_at").notNull(),
    finishedAt: integer("finished_at"),
  },
  (t) => [index("restores_disk_idx").on(t.diskId, t.createdAt)],
);

export type BackupRow = typeof backups.$inferSelect;
export type RestoreUploadRow = typeof restoreUploads.$inferSelect;
export type RestoreRow = typeof restores.$inferSelect;

export const DEPLOYMENT_STATUSES = ["queued", "building", "deploying", "ready", "failed", "cancelled"] as const;
export type DeploymentStatus = (typeof DEPLOYMENT_STATUSES)[number];

export const deployments = sqliteTable(
  "deployments",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    appId: text("app_id")
      .notNull()
      .references(() => apps.id, { onDelete: "cascade" }),
    status: text("status", { enum: DEPLOYMENT_STATUSES }).notNull(),
    error: text("error"),
    /** The uploaded source archive (.tar.gz) and its announced size. */
    sourceKey: text("source_key").notNull(),
    sourceSizeBytes: integer("source_size_bytes").notNull(),
    uploadExpiresAt: integer("upload_expires_at").notNull(),
    framework: text("framework"),
    outputDir: text("output_dir"),
    spa: integer("spa", { mode: "boolean" }),
    /** R2 key of the manifest (path → sha256, size, content type); immutable once written. */
    manifestKey: text("manifest_key"),
    fileCount: integer("file_count"),
    totalBytes: integer("total_bytes"),
    uploadedBlobs: integer("uploaded_blobs"),
    peakMemoryBytes: integer("peak_memory_bytes"),
    builderJobId: text("builder_job_id"),
    /**
     * Apps that run: the release the build made (one `.tar.gz` in R2, named by
     * the deployment, immutable) and how to run it. Null for static sites.
     */
    releaseKey: text("release_key"),
    releaseSha256: text("release_sha256"),
    releaseBytes: integer("release_bytes"),
    processType: text("process_type", { enum: ["web", "worker"] }),
    startCommand: text("start_command"),
    port: integer("port"),
    healthCheckPath: text("health_check_path"),
    /** Web apps: seconds the release's process has to pass its health check (svc.json; null: the default). */
    startTimeoutSeconds: integer("start_timeout_seconds"),
    /** Seconds a new process must stay up after it is ready before it counts as deployed. */
    minReadySeconds: integer("min_ready_seconds"),
    /** A worker: its new process may run beside the old one during a deploy (default: the old one stops first). */
    overlap: integer("overlap", { mode: "boolean" }),
    /** svc.json's `instances`, set on the app when the release rolls out; null: the app keeps its count. */
    instances: integer("instances"),
    /** Why it exists besides a build of new source: `config: GREETING set`, `rollback to dep_…`; null for a build. */
    cause: text("cause"),
    /** The app's configuration version the release runs with (apps.config_version when it was launched). */
    configVersion: integer("config_version"),
    /** The process started for it (apps that run), once there is one: what `svc deploy` follows. */
    processId: text("process_id"),
    /** What happened since the build, in order: `[{at, text}]` (starting, healthy, switching, draining, serving). */
    progress: text("progress", { mode: "json" }).$type<{ at: number; text: string }[]>(),
    /** With a failure: the last lines of the process's log (the one-line cause is `error`). */
    logExcerpt: text("log_excerpt", { mode: "json" }).$type<string[]>(),
    createdAt: integer("created_at").notNull(),
    startedAt: integer("started_at"),
    builtAt: integer("built_at"),
    finishedAt: integer("finished_at"),
  },
  (t) => [index("deployments_app_idx").on(t.appId, t.createdAt)],
);

/** One line of an app's web-server log (spec: `svc logs <app>`). */
export const requestLogs = sqliteTable(
  "request_logs",
  {
    id: integer("id").primaryKey({ autoIncrement: true }),
    appId: text("app_id")
      .notNull()
      .references(() => apps.id, { onDelete: "cascade" }),
    at: integer("at").notNull(),
    method: text("method").notNull(),
    path: text("path").notNull(),
    status: integer("status").notNull(),
    bytes: integer("bytes").notNull(),
    durationMs: integer("duration_ms").notNull(),
  },
  // `at`: the retention sweep deletes by age (without it, every sweep read the whole table).
  (t) => [index("request_logs_app_idx").on(t.appId, t.id), index("request_logs_at_idx").on(t.at)],
);

export type DeploymentRow = typeof deployments.$inferSelect;
export type RequestLogRow = typeof requestLogs.$inferSelect;

/** What webhooks can be told of (docs/webhooks.md has each payload). */
export const WEBHOOK_EVENTS = [
  "deploy.succeeded",
  "deploy.failed",
  "app.crash_loop",
  "app.recovered",
  "cron.failed",
  "cron.disabled",
  "backup.failed",
  "restore.failed",
  "disk.almost_full",
  "node.unreachable",
  "node.lost",
] as const;
export type WebhookEvent = (typeof WEBHOOK_EVENTS)[number];

/**
 * An account's webhook: where its events go, signed as Standard Webhooks
 * says with `secret` (and, for a day after a roll, `previous_secret` too).
 */
export const webhooks = sqliteTable(
  "webhooks",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    url: text("url").notNull(),
    events: text("events", { mode: "json" }).$type<WebhookEvent[]>().notNull(),
    description: text("description"),
    secret: text("secret").notNull(),
    previousSecret: text("previous_secret"),
    previousUntil: integer("previous_until"),
    createdAt: integer("created_at").notNull(),
    updatedAt: integer("updated_at").notNull(),
  },
  (t) => [index("webhooks_account_idx").on(t.accountId, t.createdAt)],
);
export type WebhookRow = typeof webhooks.$inferSelect;

export const DELIVERY_STATUSES = ["pending", "delivered", "failed"] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

/** One event sent to one webhook (its `webhook-id` is the row's id), with what the last attempt got. */
export const webhookDeliveries = sqliteTable(
  "webhook_deliveries",
  {
    id: text("id").primaryKey(),
    webhookId: text("webhook_id")
      .notNull()
      .references(() => webhooks.id, { onDelete: "cascade" }),
    event: text("event").notNull(),
    /** The body exactly as signed and sent. */
    payload: text("payload").notNull(),
    status: text("status", { enum: DELIVERY_STATUSES }).notNull(),
    attempts: integer("attempts").notNull().default(0),
    responseStatus: integer("response_status"),
    error: text("error"),
    createdAt: integer("created_at").notNull(),
    lastAttemptAt: integer("last_attempt_at"),
    nextAttemptAt: integer("next_attempt_at"),
  },
  (t) => [index("webhook_deliveries_webhook_idx").on(t.webhookId, t.createdAt)],
);
export type DeliveryRow = typeof webhookDeliveries.$inferSelect;
