import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BuilderProcess, runToEnd, startBuilder } from "./builder-process.js";

/**
 * Issue 28: the run network blocks the networks the host is directly
 * connected to, not only the private ranges. The test gives this host a LAN
 * on a documentation range (198.51.100.0/24, a public-looking range none of
 * the fixed blocks covers) with a machine on it that answers on a TCP port (a
 * network namespace of the test's own), as a provider's network or the
 * operator's office LAN would be. A run must not reach that machine.
 */
const only = process.getuid?.() === 0 ? describe : describe.skip;

const NAMESPACE = `svc-lan-${process.pid}`;
const LINK = `svclan${process.pid % 100_000}`;
const PORT = 8099;

only("the run network and the host's own networks", () => {
  let builder: BuilderProcess;
  let server: ChildProcess;

  beforeAll(async () => {
    const ip = (...args: string[]) => execFileSync("ip", args, { stdio: "pipe" });
    ip("netns", "add", NAMESPACE);
    ip("link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NAMESPACE);
    ip("addr", "add", "198.51.100.1/24", "dev", LINK);
    ip("link", "set", LINK, "up");
    ip("-n", NAMESPACE, "addr", "add", "198.51.100.7/24", "dev", "eth0");
    ip("-n", NAMESPACE, "link", "set", "eth0", "up");
    ip("-n", NAMESPACE, "route", "add", "default", "via", "198.51.100.1");
    server = spawn("ip", ["netns", "exec", NAMESPACE, process.execPath, "-e", `require("net").createServer((s) => s.end("lan machine\\n")).listen(${PORT}, "0.0.0.0")`], {
      stdio: "ignore",
    });
    // The host itself reaches the machine (it is on its LAN).
    for (let i = 0; i < 50; i++) {
      try {
        execFileSync(process.execPath, ["-e", `require("net").connect(${PORT}, "198.51.100.7").on("connect", () => process.exit(0)).on("error", () => process.exit(1))`]);
        break;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    builder = await startBuilder();
  });
  afterAll(async () => {
    await builder?.stop();
    server?.kill();
    execFileSync("ip", ["netns", "del", NAMESPACE], { stdio: "ignore" });
  });

  it("refuses a run's connection to a machine on the host's directly connected subnet, and to the host's own address there", async () => {
    const probe = (host: string) =>
      `node -e "require('net').connect(${PORT},'${host}').on('connect',()=>{console.log('${host} open');process.exit()}).on('error',(e)=>{console.log('${host} '+e.code);process.exit()});setTimeout(()=>{console.log('${host} timeout');process.exit()},3000)"`;
    const run = await runToEnd(builder, { command: `${probe("198.51.100.7")}; ${probe("198.51.100.1")}`, timeoutSeconds: 30, memoryMb: 256 });
    expect(run.status.status).toBe("succeeded");
    expect(run.log).toContain(" out 198.51.100.7 ECONNREFUSED");
    expect(run.log).not.toContain("198.51.100.7 open");
    expect(run.log).not.toContain("198.51.100.1 open");
    // The startup line names what is blocked.
    expect(builder.output()).toMatch(/its own networks \([^)]*198\.51\.100\.0\/24/);
  });
});
