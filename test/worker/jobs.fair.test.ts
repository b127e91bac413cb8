import { runDurableObjectAlarm } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import type { JobStatus } from "../../builder/src/protocol/job-status";
import { signRequest } from "../../builder/src/protocol/signing";
import { configOf } from "../../worker/env";
import { findJob, LONE_BUILDER_ID } from "../../worker/lib/builder-client";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { backupStub } from "../../worker/services/backups";
import { deploymentStub } from "../../worker/services/deployments";
import { newApp, newCron, runs } from "./cron-helpers";
import { call, json, newAccount } from "./helpers";

/**
 * Issue 17, point 5: a deployment or a backup that waits for the account's
 * share of the builder says so (deployment `queued` with the reason, backup
 * `creating` with `phase: "queued"`) until the builder really starts it.
 */
type Deployment = { id: string; status: string; waiting: string | null; startedAt: string | null };
type Backup = { id: string; status: string; phase?: string; waiting?: string };

const cleanup: { key: string; cronId: string }[] = [];
afterEach(async () => {
  for (const { key, cronId } of cleanup.splice(0)) {
    for (const run of await runs(key, cronId)) {
      if (run.status === "running") await call(`/v1/crons/${cronId}/runs/${run.jobName}/cancel`, { method: "POST", key });
    }
  }
});

/** A free account whose plan's slots are all taken by runs of `sleep 30`; `free()` ends one of them. */
async function busyAccount() {
  const { adminKey: key } = await newAccount();
  const cron = await newCron(key, { appId: (await newApp(key)).id, command: "sleep 30", concurrencyPolicy: "allow" });
  cleanup.push({ key, cronId: cron.id });
  const started: string[] = [];
  for (let i = 0; i < PLAN_LIMITS.free.concurrentJobs; i++) {
    started.push((await json<{ data: { jobName: string } }>(await call(`/v1/crons/${cron.id}/run`, { method: "POST", key }))).data.jobName);
  }
  const free = () => call(`/v1/crons/${cron.id}/runs/${started.shift()}/cancel`, { method: "POST", key });
  return { key, free };
}

/** Delivers a status the way the builder's callback does (signed). */
async function callback(status: JobStatus): Promise<number> {
  const body = JSON.stringify(status);
  const headers = await signRequest({ secret: env.BUILDER_SECRET!, method: "POST", path: "/internal/builder/callback", body });
  return (await call("/internal/builder/callback", { method: "POST", body, headers: { ...headers, "Content-Type": "application/json" } })).status;
}

async function builderStatus(key: string) {
  const found = await findJob(configOf(env), { id: LONE_BUILDER_ID, address: env.BUILDER_URL! }, key);
  if (!found.ok) throw new Error(`no builder job for ${key}: ${found.message}`);
  return found.value;
}

describe("a deployment waiting for a build slot", () => {
  it("stays queued with the reason (not building) until the builder starts it; then it has a start", async () => {
    const { key, free } = await busyAccount();
    const app = `fair-${crypto.randomUUID().slice(0, 8)}`;
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "static" } });
    const created = await json<{ data: { deployment: Deployment; uploadUrl: string } }>(
      await call(`/v1/apps/${app}/deployments`, { method: "POST", key, body: { sizeBytes: 5 } }),
    );
    const id = created.data.deployment.id;
    expect(created.data.deployment.waiting).toBeNull();
    await exports.default.fetch(new Request(created.data.uploadUrl, { method: "PUT", body: "12345" }));
    const start = await call(`/v1/apps/${app}/deployments/${id}/start`, { method: "POST", key });
    expect(start.status).toBe(202);
    const started = (await json<{ data: Deployment }>(start)).data;
    expect(started).toMatchObject({ status: "queued", startedAt: null });
    expect(started.waiting).toContain("2 of 2 concurrent jobs");
    expect(await builderStatus(id)).toMatchObject({ status: "queued" });
    // A second start changes nothing.
    expect((await json<{ data: Deployment }>(await call(`/v1/apps/${app}/deployments/${id}/start`, { method: "POST", key }))).data.status).toBe("queued");
    const listed = (await json<{ data: Deployment[] }>(await call(`/v1/apps/${app}/deployments`, { key }))).data[0]!;
    expect(listed).toMatchObject({ id, status: "queued", waiting: started.waiting });

    await free();
    expect((await builderStatus(id)).startedAt).not.toBeNull();
    let now = started;
    for (let i = 0; i < 40 && now.status === "queued"; i++) {
      await runDurableObjectAlarm(deploymentStub(env, id));
      await new Promise((r) => setTimeout(r, 250));
      now = (await json<{ data: Deployment }>(await call(`/v1/apps/${app}/deployments/${id}`, { key }))).data;
    }
    // The upload is no archive: the build fails once it runs, but it did run, and says since when.
    expect(now.status).not.toBe("queued");
    expect(now.waiting).toBeNull();
    expect(now.startedAt).not.toBeNull();
  }, 30_000);
});

describe("a backup waiting for a slot", () => {
  it("is creating with phase queued and the reason until the builder starts the snapshot", async () => {
    const { key, free } = await busyAccount();
    const disk = (await json<{ data: { id: string } }>(await call("/v1/disks", { method: "POST", key, body: { name: "data", sizeGb: 1 } }))).data;
    const created = await call(`/v1/disks/${disk.id}/backups`, { method: "POST", key, body: { description: "waits" } });
    expect(created.status).toBe(201);
    const backup = (await json<{ data: Backup }>(created)).data;
    expect(backup).toMatchObject({ status: "creating", phase: "queued" });
    expect(backup.waiting).toContain("2 of 2 concurrent jobs");
    expect(await builderStatus(backup.id)).toMatchObject({ status: "queued" });
    const list = async () => (await json<{ data: Backup[] }>(await call(`/v1/disks/${disk.id}/backups`, { key }))).data.find((b) => b.id === backup.id)!;
    expect(await list()).toMatchObject({ status: "creating", phase: "queued" });

    await free();
    const running = await builderStatus(backup.id);
    expect(running.startedAt).not.toBeNull();
    if (running.status === "running") {
      // The builder's start callback: running at once, and a start is no end (the backup is still being made).
      expect(await callback(running)).toBe(204);
      const now = await list();
      expect(now.status === "creating" ? now.phase : "ended").not.toBe("queued");
    }
    let now = await list();
    for (let i = 0; i < 40 && now.phase === "queued"; i++) {
      await runDurableObjectAlarm(backupStub(env, backup.id));
      await new Promise((r) => setTimeout(r, 250));
      now = await list();
    }
    // Running now (or already ended: this suite's storage URLs lead nowhere), never queued.
    expect(now.phase === "running" || now.status !== "creating").toBe(true);
    expect(now.waiting).toBeUndefined();
  }, 30_000);
});
