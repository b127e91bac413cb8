import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DiskInfo, parseLogLine } from "../../builder/src/protocol.js";
import { type BuilderProcess, followLog, putDisk, runToEnd, signedFetch, startBuilder, submitJob } from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

const MiB = 1024 * 1024;
const out = (log: string) =>
  log
    .split("\n")
    .map((line) => parseLogLine(line))
    .filter((record) => record?.stream === "out")
    .map((record) => record!.text);

describe("PUT/GET/DELETE /v1/disks/:id", () => {
  it("creates a disk (201), changes its quota (200), reports usage and deletes it (204)", async () => {
    const created = await putDisk(builder, "disk_a", 5 * MiB);
    expect(created.status).toBe(201);
    expect(DiskInfo.parse(await created.json())).toEqual({ id: "disk_a", sizeBytes: 5 * MiB, usedBytes: 0 });
    const resized = await putDisk(builder, "disk_a", 6 * MiB);
    expect(resized.status).toBe(200);
    expect(await resized.json()).toEqual({ id: "disk_a", sizeBytes: 6 * MiB, usedBytes: 0 });

    const deleted = await signedFetch(builder, "/v1/disks/disk_a", { method: "DELETE" });
    expect(deleted.status).toBe(204);
    const gone = await signedFetch(builder, "/v1/disks/disk_a");
    expect(gone.status).toBe(404);
    expect(await gone.json()).toEqual({ error: { code: "DISK_NOT_FOUND", message: "disk not found" } });
  });

  it("rejects ids that could leave the data directory", async () => {
    // `..` and `%2e%2e` segments never arrive: URL parsing resolves them on the client.
    for (const id of ["a.b", "a%2Fb", "%00", "x".repeat(65)]) {
      const response = await putDisk(builder, id, MiB);
      expect(response.status, id).toBe(400);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("VALIDATION_ERROR");
    }
  });

  it("refuses to delete a disk while a job uses it (409 DISK_BUSY)", async () => {
    const job = await submitJob(builder, { command: "sleep 1", disk: { id: "disk_busy", mountPath: "/data", sizeBytes: MiB } });
    const busy = await signedFetch(builder, "/v1/disks/disk_busy", { method: "DELETE" });
    expect(busy.status).toBe(409);
    expect(((await busy.json()) as { error: { code: string } }).error.code).toBe("DISK_BUSY");
    await followLog(builder, job.id);
    expect((await signedFetch(builder, "/v1/disks/disk_busy", { method: "DELETE" })).status).toBe(204);
  });
});

describe("disks in jobs", () => {
  it("keeps data written through SVC_DISK_PATH for the next job", async () => {
    const disk = { id: "disk_keep", mountPath: "/var/lib/app", sizeBytes: 10 * MiB };
    const first = await runToEnd(builder, {
      command: 'echo persisted > "$SVC_DISK_PATH/state.txt"; echo "$SVC_DISK_MOUNT_PATH"',
      disk,
    });
    expect(first.status.status).toBe("succeeded");
    expect(out(first.log)).toEqual(["/var/lib/app"]);
    const second = await runToEnd(builder, { command: 'cat "$SVC_DISK_PATH/state.txt"', disk });
    expect(out(second.log)).toEqual(["persisted"]);
    const info = await signedFetch(builder, "/v1/disks/disk_keep");
    expect(await info.json()).toEqual({ id: "disk_keep", sizeBytes: 10 * MiB, usedBytes: "persisted\n".length });
  });

  // A root builder makes each disk a filesystem of exactly its size: the kernel refuses the writes.
  it.runIf(process.getuid?.() === 0)("refuses writes past the quota and fails the job that hit it", async () => {
    const disk = { id: "disk_small", mountPath: "/data", sizeBytes: MiB };
    const { status, log } = await runToEnd(builder, { command: 'head -c 3000000 /dev/zero > "$SVC_DISK_PATH/big"', disk });
    expect(status).toMatchObject({ status: "failed", reason: "disk_quota" });
    expect(status.error).toBe("disk quota reached (1.0 MiB): writes beyond it failed, then exit code 1");
    expect(log).toMatch(/ err head: .*No space left on device/);
    const kept = await runToEnd(builder, { command: 'wc -c < "$SVC_DISK_PATH/big"', disk });
    const size = Number(out(kept.log)[0]);
    expect(size).toBeGreaterThan(MiB - 64 * 1024);
    expect(size).toBeLessThanOrEqual(MiB);
    // The quota was never exceeded, so nothing had to be killed: a command that copes with the refusal succeeds.
    const coping = await runToEnd(builder, { command: 'head -c 3000000 /dev/zero >> "$SVC_DISK_PATH/big" || echo refused', disk });
    expect(coping.status.status).toBe("succeeded");
    expect(out(coping.log)).toEqual(["refused"]);
  });

  // Without loop mounts (not root) the quota is measured during and after the job.
  it.runIf(process.getuid?.() !== 0)("kills a running job that writes past the quota", async () => {
    const started = Date.now();
    const { status, log } = await runToEnd(builder, {
      command: 'head -c 3000000 /dev/zero > "$SVC_DISK_PATH/big"; echo written; sleep 30',
      disk: { id: "disk_small", mountPath: "/data", sizeBytes: MiB },
    });
    expect(status).toMatchObject({ status: "failed", reason: "disk_quota" });
    expect(status.error).toBe("disk quota exceeded (used 2.9 MiB of 1.0 MiB)");
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(log).toContain("job failed: disk quota exceeded");
  });
});
