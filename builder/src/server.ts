/**
 * Entry point of the builder: reads its configuration from the environment,
 * finds out what the host offers the sandbox (printing one line per
 * mechanism), starts the HTTP API, and on SIGTERM/SIGINT ends every job before
 * exiting so no user process outlives it. A node of a fleet joins its control
 * plane first (membership.ts). Prints `builder listening on http://host:port`
 * (with the real port when BUILDER_PORT=0) once it accepts requests.
 */
import { chmod, mkdir, stat } from "node:fs/promises";
import { createServer, type IncomingMessage, type RequestListener, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import { join } from "node:path";
import { createRequestHandler } from "./app.js";
import { loadConfig } from "./config.js";
import { DiskLeases } from "./disks/leases.js";
import { DiskStore } from "./disks/store.js";
import { HostRoom } from "./sandbox/host-room.js";
import { DependencyCache } from "./jobs/dependency-cache.js";
import { JobManager } from "./jobs/manager.js";
import { PackageCaches } from "./jobs/package-cache.js";
import { LogShipper } from "./processes/log-shipper.js";
import { NativeProxy } from "./processes/native-proxy.js";
import { ProcessManager } from "./processes/manager.js";
import { AppProxy } from "./processes/proxy.js";
import { DiskLease } from "./node/lease.js";
import { reportMetrics } from "./node/metrics.js";
import { heartbeat, joinFleet, UNLEASED_SECONDS } from "./node/membership.js";
import type { NodeCredentials } from "./protocol/shared.js";
import { NonceCache } from "./protocol/signing.js";
import { SandboxHost } from "./sandbox/host.js";
import { TenantUsers } from "./sandbox/tenants.js";

const loaded = loadConfig(process.env, process.cwd());
if (!loaded.ok) {
  console.error(`builder: invalid configuration\n  ${loaded.problems.join("\n  ")}`);
  process.exit(1);
}
const { config } = loaded;
// Job environments are built from scratch, but keep the secrets out of reach of anything inheriting ours.
delete process.env.BUILDER_SECRET;
delete process.env.BUILDER_JOIN_TOKEN;

// A stricter inherited umask would strip the x bits job users need on the 0711 directories.
process.umask(0o022);
await mkdir(config.dataDir, { recursive: true, mode: 0o711 });
// Job users bind their disks and scratch space from below it: traversable, never listable.
await chmod(config.dataDir, 0o711);
const tenants = await TenantUsers.open(config.dataDir, config.tenantUidBase, config.tenantRegistry);
if (config.pipFindLinks !== null && !(await stat(config.pipFindLinks).catch(() => null))?.isDirectory()) {
  console.error(`builder: invalid configuration\n  BUILDER_PIP_FIND_LINKS: ${config.pipFindLinks} is not a folder`);
  process.exit(1);
}
const host = await SandboxHost.open({
  dataDir: config.dataDir,
  npmRegistry: config.npmRegistry,
  pipIndexUrl: config.pipIndexUrl,
  probeUser: config.tenantUidBase === null ? null : { uid: config.tenantUidBase, gid: config.tenantUidBase },
});
host.network?.fill(config.maxConcurrentJobs);
const room = new HostRoom({
  dataDir: config.dataDir,
  diskReserveBytes: config.hostReserveBytes,
  memoryReserveBytes: config.hostMemoryReserveBytes,
  ...(config.memoryLedgerDir ? { ledgerDir: config.memoryLedgerDir } : {}),
});
// A node of a fleet holds its disks under a lease its heartbeats renew (node/lease.ts); a lone builder needs none.
// Opened before the disks are mounted: it ends the watchdog a previous run of this node left.
const leaseDir = join(config.dataDir, "lease");
const lease = config.join
  ? await DiskLease.open({ dir: leaseDir, disksRoot: join(config.dataDir, "disks"), cgroupParents: host.cgroups?.parents ?? [] })
  : DiskLease.none(leaseDir);
const disks = await DiskStore.open(join(config.dataDir, "disks"), tenants, host.images, { room });
lease.onRegained(() => void disks.remount().catch((error: unknown) => console.error(`builder: mounting the disks again failed: ${String(error)}`)));
const leases = new DiskLeases();

// Listening comes first (a node joining must say where it is reached, and BUILDER_PORT=0 picks the
// port); until everything below is ready every request but /healthz is answered 503.
let handler: RequestListener = (request, response) => {
  const ready = request.url === "/healthz";
  response.writeHead(ready ? 200 : 503, { "Content-Type": "application/json" });
  response.end(JSON.stringify(ready ? { ok: true, starting: true } : { error: { code: "UNAVAILABLE", message: "the builder is starting" } }));
};
// WebSockets (and any other upgrade) of the apps' traffic, once the proxy exists; refused until then.
let upgrade = (_request: IncomingMessage, socket: Duplex, _head: Buffer): void => void socket.destroy();
const newServer = () => createServer((request, response) => handler(request, response)).on("upgrade", (request, socket, head) => upgrade(request, socket, head));
const servers = [newServer()];
const listen = async (target: Server, port: number, host: string): Promise<AddressInfo> => {
  await new Promise<void>((resolve, reject) => {
    target.once("error", reject);
    target.listen(port, host, () => {
      target.off("error", reject);
      resolve();
    });
  });
  return target.address() as AddressInfo;
};
/** A server of the builder's own on its public address (without HAProxy in front). */
const listenItself = async (port: number): Promise<Server> => {
  const own = newServer();
  servers.push(own);
  await listen(own, port, config.host);
  return own;
};
const urlOf = (host: string, port: number) => `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
// Apps' traffic goes through HAProxy in front of the builder's port when it can (processes/native-proxy.ts):
// the builder's own server is then on the loopback behind it, and takes what HAProxy does not answer itself.
let native: NativeProxy | null = null;
let listening: string;
if (config.nativeProxy === "off") {
  const address = await listen(servers[0]!, config.port, config.host);
  listening = urlOf(address.address, address.port);
} else {
  const behind = await listen(servers[0]!, 0, "127.0.0.1");
  // HAProxy keeps its idle connections to the builder: the builder must not close them first.
  servers[0]!.keepAliveTimeout = 120_000;
  servers[0]!.headersTimeout = 121_000;
  try {
    native = await NativeProxy.start({
      dir: join(config.dataDir, "native-proxy"),
      binary: config.haproxyBinary,
      listen: { host: config.host, port: config.port },
      fallbackPort: behind.port,
      secret: () => credentials.key,
      hold: (held, request, response) => proxy.handleHeld(held, request, response),
      abandoned: () =>
        void listenItself(Number(new URL(listening).port)).catch((error: unknown) => console.error(`builder: listening on ${listening} itself failed: ${String(error)}`)),
    });
    listening = urlOf(config.host, native.port);
    console.log(`builder native proxy: HAProxy on ${listening}, in front of the builder's own server on 127.0.0.1:${behind.port}; apps' plain requests go from it straight to their sandboxes`);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    if (config.nativeProxy === "on") {
      console.error(`builder: BUILDER_NATIVE_PROXY=on, but ${why}`);
      process.exit(1);
    }
    console.log(`builder native proxy: off (${why}); apps' traffic goes through the Node proxy alone`);
    const own = await listenItself(config.port);
    const address = own.address() as AddressInfo;
    listening = urlOf(address.address, address.port);
  }
}

const membership = new AbortController();
const memoryFreeMb = () => Math.floor(room.memoryFreeBytes / 1024 / 1024);
let credentials: NodeCredentials;
let heartbeatMs = 0;
if (config.join) {
  try {
    const joined = await joinFleet({ join: config.join, dataDir: config.dataDir, listening, disks, load: { jobs: () => 0, processes: () => 0, memoryFreeMb }, signal: membership.signal });
    credentials = joined.credentials;
    heartbeatMs = joined.heartbeatMs;
    // Joining was contact with the control plane: the node holds its disks from now (the heartbeats renew it).
    await lease.grant(joined.leaseSentAt, joined.leaseSeconds ?? UNLEASED_SECONDS);
    console.log(`builder node: joined ${config.join.controlUrl} as ${joined.name} (${joined.credentials.node}), heartbeat every ${heartbeatMs / 1000} s`);
  } catch (error) {
    console.error(`builder: ${error instanceof Error ? error.message : String(error)}`);
    process.exit(1);
  }
} else {
  credentials = { key: config.secret ?? "", node: null };
}

const jobs = await JobManager.open({
  dataDir: config.dataDir,
  maxConcurrent: config.maxConcurrentJobs,
  maxStaged: config.maxStagedJobs,
  tenantConcurrency: config.tenantConcurrency,
  credentials,
  disks,
  leases,
  host,
  tenants,
  buildScratchBytes: config.buildScratchBytes,
  npmRegistry: config.npmRegistry,
  pip: { indexUrl: config.pipIndexUrl, findLinks: config.pipFindLinks },
  dependencyCache: await DependencyCache.open(join(config.dataDir, "dependency-cache"), config.dependencyCacheBytes),
  packageCaches: new PackageCaches(join(config.dataDir, "package-cache"), config.packageCacheBytes),
});

// A node's apps' runtime logs leave it as they are written, so they outlive it (a failover, a drain).
const shipper = config.join ? new LogShipper({ controlUrl: config.join.controlUrl, credentials }) : null;
const processes = await ProcessManager.open({
  dataDir: config.dataDir,
  credentials,
  host,
  room,
  tenants,
  disks,
  leases,
  lease,
  ...(shipper ? { logTap: (appId: string, records: Buffer) => shipper.take(appId, records) } : {}),
});
shipper?.start();
const proxy = new AppProxy({ secret: credentials.key, lookup: (id) => processes.lookup(id) });

handler = createRequestHandler({ secret: credentials.key, jobs, disks, nonces: new NonceCache(), leases, lease, processes, proxy });
// Every path but the apps' traffic is refused there.
upgrade = (request, socket, head) => proxy.upgrade(request, socket, head);
native?.attach(processes);
if (config.join) {
  void heartbeat({
    controlUrl: config.join.controlUrl,
    credentials,
    intervalMs: heartbeatMs,
    dataDir: config.dataDir,
    disks,
    lease,
    load: { jobs: () => jobs.load, processes: () => processes.live, memoryFreeMb },
    processes,
    signal: membership.signal,
  });
  void reportMetrics({ controlUrl: config.join.controlUrl, credentials, intervalMs: config.metricsIntervalMs, processes, disks, signal: membership.signal });
}

let stopping = false;
async function stop(): Promise<void> {
  if (stopping) return;
  stopping = true;
  membership.abort();
  for (const server of servers) server.close();
  // App processes end with the builder (their sandboxes die with it anyway): stopped cleanly, reported.
  await Promise.all([jobs.shutdown(config.shutdownGraceMs), processes.shutdown()]);
  await shipper?.stop();
  await native?.close();
  for (const server of servers) server.closeAllConnections();
  // Each step whatever the one before it met: a disk that would not unmount must not leave the data dir's own mount behind.
  for (const [what, step] of [
    ["unmounting disks", () => disks.close()],
    ["ending the lease", () => lease.close()],
    ["closing the sandbox host", () => host.close()],
  ] as const) {
    await step().catch((error: unknown) => console.error(`builder: ${what} at shutdown failed: ${error instanceof Error ? error.message : String(error)}`));
  }
  room.close();
  process.exit(0);
}
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());

for (const line of host.summary) console.log(`builder ${line}`);
console.log(
  `builder users: ${tenants.separateUsers ? `one unprivileged uid per account on this host, from ${config.tenantUidBase} (registry ${config.tenantRegistry})` : `jobs run as the builder's own uid ${process.getuid?.()} (per-account uids need root)`}`,
);
console.log(
  `builder slots: ${config.maxConcurrentJobs} jobs at once; per account the plan's limit the Worker sends (${config.tenantConcurrency} when it sends none), never all slots when there are several`,
);
const pip = [config.pipIndexUrl && `index ${config.pipIndexUrl}`, config.pipFindLinks && `wheels in ${config.pipFindLinks}`].filter(Boolean);
console.log(
  `builder python packages: ${pip.length > 0 ? pip.join(", ") : "none (python apps with requirements fail until BUILDER_PIP_INDEX_URL or BUILDER_PIP_FIND_LINKS is set)"}`,
);
console.log(`builder listening on ${listening}`);
