import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** Output kept in memory for `output()` (tests read it); older text is dropped. */
const OUTPUT_LIMIT = 1024 * 1024;

export type LaunchOptions = {
  secret: string;
  dataDir: string;
  /** 0 (default) picks a free port; the URL comes from the builder's own start-up line. */
  port?: number;
  /** Extra environment (BUILDER_MAX_CONCURRENT_JOBS, NPM_CONFIG_REGISTRY…). */
  env?: Record<string, string>;
  /** Where the builder's output goes besides `output()`: this terminal, a log file, or nowhere. */
  log?: "inherit" | { file: string } | "none";
};

export type BuilderProcess = {
  url: string;
  pid: number;
  /** What the builder printed so far (stdout and stderr, last MiB). */
  output(): string;
  /** SIGTERM (the builder lets jobs finish within its grace period, then ends them), SIGKILL if it is still there a while after. */
  stop(): Promise<void>;
};

/**
 * Starts `builder/src/server.ts` as one Node process with only the variables it
 * needs, so nothing of the caller's environment reaches user commands, and
 * resolves once it listens. `npm start`, the Worker suites' global setup, the
 * builder tests and the benches all start the builder through this.
 */
export async function launchBuilder(options: LaunchOptions): Promise<BuilderProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "builder", "src", "server.ts")], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      ...(process.env.HOME ? { HOME: process.env.HOME } : {}),
      ...(process.env.NPM_CONFIG_REGISTRY ? { NPM_CONFIG_REGISTRY: process.env.NPM_CONFIG_REGISTRY } : {}),
      BUILDER_SECRET: options.secret,
      BUILDER_PORT: String(options.port ?? 0),
      BUILDER_HOST: "127.0.0.1",
      BUILDER_DATA_DIR: options.dataDir,
      ...options.env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const log = options.log ?? "none";
  const sink = typeof log === "object" ? createWriteStream(log.file, { flags: "a" }) : null;
  let output = "";
  const onData = (chunk: Buffer) => {
    output = (output + chunk.toString("utf8")).slice(-OUTPUT_LIMIT);
    if (log === "inherit") process.stdout.write(chunk);
    sink?.write(chunk);
  };
  child.stdout.on("data", onData);
  child.stderr.on("data", onData);
  const exited = new Promise<void>((done) => child.once("exit", () => done()));
  const url = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`builder did not start within 30 s:\n${output}`)), 30_000);
    const watch = () => {
      const match = /builder listening on (http:\/\/\S+)/.exec(output);
      if (match?.[1]) {
        clearTimeout(timer);
        child.stdout.off("data", watch);
        ok(match[1]);
      }
    };
    child.stdout.on("data", watch);
    child.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`builder exited with code ${code} before listening:\n${output}`));
    });
  });
  return {
    url,
    pid: child.pid ?? 0,
    output: () => output,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        // The grace period (BUILDER_SHUTDOWN_GRACE_SECONDS, default 20 s) plus time to report what it ended.
        const grace = Number(options.env?.BUILDER_SHUTDOWN_GRACE_SECONDS ?? 20);
        const killer = setTimeout(() => child.kill("SIGKILL"), (grace + 25) * 1000);
        await exited;
        clearTimeout(killer);
      }
      sink?.end();
    },
  };
}
