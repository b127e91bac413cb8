import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseLogLine } from "../../builder/src/protocol.js";
import { type BuilderProcess, runToEnd, startBuilder } from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

/** Values the command printed as `name=value` lines on stdout. */
function printed(log: string): Record<string, string> {
  const values: Record<string, string> = {};
  for (const line of log.split("\n")) {
    const record = parseLogLine(line);
    const match = record?.stream === "out" ? /^(\w+)=(.*)$/.exec(record.text) : null;
    if (match) values[match[1]!] = match[2]!;
  }
  return values;
}

/** Whether the process still runs. A zombie (state Z) is dead; it lingers only until its new parent reaps it. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

describe("wall-clock timeout", () => {
  it("kills the shell and its children, including one that left the process group", async () => {
    const started = Date.now();
    const { status, log } = await runToEnd(builder, {
      command: 'sleep 30 & echo "child=$!"; setsid sleep 30 & echo "escaped=$!"; echo "shell=$$"; sleep 30; wait',
      timeoutSeconds: 1,
    });
    expect(status).toMatchObject({ status: "failed", reason: "timeout", error: "timed out after 1 s" });
    expect(Date.now() - started).toBeLessThan(6000);
    const pids = printed(log);
    expect(Object.keys(pids).sort()).toEqual(["child", "escaped", "shell"]);
    for (const pid of Object.values(pids)) expect(running(Number(pid)), `pid ${pid} still runs`).toBe(false);
    expect(log).toContain("job failed: timed out after 1 s");
  });
});

describe("memory limit", () => {
  it("ends a process allocating past the limit as OOMKilled, naming limit and peak", async () => {
    const { status, log } = await runToEnd(builder, {
      command: `echo "pid=$$"; exec node -e "const a = []; setInterval(() => a.push(Buffer.alloc(8 * 1024 * 1024, 1)), 20)"`,
      memoryMb: 64,
      timeoutSeconds: 30,
    });
    expect(status).toMatchObject({ status: "failed", reason: "OOMKilled", signal: "SIGKILL" });
    expect(status.error).toMatch(/^memory limit 64 MiB exceeded \(peak \d+ MiB\)$/);
    expect(status.peakMemoryBytes).toBeGreaterThan(64 * 1024 * 1024);
    expect(status.error).toContain(`peak ${Math.round(status.peakMemoryBytes / 1024 / 1024)} MiB`);
    expect(running(Number(printed(log).pid))).toBe(false);
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
    const { status, log } = await runToEnd(builder, { command: 'sleep 30 & echo "child=$!"; exit 0' });
    expect(status.status).toBe("succeeded");
    expect(running(Number(printed(log).child))).toBe(false);
  });
});
