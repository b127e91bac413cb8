import { connect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HEADER_PROXY_SIGNATURE, HEADER_PROXY_TIMESTAMP, MAX_PROXY_BODY_BYTES, signProxy } from "../../builder/src/protocol/processes.js";
import { signRequest } from "../../builder/src/protocol/signing.js";
import { type BuilderProcess, TEST_TENANT, putDisk, runToEnd, signedFetch, startBuilder } from "./builder-process.js";
import {
  APP_SERVER,
  type ControlPlane,
  type Release,
  makeRelease,
  proxyFetch,
  proxyHeaders,
  startControlPlane,
  startProcess,
  stopProcess,
  waitFor,
  webSpec,
} from "./process-support.js";

const MiB = 1024 * 1024;
let builder: BuilderProcess;
let plane: ControlPlane;
let release: Release;
let appId: string;

beforeAll(async () => {
  builder = await startBuilder();
  plane = await startControlPlane(builder.secret);
  release = await makeRelease({ "server.js": APP_SERVER });
  const app = await startProcess(builder, webSpec(plane.serve(release)));
  await waitFor(builder, app.id, (status) => status.ready);
  appId = app.id;
});
afterAll(async () => {
  await builder?.stop();
  await plane?.close();
});

/** Writes `request` on a fresh connection to the builder and answers everything received until it closes. */
async function rawExchange(request: string): Promise<string> {
  const { port, hostname } = new URL(builder.url);
  const socket = connect(Number(port), hostname);
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write(request);
  return new Promise<string>((resolve) => {
    let text = "";
    socket.on("data", (chunk: Buffer) => {
      text += chunk.toString();
    });
    socket.on("close", () => resolve(text));
  });
}

const errorCode = async (response: Response) => ((await response.json()) as { error: { code: string } }).error.code;

describe("proxied traffic is the Worker's only", () => {
  it("refuses a request without proxy headers, with a wrong or another process's signature, or an old timestamp (401)", async () => {
    const plain = await fetch(`${builder.url}/v1/proxy/${appId}/hello`);
    expect(plain.status).toBe(401);
    expect(await errorCode(plain)).toBe("UNAUTHORIZED");

    const good = await signProxy(builder.secret, appId);
    const tampered = { ...good, [HEADER_PROXY_SIGNATURE]: `${good[HEADER_PROXY_SIGNATURE]!.slice(0, 63)}${good[HEADER_PROXY_SIGNATURE]!.endsWith("0") ? "1" : "0"}` };
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: tampered })).status).toBe(401);

    const forAnother = await signProxy(builder.secret, "prc_000000000000000000000000");
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: forAnother })).status).toBe(401);

    const wrongSecret = await signProxy("not-the-builder-secret", appId);
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: wrongSecret })).status).toBe(401);

    const old = await signProxy(builder.secret, appId, Math.floor(Date.now() / 1000) - 600);
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: old })).status).toBe(401);

    // A signature the node already accepted still holds only for its own process and second.
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: good })).status).toBe(200);
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: tampered })).status).toBe(401);
    const shifted = { ...good, [HEADER_PROXY_TIMESTAMP]: String(Number(good[HEADER_PROXY_TIMESTAMP]) + 1) };
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: shifted })).status).toBe(401);

    // The builder's own request signature is not a proxy signature.
    const apiSigned = await signRequest({ secret: builder.secret, method: "GET", path: `/v1/proxy/${appId}/hello` });
    expect((await fetch(`${builder.url}/v1/proxy/${appId}/hello`, { headers: apiSigned })).status).toBe(401);
  });

  it("refuses a WebSocket upgrade without a valid proxy signature", async () => {
    const answer = await rawExchange(
      `GET /v1/proxy/${appId}/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
    );
    expect(answer).toMatch(/^HTTP\/1\.1 401 /);
  });

  it("refuses a request body announced over the limit before it reaches the app (413)", async () => {
    const headers = await proxyHeaders(builder.secret, appId);
    let head = `POST /v1/proxy/${appId}/echo HTTP/1.1\r\nHost: x\r\nContent-Length: ${MAX_PROXY_BODY_BYTES + 1}\r\n`;
    for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
    const answer = await rawExchange(`${head}\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 413 /);
    expect(answer).toContain("PAYLOAD_TOO_LARGE");
  });
});

describe("the app's port", () => {
  it("is reachable by the node but not from another tenant's run, and the host stays closed to the app's network", async () => {
    const info = (await (await proxyFetch(builder, appId, "/info")).json()) as { address: string };
    expect(info.address).toMatch(/^10\.213\.\d+\.\d+$/);
    const probe = (host: string, port: number) =>
      `node -e "require('net').connect(${port},'${host}').on('connect',()=>{console.log('open');process.exit()}).on('error',(e)=>{console.log(e.code);process.exit()});setTimeout(()=>{console.log('timeout');process.exit()},3000)"`;
    const other = await runToEnd(builder, { tenant: "acct_other", command: probe(info.address, 8080), timeoutSeconds: 30, memoryMb: 256 });
    expect(other.status.status).toBe("succeeded");
    expect(other.log).toMatch(/ out (timeout|EHOSTUNREACH|ECONNREFUSED|ENETUNREACH)\n/);
    expect(other.log).not.toContain(" out open");
    const same = await runToEnd(builder, { tenant: TEST_TENANT, command: probe(info.address, 8080), timeoutSeconds: 30, memoryMb: 256 });
    expect(same.log).not.toContain(" out open");
    // Replies to the node's connections come back in; a run still cannot open one to the host (the builder's port).
    const gateway = info.address.replace(/\.\d+$/, ".1");
    const toHost = await runToEnd(builder, { tenant: "acct_other", command: probe(gateway, Number(new URL(builder.url).port)), timeoutSeconds: 30, memoryMb: 256 });
    expect(toHost.log).not.toContain(" out open");
  });
});

describe("a process holds its disk", () => {
  it("refuses a restore and a deletion of the disk while a process uses it (409 DISK_BUSY), and allows them once it stopped", async () => {
    expect((await putDisk(builder, "appdisk", 16 * MiB)).status).toBe(201);
    const started = await startProcess(builder, webSpec(plane.serve(release), { disk: { id: "appdisk", mountPath: "/data", sizeBytes: 16 * MiB } }));
    await waitFor(builder, started.id, (status) => status.ready);
    const archive = await makeRelease({ "restored.txt": "restored\n" });
    const served = plane.serve(archive);
    const restore = { diskId: "appdisk", archiveUrl: served.url, expectedSizeBytes: archive.sizeBytes, maxEntries: 10, maxExpandedBytes: MiB };
    const refused = await signedFetch(builder, "/v1/restores", { method: "POST", body: restore });
    expect(refused.status).toBe(409);
    const body = (await refused.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("DISK_BUSY");
    expect(body.error.message).toBe(`disk appdisk is used by app process ${started.id}; stop the app's process first`);
    const deletion = await signedFetch(builder, "/v1/disks/appdisk", { method: "DELETE" });
    expect(deletion.status).toBe(409);
    expect(await errorCode(deletion)).toBe("DISK_BUSY");
    // A run job may share the disk with the app.
    const run = await runToEnd(builder, { command: "ls /data", disk: { id: "appdisk", mountPath: "/data", sizeBytes: 16 * MiB } });
    expect(run.status.status).toBe("succeeded");

    await stopProcess(builder, started.id);
    await waitFor(builder, started.id, (status) => status.state === "stopped");
    const accepted = await signedFetch(builder, "/v1/restores", { method: "POST", body: restore });
    expect(accepted.status).toBe(201);
  });

  it("refuses a process on another tenant's disk", async () => {
    expect((await putDisk(builder, "theirs", MiB, "acct_other")).status).toBe(201);
    const refused = await signedFetch(builder, "/v1/processes", {
      method: "POST",
      body: webSpec(plane.serve(release), { disk: { id: "theirs", mountPath: "/data", sizeBytes: MiB } }),
    });
    expect(refused.status).toBe(409);
    expect(await errorCode(refused)).toBe("DISK_BUSY");
  });
});

describe("the routes", () => {
  it("need the builder's signature (except proxied traffic, which needs its own)", async () => {
    expect((await fetch(`${builder.url}/v1/processes/${appId}`)).status).toBe(401);
    expect((await fetch(`${builder.url}/v1/app-logs/app_test`)).status).toBe(401);
    expect((await fetch(`${builder.url}/v1/processes/${appId}/stop`, { method: "POST", body: "{}" })).status).toBe(401);
    expect((await signedFetch(builder, "/v1/app-logs/..%2Fetc")).status).toBe(400);
  });

  it("stops the last process at the end", async () => {
    await stopProcess(builder, appId);
    await waitFor(builder, appId, (status) => status.state === "stopped");
  });
});
