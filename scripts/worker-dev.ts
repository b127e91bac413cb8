/**
 * The control-plane Worker under local workerd, for `npm start`, the tests and
 * the benches (scripts/local-stack.ts starts it as its own process).
 *
 * It is `wrangler dev`, minus its devtools inspector: the same wrangler
 * function (`unstable_startWorker`) given the input `wrangler dev` builds from
 * its flags (wrangler.toml, the secrets file, `--var`s, `--persist-to`,
 * `--test-scheduled`, `--log-level`), so the Worker is bundled, configured and
 * bound exactly as there and as `wrangler deploy` ships it. The inspector is
 * what differs: under `wrangler dev` every subrequest of the Worker (D1, R2,
 * the builder) is relayed to wrangler's Node process for the devtools, about
 * 18 ms of CPU per cron run on the 2-core machine, a third of the run's cost
 * (bench/cron-lag.ts). Nothing here needs the devtools.
 *
 *     node --import tsx scripts/worker-dev.ts '<Options as JSON>'
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { ROOT } from "./root.js";

/** What local-stack.ts passes (no secret: those stay in the env file). */
export const WorkerDevOptions = z.object({
  port: z.number().int().min(1).max(65535),
  persistDir: z.string().min(1),
  /** A dotenv file of secrets; absent: wrangler's default (.dev.vars at the root). */
  envFile: z.string().min(1).optional(),
  /** Worker vars over wrangler.toml's, as `wrangler dev --var KEY:VALUE` gives them. */
  vars: z.record(z.string(), z.string()),
  logLevel: z.enum(["log", "warn"]),
});
export type WorkerDevOptions = z.infer<typeof WorkerDevOptions>;

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const options = WorkerDevOptions.parse(JSON.parse(process.argv[2] ?? "{}"));
  // wrangler's own logger reads its level here, as `wrangler dev --log-level` sets it.
  process.env.WRANGLER_LOG = options.logLevel;
  const { unstable_startWorker } = await import("wrangler");
  const worker = await unstable_startWorker({
    config: join(ROOT, "wrangler.toml"),
    ...(options.envFile ? { envFiles: [options.envFile] } : {}),
    bindings: Object.fromEntries(Object.entries(options.vars).map(([name, value]) => [name, { type: "plain_text", value }])),
    dev: {
      server: { hostname: "127.0.0.1", port: options.port },
      inspector: false,
      persist: options.persistDir,
      testScheduled: true,
      logLevel: options.logLevel,
      liveReload: false,
      watch: false,
    },
  });
  await worker.ready;
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await worker.dispose();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
