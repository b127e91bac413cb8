import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HEADER_TIMESTAMP, parseLogLine, signRequest } from "../../builder/src/protocol.js";
import { type BuilderProcess, runToEnd, signedFetch, startBuilder } from "./builder-process.js";

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
    const body = '{"sizeBytes":1048576}';
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

describe("job user (BUILDER_JOB_USER)", () => {
  let isolated: BuilderProcess;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = await mkdtemp(join(tmpdir(), "svc-builder-user-"));
    await chmod(dataDir, 0o711); // the job user must be able to traverse to its working directory
    isolated = await startBuilder({ dataDir, env: { BUILDER_JOB_USER: "65534:65534" } });
  });
  afterAll(async () => {
    await isolated?.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  it("runs commands unprivileged, so the builder's environment stays unreadable", async () => {
    const { status, log } = await runToEnd(isolated, {
      command: 'id -u; touch "$HOME/x" && echo home-writable; echo data > "$SVC_DISK_PATH/f" && echo disk-writable; cat /proc/$PPID/environ; ls ..',
      disk: { id: "user_disk", mountPath: "/data", sizeBytes: 1024 * 1024 },
    });
    const out = log
      .split("\n")
      .map((line) => parseLogLine(line))
      .filter((record) => record?.stream === "out")
      .map((record) => record!.text);
    expect(out).toEqual(["65534", "home-writable", "disk-writable"]);
    expect(log).toContain("Permission denied");
    expect(log).not.toContain(isolated.secret);
    expect(status).toMatchObject({ status: "failed", reason: "exit_code" });
  });
});
