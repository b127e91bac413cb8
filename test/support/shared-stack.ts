import { execFileSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { type LocalSecrets, ROOT, startLocalStack } from "../../scripts/local-stack.js";

/** What the CLI and end-to-end files get of the stack they share (serialisable: vitest hands it to each file). */
export type SharedStack = {
  apiUrl: string;
  builderUrl: string;
  secrets: LocalSecrets;
  stateDir: string;
  workerPid: number;
  builderPid: number;
  nodes: { name: string; id: string; url: string; dataDir: string; logFile: string | null; pid: number }[];
};

declare module "vitest" {
  export interface ProvidedContext {
    sharedStack: SharedStack;
  }
}

/**
 * Starts one stack (wrangler dev + builder, as `npm start` runs them) for the
 * CLI and end-to-end files, which each get an account of their own on it
 * (test/cli/svc.ts, `startStack`): a stack costs ~10 s of CPU to start, and
 * a dozen files starting their own made the suite several minutes longer on
 * two cores. Files that kill or restart parts of the stack start their own.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = await mkdtemp(join(tmpdir(), "svc-shared-stack-"));
  const stateDir = join(dir, "state");
  // The CLI's first start bundles its sources (cli/bin/bundle.js): once here, not by every file's first command at once.
  execFileSync(process.execPath, [join(ROOT, "cli", "bin", "svc.js"), "--version"], { stdio: "ignore" });
  const stack = await startLocalStack({
    port: 0,
    persistDir: join(dir, "persist"),
    stateDir,
    secretsFile: join(dir, "secrets.env"),
    output: "files",
    // Usage metrics every 5 s rather than 10: the files that wait for them wait less, and every report
    // (a call per app that runs, and the shared stack runs dozens by the end) costs the Worker little.
    builderEnv: { BUILDER_METRICS_SECONDS: "5" },
  });
  project.provide("sharedStack", {
    apiUrl: stack.apiUrl,
    builderUrl: stack.builderUrl,
    secrets: stack.secrets,
    stateDir,
    workerPid: stack.workerPid(),
    builderPid: stack.builderPid(),
    nodes: stack.nodes.map(({ name, id, url, dataDir, logFile, pid }) => ({ name, id, url, dataDir, logFile, pid: pid() })),
  });
  return async () => {
    await stack.stop();
    await rm(dir, { recursive: true, force: true });
  };
}
