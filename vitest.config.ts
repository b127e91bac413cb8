import { fileURLToPath } from "node:url";
import { cloudflareTest, readD1Migrations } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";
import { builderBundle } from "./scripts/builder-process";
import { freePort } from "./scripts/local-stack";

const migrationsDir = fileURLToPath(new URL("./migrations", import.meta.url));

// The Worker suites drive a real builder process (started by the global setup).
process.env.SVC_TEST_BUILDER_PORT ??= String(await freePort());
process.env.SVC_TEST_BUILDER_SECRET ??= "test-builder-secret";
const builderSecret = process.env.SVC_TEST_BUILDER_SECRET;
const builderUrl = `http://127.0.0.1:${process.env.SVC_TEST_BUILDER_PORT}`;
// Every builder the run starts (global setups, builder suites, stacks) runs this one bundle,
// made when the run starts: under `vitest --watch`, a change to builder/src needs a new run.
process.env.SVC_BUILDER_BUNDLE ??= await builderBundle();

/** Worker test files that hold a request (sites.security) or a `_headers` match (sites.headers) to a time bound. */
const TIMED_WORKER_FILES = ["test/worker/sites.security.test.ts", "test/worker/sites.headers.test.ts"];

/** A project of Worker test files in real workerd, with the bindings the suites expect. */
function workerProject(test: { name: string; include: string[]; exclude?: string[]; isolate: boolean; globalSetup?: string[] }) {
  return {
    plugins: [
      cloudflareTest(async () => ({
        wrangler: { configPath: "./wrangler.toml" },
        miniflare: {
          bindings: {
            TEST_MIGRATIONS: await readD1Migrations(migrationsDir),
            OPERATOR_TOKEN: "test-operator-token",
            BUILDER_SECRET: builderSecret,
            BUILDER_URL: builderUrl,
            // Nothing listens here: completion reaches the Worker suites by polling,
            // the path a lost callback takes in production.
            PUBLIC_URL: "http://127.0.0.1:9",
            // The suites call the API at http://api.test (test/worker/helpers.ts): a host of the control plane's own.
            API_HOSTS: "api.test",
            ENV_ENCRYPTION_KEY: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            R2_ACCESS_KEY_ID: "test-access-key",
            R2_SECRET_ACCESS_KEY: "test-secret-access-key",
          },
        },
      })),
    ],
    test: {
      ...test,
      // Many of these drive the real builder (runs, builds, processes) on a shared 2-core machine.
      testTimeout: 30_000,
      // Objects log on their own (a cron's alarm, every minute, long after the test that made it): sent to
      // vitest over the runner's RPC, a log that came as the runtime closed left the whole run waiting
      // (vitest-dev/vitest#11153's race, here a hang). workerd prints them itself instead.
      disableConsoleIntercept: true,
      setupFiles: ["./test/worker/apply-migrations.ts"],
      // cron-parser is CommonJS requiring luxon; pre-bundle it the way wrangler's esbuild does.
      deps: { optimizer: { ssr: { enabled: true, include: ["cron-parser", "standardwebhooks"] } } },
    },
  };
}

/**
 * Three kinds of project: the Worker suites run inside real workerd (D1, R2, Durable
 * Objects through Miniflare); the builder suites run in Node against real
 * builder processes; the CLI and end-to-end suites run in Node against a
 * stack (the local Worker + builder) they share.
 */
export default defineConfig({
  test: {
    // Two files at once on two cores (vitest's default there is one). A third fills the 23-27 %
    // the cores sit idle while both files wait (a cron's minute, a lease running out, a build's
    // sleep): 923 s instead of 1,041-1,114 s, but the files that hold a time bound (a lease's
    // writer gone 16 s after the cut against 9; the dashboard's 1 s to interactive) then fail.
    maxWorkers: 2,
    projects: [
      workerProject({
        name: "worker",
        include: ["test/worker/**/*.test.ts"],
        exclude: TIMED_WORKER_FILES,
        // One runtime per pool worker for every file, not one per file (which cost ~4 s each):
        // the files share its D1, R2 and objects, each working in its own fresh accounts.
        isolate: false,
        globalSetup: ["./test/support/worker-global-setup.ts"],
      }),
      // In the shared runtime the heap the files before them left could pause a timed request past
      // its bound (230-251 ms against 200), so each of these gets a runtime of its own.
      workerProject({ name: "worker-timed", include: TIMED_WORKER_FILES, isolate: true }),
      {
        test: {
          name: "node",
          environment: "node",
          include: ["test/builder/**/*.test.ts", "test/dashboard/**/*.test.ts", "test/scripts/**/*.test.ts"],
          // One process runs file after file, importing what they share once: a fresh process per file cost
          // ~1.9 s of CPU a file (14 builder files: 128 -> 102 s). No file mocks modules or changes process.env.
          isolate: false,
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          // The CLI and end-to-end files share one stack (an account each); see test/support/shared-stack.ts.
          name: "e2e",
          environment: "node",
          include: ["test/cli/**/*.test.ts", "test/e2e/**/*.test.ts"],
          globalSetup: ["./test/support/shared-stack.ts"],
          // As the node files: ~1 s of CPU less a file.
          isolate: false,
          testTimeout: 60_000,
          hookTimeout: 240_000,
        },
      },
    ],
  },
});
