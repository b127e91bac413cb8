import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { signedFetch, startBuilder } from "./builder-process.js";
import {
  APP_SERVER,
  type ControlPlane,
  type Release,
  makeRelease,
  pidsWith,
  processStatus,
  startControlPlane,
  startProcess,
  waitFor,
  webSpec,
} from "./process-support.js";

let dataDir: string;
let secret: string;
let plane: ControlPlane;
let release: Release;

beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "svc-builder-procs-"));
  secret = randomBytes(24).toString("hex");
  plane = await startControlPlane(secret);
  release = await makeRelease({ "server.js": APP_SERVER });
});
afterAll(async () => {
  await plane?.close();
  await rm(dataDir, { recursive: true, force: true });
});

const mountedTrees = () => readFileSync("/proc/mounts", "utf8").split("\n").filter((line) => line.includes(`${dataDir}/processes/`));

async function gone(marker: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (pidsWith(marker).length > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
  expect(pidsWith(marker)).toEqual([]);
}

describe("the builder going away", () => {
  it("stops its processes cleanly on SIGTERM and reports them stopped", async () => {
    const builder = await startBuilder({ dataDir, secret });
    const marker = `marker-${randomBytes(6).toString("hex")}`;
    const started = await startProcess(builder, webSpec(plane.serve(release), { command: `node server.js ${marker}`, callbackUrl: plane.callbackUrl }));
    await waitFor(builder, started.id, (status) => status.ready);
    await builder.stop();
    await gone(marker);
    expect(mountedTrees()).toEqual([]);
    expect(plane.callbacks.filter((status) => status.id === started.id).at(-1)?.state).toBe("stopped");
  });

  it("after a crash of the builder, reports the processes it ran failed (the control plane starts new ones)", async () => {
    const builder = await startBuilder({ dataDir, secret });
    const marker = `marker-${randomBytes(6).toString("hex")}`;
    const started = await startProcess(builder, webSpec(plane.serve(release), { command: `node server.js ${marker}`, callbackUrl: plane.callbackUrl }));
    await waitFor(builder, started.id, (status) => status.ready);
    process.kill(builder.pid, "SIGKILL");
    // The sandboxes die with their builder.
    await gone(marker);

    const restarted = await startBuilder({ dataDir, secret });
    try {
      expect(mountedTrees()).toEqual([]);
      const status = await processStatus(restarted, started.id);
      expect(status.state).toBe("failed");
      expect(status.ready).toBe(false);
      expect(status.lastExit).toMatchObject({ reason: "error", message: "the builder restarted and the process ended with it; start a new process" });
      await expect.poll(() => plane.callbacks.filter((c) => c.id === started.id).at(-1)?.state, { timeout: 10_000 }).toBe("failed");
      // Its key names it for good: the same start again answers the failed record; a new key starts anew.
      const sameKey = await signedFetch(restarted, "/v1/processes", { method: "POST", body: webSpec(plane.serve(release), { key: started.key }) });
      expect(sameKey.status).toBe(200);
      expect(((await sameKey.json()) as { id: string; state: string })).toMatchObject({ id: started.id, state: "failed" });
      const again = await startProcess(restarted, webSpec(plane.serve(release), { key: `${started.key}-2` }));
      await waitFor(restarted, again.id, (s) => s.ready);
    } finally {
      await restarted.stop();
    }
  });
});
