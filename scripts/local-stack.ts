import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, openSync } from "node:fs";
import { appendFile, chmod, cp, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join, resolve } from "node:path";
import { parseEnv } from "node:util";
import { superviseBuilder } from "./builder-process";
import { cronsOf, scheduleTriggers } from "./local-crons.js";
import { ROOT } from "./root.js";
import { quietDisconnects } from "./wrangler-output.js";
import { SCHEDULED_PATH } from "./scheduled-route.js";
import type { WorkerDevOptions } from "./worker-dev.js";

/**
 * Starts the whole system locally: D1 migrations, the builder, the Worker (wrangler's dev server, scripts/worker-dev.ts),
 * and an account with an admin key. `npm start` and the CLI / end-to-end tests
 * use this same function, so the tests exercise what a newcomer runs.
 */

export { ROOT };
const BIN = join(ROOT, "node_modules", ".bin");

export type LocalSecrets = {
  OPERATOR_TOKEN: string;
  BUILDER_SECRET: string;
  ENV_ENCRYPTION_KEY: string;
  R2_ACCESS_KEY_ID: string;
  R2_SECRET_ACCESS_KEY: string;
};

export type LocalStackOptions = {
  /** API port; 0 picks a free one. */
  port: number;
  /** Where D1/R2/DO state lives (wrangler --persist-to). */
  persistDir: string;
  /** Where the admin key, builder data and logs live. */
  stateDir: string;
  /**
   * File holding the local secrets (dotenv format); created with fresh values if
   * absent. wrangler reads it as it is (`.dev.vars` at the root by default,
   * any other file through --env-file): secrets never go on a command line.
   */
  secretsFile: string;
  /** Child process output: inherited (npm start) or kept in `<stateDir>/*.log` (tests). */
  output: "inherit" | "files";
  /** Where the builder reaches the Worker (callbacks, part and blob URLs); the API's own URL by default. */
  publicUrl?: string;
  /** Extra builder settings (e.g. BUILDER_MAX_CONCURRENT_JOBS for a benchmark). */
  builderEnv?: Record<string, string>;
  /** Keep the Worker's own console lines (e.g. `"event":"cron.run"`) in wrangler's output; only warnings by default. */
  workerLogs?: boolean;
  /** Builder nodes to start and join (1 by default; `npm start -- --nodes 3` to try failover on one machine). */
  nodes?: number;
  /** Worker vars over wrangler.toml's (e.g. a short NODE_LOST_AFTER_SECONDS for a failover test). */
  workerVars?: Record<string, string>;
  /** A cgroup v2 directory under which each node runs in a cgroup named after it (local-1, …): a test cuts one node's network by it. */
  nodeCgroupRoot?: string;
};

/** One builder node the stack runs (supervised: started again on its port and data directory when it dies). */
export type LocalNode = {
  /** local-1, local-2, … */
  name: string;
  /** The id the control plane gave it (kept in its data directory across restarts). */
  id: string;
  url: string;
  dataDir: string;
  /** The file its output goes to (`output: "files"`); null when it goes to this terminal. */
  logFile: string | null;
  pid(): number;
  /** Stops supervising it and stops it (SIGTERM). */
  stop(): Promise<void>;
  /** Stops supervising it and kills it (SIGKILL), as a host dying would. */
  kill(): void;
  /** Starts it again after `kill()` (same port, data directory and identity), supervised. */
  revive(): Promise<void>;
};

export type LocalStack = {
  apiUrl: string;
  /** The first node's address and pid (the only node unless `nodes` says more). */
  builderUrl: string;
  /** The first node running now (its pid changes when the supervisor starts it again). */
  builderPid(): number;
  nodes: LocalNode[];
  /** Stops the Worker and starts it again (same port, same state). */
  restartApi(): Promise<void>;
  adminKey: string;
  secrets: LocalSecrets;
  /** The Worker's process running now (scripts/worker-dev.ts), leader of its own process group (workerd runs in it). */
  workerPid(): number;
  stop(): Promise<void>;
};

function freshSecrets(): LocalSecrets {
  const token = () => randomBytes(24).toString("base64url");
  return {
    OPERATOR_TOKEN: token(),
    BUILDER_SECRET: token(),
    ENV_ENCRYPTION_KEY: randomBytes(32).toString("base64"),
    R2_ACCESS_KEY_ID: `local${randomBytes(8).toString("hex")}`,
    R2_SECRET_ACCESS_KEY: token(),
  };
}

/** Reads the dotenv secrets file, adding any missing secret with a fresh random value. */
export async function ensureSecrets(file: string): Promise<LocalSecrets> {
  const existing = existsSync(file) ? parseEnv(await readFile(file, "utf8")) : {};
  const secrets = { ...freshSecrets(), ...existing } as LocalSecrets;
  const missing = Object.keys(secrets).some((k) => !(k in existing));
  if (missing) {
    const lines = Object.entries(secrets).map(([k, v]) => `${k}="${v}"`);
    await writeFile(file, `# Local secrets written by npm start. Never commit.\n${lines.join("\n")}\n`, { mode: 0o600 });
  }
  return secrets;
}

/**
 * Worker vars for a fleet whose clocks run in seconds (heartbeat every second; wrangler.toml has the
 * production ones): the tests and the chaos run that lose, cut off and fence nodes on purpose.
 */
export function fleetClocks(clocks: { lostAfterSeconds: number; graceSeconds: number; leaseSeconds: number }): Record<string, string> {
  return {
    NODE_HEARTBEAT_SECONDS: "1",
    NODE_LOST_AFTER_SECONDS: String(clocks.lostAfterSeconds),
    DISK_FAILOVER_GRACE_SECONDS: String(clocks.graceSeconds),
    NODE_LEASE_SECONDS: String(clocks.leaseSeconds),
  };
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((ok, fail) => {
    const child = spawn(cmd, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d));
    child.stderr.on("data", (d: Buffer) => (out += d));
    child.on("error", fail);
    child.on("close", (code) => (code === 0 ? ok(out) : fail(new Error(`${cmd} ${args.join(" ")} failed:\n${out}`))));
  });
}

/**
 * Output of a child: inherited, or appended to a log file; `filter` (inherited
 * output only) makes it pass through a line filter on its way to stderr.
 */
function startProcess(
  cmd: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  output: "inherit" | string,
  filter?: (write: (text: string) => void) => (chunk: string) => void,
): ChildProcess {
  if (output === "inherit" && filter) {
    // A pipe is not a terminal: keep the colours the terminal would have had.
    const colour = process.stderr.isTTY ? { FORCE_COLOR: "1" } : {};
    const child = spawn(cmd, args, { cwd: ROOT, env: { ...env, ...colour }, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const feed = filter((text) => void process.stderr.write(text));
    child.stdout?.setEncoding("utf8").on("data", feed);
    child.stderr?.setEncoding("utf8").on("data", feed);
    return child;
  }
  const sink = output === "inherit" ? "inherit" : openSync(output, "a");
  // Own process group, so stopping it also ends the grandchildren (workerd under wrangler).
  return spawn(cmd, args, { cwd: ROOT, env, stdio: ["ignore", sink, sink], detached: true });
}

/**
 * Applies the D1 migrations to a state directory. `wrangler d1 migrations apply --local` starts a
 * runtime per migration file: 11 s for ten on the 2-core machine, against 3 s with nothing to apply,
 * and the tests start several fresh stacks. So a fresh directory gets a copy of one made by wrangler
 * once per set of migrations (and wrangler version), kept in node_modules/.cache; a directory that
 * has a database already is migrated by wrangler in place, as before.
 */
async function migrate(persistDir: string, env: NodeJS.ProcessEnv): Promise<void> {
  const apply = (dir: string) => run(join(BIN, "wrangler"), ["d1", "migrations", "apply", "DB", "--local", "--persist-to", dir], env);
  const d1 = join("v3", "d1");
  if (existsSync(join(persistDir, d1))) {
    await apply(persistDir);
    return;
  }
  const hash = createHash("sha256");
  const wrangler = JSON.parse(await readFile(join(ROOT, "node_modules", "wrangler", "package.json"), "utf8")) as { version: string };
  hash.update(`wrangler ${wrangler.version}\n`);
  for (const file of (await readdir(join(ROOT, "migrations"))).filter((f) => f.endsWith(".sql")).sort()) {
    hash.update(`${file}\n`).update(await readFile(join(ROOT, "migrations", file)));
  }
  const cache = join(ROOT, "node_modules", ".cache", "svc-d1");
  const template = join(cache, hash.digest("hex").slice(0, 16));
  if (!existsSync(join(template, d1))) {
    await mkdir(cache, { recursive: true });
    const scratch = await mkdtemp(`${template}.tmp-`);
    try {
      await apply(scratch);
      // Two stacks starting at once may both make it: the first rename wins, the other's is dropped.
      await rename(scratch, template).catch(() => undefined);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }
  await cp(join(template, d1), join(persistDir, d1), { recursive: true });
}

async function waitFor(url: string, child: ChildProcess, name: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${name} exited with code ${child.exitCode} during start-up`);
    try {
      const res = await fetch(url);
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 150));
  }
  throw new Error(`${name} did not answer ${url} within ${timeoutMs / 1000} s`);
}

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const kill = (signal: NodeJS.Signals) => {
    try {
      process.kill(-child.pid!, signal);
    } catch {
      // already gone
    }
  };
  kill("SIGTERM");
  const timer = setTimeout(() => kill("SIGKILL"), 5000);
  await exited;
  clearTimeout(timer);
}

/**
 * A join token for one local node (docs/fleet.md, "Joining"), minted through
 * the operator route as an operator would. A node that joined before (its
 * `node.json` kept) joins again with its own key and leaves the token unused;
 * it expires in ten minutes.
 */
export async function mintJoinToken(apiUrl: string, operatorToken: string, note: string): Promise<string> {
  const res = await fetch(`${apiUrl}/v1/operator/join-tokens`, {
    method: "POST",
    headers: { Authorization: `Bearer ${operatorToken}`, "Content-Type": "application/json" },
    body: JSON.stringify({ uses: 1, ttlSeconds: 600, note }),
  });
  if (res.status !== 201) throw new Error(`minting a join token failed: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { data: { token: string } }).data.token;
}

/** Returns the saved admin key if it still works, else creates an account through the operator route. */
async function adminKeyFor(apiUrl: string, secrets: LocalSecrets, stateDir: string): Promise<string> {
  const keyFile = join(stateDir, "local-admin-key");
  if (existsSync(keyFile)) {
    const saved = (await readFile(keyFile, "utf8")).trim();
    const res = await fetch(`${apiUrl}/v1/api-keys`, { headers: { Authorization: `Bearer ${saved}` } });
    if (res.ok) return saved;
  }
  const res = await fetch(`${apiUrl}/v1/accounts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${secrets.OPERATOR_TOKEN}`, "Content-Type": "application/json" },
    // The local account is the operator's too: its webhooks may hear of the nodes.
    body: JSON.stringify({ name: "local", plan: "business", operatorEvents: true }),
  });
  if (res.status !== 201) throw new Error(`creating the local account failed: ${res.status} ${await res.text()}`);
  const { apiKey } = (await res.json()) as { apiKey: { key: string } };
  await writeFile(keyFile, `${apiKey.key}\n`, { mode: 0o600 });
  await chmod(keyFile, 0o600);
  return apiKey.key;
}

export async function startLocalStack(opts: LocalStackOptions): Promise<LocalStack> {
  await mkdir(opts.stateDir, { recursive: true });
  await mkdir(opts.persistDir, { recursive: true });
  const secrets = await ensureSecrets(opts.secretsFile);
  // Nothing may need the internet: no metrics, no fetch of the `Request.cf` placeholder.
  const env = { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false" };

  await migrate(opts.persistDir, env);

  const secretsFile = resolve(opts.secretsFile);
  // npm start's own .dev.vars is wrangler's default; any other file is named.
  const envFile = secretsFile === join(ROOT, ".dev.vars") ? undefined : secretsFile;
  const startWorker = (port: number) => {
    const apiUrl = `http://127.0.0.1:${port}`;
    // Addresses only: the secrets reach the Worker through their file, never the command line (visible in ps).
    const options: WorkerDevOptions = {
      port,
      persistDir: opts.persistDir,
      ...(envFile ? { envFile } : {}),
      vars: {
        PUBLIC_URL: opts.publicUrl ?? apiUrl,
        S3_ENDPOINT: `${apiUrl}/storage`,
        APPS_DOMAIN: `localhost:${port}`,
        APPS_URL_SCHEME: "http",
        // Custom domains prove ownership here: the verifier asks this very edge, with the domain's Host header.
        DOMAIN_CHECK_ORIGIN: apiUrl,
        ...opts.workerVars,
      },
      logLevel: opts.workerLogs ? "log" : "warn",
    };
    return startProcess(
      process.execPath,
      ["--import", "tsx", join(ROOT, "scripts", "worker-dev.ts"), JSON.stringify(options)],
      env,
      opts.output === "files" ? join(opts.stateDir, "wrangler.log") : "inherit",
      quietDisconnects,
    );
  };
  let worker: ChildProcess | undefined;
  let triggers: { stop(): void } | undefined;
  const nodes: LocalNode[] = [];
  /** Set while this stack stops or restarts the Worker itself; any other exit is unexpected. */
  let ownStop = false;
  const stop = async () => {
    ownStop = true;
    triggers?.stop();
    // Nodes first: a node's last word (its processes stopped) goes to the Worker, which takes it at once; with the
    // Worker gone it would retry for its 10 s before exiting (SHUTDOWN_CALLBACKS_MS), and every stack stopped 10 s late.
    await Promise.all(nodes.map((node) => node.stop()));
    if (worker) await stopProcess(worker);
  };
  const say = async (line: string) => {
    if (opts.output === "inherit") process.stderr.write(line);
    else await appendFile(join(opts.stateDir, "wrangler.log"), line);
  };
  // The Worker starts first: nodes join it. A stack starting beside this one (tests run two files
  // at once) can take a chosen port first; the Worker then exits during start-up, and starts again
  // on fresh ones.
  let port = 0;
  for (let attempt = 1; ; attempt++) {
    port = opts.port || (await freePort());
    worker = startWorker(port);
    try {
      await waitFor(`http://127.0.0.1:${port}/healthz`, worker, "the Worker", 90_000);
      break;
    } catch (err) {
      if (worker.exitCode === null || attempt === 3) {
        await stop();
        throw err;
      }
    }
  }
  const apiUrl = `http://127.0.0.1:${port}`;
  /**
   * Supervised like the nodes: a Worker process that exits on its own (wrangler's
   * dev server ends on an internal error, seen under load in the test suites) is
   * started again on the same port and state, and the stack's log says why.
   */
  const supervise = (child: ChildProcess) => {
    child.once("exit", (code, signal) => {
      if (ownStop || child !== worker) return;
      void say(`local stack: the Worker's process exited on its own (${signal ?? `code ${code}`}); starting it again on ${apiUrl}\n`);
      setTimeout(() => {
        if (ownStop || child !== worker) return;
        worker = supervise(startWorker(port));
      }, 500);
    });
    return child;
  };
  if (worker) supervise(worker);
  /** Stops the Worker and starts it again on the same port and state, as a Worker deploy or an outage would. */
  const restartApi = async () => {
    ownStop = true;
    if (worker) await stopProcess(worker);
    ownStop = false;
    worker = supervise(startWorker(port));
    await waitFor(`${apiUrl}/healthz`, worker, "the Worker", 90_000);
  };
  try {
    // Supervised, as an orchestrator would: a node that dies is started again within seconds, on
    // its port and data directory, and joins again as itself.
    for (let i = 1; i <= (opts.nodes ?? 1); i++) {
      const dataDir = join(opts.stateDir, i === 1 ? "builder" : `builder-${i}`);
      const logFile = opts.output === "files" ? join(opts.stateDir, i === 1 ? "builder.log" : `builder-${i}.log`) : null;
      const joinToken = await mintJoinToken(apiUrl, secrets.OPERATOR_TOKEN, `local-${i} (npm start)`);
      const launch = (port?: number) =>
        superviseBuilder({
          dataDir,
          ...(port === undefined ? {} : { port }),
          env: {
            ...opts.builderEnv,
            BUILDER_JOIN_TOKEN: joinToken,
            BUILDER_CONTROL_URL: opts.publicUrl ?? apiUrl,
            BUILDER_NODE_NAME: `local-${i}`,
          },
          log: logFile ? { file: logFile } : "inherit",
          ...(opts.nodeCgroupRoot ? { cgroup: join(opts.nodeCgroupRoot, `local-${i}`) } : {}),
        });
      let supervised = await launch();
      const { nodeId } = JSON.parse(await readFile(join(dataDir, "node.json"), "utf8")) as { nodeId: string };
      const port = Number(new URL(supervised.url).port);
      nodes.push({
        name: `local-${i}`,
        id: nodeId,
        url: supervised.url,
        dataDir,
        logFile,
        pid: () => supervised.pid(),
        stop: () => supervised.stop(),
        kill: () => supervised.kill(),
        revive: async () => {
          supervised = await launch(port);
        },
      });
    }
    const adminKey = await adminKeyFor(apiUrl, secrets, opts.stateDir);
    // `svc login --local` reads where this stack answers (the key is in local-admin-key beside it).
    await writeFile(join(opts.stateDir, "local-api-url"), `${apiUrl}\n`);
    triggers = scheduleTriggers({
      crons: await cronsOf(join(ROOT, "wrangler.toml")),
      fire: async (cron) => {
        const res = await fetch(`${apiUrl}${SCHEDULED_PATH}?cron=${encodeURIComponent(cron)}`).catch((err: unknown) => err);
        if (res instanceof Response && res.ok) return void (await res.body?.cancel());
        const why = res instanceof Response ? `HTTP ${res.status}: scheduled() ended with "${await res.text()}"` : String(res);
        await say(`local stack: the cron trigger "${cron}" could not be fired (${why})\n`);
      },
    });
    const first = nodes[0]!;
    return { apiUrl, builderUrl: first.url, builderPid: first.pid, nodes, workerPid: () => worker?.pid ?? 0, restartApi, adminKey, secrets, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
