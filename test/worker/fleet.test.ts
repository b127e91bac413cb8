import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { afterAll, afterEach, beforeEach, describe, expect, it } from "vitest";
import { type NodeCapacity, type NodeJoin, nodeKey, signRequest } from "../../builder/src/protocol";
import { deployments, disks, nodes } from "../../worker/db/schema";
import { deploymentStub } from "../../worker/services/deployments";
import { fleetStub, forgetFleet } from "../../worker/services/fleet";
import { placeDisk, placeStateless } from "../../worker/services/placement";
import { call, db, type ErrorJson, json, newAccount } from "./helpers";

/**
 * The fleet's control plane in real workerd (D1 and the Fleet object). The
 * nodes here are requests made as a node would make them (join, signed
 * heartbeats); the end-to-end suite runs real node processes.
 */

const operator = { Authorization: "Bearer test-operator-token" };
const joinToken = { Authorization: "Bearer test-node-join-token" };
const GIB = 2 ** 30;

function capacity(freeGb = 100, totalGb = 200): NodeCapacity {
  return { cores: 2, memoryMb: 4096, diskTotalBytes: totalGb * GIB, diskFreeBytes: freeGb * GIB, runningJobs: 0, processes: 0 };
}

async function join(name: string, extra: Partial<NodeJoin> = {}): Promise<{ nodeId: string; key: string }> {
  const body: NodeJoin = { name, address: `http://127.0.0.1:9/${name}`, capacity: capacity(), disks: [], ...extra };
  const res = await call("/v1/nodes/join", { method: "POST", headers: joinToken, body });
  expect(res.status).toBe(200);
  return json<{ nodeId: string; key: string }>(res);
}

async function heartbeat(nodeId: string, key: string, body: unknown): Promise<Response> {
  const text = JSON.stringify(body);
  const headers = await signRequest({ secret: key, node: nodeId, method: "POST", path: "/internal/nodes/heartbeat", body: text });
  return call("/internal/nodes/heartbeat", { method: "POST", headers, body: text });
}

// Each test starts from an empty fleet, and the file leaves one: the Worker test files after it
// share this D1 (vitest.config.ts), and their disks go to the lone builder only while no node joined.
async function emptyFleet(): Promise<void> {
  await db().delete(disks);
  await db().delete(nodes);
  forgetFleet();
}
beforeEach(emptyFleet);
afterEach(() => forgetFleet());
afterAll(emptyFleet);

describe("joining", () => {
  it("refuses a missing or wrong join token, and the operator token or an API key in its place", async () => {
    const { adminKey } = await newAccount();
    const body: NodeJoin = { name: "n1", address: "http://127.0.0.1:9", capacity: capacity(), disks: [] };
    for (const headers of [{}, { Authorization: "Bearer wrong-token-wrong-token" }, operator, { Authorization: `Bearer ${adminKey}` }]) {
      const res = await call("/v1/nodes/join", { method: "POST", headers, body });
      expect(res.status).toBe(401);
      expect((await json<ErrorJson>(res)).error.code).toBe("UNAUTHORIZED");
    }
    expect(await db().select().from(nodes)).toHaveLength(0);
  });

  it("gives each node its own key, derived from BUILDER_SECRET; a request signed for one node is refused as another", async () => {
    const a = await join("node-a");
    const b = await join("node-b");
    expect(a.nodeId).not.toBe(b.nodeId);
    expect(a.key).toBe(await nodeKey(env.BUILDER_SECRET!, a.nodeId));
    expect(a.key).not.toBe(b.key);
    const report = { capacity: capacity(), disks: [], quarantined: [] };
    expect((await heartbeat(a.nodeId, a.key, report)).status).toBe(200);
    // Signed with a's key but claiming to be b: refused.
    const forged = await heartbeat(b.nodeId, a.key, report);
    expect(forged.status).toBe(401);
    // A node that never joined.
    expect((await heartbeat("node_notamember0000", a.key, report)).status).toBe(401);
  });

  it("joins again as itself with its id after a restart, and refuses another node taking its name", async () => {
    const first = await join("node-a");
    const again = await join("node-a", { nodeId: first.nodeId as NodeJoin["nodeId"] });
    expect(again.nodeId).toBe(first.nodeId);
    const res = await call("/v1/nodes/join", {
      method: "POST",
      headers: joinToken,
      body: { name: "node-a", address: "http://127.0.0.1:9", capacity: capacity(), disks: [] },
    });
    expect(res.status).toBe(409);
    expect((await json<ErrorJson>(res)).error.code).toBe("NAME_TAKEN");
  });
});

describe("operator routes", () => {
  it("refuse everyone but the operator token", async () => {
    const { nodeId } = await join("node-a");
    const { adminKey } = await newAccount("business");
    const attempts: [string, string][] = [
      ["GET", "/v1/operator/nodes"],
      ["POST", `/v1/operator/nodes/${nodeId}/cordon`],
      ["POST", `/v1/operator/nodes/${nodeId}/lost`],
      ["DELETE", `/v1/operator/nodes/${nodeId}`],
    ];
    for (const [method, path] of attempts) {
      for (const headers of [{}, { Authorization: `Bearer ${adminKey}` }, joinToken]) {
        expect((await call(path, { method, headers })).status, `${method} ${path}`).toBe(401);
      }
    }
    const listed = await json<{ data: { id: string; state: string }[] }>(await call("/v1/operator/nodes", { headers: operator }));
    expect(listed.data).toEqual([expect.objectContaining({ id: nodeId, state: "ready" })]);
  });

  it("cordon takes a node out of placement and uncordon puts it back; remove only when empty", async () => {
    const a = await join("node-a");
    const b = await join("node-b");
    expect((await call(`/v1/operator/nodes/${a.nodeId}/cordon`, { method: "POST", headers: operator })).status).toBe(200);
    forgetFleet();
    for (let i = 0; i < 20; i++) expect((await placeStateless(env)).id).toBe(b.nodeId);
    expect((await call(`/v1/operator/nodes/${a.nodeId}/uncordon`, { method: "POST", headers: operator })).status).toBe(200);

    const { accountId } = await newAccount("business");
    const now = Date.now();
    await db().insert(disks).values({ id: "disk_onb", accountId, name: "d", sizeGb: 1, mountPath: "/data", nodeId: b.nodeId, createdAt: now, updatedAt: now });
    const listed = await json<{ data: { id: string; disks: string[] }[] }>(await call("/v1/operator/nodes", { headers: operator }));
    expect(listed.data.find((n) => n.id === b.nodeId)?.disks).toEqual(["disk_onb"]);
    const refused = await call(`/v1/operator/nodes/${b.nodeId}`, { method: "DELETE", headers: operator });
    expect(refused.status).toBe(409);
    expect((await json<ErrorJson>(refused)).error.code).toBe("NODE_NOT_EMPTY");
    expect((await call(`/v1/operator/nodes/${a.nodeId}`, { method: "DELETE", headers: operator })).status).toBe(200);
    expect((await db().select().from(nodes)).map((n) => n.id)).toEqual([b.nodeId]);
  });
});

describe("placement", () => {
  it("spreads stateless work over the ready nodes (no node gets more than half of 200)", async () => {
    const joined = [await join("n1"), await join("n2"), await join("n3")];
    forgetFleet();
    const counts = new Map<string, number>();
    for (let i = 0; i < 200; i++) {
      const { id } = await placeStateless(env);
      counts.set(id, (counts.get(id) ?? 0) + 1);
    }
    expect([...counts.keys()].sort()).toEqual(joined.map((n) => n.nodeId).sort());
    for (const count of counts.values()) expect(count).toBeLessThanOrEqual(100);
  });

  it("puts a disk on the ready node with the most room once its disks are counted full", async () => {
    const small = await join("small", { capacity: capacity(50, 60) });
    const big = await join("big", { capacity: capacity(100, 120) });
    forgetFleet();
    expect((await placeDisk(env, db(), 10 * GIB)).id).toBe(big.nodeId);
    const { accountId } = await newAccount("business");
    const now = Date.now();
    // 60 GB already promised on the big node: it has 48 GB of room left (108 - 60), the small one 54.
    await db().insert(disks).values({ id: "disk_big", accountId, name: "d", sizeGb: 60, mountPath: "/data", nodeId: big.nodeId, createdAt: now, updatedAt: now });
    expect((await placeDisk(env, db(), 10 * GIB)).id).toBe(small.nodeId);
    await expect(placeDisk(env, db(), 500 * GIB)).rejects.toThrow(/no node can hold a disk of 500 GB/);
  });
});

describe("a lost node", () => {
  it("is declared lost by the Fleet object's alarm once silent past the threshold, and is ready again when it heartbeats", async () => {
    const a = await join("node-a");
    const b = await join("node-b");
    // b heartbeats; a has been silent for longer than NODE_LOST_AFTER_SECONDS.
    await fleetStub(env).join({ nodeId: a.nodeId as NodeJoin["nodeId"], name: "node-a", address: "http://127.0.0.1:9", capacity: capacity(), disks: [] }, Date.now() - 120_000);
    // Its deadline has passed: the alarm (armed for then) runs at once, or here if it has not yet.
    await runDurableObjectAlarm(fleetStub(env));
    let states: Record<string, string> = {};
    for (let i = 0; i < 50 && states[a.nodeId] !== "lost"; i++) {
      states = Object.fromEntries((await db().select().from(nodes)).map((n) => [n.id, n.state]));
      if (states[a.nodeId] !== "lost") await new Promise((r) => setTimeout(r, 100));
    }
    expect(states).toEqual({ [a.nodeId]: "lost", [b.nodeId]: "ready" });
    forgetFleet();
    for (let i = 0; i < 10; i++) expect((await placeStateless(env)).id).toBe(b.nodeId);
    expect((await heartbeat(a.nodeId, a.key, { capacity: capacity(), disks: [], quarantined: [] })).status).toBe(200);
    expect((await db().select().from(nodes).where(eq(nodes.id, a.nodeId)))[0]!.state).toBe("ready");
  });

  it("a build it held starts again from its source on another node (a build is safe to repeat)", async () => {
    const nodeA = await join("node-a");
    const nodeB = await join("node-b");
    forgetFleet();
    const { adminKey: key } = await newAccount("business");
    await call("/v1/apps", { method: "POST", key, body: { name: `rebuild-${crypto.randomUUID().slice(0, 8)}`, runtime: "static" } });
    const [app] = (await json<{ data: { name: string }[] }>(await call("/v1/apps", { key }))).data;
    const created = await json<{ data: { deployment: { id: string }; uploadUrl: string } }>(
      await call(`/v1/apps/${app!.name}/deployments`, { method: "POST", key, body: { sizeBytes: 5 } }),
    );
    const id = created.data.deployment.id;
    await exports.default.fetch(new Request(created.data.uploadUrl, { method: "PUT", body: "12345" }));
    expect((await call(`/v1/apps/${app!.name}/deployments/${id}/start`, { method: "POST", key })).status).toBe(202);
    // These nodes are addresses nothing answers at: the build was sent to one of them, which never replied.
    const first = await runInDurableObject(deploymentStub(env, id), (_i, state) => state.storage.kv.get<string>("node"));
    expect([nodeA.nodeId, nodeB.nodeId]).toContain(first);
    const other = first === nodeA.nodeId ? nodeB.nodeId : nodeA.nodeId;
    expect((await call(`/v1/operator/nodes/${first}/lost`, { method: "POST", headers: operator })).status).toBe(200);
    forgetFleet();
    await runDurableObjectAlarm(deploymentStub(env, id));
    expect(await runInDurableObject(deploymentStub(env, id), (_i, state) => state.storage.kv.get<string>("node"))).toBe(other);
    const row = await db().select().from(deployments).where(eq(deployments.id, id)).get();
    expect(row).toMatchObject({ status: "queued", startedAt: null });
  });

  it("fences a returning node's copies of disks whose record moved or was deleted (it sets them aside)", async () => {
    const a = await join("node-a");
    const b = await join("node-b");
    const { accountId } = await newAccount("business");
    const now = Date.now();
    await db()
      .insert(disks)
      .values([
        { id: "disk_kept", accountId, name: "kept", sizeGb: 1, mountPath: "/data", nodeId: a.nodeId, generation: 1, createdAt: now, updatedAt: now },
        { id: "disk_moved", accountId, name: "moved", sizeGb: 1, mountPath: "/data", nodeId: b.nodeId, generation: 2, createdAt: now, updatedAt: now },
      ]);
    const held = [
      { id: "disk_kept", generation: 1 },
      { id: "disk_moved", generation: 1 },
      { id: "disk_gone", generation: 1 },
    ];
    const res = await heartbeat(a.nodeId, a.key, { capacity: capacity(), disks: held, quarantined: [] });
    expect(res.status).toBe(200);
    expect((await json<{ fence: string[] }>(res)).fence.sort()).toEqual(["disk_gone", "disk_moved"]);
  });
});
