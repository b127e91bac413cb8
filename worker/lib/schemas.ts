import { z } from "@hono/zod-openapi";

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
