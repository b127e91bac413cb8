import { type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import type { JobSpec } from "../../builder/src/protocol/jobs.js";
import { type FakeWorker, packProject, sitesDir, startFakeWorker, submitBuild } from "./build-support.js";
import { type BuilderProcess, jobStatus, putDisk, signedFetch, startBuilder } from "./builder-process.js";
import { type FakeStorage, startFakeStorage } from "./snapshot-storage.js";

/**
 * Fairness between tenants (issue 17, point 5): one queue per tenant, each
 * tenant capped at its plan's concurrency, free slots handed out to the tenant
 * with the fewest running jobs, so one account's backlog never delays
 * another's next job by more than one job's start.
 */
const SLOTS = 4;
/** How long another tenant's next job may wait for a slot that is free, or for the next one that frees. */
const START_BOUND_MS = 2_000;

let builder: BuilderProcess;
let worker: FakeWorker;
let storage: FakeStorage;
let receiver: Server;
let receiverUrl: string;
const callbacks: JobStatus[] = [];
/** Jobs a test leaves running; cancelled after it, so the next test starts with free slots. */
const leftovers: string[] = [];

beforeAll(async () => {
  builder = await startBuilder({ env: { BUILDER_MAX_CONCURRENT_JOBS: String(SLOTS) } });
  worker = await startFakeWorker(builder.secret);
  storage = await startFakeStorage(builder.secret);
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      callbacks.push(JobStatus.parse(JSON.parse(Buffer.concat(chunks).toString("utf8"))));
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/internal/builder/callback`;
});
afterEach(async () => {
  await Promise.all(leftovers.splice(0).map((id) => signedFetch(builder, `/v1/jobs/${id}/cancel`, { method: "POST" })));
});
afterAll(async () => {
  await worker?.close();
  await storage?.close();
  receiver?.close();
  await builder?.stop();
});

type Submission = Partial<JobSpec> & { command: string; tenant: string; tenantConcurrency?: number; tenantMaxQueued?: number; startCallback?: boolean };

async function submit(spec: Submission): Promise<Response> {
  return signedFetch(builder, "/v1/jobs", { method: "POST", body: { env: {}, timeoutSeconds: 120, memoryMb: 256, ...spec } });
}

async function accepted(spec: Submission): Promise<JobStatus> {
  const response = await submit(spec);
  if (response.status !== 201) throw new Error(`submit failed: ${response.status} ${await response.text()}`);
  const status = JobStatus.parse(await response.json());
  leftovers.push(status.id);
  return status;
}

/** Polls the job until the builder has started it (or it ended); its status then. */
async function started(id: string, timeoutMs: number): Promise<JobStatus> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const status = await jobStatus(builder, id);
    if (status.startedAt !== null || status.finishedAt !== null || Date.now() > deadline) return status;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Milliseconds from submission to start, as the builder recorded them (Infinity when it never started). */
const waitOf = (status: JobStatus) => (status.startedAt === null ? Number.POSITIVE_INFINITY : Date.parse(status.startedAt) - Date.parse(status.createdAt));

describe("per-tenant limits and a fair queue", () => {
  it("A's backlog beyond its limit waits as queued; B's run, snapshot and build start at once", async () => {
    const a = [];
    for (let i = 0; i < 2 * SLOTS; i++) a.push(await accepted({ tenant: "acct_a", tenantConcurrency: 2, command: "sleep 60" }));
    const run = await started((await accepted({ tenant: "acct_b", tenantConcurrency: 2, command: "echo b" })).id, 10_000);
    await putDisk(builder, "fair-b", 1024 * 1024, "acct_b");
    // No tenant in the snapshot's spec: the builder counts it against the disk's owner.
    const snapshotResponse = await signedFetch(builder, "/v1/snapshots", {
      method: "POST",
      body: { diskId: "fair-b", partSizeBytes: 5 * 1024 * 1024, partUrlEndpoint: storage.partUrlEndpoint, tenantConcurrency: 2 },
    });
    expect(snapshotResponse.status).toBe(201);
    const snapshot = await started(JobStatus.parse(await snapshotResponse.json()).id, 10_000);
    const build = await submitBuild(builder, {
      tenant: "acct_b",
      tenantConcurrency: 2,
      sourceUrl: worker.serveSource("fair", packProject(join(sitesDir, "plain"))),
      env: {},
      memoryMb: 512,
      timeoutSeconds: 120,
      blobsEndpoint: worker.blobsEndpoint("fair"),
    });
    leftovers.push(build.id);
    const buildStarted = await started(build.id, 10_000);

    const waits = { run: waitOf(run), snapshot: waitOf(snapshot), build: waitOf(buildStarted) };
    console.log(`B's waits behind A's backlog of ${a.length} jobs (ms): ${JSON.stringify(waits)}`);
    expect(waits.run).toBeLessThan(START_BOUND_MS);
    expect(waits.snapshot).toBeLessThan(START_BOUND_MS);
    expect(waits.build).toBeLessThan(START_BOUND_MS);
    expect(a.slice(0, 2).map((job) => job.status)).toEqual(["running", "running"]);
    for (const [i, job] of a.slice(2).entries()) {
      expect(job).toMatchObject({ status: "queued", startedAt: null, waiting: { reason: "tenant_limit", tenantRunning: 2, tenantLimit: 2, ahead: i } });
    }
    // A's extra jobs are still waiting, and say so.
    for (const job of a.slice(2)) expect(await jobStatus(builder, job.id)).toMatchObject({ status: "queued", startedAt: null });
  });

  it("a tenant whose limit is the whole builder still leaves a slot: B's job starts at once", async () => {
    for (let i = 0; i < SLOTS + 2; i++) await accepted({ tenant: "acct_big", tenantConcurrency: 64, command: "sleep 60" });
    const running = (await Promise.all(leftovers.map((id) => jobStatus(builder, id)))).filter((job) => job.status === "running");
    expect(running).toHaveLength(SLOTS - 1);
    const b = await started((await accepted({ tenant: "acct_b", command: "echo b" })).id, 10_000);
    expect(waitOf(b)).toBeLessThan(START_BOUND_MS);
  });

  it("with every slot busy, B's job takes the next slot that frees, ahead of A's backlog", async () => {
    // A: three running (one ends in 2 s) and three queued; C fills the last slot.
    const short = await accepted({ tenant: "acct_a", tenantConcurrency: 3, command: "sleep 2" });
    for (let i = 0; i < 5; i++) await accepted({ tenant: "acct_a", tenantConcurrency: 3, command: "sleep 60" });
    await accepted({ tenant: "acct_c", tenantConcurrency: 3, command: "sleep 60" });
    const queuedA = leftovers.slice(3, 6);
    // B's job holds its slot: were it to end at once, the slot it frees would rightly go to A's backlog.
    const b = await accepted({ tenant: "acct_b", tenantConcurrency: 3, command: "sleep 60" });
    expect(b).toMatchObject({ status: "queued", waiting: { reason: "builder_full", tenantRunning: 0, tenantLimit: 3, ahead: 0 } });

    const bStarted = await started(b.id, 10_000);
    const shortDone = await jobStatus(builder, short.id);
    expect(shortDone.finishedAt).not.toBeNull();
    const afterRelease = Date.parse(bStarted.startedAt ?? "9999-01-01T00:00:00.000Z") - Date.parse(shortDone.finishedAt!);
    console.log(`B started ${afterRelease} ms after the first slot freed (B waited ${waitOf(bStarted)} ms in all)`);
    expect(afterRelease).toBeLessThan(1_000);
    // The slot went to B, not to the head of A's backlog.
    for (const id of queuedA) expect((await jobStatus(builder, id)).status).toBe("queued");
  });
});

describe("what a queued job reports", () => {
  it("with startCallback, a job that waited reports its start through the callback, then its end", async () => {
    callbacks.length = 0;
    const first = await accepted({ tenant: "acct_d", tenantConcurrency: 1, command: "sleep 1" });
    const second = await accepted({ tenant: "acct_d", tenantConcurrency: 1, command: "echo second", callbackUrl: receiverUrl, startCallback: true });
    // Without it (or for a job that started at once) only the end is reported.
    await accepted({ tenant: "acct_d", tenantConcurrency: 1, command: "true", callbackUrl: receiverUrl });
    expect(first.status).toBe("running");
    expect(second.status).toBe("queued");
    await expect.poll(() => callbacks.filter((c) => c.id === second.id).map((c) => c.status), { timeout: 15_000 }).toEqual(["running", "succeeded"]);
    const [start] = callbacks.filter((c) => c.id === second.id);
    expect(start).toMatchObject({ status: "running", finishedAt: null, waiting: null });
    expect(start!.startedAt).not.toBeNull();
    await expect.poll(() => callbacks.filter((c) => c.id !== second.id).map((c) => c.status), { timeout: 15_000 }).toEqual(["succeeded"]);
  });

  it("refuses a submission with tenantMaxQueued once the tenant has that many queued (429 TENANT_QUEUE_FULL); others still queue", async () => {
    await accepted({ tenant: "acct_e", tenantConcurrency: 1, command: "sleep 60" });
    const queued = await accepted({ tenant: "acct_e", tenantConcurrency: 1, tenantMaxQueued: 1, command: "sleep 60", key: "fair/e-2" });
    expect(queued.status).toBe("queued");
    const refused = await submit({ tenant: "acct_e", tenantConcurrency: 1, tenantMaxQueued: 1, command: "echo refused" });
    expect(refused.status).toBe(429);
    const body = (await refused.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("TENANT_QUEUE_FULL");
    expect(body.error.message).toMatch(/1 job.* waiting/);
    // A retry of an accepted submission is still answered with its job.
    const again = await submit({ tenant: "acct_e", tenantConcurrency: 1, tenantMaxQueued: 1, command: "sleep 60", key: "fair/e-2" });
    expect(again.status).toBe(200);
    // Submissions that set no bound (scheduled runs, builds, backups) queue as before; other tenants are not affected.
    await accepted({ tenant: "acct_e", tenantConcurrency: 1, command: "sleep 60" });
    expect((await accepted({ tenant: "acct_f", tenantConcurrency: 1, tenantMaxQueued: 1, command: "sleep 60" })).status).toBe("running");
  });
});
