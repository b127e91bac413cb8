import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { TenantUsers } from "../../builder/src/sandbox/tenants";

/**
 * One uid per account per host (issue 28): every node on a host allocates
 * from one registry, so two nodes (two data directories, two builders) never
 * give two accounts the same uid, and give one account the same uid.
 */
const BASE = 3_000_000;
const dirs: string[] = [];
const temp = async (prefix: string) => {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
};
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((dir) => rm(dir, { recursive: true, force: true })));
});

const tenant = (n: number) => `acct_${String(n).padStart(24, "0")}`;

describe("the host's tenant registry", () => {
  it("gives two accounts on two nodes of one host two uids, and one account the same uid on both", async () => {
    const registry = await temp("svc-registry-");
    const nodeA = await TenantUsers.open(await temp("svc-node-a-"), BASE, registry);
    const nodeB = await TenantUsers.open(await temp("svc-node-b-"), BASE, registry);
    // Each node's first account: a data directory's own table gave both BASE.
    const first = await nodeA.userOf(tenant(1));
    const second = await nodeB.userOf(tenant(2));
    expect(first.uid).toBe(BASE);
    expect(second.uid).toBe(BASE + 1);
    expect((await nodeB.userOf(tenant(1))).uid).toBe(first.uid);
    expect((await nodeA.userOf(tenant(2))).uid).toBe(second.uid);
  });

  it("allocates at once from several builders without two accounts sharing a uid or one account getting two", async () => {
    const registry = await temp("svc-registry-");
    const nodes = await Promise.all([1, 2, 3, 4].map(async (n) => TenantUsers.open(await temp(`svc-node-${n}-`), BASE, registry)));
    const asked = await Promise.all(nodes.flatMap((node) => Array.from({ length: 20 }, (_, i) => node.userOf(tenant(i)).then((user) => [i, user.uid] as const))));
    const byTenant = new Map<number, Set<number>>();
    for (const [t, uid] of asked) byTenant.set(t, (byTenant.get(t) ?? new Set()).add(uid));
    for (const uids of byTenant.values()) expect(uids.size).toBe(1);
    const uids = [...byTenant.values()].map((set) => [...set][0]!);
    expect(new Set(uids).size).toBe(20);
  });

  it("keeps a tenant's uid from a data directory's old table when the host has it free, and moves it when another account holds it", async () => {
    const registry = await temp("svc-registry-");
    const other = await TenantUsers.open(await temp("svc-node-other-"), BASE, registry);
    expect((await other.userOf(tenant(9))).uid).toBe(BASE);
    const dataDir = await temp("svc-node-old-");
    await writeFile(join(dataDir, "tenants.json"), JSON.stringify({ [tenant(1)]: BASE, [tenant(2)]: BASE + 5 }));
    const users = await TenantUsers.open(dataDir, BASE, registry);
    expect((await users.userOf(tenant(2))).uid).toBe(BASE + 5);
    expect((await users.userOf(tenant(1))).uid).not.toBe(BASE);
    expect(users.moved).toEqual(new Map([[tenant(1), BASE]]));
    expect(await readFile(join(registry, "by-uid", String(BASE)), "utf8")).toBe(tenant(9));
  });

  it("refuses a tenant that cannot name a user, and gives the builder's own user when it is not root", async () => {
    const users = await TenantUsers.open(await temp("svc-node-"), BASE, await temp("svc-registry-"));
    await expect(users.userOf("../etc")).rejects.toThrow(/invalid tenant/);
    const unprivileged = await TenantUsers.open(await temp("svc-node-"), null);
    expect((await unprivileged.userOf(tenant(1))).uid).toBe(process.getuid?.());
  });
});
