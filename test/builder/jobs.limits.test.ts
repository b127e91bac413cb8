import { randomInt } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BuilderProcess, runToEnd, startBuilder } from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

/**
 * A `sleep` no other process on the host runs (its argument is unique), so the
 * host's /proc tells whether anything the job started survives it: pids inside
 * the job's PID namespace mean nothing outside.
 */
function uniqueSleep(): string {
  return `sleep 30.${randomInt(1e9).toString().padStart(9, "0")}`;
}

/** Host processes (not zombies) whose command line is `command`. */
function survivors(command: string): number[] {
  const found: number[] = [];
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ");
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      if (cmdline === command && stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z") found.push(Number(pid));
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

describe("wall-clock timeout", () => {
  it("kills the shell and its children, including one that left the session", async () => {
    const started = Date.now();
    const sleep = uniqueSleep();
    const { status, log } = await runToEnd(builder, {
      command: `${sleep} & setsid ${sleep} & (trap "" TERM; ${sleep}) & echo started; ${sleep}; wait`,
      timeoutSeconds: 1,
    });
    expect(status).toMatchObject({ status: "failed", reason: "timeout", error: "timed out after 1 s" });
    expect(Date.now() - started).toBeLessThan(6000);
    expect(log).toContain(" out started");
    expect(survivors(sleep)).toEqual([]);
    expect(log).toContain("job failed: timed out after 1 s");
  });
});

describe("memory limit", () => {
  it("ends a process allocating past the limit as OOMKilled, naming limit and peak", async () => {
    const { status, log } = await runToEnd(builder, {
      command: `exec node -e "const a = []; setInterval(() => a.push(Buffer.alloc(8 * 1024 * 1024, 1)), 20)"`,
      memoryMb: 64,
      timeoutSeconds: 30,
    });
    expect(status).toMatchObject({ status: "failed", reason: "OOMKilled", signal: "SIGKILL" });
    expect(status.error).toMatch(/^memory limit 64 MiB exceeded \(peak \d+ MiB\)$/);
    // A cgroup's peak stops at its limit; RSS sampling sees it pass the limit.
    expect(status.peakMemoryBytes).toBeGreaterThanOrEqual(64 * 1024 * 1024);
    expect(status.error).toContain(`peak ${Math.round(status.peakMemoryBytes / 1024 / 1024)} MiB`);
    expect(log).toContain("job failed: memory limit 64 MiB exceeded");
  });

  it("records the peak memory of a job that stays under its limit", async () => {
    const { status } = await runToEnd(builder, {
      command: `node -e "const b = Buffer.alloc(32 * 1024 * 1024, 1); setTimeout(() => console.log(b.length), 400)"`,
      memoryMb: 256,
    });
    expect(status).toMatchObject({ status: "succeeded" });
    expect(status.peakMemoryBytes).toBeGreaterThan(32 * 1024 * 1024);
  });
});

describe("process cleanup", () => {
  it("kills background processes the command left behind when it exits", async () => {
    const sleep = uniqueSleep();
    const { status } = await runToEnd(builder, { command: `${sleep} & exit 0` });
    expect(status.status).toBe("succeeded");
    expect(survivors(sleep)).toEqual([]);
  });
});
