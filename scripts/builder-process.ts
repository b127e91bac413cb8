import { spawn } from "node:child_process";
import { createWriteStream, rmSync } from "node:fs";
import { mkdir, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bundleForNode } from "./bundle.js";
import { ROOT } from "./root.js";

/** Output kept in memory for `output()` (tests read it); older text is dropped. */
const OUTPUT_LIMIT = 1024 * 1024;

export type LaunchOptions = {
  /** BUILDER_SECRET for a lone builder; absent for a node that joins (BUILDER_CONTROL_URL, and BUILDER_JOIN_TOKEN the first time, in `env`). */
  secret?: string;
  dataDir: string;
  /** 0 (default) picks a free port; the URL comes from the builder's own start-up line. */
  port?: number;
  /** Extra environment (BUILDER_MAX_CONCURRENT_JOBS, NPM_CONFIG_REGISTRY…). */
  env?: Record<string, string>;
  /** Where the builder's output goes besides `output()`: this terminal, a log file, or nowhere. */
  log?: "inherit" | { file: string } | "none";
  /**
   * A cgroup v2 directory the builder starts in (made if missing), so every socket it opens is
   * that cgroup's: a test cuts one node's network with nftables' `socket cgroupv2` (scripts/partition.ts).
   */
  cgroup?: string;
};

export type BuilderProcess = {
  url: string;
  pid: number;
  /** Resolves when the process has exited, for whatever reason. */
  exited: Promise<void>;
  /** What the builder printed so far (stdout and stderr, last MiB). */
  output(): string;
  /** SIGTERM (the builder lets jobs finish within its grace period, then ends them), SIGKILL if it is still there a while after. */
  stop(): Promise<void>;
};

let bundled: Promise<string> | undefined;

/**
 * `builder/src/server.ts` bundled into one module, once per process (or once
 * per test run: vitest.config.ts makes it and passes SVC_BUILDER_BUNDLE), and
 * run by plain `node`. The builder forks for every sandbox it makes, and a
 * fork of a process that carries tsx's loader (a second V8 isolate on a thread
 * of its own) costs far more: 16 ms of CPU per spawn against 9 ms here. It
 * also starts sooner, with nothing left to compile.
 */
export function builderBundle(): Promise<string> {
  const given = process.env.SVC_BUILDER_BUNDLE;
  if (given) return Promise.resolve(given);
  bundled ??= (async () => {
    const dir = await mkdtemp(join(tmpdir(), "svc-builder-bundle-"));
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
    const outfile = join(dir, "server.mjs");
    await bundleForNode(join(ROOT, "builder", "src", "server.ts"), outfile);
    return outfile;
  })();
  return bundled;
}

/**
 * Starts the builder ({@link builderBundle}) as one Node process with only the
 * variables it needs, so nothing of the caller's environment reaches user
 * commands, and resolves once it listens. `npm start`, the Worker suites'
 * global setup, the builder tests and the benches all start the builder
 * through this.
 */
export async function launchBuilder(options: LaunchOptions): Promise<BuilderProcess> {
  if (options.cgroup) await mkdir(options.cgroup, { recursive: true });
  // In its cgroup before its first instruction: the shell joins it, then becomes the builder (same pid).
  const argv = options.cgroup
    ? ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', options.cgroup, process.execPath, await builderBundle()]
    : [process.execPath, await builderBundle()];
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      ...(process.env.HOME ? { HOME: process.env.HOME } : {}),
      ...(process.env.NPM_CONFIG_REGISTRY ? { NPM_CONFIG_REGISTRY: process.env.NPM_CONFIG_REGISTRY } : {}),
      ...(options.secret ? { BUILDER_SECRET: options.secret } : {}),
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
    exited,
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

/** A builder that is started again when it dies, the way an orchestrator restarts a container. */
export type SupervisedBuilder = {
  url: string;
  /** The running builder's pid (a new one after each restart). */
  pid(): number;
  /** How many times it was started again. */
  restarts(): number;
  /** Stops supervising, then stops the builder. */
  stop(): Promise<void>;
  /** Stops supervising and kills the builder at once (SIGKILL): a host that died. */
  kill(): void;
};

const RESTART_DELAY_MS = 1_000;

/**
 * Starts the builder and keeps it running: when it exits without being asked
 * to, it is started again within about a second, on the same port and data
 * directory, so its disks and job records carry over and the Worker (which
 * knows it by URL) carries on. What `npm start` runs, like a production
 * orchestrator would.
 */
export async function superviseBuilder(options: LaunchOptions): Promise<SupervisedBuilder> {
  let current = await launchBuilder(options);
  const port = Number(new URL(current.url).port);
  let stopping = false;
  let restarts = 0;
  const say = (line: string) => {
    if (options.log === "inherit") console.error(line);
    else if (typeof options.log === "object") createWriteStream(options.log.file, { flags: "a" }).end(`${line}\n`);
  };
  const keepAlive = (running: BuilderProcess): void => {
    void running.exited.then(async () => {
      while (!stopping) {
        say(`builder (pid ${running.pid}) exited; starting it again on port ${port}`);
        await new Promise((resolve) => setTimeout(resolve, RESTART_DELAY_MS));
        if (stopping) return;
        try {
          current = await launchBuilder({ ...options, port });
          restarts++;
          keepAlive(current);
          return;
        } catch (error) {
          say(`builder did not start again: ${error instanceof Error ? error.message.split("\n")[0] : String(error)}`);
        }
      }
    });
  };
  keepAlive(current);
  return {
    url: current.url,
    pid: () => current.pid,
    restarts: () => restarts,
    async stop() {
      stopping = true;
      await current.stop();
    },
    kill() {
      stopping = true;
      try {
        process.kill(current.pid, "SIGKILL");
      } catch {
        // already gone
      }
    },
  };
}
