import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { type IncomingMessage, type Server, type ServerResponse, createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { nodeKey } from "../../builder/src/protocol/node.js";
import { signRequest } from "../../builder/src/protocol/signing.js";
import { freePort, type LocalStack, startLocalStack } from "../../scripts/local-stack.js";
import { diskDataPath } from "../builder/builder-process.js";

/**
 * Issue 10's fault suite, on the stack `npm start` runs (supervised builder,
 * wrangler dev): the builder is killed with SIGKILL in the middle of a cron
 * run, a backup, a restore and a build, and started again by its supervisor;
 * wrangler dev is stopped and started while operations run; and a stack whose
 * builder cannot deliver a single callback still completes everything by
 * polling. Each operation must reach a true final state within a bound, and
 * data must be intact.
 */
const only = process.getuid?.() === 0 ? describe : describe.skip;
/** How long an operation may take to reach its final state after a fault. */
const SETTLE_MS = 60_000;

type Envelope<T> = { data: T; status: number };

class Client {
  constructor(
    readonly stack: LocalStack,
    readonly key: string,
  ) {}

  async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const res = await fetch(`${this.stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${this.key}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return (text ? JSON.parse(text) : null) as T;
  }

  /** The builder's job for a control-plane key (run, backup, restore, deployment id), asked the way the Worker asks. */
  async builderJob(key: string): Promise<JobStatus | null> {
    const path = `/v1/jobs?key=${encodeURIComponent(key)}`;
    // The node's own key, derived as the Worker derives it (protocol/node.ts, nodeKey).
    const secret = await nodeKey(this.stack.secrets.BUILDER_SECRET, this.stack.nodes[0]!.id);
    const headers = await signRequest({ secret, method: "GET", path });
    const res = await fetch(`${this.stack.builderUrl}${path}`, { headers }).catch(() => null);
    return res?.ok ? JobStatus.parse(await res.json()) : null;
  }
}

async function until<T>(what: string, probe: () => Promise<T | null | undefined>, timeoutMs = SETTLE_MS): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => null);
    if (value !== null && value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await sleep(250);
  }
}

/** Files under `dir` with their SHA-256: what "the disk is intact" compares. */
async function tree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (at: string) => {
    for (const entry of await readdir(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) await walk(path);
      else out[relative(dir, path)] = createHash("sha256").update(await readFile(path)).digest("hex");
    }
  };
  await walk(dir);
  return out;
}

async function stackIn(root: string, extra: { publicUrl?: string; port?: number } = {}): Promise<LocalStack> {
  return startLocalStack({
    port: extra.port ?? 0,
    persistDir: join(root, "persist"),
    stateDir: join(root, "state"),
    secretsFile: join(root, "dev.vars"),
    output: "files",
    ...(extra.publicUrl ? { publicUrl: extra.publicUrl } : {}),
  });
}

async function newClient(stack: LocalStack): Promise<Client> {
  const res = await fetch(`${stack.apiUrl}/v1/api-keys`, {
    method: "POST",
    headers: { Authorization: `Bearer ${stack.adminKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name: `faults-${randomBytes(3).toString("hex")}`, scopes: ["deploy"] }),
  });
  return new Client(stack, ((await res.json()) as { key: string }).key);
}

/** A tar.gz of a folder holding `bytes` of random data, made with GNU tar. */
async function archiveOf(dir: string, bytes: number): Promise<Buffer> {
  const { execFileSync } = await import("node:child_process");
  await mkdir(join(dir, "tree"), { recursive: true });
  await writeFile(join(dir, "tree", "restored.bin"), randomBytes(bytes));
  execFileSync("tar", ["-czf", join(dir, "a.tgz"), "-C", join(dir, "tree"), "."]);
  return readFile(join(dir, "a.tgz"));
}

/** A static site whose build takes a while (so a kill lands in the middle), with its lockfile-free package.json. */
async function slowSite(dir: string): Promise<Buffer> {
  const { execFileSync } = await import("node:child_process");
  await mkdir(join(dir, "site"), { recursive: true });
  await writeFile(join(dir, "site", "svc.json"), JSON.stringify({ runtime: "static", buildCommand: "sleep 120 && mkdir -p out && echo hi > out/index.html", outputDir: "out" }));
  execFileSync("tar", ["-czf", join(dir, "site.tgz"), "-C", join(dir, "site"), "."]);
  return readFile(join(dir, "site.tgz"));
}

async function deploy(client: Client, app: string, source: Buffer): Promise<string> {
  const created = await client.call<{ data: { deployment: { id: string }; uploadUrl: string } }>("POST", `/v1/apps/${app}/deployments`, {
    sizeBytes: source.byteLength,
  });
  const put = await fetch(created.data.uploadUrl, { method: "PUT", body: source });
  expect(put.status).toBe(200);
  await client.call("POST", `/v1/apps/${app}/deployments/${created.data.deployment.id}/start`);
  return created.data.deployment.id;
}

// One stack for both: its builder is killed (and started again by its supervisor) in the first test, its Worker in the second.
only("faults: the builder killed mid-operation and started again by its supervisor, then the Worker stopped and started", () => {
  let root: string;
  let stack: LocalStack;
  let client: Client;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "svc-faults-"));
    stack = await stackIn(root);
    client = await newClient(stack);
  }, 240_000);
  afterAll(async () => {
    await stack?.stop();
    await rm(root, { recursive: true, force: true });
  });

  /** SIGKILL the builder, then wait for the supervisor to have it answering again. */
  async function killBuilder(): Promise<void> {
    const pid = stack.builderPid();
    process.kill(pid, "SIGKILL");
    await until("the supervisor to start the builder again", async () =>
      stack.builderPid() !== pid && (await fetch(`${stack.builderUrl}/healthz`).then((r) => r.ok, () => false)) ? true : null,
    );
  }

  it("every operation the kill cut short reaches a true final state, and the data is intact", async () => {
    const app = `faults-${randomBytes(3).toString("hex")}`;
    await client.call("POST", "/v1/apps", { name: app, runtime: "static", memoryMb: 512 });
    // Two disks: a restore of a disk that is being backed up is refused (DISK_BUSY), so each has its own.
    await client.call("POST", "/v1/disks", { name: "kept", sizeGb: 1, mountPath: "/data" });
    await client.call("POST", "/v1/disks", { name: "saved", sizeGb: 1, mountPath: "/saved" });
    const disks = await client.call<{ data: { id: string; name: string }[] }>("GET", "/v1/disks");
    const diskId = disks.data.find((d) => d.name === "kept")!.id;
    const savedId = disks.data.find((d) => d.name === "saved")!.id;
    const data = diskDataPath(join(root, "state", "builder"), diskId);
    await writeFile(join(data, "big.bin"), randomBytes(8 * 1024 * 1024));
    await writeFile(join(data, "note.txt"), "the disk before the restore\n");
    const before = await tree(data);
    await writeFile(join(diskDataPath(join(root, "state", "builder"), savedId), "big.bin"), randomBytes(48 * 1024 * 1024));

    // A cron run, a backup, a restore and a build, all running when the builder dies.
    const cron = await client.call<{ data: { id: string } }>("POST", "/v1/crons", {
      appId: app,
      name: "long",
      schedule: "0 0 1 1 *",
      // Far longer than the others take to start on a loaded machine: all four run together when the kill comes.
      command: "echo started; sleep 300",
    });
    const run = await client.call<{ data: { jobName: string } }>("POST", `/v1/crons/${cron.data.id}/run`);
    const backup = await client.call<Envelope<{ id: string }>>("POST", `/v1/disks/${savedId}/backups`, { description: "cut short" });
    const archive = await archiveOf(join(root, "restore"), 32 * 1024 * 1024);
    const presigned = await client.call<Envelope<{ uploadUrl: string; uploadId: string }>>("POST", `/v1/disks/${diskId}/backups/restore/presign`, {
      sizeBytes: archive.byteLength,
    });
    expect((await fetch(presigned.data.uploadUrl, { method: "PUT", body: archive })).status).toBe(200);
    // Not in use: no app holds the disk.
    const restore = await client.call<Envelope<{ jobId: string }>>("POST", `/v1/disks/${diskId}/backups/restore`, { uploadId: presigned.data.uploadId });
    const deployment = await deploy(client, app, await slowSite(join(root, "deploy")));

    await until("every job to be running on the builder", async () => {
      const jobs = await Promise.all([`${cron.data.id}/${run.data.jobName}`, deployment].map((key) => client.builderJob(key)));
      return jobs.every((job) => job?.status === "running") ? true : null;
    });
    const killedAt = Date.now();
    await killBuilder();

    const runEnded = await until("the cron run to end", async () => {
      const runs = await client.call<{ data: { jobName: string; status: string; error: string | null }[] }>("GET", `/v1/crons/${cron.data.id}/runs`);
      const found = runs.data.find((r) => r.jobName === run.data.jobName);
      return found && found.status !== "running" ? found : null;
    });
    expect(runEnded).toMatchObject({ status: "failed", error: "builder restarted before the job finished" });

    const deployed = await until("the deployment to end", async () => {
      const list = await client.call<{ data: { id: string; status: string; error: string | null }[] }>("GET", `/v1/apps/${app}/deployments`);
      const found = list.data.find((d) => d.id === deployment);
      return found && !["queued", "building", "deploying"].includes(found.status) ? found : null;
    });
    expect(deployed).toMatchObject({ status: "failed", error: "builder restarted before the job finished" });

    const restored = await until("the restore to end", async () => {
      const res = await client.call<Envelope<{ status: string; error: string | null }>>("GET", `/v1/disks/${diskId}/backups/restore/${restore.data.jobId}`);
      return res.data.status === "running" ? null : res.data;
    });
    // The restore either finished before the kill or was cut short; cut short, the disk is as it was.
    if (restored.status === "failed") {
      expect(restored.error).toBe("builder restarted before the job finished");
      expect(await tree(data)).toEqual(before);
    } else {
      expect(Object.keys(await tree(data))).toEqual(["restored.bin"]);
    }

    const backedUp = await until("the backup to end", async () => {
      const list = await client.call<Envelope<{ id: string; status: string; sha256?: string; failureReason?: string }[]>>("GET", `/v1/disks/${savedId}/backups`);
      const found = list.data.find((b) => b.id === backup.data.id);
      return found && found.status !== "creating" ? found : null;
    });
    if (backedUp.status === "ready") {
      // A backup that says ready downloads, and verifies.
      const link = await client.call<Envelope<{ url: string }>>("GET", `/v1/disks/${savedId}/backups/${backedUp.id}/download`);
      const bytes = Buffer.from(await (await fetch(link.data.url)).arrayBuffer());
      expect(createHash("sha256").update(bytes).digest("hex")).toBe(backedUp.sha256);
    } else {
      expect(backedUp).toMatchObject({ status: "failed", failureReason: "builder restarted before the job finished" });
    }
    const settled = Date.now() - killedAt;
    console.log(`faults: every operation reached its final state ${(settled / 1000).toFixed(1)} s after the kill`);
    expect(settled).toBeLessThan(SETTLE_MS);
    // The supervisor kept the disk: a new run reads it.
    const after = await client.call<{ data: { jobName: string } }>("POST", `/v1/crons/${cron.data.id}/run`);
    expect(after.data.jobName).toMatch(/^manual-/);
    // It would sleep for minutes in one of the account's job slots.
    await client.call("POST", `/v1/crons/${cron.data.id}/runs/${after.data.jobName}/cancel`);
  }, 240_000);

  it("nothing is stuck and nothing runs twice", async () => {
    const app = `restart-${randomBytes(3).toString("hex")}`;
    await client.call("POST", "/v1/apps", { name: app, runtime: "node" });
    const marker = `ran-${randomBytes(4).toString("hex")}`;
    const cron = await client.call<{ data: { id: string } }>("POST", "/v1/crons", {
      appId: app,
      name: "across",
      schedule: "0 0 1 1 *",
      command: `sleep 6; echo ${marker}`,
    });
    const run = await client.call<{ data: { jobName: string } }>("POST", `/v1/crons/${cron.data.id}/run`);
    await client.call("POST", "/v1/disks", { name: "d", sizeGb: 1 });
    const disk = (await client.call<{ data: { id: string; name: string }[] }>("GET", "/v1/disks")).data.find((d) => d.name === "d")!;
    await writeFile(join(diskDataPath(join(root, "state", "builder"), disk.id), "f.txt"), "across a restart\n");
    const backup = await client.call<Envelope<{ id: string }>>("POST", `/v1/disks/${disk.id}/backups`, { description: "across" });

    const stopped = Date.now();
    await stack.restartApi();
    console.log(`faults: the Worker answered again ${((Date.now() - stopped) / 1000).toFixed(1)} s after it was stopped`);

    const ended = await until("the run to end", async () => {
      const runs = await client.call<{ data: { jobName: string; status: string }[] }>("GET", `/v1/crons/${cron.data.id}/runs`);
      return runs.data.every((r) => r.status !== "running") ? runs.data : null;
    });
    expect(ended.map((r) => [r.jobName, r.status])).toEqual([[run.data.jobName, "success"]]);
    const logs = await client.call<{ data: { logs: string } }>("GET", `/v1/crons/${cron.data.id}/runs/${run.data.jobName}/logs`);
    expect(logs.data.logs.match(new RegExp(` out ${marker}$`, "gm"))).toHaveLength(1);
    const ready = await until("the backup to be ready", async () => {
      const list = await client.call<Envelope<{ id: string; status: string }[]>>("GET", `/v1/disks/${disk.id}/backups`);
      const found = list.data.find((b) => b.id === backup.data.id);
      return found?.status === "ready" ? found : found?.status === "failed" ? Promise.reject(new Error(JSON.stringify(found))) : null;
    });
    expect(ready.status).toBe("ready");
  }, 180_000);
});

only("faults: a builder whose callbacks never arrive", () => {
  let root: string;
  let stack: LocalStack;
  let client: Client;
  let proxy: Server;
  let dropped = 0;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "svc-faults-nocallbacks-"));
    // The builder reaches the Worker through a proxy that drops every completion callback (and passes the rest).
    const apiPort = await freePort();
    proxy = createServer((req: IncomingMessage, res: ServerResponse) => {
      if (req.url?.startsWith("/internal/builder/callback")) {
        dropped++;
        req.resume();
        res.writeHead(503).end();
        return;
      }
      const upstream = httpRequest({ host: "127.0.0.1", port: apiPort, path: req.url, method: req.method, headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      });
      upstream.on("error", () => res.writeHead(502).end());
      req.pipe(upstream);
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    stack = await stackIn(root, { port: apiPort, publicUrl: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}` });
    client = await newClient(stack);
  }, 240_000);
  afterAll(async () => {
    await stack?.stop();
    proxy?.close();
    await rm(root, { recursive: true, force: true });
  });

  it("runs, backups, restores and deployments all complete by polling", async () => {
    const app = `nocb-${randomBytes(3).toString("hex")}`;
    await client.call("POST", "/v1/apps", { name: app, runtime: "static" });
    const cron = await client.call<{ data: { id: string } }>("POST", "/v1/crons", { appId: app, name: "poll", schedule: "0 0 1 1 *", command: "echo polled" });
    const run = await client.call<{ data: { jobName: string } }>("POST", `/v1/crons/${cron.data.id}/run`);
    await client.call("POST", "/v1/disks", { name: "p", sizeGb: 1 });
    const disk = (await client.call<{ data: { id: string; name: string }[] }>("GET", "/v1/disks")).data.find((d) => d.name === "p")!;
    await writeFile(join(diskDataPath(join(root, "state", "builder"), disk.id), "kept.txt"), "polled\n");
    const backup = await client.call<Envelope<{ id: string }>>("POST", `/v1/disks/${disk.id}/backups`, { description: "polled" });
    const site = join(root, "site");
    await mkdir(join(site, "static"), { recursive: true });
    await writeFile(join(site, "static", "index.html"), "<h1>polled</h1>");
    const { execFileSync } = await import("node:child_process");
    execFileSync("tar", ["-czf", join(root, "site.tgz"), "-C", site, "."]);
    const deployment = await deploy(client, app, await readFile(join(root, "site.tgz")));

    await until("the run to succeed", async () => {
      const runs = await client.call<{ data: { jobName: string; status: string }[] }>("GET", `/v1/crons/${cron.data.id}/runs`);
      return runs.data.find((r) => r.jobName === run.data.jobName && r.status === "success") ?? null;
    });
    const ready = await until("the backup to be ready", async () => {
      const list = await client.call<Envelope<{ id: string; status: string }[]>>("GET", `/v1/disks/${disk.id}/backups`);
      return list.data.find((b) => b.id === backup.data.id && b.status === "ready") ?? null;
    });
    const restore = await client.call<Envelope<{ jobId: string }>>("POST", `/v1/disks/${disk.id}/backups/restore`, { backupId: ready.id });
    await until("the restore to succeed", async () => {
      const res = await client.call<Envelope<{ status: string }>>("GET", `/v1/disks/${disk.id}/backups/restore/${restore.data.jobId}`);
      return res.data.status === "succeeded" ? true : null;
    });
    await until("the deployment to be ready", async () => {
      const list = await client.call<{ data: { id: string; status: string }[] }>("GET", `/v1/apps/${app}/deployments`);
      return list.data.find((d) => d.id === deployment && d.status === "ready") ?? null;
    });
    expect(dropped).toBeGreaterThanOrEqual(4);
    expect(existsSync(join(diskDataPath(join(root, "state", "builder"), disk.id), "kept.txt"))).toBe(true);
  }, 180_000);
});
