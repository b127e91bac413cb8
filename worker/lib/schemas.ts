import { z } from "@hono/zod-openapi";
import { METRIC_RANGES, type MetricRange } from "../services/metrics";

/** App and cron names are DNS labels (DESIGN §3): apps become subdomains, cron names go into run names. */
export const DnsLabel = z
  .string()
  .regex(
    /^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$/,
    "must be 1-52 lowercase letters, digits or hyphens, starting and ending with a letter or digit",
  );

/** `{data}` envelope used by every resource family except API keys. */
export const dataOf = <T extends z.ZodType>(schema: T) => z.object({ data: schema });

export const Deleted = z.object({ id: z.string(), deleted: z.literal(true) });

/** Path parameter accepting an id or a name. */
export const Ref = z.string().min(1).max(64);

/** What became of a change of an app's configuration (worker/services/rollout.ts). */
export const RolloutSchema = z
  .object({
    applied: z.boolean().openapi({ description: "On its way to the app now; false: it waits for `POST /v1/apps/{app}/apply`" }),
    deploymentId: z.string().nullable().openapi({ description: "The deployment rolling it out (follow it as a deploy); null when nothing needs to" }),
    message: z.string().openapi({ example: "GREETING set; rolling out to api" }),
  })
  .openapi("Rollout");

/** A 200 answer of a configuration change: the changed resource as `data`, and what became of the change as `rollout`. */
export const withRollout = <T extends z.ZodType>(schema: T, description: string) => ({
  description,
  content: { "application/json": { schema: dataOf(schema).extend({ rollout: RolloutSchema }) } },
});

/** `?apply=false`: record a configuration change without rolling it out (several then roll out together). */
export const ApplyQuery = z.object({
  apply: z
    .enum(["true", "false"])
    .optional()
    .openapi({ description: "false: the change waits until `POST /v1/apps/{app}/apply` (or a restart or deploy) rolls out everything pending" }),
});

/** `?since=`: the range metrics are read over (worker/services/metrics.ts); each is summed into 60-120 steps. */
export const MetricsQuery = z.object({
  since: z
    .enum(Object.keys(METRIC_RANGES) as [MetricRange, ...MetricRange[]])
    .default("1h")
    .openapi({ description: "1h (1-minute steps), 24h (15 minutes), 7d (2 hours) or 30d (6 hours)" }),
});
