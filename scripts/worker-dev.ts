/**
 * The control-plane Worker under local workerd, for `npm start`, the tests and
 * the benches (scripts/local-stack.ts starts it as its own process).
 *
 * Bound exactly as `wrangler deploy` ships it: wrangler reads wrangler.toml and
 * turns it into Miniflare's options (`unstable_getMiniflareWorkerOptions`, the
 * call the Workers vitest pool makes), and the Worker runs in the Miniflare
 * wrangler itself uses. What `wrangler dev` adds on top is left out on
 * purpose: its proxy Worker, a second workerd in front of this one that holds
 * requests while a changed file reloads the Worker (nothing reloads here). Every
 * request crossed both and a kept-alive connection between them, which cost
 * more than half the CPU of a plain request (/healthz: 1,270 requests/s straight
 * against 540 through it on the 2-core machine) and, when the proxy reused a
 * connection the inner workerd was closing, answered `500 Error: Network
 * connection lost` or "Your worker restarted mid-request" (seen in CI); and its
 * devtools inspector, which relayed every subrequest to Node.
 *
 * The cron triggers reach `scheduled()` through worker-dev-entry.ts's
 * `/__scheduled?cron=<expr>` (scripts/local-crons.ts fires them).
 *
 *     node --import tsx scripts/worker-dev.ts '<Options as JSON>'
 */
import { readFile, rm } from "node:fs/promises";
import { builtinModules, createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseEnv } from "node:util";
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

/** The part of Miniflare's API used here (the package wrangler depends on, whatever its version). */
type StructuredLog = { level: string; message: string };
type MiniflareOptions = Record<string, unknown> & { workers: Record<string, unknown>[] };
type MiniflareModule = {
  Miniflare: new (options: MiniflareOptions) => { ready: Promise<URL>; dispose(): Promise<void> };
  Log: new (level: number) => object;
  LogLevel: { WARN: number; INFO: number };
};

/**
 * The Worker's Miniflare options: wrangler.toml's bindings as wrangler makes them,
 * then the secrets file's values and the local addresses over its vars, and the
 * bundle at `script`.
 */
export async function miniflareOptions(options: WorkerDevOptions, script: string): Promise<MiniflareOptions> {
  const { unstable_getMiniflareWorkerOptions, unstable_readConfig } = await import("wrangler");
  const config = unstable_readConfig({ config: join(ROOT, "wrangler.toml") });
  const { workerOptions } = unstable_getMiniflareWorkerOptions(config);
  const secrets = parseEnv(await readFile(options.envFile ?? join(ROOT, ".dev.vars"), "utf8").catch(() => ""));
  const { bindings, ...bound } = workerOptions as Record<string, unknown> & { bindings?: Record<string, unknown> };
  return {
    host: "127.0.0.1",
    port: options.port,
    // request.cf is Miniflare's stand-in: fetching Cloudflare's would need the internet.
    cf: false,
    unsafeTriggerHandlers: true,
    logRequests: false,
    // The same layout as `wrangler dev --persist-to` and `wrangler d1 migrations apply --local --persist-to`.
    defaultPersistRoot: join(options.persistDir, "v3"),
    workers: [
      {
        ...bound,
        name: config.name,
        modules: true,
        scriptPath: script,
        modulesRoot: dirname(script),
        bindings: { ...bindings, ...secrets, ...options.vars },
      },
    ],
  };
}

/** The Worker (worker/index.ts behind worker-dev-entry.ts's cron route) as one ES module for workerd, bundled as wrangler does. */
async function bundle(outfile: string): Promise<void> {
  const { build } = await import("esbuild");
  await build({
    entryPoints: [join(ROOT, "scripts", "worker-dev-entry.ts")],
    bundle: true,
    outfile,
    format: "esm",
    platform: "neutral",
    mainFields: ["browser", "module", "main"],
    conditions: ["workerd", "worker", "browser"],
    target: "es2022",
    // Node's modules are not there without nodejs_compat: left as requires that throw if ever called (cron-parser
    // requires fs only to read crontab files, which the Worker never does), as wrangler leaves them.
    external: ["cloudflare:*", ...builtinModules, ...builtinModules.map((name) => `node:${name}`)],
    define: { "process.env.NODE_ENV": '"development"' },
    logLevel: "warning",
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const options = WorkerDevOptions.parse(JSON.parse(process.argv[2] ?? "{}"));
  const script = join(tmpdir(), `svc-worker-${process.pid}.mjs`);
  await bundle(script);
  // The Miniflare wrangler depends on, so that workerd and the options are the versions wrangler made them for.
  const requireFromWrangler = createRequire(createRequire(import.meta.url).resolve("wrangler"));
  const { Miniflare, Log, LogLevel } = requireFromWrangler("miniflare") as MiniflareModule;
  const quiet = options.logLevel === "warn";
  const mf = new Miniflare({
    ...(await miniflareOptions(options, script)),
    log: new Log(quiet ? LogLevel.WARN : LogLevel.INFO),
    // The Worker's console output, by level: errors and warnings always, the rest when asked for.
    handleStructuredLogs: ({ level, message }: StructuredLog) => {
      if (level === "error" || level === "warn") process.stderr.write(`${message}\n`);
      else if (!quiet) process.stdout.write(`${message}\n`);
    },
  });
  const url = await mf.ready;
  process.stdout.write(`Ready on ${url.origin}\n`);
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await mf.dispose();
    await rm(script, { force: true });
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
