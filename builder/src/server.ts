/**
 * Entry point of the builder: reads its configuration from the environment,
 * starts the HTTP API, and on SIGTERM/SIGINT ends every job before exiting so
 * no user process outlives it. Prints `builder listening on http://host:port`
 * (with the real port when BUILDER_PORT=0) once it accepts requests.
 */
import { mkdir } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { createRequestHandler } from "./app.js";
import { loadConfig } from "./config.js";
import { DiskStore } from "./disks.js";
import { JobManager } from "./job-manager.js";
import { NonceCache } from "./protocol.js";
import { CgroupV2 } from "./sandbox.js";

const loaded = loadConfig(process.env, process.cwd());
if (!loaded.ok) {
  console.error(`builder: invalid configuration\n  ${loaded.problems.join("\n  ")}`);
  process.exit(1);
}
const { config } = loaded;
// Job environments are built from scratch, but keep the secret out of reach of anything inheriting ours.
delete process.env.BUILDER_SECRET;

// A stricter inherited umask would strip the x bits the job user needs on the 0711 directories.
process.umask(0o022);
await mkdir(config.dataDir, { recursive: true, mode: 0o711 });
const disks = await DiskStore.open(join(config.dataDir, "disks"), config.jobUser);
const cgroups = await CgroupV2.detect();
const jobs = await JobManager.open({
  dataDir: config.dataDir,
  maxConcurrent: config.maxConcurrentJobs,
  secret: config.secret,
  disks,
  cgroups,
  user: config.jobUser,
  npmRegistry: config.npmRegistry,
});

const server = createServer(createRequestHandler({ secret: config.secret, jobs, disks, nonces: new NonceCache() }));

let stopping = false;
async function stop(): Promise<void> {
  if (stopping) return;
  stopping = true;
  server.close();
  await jobs.shutdown();
  server.closeAllConnections();
  process.exit(0);
}
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());

server.listen(config.port, config.host, () => {
  const address = server.address() as AddressInfo;
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  console.log(`builder memory limits: ${cgroups ? "cgroup v2 memory.max" : "RSS sampling of the process tree"}`);
  console.log(`builder listening on http://${host}:${address.port}`);
});
