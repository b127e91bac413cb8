import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { launchBuilder } from "../../scripts/builder-process";

/**
 * The Worker suites talk to a real builder process: vitest.config.ts picks its
 * port and secret and hands them to workerd as bindings; this starts it.
 */
export default async function setup(): Promise<() => Promise<void>> {
  const dataDir = await mkdtemp(join(tmpdir(), "svc-worker-builder-"));
  const builder = await launchBuilder({
    port: Number(process.env.SVC_TEST_BUILDER_PORT),
    secret: process.env.SVC_TEST_BUILDER_SECRET ?? "",
    dataDir,
    // Two Worker test files run at once against this one builder: room enough that the fairness
    // tests (crons.fair) meet their account's plan limit, never a builder another file filled.
    env: { BUILDER_SHUTDOWN_GRACE_SECONDS: "0", BUILDER_MAX_CONCURRENT_JOBS: "32" },
    log: { file: join(dataDir, "builder.log") },
  });
  return async () => {
    await builder.stop();
    await rm(dataDir, { recursive: true, force: true });
  };
}
