/**
 * The builder's configuration, read once from the environment at startup so a
 * bad value stops the process with a clear message instead of failing a job.
 */
import { resolve } from "node:path";
import { z } from "zod";
import { DEFAULT_TENANT_REGISTRY } from "./sandbox/tenants.js";

/** Validated settings the server runs with. */
export interface BuilderConfig {
  /** HMAC key shared with the Worker (a builder that does not join); null when the node joins and gets its own. */
  secret: string | null;
  /** How the node joins a control plane (BUILDER_CONTROL_URL, and BUILDER_JOIN_TOKEN the first time); null for a builder holding BUILDER_SECRET. */
  join: JoinConfig | null;
  host: string;
  /** 0 picks a free port. */
  port: number;
  /** Absolute; holds `jobs/` and `disks/`. */
  dataDir: string;
  maxConcurrentJobs: number;
  /** Runs made ready ahead of their second at once (jobs/manager.ts); 0 makes every run at its second. */
  maxStagedJobs: number;
  /**
   * Jobs one tenant (account) runs at once when its submission names no limit
   * (the Worker sends its plan's). Whatever the limit, a tenant never gets
   * every slot of a builder with more than one.
   */
  tenantConcurrency: number;
  /** First uid (and gid) given to tenants, when the builder is root; null when it is not (jobs keep its user). */
  tenantUidBase: number | null;
  /** The host-wide registry of tenants' uids, shared by every node on the host (tenants.ts). */
  tenantRegistry: string;
  /** Room a build gets for project, dependencies and output. */
  buildScratchBytes: number;
  /** Bound of the per-app dependency cache across the node (BUILDER_DEPENDENCY_CACHE_MB; 0: off). */
  dependencyCacheBytes: number;
  /** Bound of each account's package-manager cache (BUILDER_PACKAGE_CACHE_MB; 0: off). */
  packageCacheBytes: number;
  /** On SIGTERM, how long running jobs may go on before they are ended. */
  shutdownGraceMs: number;
  /** Package mirror builds install through; null keeps the package managers' default registry. */
  npmRegistry: string | null;
  /** Bytes of the data dir's filesystem never promised to disks and working trees; null: 10 % of its size. */
  hostReserveBytes: number | null;
  /** Bytes of the host's memory never promised to app processes; null: 10 % of it, at least 1 GiB. */
  hostMemoryReserveBytes: number | null;
  /** Where every node on this host records the memory it promised (sandbox/host-room.ts); null: /run/svc-builder/memory. */
  memoryLedgerDir: string | null;
  /**
   * Python package index (PEP 503 "simple" URL) pip installs python apps'
   * requirements from; its host becomes reachable from builds. Null: none.
   */
  pipIndexUrl: string | null;
  /** Absolute path of a folder of wheels (pip's find-links), shown read-only to python builds; null: none. */
  pipFindLinks: string | null;
  /** How often the node reports its apps' usage (BUILDER_METRICS_SECONDS, default 10; node/metrics.ts). */
  metricsIntervalMs: number;
  /**
   * Apps' traffic through HAProxy (processes/native-proxy.ts): `auto` when
   * its binary is there (else the Node proxy alone, said at startup), `on`
   * (refuse to start without it), `off`.
   */
  nativeProxy: "auto" | "on" | "off";
  /** The HAProxy binary (BUILDER_HAPROXY). */
  haproxyBinary: string;
}

/**
 * Joining a fleet (DESIGN §10): the Worker's URL, how the Worker reaches this
 * node, and the join token the operator minted. The token is needed once: a
 * node that joined keeps its id and key in its data directory and joins again
 * by signing with that key.
 */
export interface JoinConfig {
  token: string | null;
  controlUrl: string;
  /** Where the Worker reaches this node; null: http://<BUILDER_HOST>:<the port it listens on>. */
  advertiseUrl: string | null;
  /** Unique among nodes; the host name and port by default. */
  name: string | null;
}

const httpUrl = z.url({ protocol: /^https?$/, error: "must be an http(s) URL" });

const EnvSchema = z.object({
  BUILDER_SECRET: z.string().min(16, "must be at least 16 characters").optional(),
  BUILDER_JOIN_TOKEN: z.string().min(16, "must be at least 16 characters").optional(),
  BUILDER_CONTROL_URL: httpUrl.optional(),
  BUILDER_ADVERTISE_URL: httpUrl.optional(),
  BUILDER_NODE_NAME: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, "letters, digits, '.', '_' and '-', at most 63")
    .optional(),
  BUILDER_HOST: z.string().min(1).default("127.0.0.1"),
  BUILDER_PORT: z.coerce.number().int().min(0).max(65_535).default(8788),
  BUILDER_DATA_DIR: z.string().min(1).default(".svc/builder"),
  BUILDER_MAX_CONCURRENT_JOBS: z.coerce.number().int().min(1).max(1024).default(8),
  BUILDER_TENANT_MAX_CONCURRENT_JOBS: z.coerce.number().int().min(1).max(1024).optional(),
  BUILDER_MAX_STAGED_JOBS: z.coerce.number().int().min(0).max(1024).default(256),
  BUILDER_TENANT_UID_BASE: z.coerce.number().int().min(1000).max(4_000_000_000).default(2_000_000),
  BUILDER_TENANT_REGISTRY: z.string().min(1).default(DEFAULT_TENANT_REGISTRY),
  BUILDER_BUILD_SCRATCH_MB: z.coerce.number().int().min(64).max(1_048_576).default(4096),
  BUILDER_DEPENDENCY_CACHE_MB: z.coerce.number().int().min(0).max(1_073_741_824).default(2048),
  BUILDER_PACKAGE_CACHE_MB: z.coerce.number().int().min(0).max(1_073_741_824).default(1024),
  BUILDER_SHUTDOWN_GRACE_SECONDS: z.coerce.number().int().min(0).max(3600).default(20),
  NPM_CONFIG_REGISTRY: httpUrl.optional(),
  BUILDER_HOST_RESERVE_MB: z.coerce.number().int().min(0).max(1_073_741_824).optional(),
  BUILDER_HOST_MEMORY_RESERVE_MB: z.coerce.number().int().min(0).max(1_073_741_824).optional(),
  BUILDER_MEMORY_LEDGER_DIR: z.string().min(1).optional(),
  BUILDER_PIP_INDEX_URL: httpUrl.optional(),
  BUILDER_PIP_FIND_LINKS: z.string().min(1).optional(),
  BUILDER_METRICS_SECONDS: z.coerce.number().int().min(1).max(300).default(10),
  BUILDER_NATIVE_PROXY: z.enum(["auto", "on", "off"]).default("auto"),
  BUILDER_HAPROXY: z.string().startsWith("/", "must be an absolute path").default("/usr/sbin/haproxy"),
});

/** Parses the environment; expected mistakes come back as readable lines, not exceptions. */
export function loadConfig(
  env: Record<string, string | undefined>,
  cwd: string,
): { ok: true; config: BuilderConfig } | { ok: false; problems: string[] } {
  const parsed = EnvSchema.safeParse(Object.fromEntries(Object.entries(env).filter(([, value]) => value !== "")));
  if (!parsed.success) {
    return { ok: false, problems: parsed.error.issues.map((issue) => `${issue.path.join(".")}: ${issue.message}`) };
  }
  const values = parsed.data;
  const joins = values.BUILDER_CONTROL_URL !== undefined;
  if (values.BUILDER_JOIN_TOKEN !== undefined && !joins) {
    return { ok: false, problems: ["BUILDER_CONTROL_URL: a node that joins with BUILDER_JOIN_TOKEN needs the control plane's URL"] };
  }
  if (joins === (values.BUILDER_SECRET !== undefined)) {
    return {
      ok: false,
      problems: ["BUILDER_SECRET or BUILDER_CONTROL_URL: set exactly one (join a control plane, or share its secret as a lone builder)"],
    };
  }
  return {
    ok: true,
    config: {
      secret: values.BUILDER_SECRET ?? null,
      join:
        values.BUILDER_CONTROL_URL !== undefined
          ? {
              token: values.BUILDER_JOIN_TOKEN ?? null,
              controlUrl: values.BUILDER_CONTROL_URL,
              advertiseUrl: values.BUILDER_ADVERTISE_URL ?? null,
              name: values.BUILDER_NODE_NAME ?? null,
            }
          : null,
      host: values.BUILDER_HOST,
      port: values.BUILDER_PORT,
      dataDir: resolve(cwd, values.BUILDER_DATA_DIR),
      maxConcurrentJobs: values.BUILDER_MAX_CONCURRENT_JOBS,
      maxStagedJobs: values.BUILDER_MAX_STAGED_JOBS,
      // Half the slots by default: one account alone never fills the builder.
      tenantConcurrency: values.BUILDER_TENANT_MAX_CONCURRENT_JOBS ?? Math.ceil(values.BUILDER_MAX_CONCURRENT_JOBS / 2),
      tenantUidBase: process.getuid?.() === 0 ? values.BUILDER_TENANT_UID_BASE : null,
      tenantRegistry: resolve(cwd, values.BUILDER_TENANT_REGISTRY),
      buildScratchBytes: values.BUILDER_BUILD_SCRATCH_MB * 1024 * 1024,
      dependencyCacheBytes: values.BUILDER_DEPENDENCY_CACHE_MB * 1024 * 1024,
      packageCacheBytes: values.BUILDER_PACKAGE_CACHE_MB * 1024 * 1024,
      shutdownGraceMs: values.BUILDER_SHUTDOWN_GRACE_SECONDS * 1000,
      npmRegistry: values.NPM_CONFIG_REGISTRY ?? null,
      hostReserveBytes: values.BUILDER_HOST_RESERVE_MB === undefined ? null : values.BUILDER_HOST_RESERVE_MB * 1024 * 1024,
      hostMemoryReserveBytes: values.BUILDER_HOST_MEMORY_RESERVE_MB === undefined ? null : values.BUILDER_HOST_MEMORY_RESERVE_MB * 1024 * 1024,
      memoryLedgerDir: values.BUILDER_MEMORY_LEDGER_DIR === undefined ? null : resolve(cwd, values.BUILDER_MEMORY_LEDGER_DIR),
      pipIndexUrl: values.BUILDER_PIP_INDEX_URL ?? null,
      pipFindLinks: values.BUILDER_PIP_FIND_LINKS === undefined ? null : resolve(cwd, values.BUILDER_PIP_FIND_LINKS),
      metricsIntervalMs: values.BUILDER_METRICS_SECONDS * 1000,
      nativeProxy: values.BUILDER_NATIVE_PROXY,
      haproxyBinary: values.BUILDER_HAPROXY,
    },
  };
}
