import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env, exports } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { afterAll, afterEach, beforeEach, describe, expect, it } from "vitest";
import { type NodeCapacity, type NodeJoin, type NodeRejoin, nodeKey } from "../../builder/src/protocol/node";
import { signRequest } from "../../builder/src/protocol/signing";
import { deployments, disks, nodeJoinTokens, nodes } from "../../worker/db/schema";
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
const GIB = 2 ** 30;

function capacity(freeGb = 100, totalGb = 200): NodeCapacity {
  return { cores: 2, memoryMb: 4096, diskTotalBytes: totalGb * GIB, diskFreeBytes: freeGb * GIB, runningJobs: 0, processes: 0, memoryFreeMb: 3072 };
}

/** A join token as the operator mints it (`svc admin nodes token`). */
async function mintToken(body: Record<string, unknown> = {}): Promise<{ id: string; token: string; usesLeft: number }> {
  const res = await call("/v1/operator/join-tokens", { method: "POST", headers: operator, body });
  expect(res.status).toBe(201);
  return (await json<{ data: { id: string; token: string; usesLeft: number } }>(res)).data;
}

function joinWith(token: string, body: Partial<NodeJoin> & { name: string }): Promise<Response> {
  const full: NodeJoin = { address: `http://127.0.0.1:9/${body.name}`, capacity: capacity(), disks: [], ...body };
  return call("/v1/nodes/join", { method: "POST", headers: { Authorization: `Bearer ${token}` }, body: full });
}

async function join(name: string, extra: Partial<NodeJoin> = {}, token?: string): Promise<{ nodeId: string; key: string }> {
  const res = await joinWith(token ?? (await mintToken()).token, { name, ...extra });
  expect(res.status).toBe(200);
  return json<{ nodeId: string; key: string }>(res);
}

async function signed(path: string, nodeId: string, key: string, body: unknown): Promise<Response> {
  const text = JSON.stringify(body);
  const headers = await signRequest({ secret: key, node: nodeId, method: "POST", path, body: text });
  return call(path, { method: "POST", headers, body: text });
}

const rejoin = (nodeId: string, key: string, body: NodeRejoin) => signed("/internal/nodes/rejoin", nodeId, key, body);

function heartbeat(nodeId: string, key: string, body: unknown): Promise<Response> {
  return signed("/internal/nodes/heartbeat", nodeId, key, body);
}

// Each test starts from an empty fleet, and the file leaves one: the Worker test files after it
// share this D1 (vitest.config.ts), and their disks go to the lone builder only while no node joined.
async function emptyFleet(): Promise<void> {
  await db().delete(disks);
  await db().delete(nodes);
  // When the fleet last heard a node (its own silences are not held against nodes): each test starts unheard.
  await runInDurableObject(fleetStub(env), (_instance, state) => {
    state.storage.kv.delete("heardAt");
    state.storage.kv.delete("listeningFrom");
  });
  forgetFleet();
}
beforeEach(emptyFleet);
afterEach(() => forgetFleet());
afterAll(emptyFleet);

describe("joining", () => {
  it("refuses a missing, malformed or unknown join token, and the operator token or an API key in its place", async () => {
    const { adminKey } = await newAccount();
    const body: NodeJoin = { name: "n1", address: "http://127.0.0.1:9", capacity: capacity(), disks: [] };
    const unknown = `svcjoin_${"A".repeat(40)}`;
    for (const headers of [{}, { Authorization: "Bearer wrong-token-wrong-token" }, { Authorization: `Bearer ${unknown}` }, operator, { Authorization: `Bearer ${adminKey}` }]) {
      const res = await call("/v1/nodes/join", { method: "POST", headers, body });
      expect(res.status).toBe(401);
      expect((await json<ErrorJson>(res)).error.code).toBe("UNAUTHORIZED");
    }
    expect(await db().select().from(nodes)).toHaveLength(0);
  });

  it("spends a token's uses: a one-time token admits one node, and expired or revoked tokens none", async () => {
    const once = await mintToken();
    expect((await joinWith(once.token, { name: "first" })).status).toBe(200);
    const again = await joinWith(once.token, { name: "second" });
    expect(again.status).toBe(401);
    expect((await json<ErrorJson>(again)).error.message).toMatch(/used up or expired/);

    const twice = await mintToken({ uses: 2 });
    expect((await joinWith(twice.token, { name: "second" })).status).toBe(200);
    expect((await joinWith(twice.token, { name: "third" })).status).toBe(200);
    expect((await joinWith(twice.token, { name: "fourth" })).status).toBe(401);

    const revoked = await mintToken();
    expect((await call(`/v1/operator/join-tokens/${revoked.id}`, { method: "DELETE", headers: operator })).status).toBe(200);
    expect((await joinWith(revoked.token, { name: "fourth" })).status).toBe(401);

    const expiring = await mintToken({ ttlSeconds: 60 });
    await db().update(nodeJoinTokens).set({ expiresAt: Date.now() - 1 }).where(eq(nodeJoinTokens.id, expiring.id));
    expect((await joinWith(expiring.token, { name: "fourth" })).status).toBe(401);

    // The listing shows what is still good for a join, never a token's value.
    const listed = await json<{ data: { id: string; token?: string }[] }>(await call("/v1/operator/join-tokens", { headers: operator }));
    expect(listed.data.map((t) => t.id)).not.toContain(once.id);
    expect(listed.data.every((t) => t.token === undefined)).toBe(true);
    expect((await db().select().from(nodes)).map((n) => n.name).sort()).toEqual(["first", "second", "third"]);
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

  it("never lets a join token be an existing node: a join naming its id is refused and the node keeps its address and key", async () => {
    const victim = await join("victim", { address: "http://10.0.0.5:8788" });
    const { token } = await mintToken();
    const res = await joinWith(token, { name: "victim", nodeId: victim.nodeId, address: "http://attacker.example:80" });
    expect(res.status).toBe(403);
    const refusal = await json<ErrorJson>(res);
    expect(refusal.error.code).toBe("FORBIDDEN");
    expect(refusal.error.message).toMatch(/only admits new nodes/);
    // Under a new name it would be a new node with a new id and key: never the victim's.
    const other = await json<{ nodeId: string; key: string }>(await joinWith(token, { name: "attacker", address: "http://attacker.example:80" }));
    expect(other.nodeId).not.toBe(victim.nodeId);
    expect(other.key).not.toBe(victim.key);
    const row = await db().select().from(nodes).where(eq(nodes.id, victim.nodeId)).get();
    expect(row).toMatchObject({ name: "victim", address: "http://10.0.0.5:8788" });
    forgetFleet();
    expect((await placeStateless(env)).id).toBeDefined();
  });

  it("joins again as itself with a request signed by its own key, which alone may move its address; another name stays its own", async () => {
    const a = await join("node-a", { address: "http://10.0.0.5:8788" });
    const b = await join("node-b");
    const body: NodeRejoin = { name: "node-a", address: "http://10.0.0.6:8788", capacity: capacity(), disks: [] };
    // Signed with another node's key, or by nobody: refused, and nothing moves.
    expect((await rejoin(a.nodeId, b.key, body)).status).toBe(401);
    expect((await call("/internal/nodes/rejoin", { method: "POST", body })).status).toBe(401);
    expect((await db().select().from(nodes).where(eq(nodes.id, a.nodeId)).get())?.address).toBe("http://10.0.0.5:8788");
    const res = await rejoin(a.nodeId, a.key, body);
    expect(res.status).toBe(200);
    expect(await json(res)).toMatchObject({ nodeId: a.nodeId, heartbeatSeconds: 5 });
    expect((await db().select().from(nodes).where(eq(nodes.id, a.nodeId)).get())?.address).toBe("http://10.0.0.6:8788");
    // b signing as itself cannot take a's name.
    const taken = await rejoin(b.nodeId, b.key, { ...body, name: "node-a" });
    expect(taken.status).toBe(409);
    expect((await json<ErrorJson>(taken)).error.code).toBe("NAME_TAKEN");
    // A token cannot take a name either.
    const byToken = await joinWith((await mintToken()).token, { name: "node-a" });
    expect(byToken.status).toBe(409);
  });

  it("holds a node's capacity to its caps: a node claiming a petabyte gets no disk an honest node has room for", async () => {
    const honest = await join("honest", { capacity: capacity(150, 200) });
    const liar = await join("liar", { capacity: capacity(1024 * 1024, 1024 * 1024) }, (await mintToken({ maxDiskGb: 100, maxCores: 4 })).token);
    forgetFleet();
    expect((await placeDisk(env, db(), 10 * GIB)).id).toBe(honest.nodeId);
    const listed = await json<{ data: { id: string; capacity: NodeCapacity; claimed: NodeCapacity | null; caps: { diskBytes: number; defaults: boolean } }[] }>(
      await call("/v1/operator/nodes", { headers: operator }),
    );
    const view = listed.data.find((n) => n.id === liar.nodeId)!;
    expect(view.capacity.diskTotalBytes).toBe(100 * GIB);
    expect(view.capacity.diskFreeBytes).toBe(100 * GIB);
    expect(view.claimed?.diskTotalBytes).toBe(1024 * 1024 * GIB);
    expect(view.caps).toMatchObject({ diskBytes: 100 * GIB, defaults: false });
    expect(listed.data.find((n) => n.id === honest.nodeId)).toMatchObject({ claimed: null, caps: { defaults: true } });
    // Its heartbeats are held to the caps too; the fleet-wide default holds nodes without caps of their own.
    await heartbeat(liar.nodeId, liar.key, { capacity: capacity(1024 * 1024, 1024 * 1024), disks: [], quarantined: [] });
    expect((await db().select().from(nodes).where(eq(nodes.id, liar.nodeId)).get())?.diskTotalBytes).toBe(100 * GIB);
    await heartbeat(honest.nodeId, honest.key, { capacity: capacity(1024 * 1024, 1024 * 1024), disks: [], quarantined: [] });
    expect((await db().select().from(nodes).where(eq(nodes.id, honest.nodeId)).get())?.diskTotalBytes).toBe(Number(env.NODE_MAX_DISK_GB) * GIB);
    // The operator raises the liar's cap once its host really has the room.
    const patched = await call(`/v1/operator/nodes/${liar.nodeId}`, { method: "PATCH", headers: operator, body: { maxDiskGb: 500 } });
    expect(patched.status).toBe(200);
    expect((await json<{ data: { capacity: NodeCapacity } }>(patched)).data.capacity.diskTotalBytes).toBe(500 * GIB);
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
    const joinToken = { Authorization: `Bearer ${(await mintToken()).token}` };
    attempts.push(["GET", "/v1/operator/join-tokens"], ["POST", "/v1/operator/join-tokens"], ["PATCH", `/v1/operator/nodes/${nodeId}`]);
    for (const [method, path] of attempts) {
      for (const headers of [{} as Record<string, string>, { Authorization: `Bearer ${adminKey}` }, joinToken]) {
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
    await fleetStub(env).rejoin(a.nodeId, { name: "node-a", address: "http://127.0.0.1:9", capacity: capacity(), disks: [] }, Date.now() - 120_000);
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

  it("is not declared lost for a silence of every node at once (the control plane's own restart): each gets a whole threshold again", async () => {
    const a = await join("node-a");
    const b = await join("node-b");
    const fleet = fleetStub(env);
    const old = Date.now() - 120_000;
    // The fleet heard nobody for two minutes: its own silence, as across the local Worker's restart (the chaos run's).
    await runInDurableObject(fleet, (_instance, state) => state.storage.kv.put("heardAt", old));
    // Then a node speaks (here rejoining; its last heartbeat as old as the silence), and the alarm comes.
    for (const [node, name] of [
      [a, "node-a"],
      [b, "node-b"],
    ] as const) {
      await fleet.rejoin(node.nodeId, { name, address: "http://127.0.0.1:9", capacity: capacity(), disks: [] }, old);
    }
    await runDurableObjectAlarm(fleet);
    const states = Object.fromEntries((await db().select().from(nodes)).map((n) => [n.id, n.state]));
    expect(states).toEqual({ [a.nodeId]: "ready", [b.nodeId]: "ready" });
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
