import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type { Plugin } from "esbuild";
import type { TestProject } from "vitest/node";
import { bundleForNode } from "../../scripts/bundle.js";
import { type LocalSecrets, ROOT, startLocalStack } from "../../scripts/local-stack.js";

/** What the CLI and end-to-end files get of the stack they share (serialisable: vitest hands it to each file). */
export type SharedStack = {
  apiUrl: string;
  builderUrl: string;
  secrets: LocalSecrets;
  stateDir: string;
  workerPid: number;
  builderPid: number;
  nodes: { name: string; id: string; url: string; dataDir: string; pid: number }[];
};

declare module "vitest" {
  export interface ProvidedContext {
    sharedStack: SharedStack;
    /** The CLI bundled once for the whole run (test/cli/svc.ts, `svc`). */
    svcEntry: string;
  }
}

/**
 * Bundles the CLI (cli/src/main.ts with what it imports) once for the whole
 * run with esbuild, and writes an entry that runs `main` as cli/bin/svc.js
 * does. cli/bin/svc.js compiles the sources through tsx at every start
 * (~0.9 s here); the bundle starts in ~0.3 s, and the suites run the CLI
 * several hundred times. Same sources, same `main`: each file's
 * `import.meta.url` is kept as the source file's own (the CLI finds
 * package.json and the local stack's .svc/ relative to itself), and one test
 * still runs cli/bin/svc.js (test/cli/usage.test.ts).
 */
async function bundleCli(into: string): Promise<string> {
  const ownUrl: Plugin = {
    name: "own-url",
    setup(builder) {
      builder.onLoad({ filter: /\/(cli|builder)\/src\/.*\.ts$/ }, async ({ path }) => ({
        contents: (await readFile(path, "utf8")).replaceAll("import.meta.url", JSON.stringify(pathToFileURL(path).href)),
        loader: "ts",
      }));
    },
  };
  await bundleForNode(join(ROOT, "cli", "src", "main.ts"), join(into, "main.mjs"), [ownUrl]);
  const entry = join(into, "svc.mjs");
  await writeFile(entry, 'const { main } = await import("./main.mjs");\nprocess.exitCode = await main(process.argv.slice(2));\n');
  return entry;
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
  project.provide("svcEntry", await bundleCli(join(dir, "cli-bundle")));
  const stack = await startLocalStack({
    port: 0,
    persistDir: join(dir, "persist"),
    stateDir,
    secretsFile: join(dir, "secrets.env"),
    output: "files",
  });
  project.provide("sharedStack", {
    apiUrl: stack.apiUrl,
    builderUrl: stack.builderUrl,
    secrets: stack.secrets,
    stateDir,
    workerPid: stack.workerPid(),
    builderPid: stack.builderPid(),
    nodes: stack.nodes.map(({ name, id, url, dataDir, pid }) => ({ name, id, url, dataDir, pid: pid() })),
  });
  return async () => {
    await stack.stop();
    await rm(dir, { recursive: true, force: true });
  };
}
