import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseLogLine } from "../../builder/src/protocol/jobs.js";
import { HEADER_TIMESTAMP, signRequest } from "../../builder/src/protocol/signing.js";
import { type BuilderProcess, putDisk, runToEnd, signedFetch, startBuilder } from "./builder-process.js";

let builder: BuilderProcess;
beforeAll(async () => {
  builder = await startBuilder();
});
afterAll(async () => {
  await builder?.stop();
});

async function expectUnauthorized(response: Response, reason: RegExp): Promise<void> {
  expect(response.status).toBe(401);
  const body = (await response.json()) as { error: { code: string; message: string } };
  expect(body.error.code).toBe("UNAUTHORIZED");
  expect(body.error.message).toMatch(reason);
}

describe("request signatures", () => {
  it("serves GET /healthz without a signature", async () => {
    const response = await fetch(`${builder.url}/healthz`);
    expect(response.status).toBe(200);
  });

  it("answers 401 to an unsigned request, on known and unknown routes alike", async () => {
    await expectUnauthorized(await fetch(`${builder.url}/v1/jobs`, { method: "POST", body: "{}" }), /missing/);
    await expectUnauthorized(await fetch(`${builder.url}/v1/nothing`), /missing/);
  });

  it("answers 401 to a signature made with another secret", async () => {
    await expectUnauthorized(await signedFetch({ url: builder.url, secret: "not-the-builder-secret" }, "/v1/disks/d1"), /does not match/);
  });

  it("answers 401 when the body differs from the signed one", async () => {
    const signed = await signRequest({ secret: builder.secret, method: "PUT", path: "/v1/disks/d1", body: '{"sizeBytes":1}' });
    const response = await fetch(`${builder.url}/v1/disks/d1`, { method: "PUT", headers: signed, body: '{"sizeBytes":999999}' });
    await expectUnauthorized(response, /does not match/);
  });

  it("answers 401 to a stale timestamp (more than 5 minutes old)", async () => {
    const timestamp = Math.floor(Date.now() / 1000) - 301;
    const headers = await signRequest({ secret: builder.secret, method: "GET", path: "/v1/disks/d1", timestamp });
    expect(headers[HEADER_TIMESTAMP]).toBe(String(timestamp));
    await expectUnauthorized(await fetch(`${builder.url}/v1/disks/d1`, { headers }), /window/);
  });

  it("answers 401 to a replayed request (same headers twice)", async () => {
    const body = '{"sizeBytes":1048576,"tenant":"acct_test"}';
    const headers = await signRequest({ secret: builder.secret, method: "PUT", path: "/v1/disks/replay", body });
    const first = await fetch(`${builder.url}/v1/disks/replay`, { method: "PUT", headers, body });
    expect(first.status).toBe(201);
    await expectUnauthorized(await fetch(`${builder.url}/v1/disks/replay`, { method: "PUT", headers, body }), /replayed/);
  });

  it("answers 413 to a body over 1 MiB", async () => {
    const body = JSON.stringify({ command: "x".repeat(1024 * 1024 + 1) });
    const response = await signedFetch(builder, "/v1/jobs", { method: "POST", body });
    expect(response.status).toBe(413);
  });
});

describe("tenants", () => {
  const other = "acct_other";

  it.runIf(process.getuid?.() === 0)("runs each tenant's jobs as its own unprivileged user", async () => {
    const mine = await runToEnd(builder, { command: "id -u; id -G" });
    const theirs = await runToEnd(builder, { command: "id -u", tenant: other });
    const [uid, groups] = outLines(mine.log);
    expect(Number(uid)).toBeGreaterThanOrEqual(2_000_000);
    expect(groups).toBe(uid);
    expect(outLines(theirs.log)[0]).not.toBe(uid);
  });

  it("refuses a job naming a disk that belongs to another tenant, and the disk route likewise", async () => {
    expect((await putDisk(builder, "theirs", 1024 * 1024, other)).status).toBe(201);
    const stolen = await runToEnd(builder, {
      command: 'ls "$SVC_DISK_PATH"',
      disk: { id: "theirs", mountPath: "/data", sizeBytes: 1024 * 1024 },
    });
    expect(stolen.status).toMatchObject({ status: "failed", reason: "error", error: "disk theirs belongs to another tenant" });
    expect(outLines(stolen.log)).toEqual([]);
    const taken = await putDisk(builder, "theirs", 2 * 1024 * 1024);
    expect(taken.status).toBe(409);
  });

  it("shows a job none of the builder: not its files, processes, environment or secret", async () => {
    const { status, log } = await runToEnd(builder, {
      command: [
        `ls ${builder.dataDir} 2>&1 | head -1`,
        "ls /proc | grep -c '^[0-9]'",
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c BUILDER_SECRET",
        "echo done",
      ].join("; "),
    });
    expect(status.status, log).toBe("succeeded");
    const [listing, processes, secrets, done] = outLines(log);
    expect(listing).toMatch(/No such file or directory/);
    // The prelude's shell is gone (exec); what is left is bubblewrap's init, the shell, and the pipeline.
    expect(Number(processes)).toBeLessThan(8);
    expect(secrets).toBe("0");
    expect(done).toBe("done");
    expect(log).not.toContain(builder.secret);
  });
});

function outLines(log: string): string[] {
  return log
    .split("\n")
    .map((line) => parseLogLine(line))
    .filter((record) => record?.stream === "out")
    .map((record) => record!.text);
}
