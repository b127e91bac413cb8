/**
 * The builder's configuration, read once from the environment at startup so a
 * bad value stops the process with a clear message instead of failing a job.
 */
import { resolve } from "node:path";
import { z } from "zod";
import type { JobUser } from "./sandbox.js";

/** Validated settings the server runs with. */
export interface BuilderConfig {
  /** HMAC key shared with the Worker. */
  secret: string;
  host: string;
  /** 0 picks a free port. */
  port: number;
  /** Absolute; holds `jobs/` and `disks/`. */
  dataDir: string;
  maxConcurrentJobs: number;
  /** Unprivileged user for job processes; null runs them as the builder's own user. */
  jobUser: JobUser | null;
  /** Package mirror builds install through; null keeps the package managers' default registry. */
  npmRegistry: string | null;
}

const EnvSchema = z.object({
  BUILDER_SECRET: z.string().min(16, "must be at least 16 characters"),
  BUILDER_HOST: z.string().min(1).default("127.0.0.1"),
  BUILDER_PORT: z.coerce.number().int().min(0).max(65_535).default(8788),
  BUILDER_DATA_DIR: z.string().min(1).default(".svc/builder"),
  BUILDER_MAX_CONCURRENT_JOBS: z.coerce.number().int().min(1).max(1024).default(8),
  BUILDER_JOB_USER: z
    .string()
    .regex(/^\d+:\d+$/, 'must be "<uid>:<gid>"')
    .optional(),
  NPM_CONFIG_REGISTRY: z.url({ protocol: /^https?$/, error: "must be an http(s) URL" }).optional(),
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
  let jobUser: JobUser | null = null;
  if (values.BUILDER_JOB_USER !== undefined) {
    const [uid, gid] = values.BUILDER_JOB_USER.split(":").map(Number) as [number, number];
    if (process.getuid?.() !== 0) {
      return { ok: false, problems: ["BUILDER_JOB_USER: the builder must run as root to start jobs as another user"] };
    }
    jobUser = { uid, gid };
  }
  return {
    ok: true,
    config: {
      secret: values.BUILDER_SECRET,
      host: values.BUILDER_HOST,
      port: values.BUILDER_PORT,
      dataDir: resolve(cwd, values.BUILDER_DATA_DIR),
      maxConcurrentJobs: values.BUILDER_MAX_CONCURRENT_JOBS,
      jobUser,
      npmRegistry: values.NPM_CONFIG_REGISTRY ?? null,
    },
  };
}
