import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inject } from "vitest";
import { type LocalStack, type LocalStackOptions, ROOT, startLocalStack } from "../../scripts/local-stack.js";

/** What one `svc` invocation produced. */
export type SvcResult = { code: number | null; stdout: string; stderr: string };

/** A private HOME / XDG_CONFIG_HOME, so tests never read or write the developer's real login. */
export async function tempHome(): Promise<{ dir: string; env: Record<string, string>; remove(): Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "svc-cli-home-"));
  return {
    dir,
    env: { HOME: dir, XDG_CONFIG_HOME: join(dir, "config") },
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

/**
 * Runs the real `svc` (cli/bin/svc.js, the file users run) with only PATH plus the given
 * variables in its environment, so SVC_* settings of the developer's shell
 * cannot leak in. stdin is a pipe (not a terminal), closed after `input`.
 */
export function svc(args: readonly string[], env: Record<string, string>, input = "", cwd = ROOT): Promise<SvcResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, "cli", "bin", "svc.js"), ...args], {
      cwd,
      env: { PATH: process.env.PATH ?? "", ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => {
      stdout += d;
    });
    child.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(input);
  });
}

/**
 * How long a test file's `beforeAll` may take to start the stack. Longer than
 * startLocalStack's own deadlines (migrations, then 90 s for wrangler dev), so
 * a stack that never becomes healthy is stopped by startLocalStack itself
 * instead of being orphaned when vitest abandons a timed-out hook.
 */
export const STACK_START_TIMEOUT_MS = 240_000;

/**
 * The stack a CLI or end-to-end file works against: the one the suite shares
 * (test/support/shared-stack.ts), with a new account of its own (business
 * plan), so what one file creates or lists never meets another's. `stop()`
 * leaves the shared stack running; restarting its parts is refused (files
 * that do so start their own with {@link startOwnStack}).
 */
export async function startStack(): Promise<LocalStack & { stateDir: string }> {
  const shared = inject("sharedStack");
  const res = await fetch(`${shared.apiUrl}/v1/accounts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${shared.secrets.OPERATOR_TOKEN}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name: `test-${randomBytes(4).toString("hex")}`, plan: "business" }),
  });
  if (res.status !== 201) throw new Error(`creating the file's account on the shared stack: ${res.status} ${await res.text()}`);
  const { apiKey } = (await res.json()) as { apiKey: { key: string } };
  const own = (what: string) => () => {
    throw new Error(`the shared stack cannot ${what}: start one of your own (startOwnStack)`);
  };
  return {
    apiUrl: shared.apiUrl,
    builderUrl: shared.builderUrl,
    secrets: shared.secrets,
    stateDir: shared.stateDir,
    adminKey: apiKey.key,
    builderPid: () => shared.builderPid,
    nodes: shared.nodes.map((node) => ({ ...node, pid: () => node.pid, stop: own("stop a node"), kill: own("kill a node"), revive: own("revive a node") })),
    workerPid: () => shared.workerPid,
    restartApi: own("restart its API"),
    stop: async () => {},
  };
}

/** One local stack (wrangler dev + builder) in a temporary directory, removed again by `stop()`; its logs are in `stateDir`. */
export async function startOwnStack(
  options: Pick<LocalStackOptions, "nodes" | "workerVars" | "workerLogs" | "builderEnv" | "nodeCgroupRoot"> = {},
): Promise<LocalStack & { stateDir: string }> {
  const dir = await mkdtemp(join(tmpdir(), "svc-cli-stack-"));
  const stack = await startLocalStack({
    ...options,
    port: 0,
    persistDir: join(dir, "persist"),
    stateDir: join(dir, "state"),
    secretsFile: join(dir, "secrets.env"),
    output: "files",
  }).catch((err: unknown) => {
    throw new Error(`local stack did not start (logs kept in ${join(dir, "state")}): ${err instanceof Error ? err.message : err}`);
  });
  return {
    ...stack,
    stateDir: join(dir, "state"),
    stop: async () => {
      await stack.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Creates a key straight through the API (not the CLI), for tests whose subject is another command. */
export async function createKey(stack: LocalStack, name: string, scopes: string[]): Promise<{ id: string; key: string }> {
  const res = await fetch(`${stack.apiUrl}/v1/api-keys`, {
    method: "POST",
    headers: { Authorization: `Bearer ${stack.adminKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name, scopes }),
  });
  const text = await res.text();
  if (res.status !== 201) throw new Error(`creating key ${name}: ${res.status} ${text}`);
  return JSON.parse(text) as { id: string; key: string };
}

/** Every process's command line on this machine, arguments joined by spaces (what `ps` shows any user). */
export async function processCommandLines(): Promise<string[]> {
  const lines: string[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const raw = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    if (raw !== "") lines.push(raw.split("\0").join(" "));
  }
  return lines;
}
