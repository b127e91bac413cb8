import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppLogLine } from "../../builder/src/protocol/processes.js";
import { LOG_RATE } from "../../builder/src/processes/app-log.js";
import { type BuilderProcess, signedFetch, startBuilder } from "./builder-process.js";
import { APP_SERVER, type ControlPlane, type Release, makeRelease, startControlPlane, startProcess, stopProcess, waitFor, webSpec } from "./process-support.js";

/**
 * Issue 28: what one app may take of its node. A node admits a process only
 * when its host holds the process's memory limit beside what it promised
 * already (507 with the numbers), and what an app prints costs the node a
 * bounded amount of work (the log rate: past it output is dropped, counted
 * and said).
 */
const MIB = 1024 * 1024;
/** The host lets app processes have this much of its memory (the rest is the builder's reserve). */
const CAPACITY_MB = 3_000;

let builder: BuilderProcess;
let plane: ControlPlane;
let release: Release;
let ledger: string;

beforeAll(async () => {
  // A ledger of its own: the other builders of the test run promise memory on this host too.
  ledger = await mkdtemp(join(tmpdir(), "svc-ledger-"));
  builder = await startBuilder({
    env: { BUILDER_HOST_MEMORY_RESERVE_MB: String(Math.floor(totalmem() / MIB) - CAPACITY_MB), BUILDER_MEMORY_LEDGER_DIR: ledger },
  });
  plane = await startControlPlane(builder.secret);
  release = await makeRelease({ "server.js": APP_SERVER });
});
afterAll(async () => {
  await builder?.stop();
  await plane?.close();
  await rm(ledger, { recursive: true, force: true });
});

describe("admission of app processes", () => {
  it("refuses a process its host cannot hold beside the memory it promised (507 with the numbers), and admits it once a process ended", async () => {
    const spec = (key: string, memoryMb: number) => webSpec(plane.serve(release), { key, memoryMb });
    const first = await startProcess(builder, spec("mem-first", 2_048));
    const refused = await signedFetch(builder, "/v1/processes", { method: "POST", body: spec("mem-second", 2_048) });
    expect(refused.status).toBe(507);
    const body = (await refused.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("INSUFFICIENT_MEMORY");
    expect(body.error.message).toMatch(/cannot hold a process with a memory limit of 2048 MiB: 2\.9 GiB of its memory may be promised to apps and 2\.0 GiB already is; 2\.0 GiB more does not fit/);
    // Larger than the host altogether: refused the same way.
    expect((await signedFetch(builder, "/v1/processes", { method: "POST", body: spec("mem-huge", 65_536) })).status).toBe(507);
    // The ledger says what this builder promised, for the other nodes of the host.
    expect(JSON.parse(readFileSync(join(ledger, String(builder.pid)), "utf8")).bytes).toBe(2_048 * MIB);
    await stopProcess(builder, first.id);
    await waitFor(builder, first.id, (status) => status.state === "stopped");
    const second = await startProcess(builder, spec("mem-second", 2_048));
    await waitFor(builder, second.id, (status) => status.ready);
    await stopProcess(builder, second.id);
  });
});

describe("the log rate", () => {
  it("drops what an app prints past its rate, says how much, and keeps the node's own work small", async () => {
    const appId = `app_spam_${Date.now().toString(36)}`;
    // Long lines full of escape codes, as fast as the shell can print them, for 3 s; then, once quiet for a second
    // (the rate has room again: a line printed while it has none is dropped like the spam), one last line.
    const line = `\\033[31m${"spam ".repeat(200)}\\033[0m`;
    const command = `sleep 1; timeout 3 yes "$(printf '${line}')"; sleep 1; echo spam over; sleep 60`;
    const ticks = () => {
      const fields = readFileSync(`/proc/${builder.pid}/stat`, "utf8").split(") ")[1]!.split(" ");
      return Number(fields[11]) + Number(fields[12]);
    };
    const spam = await startProcess(builder, webSpec(plane.serve(release), { appId, type: "worker", port: null, healthCheck: null, command }));
    // From the moment it runs (its start is the node's ordinary work), through its 3 s of spam.
    await waitFor(builder, spam.id, (status) => status.ready);
    const before = ticks();
    const started = Date.now();
    let last = "";
    for (let i = 0; i < 300 && !last.includes(" spam over"); i++) {
      await sleep(200);
      last = await (await signedFetch(builder, `/v1/app-logs/${appId}?lines=3`)).text();
    }
    const seconds = (Date.now() - started) / 1000;
    const cpuSeconds = (ticks() - before) / 100;
    await stopProcess(builder, spam.id);
    const log = await (await signedFetch(builder, `/v1/app-logs/${appId}`)).text();
    const records = log.trimEnd().split("\n").map((record) => parseAppLogLine(record));
    const kept = records.filter((record) => record?.stream === "out").length;
    const notices = records.filter((record) => record?.stream === "svc" && record.text.startsWith("log rate limit: dropped"));
    console.log(`log rate: ${kept} lines kept in ${seconds.toFixed(1)} s, ${notices.length} notices, builder CPU ${cpuSeconds.toFixed(2)} s`);
    expect(log).toMatch(/ out \S+\/prc_\w+ spam over\n/);
    expect(notices.length).toBeGreaterThan(0);
    expect(notices[0]!.text).toMatch(/dropped \d+ lines \(\d+ bytes\) of output written faster than 500 lines or 1024 KiB a second/);
    // Kept: the burst plus the sustained rate, and at most one pipe's chunk (64 KiB of these lines) beyond.
    expect(kept).toBeLessThanOrEqual(LOG_RATE.burstLines + LOG_RATE.linesPerSecond * seconds + 64);
    // The node's agent spent a fraction of a core on it (unbounded, it spent most of one).
    expect(cpuSeconds / seconds).toBeLessThan(0.35);
    // No escape code reached the log.
    expect(log).not.toContain("\u001b");
  });
});
