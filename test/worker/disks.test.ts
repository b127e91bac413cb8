import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { signRequest } from "../../builder/src/protocol/signing";
import { isInUse } from "../../worker/services/disks";
import { call, type ErrorJson, json, newAccount } from "./helpers";

type Disk = { id: string; name: string; sizeGb: number; mountPath: string; appId: string | null; appName: string | null; inUse: boolean; status: string };
type Data<T> = { data: T };
const uniqueName = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

/** Asks the real builder (started by the global setup) whether it holds the disk, with a signed request. */
async function builderHasDisk(id: string): Promise<boolean> {
  const path = `/v1/disks/${id}`;
  const headers = await signRequest({ secret: env.BUILDER_SECRET!, method: "GET", path });
  const res = await fetch(new URL(path, env.BUILDER_URL), { headers });
  return res.status === 200;
}

describe("/v1/disks", () => {
  it("creates a disk on the builder, attaches, reports in-use, detaches and deletes it", async () => {
    const { adminKey: key } = await newAccount();
    const app = uniqueName("withdisk");
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "node" } });
    const created = await call("/v1/disks", { method: "POST", key, body: { name: "data", sizeGb: 2, mountPath: "/var/lib/data" } });
    expect(created.status).toBe(201);
    const disk = (await json<Data<Disk>>(created)).data;
    expect(disk).toMatchObject({ name: "data", sizeGb: 2, mountPath: "/var/lib/data", appId: null, inUse: false, status: "available" });
    expect(disk.id).toMatch(/^disk_/);
    expect(await builderHasDisk(disk.id)).toBe(true);

    const attached = await call(`/v1/disks/data/attach`, { method: "POST", key, body: { app } });
    expect(attached.status).toBe(200);
    expect((await json<Data<Disk>>(attached)).data).toMatchObject({ appName: app, inUse: true });
    const appInfo = (await json<Data<{ disks: { id: string }[] }>>(await call(`/v1/apps/${app}`, { key }))).data;
    expect(appInfo.disks.map((d) => d.id)).toEqual([disk.id]);

    await call(`/v1/apps/${app}/stop`, { method: "POST", key });
    expect((await json<Data<Disk>>(await call(`/v1/disks/${disk.id}`, { key }))).data).toMatchObject({ appName: app, inUse: false });
    await call(`/v1/apps/${app}/restart`, { method: "POST", key });

    const refused = await call(`/v1/disks/${disk.id}`, { method: "DELETE", key });
    expect(refused.status).toBe(409);
    expect((await json<ErrorJson>(refused)).error.code).toBe("DISK_ATTACHED");
    expect(await builderHasDisk(disk.id)).toBe(true);

    const detached = await call(`/v1/disks/${disk.id}/detach`, { method: "POST", key });
    expect((await json<Data<Disk>>(detached)).data).toMatchObject({ appId: null, inUse: false });
    const deleted = await call(`/v1/disks/${disk.id}`, { method: "DELETE", key });
    expect(deleted.status).toBe(200);
    expect(await json(deleted)).toEqual({ data: { id: disk.id, deleted: true } });
    expect(await builderHasDisk(disk.id)).toBe(false);
    expect((await call(`/v1/disks/${disk.id}`, { key })).status).toBe(404);
  });

  it("refuses duplicate names (409), attaching to a second app (409) and bad input (400)", async () => {
    const { adminKey: key } = await newAccount();
    const [one, two] = [uniqueName("one"), uniqueName("two")];
    for (const name of [one, two]) await call("/v1/apps", { method: "POST", key, body: { name, runtime: "node" } });
    expect((await call("/v1/disks", { method: "POST", key, body: { name: "shared", sizeGb: 1 } })).status).toBe(201);
    const dup = await call("/v1/disks", { method: "POST", key, body: { name: "shared", sizeGb: 1 } });
    expect(dup.status).toBe(409);
    expect((await json<ErrorJson>(dup)).error.code).toBe("NAME_TAKEN");
    expect((await call("/v1/disks/shared/attach", { method: "POST", key, body: { app: one } })).status).toBe(200);
    const second = await call("/v1/disks/shared/attach", { method: "POST", key, body: { app: two } });
    expect(second.status).toBe(409);
    expect((await json<ErrorJson>(second)).error.message).toContain(one);
    for (const body of [
      { name: "x", sizeGb: 0 },
      { name: "x", sizeGb: 1.5 },
      { name: "x", sizeGb: 1, mountPath: "relative" },
      { name: "x", sizeGb: 1, mountPath: "/a/../../etc" },
      { name: "x", sizeGb: 1, mountPath: "/" },
      { name: "x", sizeGb: 1, mountPath: "/etc/app" },
      { name: "x", sizeGb: 1, mountPath: "/proc" },
      { name: "x", sizeGb: 1, mountPath: "/tmp/cache" },
      { name: "Bad Name", sizeGb: 1 },
    ]) {
      expect((await call("/v1/disks", { method: "POST", key, body })).status, JSON.stringify(body)).toBe(400);
    }
    const sandboxPath = await call("/v1/disks", { method: "POST", key, body: { name: "x", sizeGb: 1, mountPath: "/usr/data" } });
    expect((await json<ErrorJson>(sandboxPath)).error).toMatchObject({
      code: "VALIDATION_ERROR",
      details: [{ field: "mountPath", message: "/usr belongs to the job's sandbox; choose another path, e.g. /data" }],
    });
    const attachMissing = await call("/v1/disks/shared/attach", { method: "POST", key, body: { app: "no-such-app" } });
    expect((await json<ErrorJson>(attachMissing)).error.message).toBe("app not found");
    await call("/v1/disks/shared/detach", { method: "POST", key });
    await call("/v1/disks/shared", { method: "DELETE", key });
  });

  it("deleting an app detaches its disk and keeps the data", async () => {
    const { adminKey: key } = await newAccount();
    const app = uniqueName("ephemeral");
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "node" } });
    const disk = (await json<Data<Disk>>(await call("/v1/disks", { method: "POST", key, body: { name: "keep", sizeGb: 1 } }))).data;
    await call("/v1/disks/keep/attach", { method: "POST", key, body: { app } });
    await call(`/v1/apps/${app}`, { method: "DELETE", key });
    expect((await json<Data<Disk>>(await call("/v1/disks/keep", { key }))).data).toMatchObject({ appId: null, inUse: false });
    expect(await builderHasDisk(disk.id)).toBe(true);
    await call("/v1/disks/keep", { method: "DELETE", key });
  });

  it("an app has one disk: a second attach is refused with 409 APP_HAS_DISK, even when both are attached at once", async () => {
    const { adminKey: key } = await newAccount();
    const app = uniqueName("onedisk");
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "node" } });
    for (const [name, mountPath] of [["first", "/data"], ["second", "/big"]] as const) {
      expect((await call("/v1/disks", { method: "POST", key, body: { name, sizeGb: 1, mountPath } })).status).toBe(201);
    }
    expect((await call("/v1/disks/first/attach", { method: "POST", key, body: { app } })).status).toBe(200);
    const second = await call("/v1/disks/second/attach", { method: "POST", key, body: { app } });
    expect(second.status).toBe(409);
    expect((await json<ErrorJson>(second)).error).toMatchObject({
      code: "APP_HAS_DISK",
      message: `app ${app} already has disk first at /data; an app has one disk: detach it first`,
    });
    // Attaching the same disk again is not a second disk.
    expect((await call("/v1/disks/first/attach", { method: "POST", key, body: { app } })).status).toBe(200);

    await call("/v1/disks/first/detach", { method: "POST", key });
    const racing = await Promise.all(["first", "second"].map((disk) => call(`/v1/disks/${disk}/attach`, { method: "POST", key, body: { app } })));
    expect(racing.map((r) => r.status).sort()).toEqual([200, 409]);
    const appInfo = (await json<Data<{ disks: { id: string }[] }>>(await call(`/v1/apps/${app}`, { key }))).data;
    expect(appInfo.disks).toHaveLength(1);
  });

  it("deleting a disk while it is being backed up is 409 DISK_BUSY naming the backup; the disk and backup stay", async () => {
    const { adminKey: key } = await newAccount();
    const disk = (await json<Data<Disk>>(await call("/v1/disks", { method: "POST", key, body: { name: "busy", sizeGb: 1 } }))).data;
    const backup = await json<{ data: { id: string; status: string } }>(
      await call(`/v1/disks/${disk.id}/backups`, { method: "POST", key, body: { description: "during delete" } }),
    );
    expect(backup.data.status).toBe("creating");
    const refused = await call(`/v1/disks/${disk.id}`, { method: "DELETE", key });
    expect(refused.status).toBe(409);
    expect((await json<ErrorJson>(refused)).error).toMatchObject({
      code: "DISK_BUSY",
      message: `disk busy is being backed up (${backup.data.id}); delete it once the backup is ready or failed`,
    });
    expect(await builderHasDisk(disk.id)).toBe(true);
    const backups = await json<{ data: { id: string }[] }>(await call(`/v1/disks/${disk.id}/backups`, { key }));
    expect(backups.data.map((b) => b.id)).toEqual([backup.data.id]);
  });

  it("defines in-use as attached to a running app", () => {
    const disk = {} as Parameters<typeof isInUse>[0]["disk"];
    expect(isInUse({ disk, app: null })).toBe(false);
    expect(isInUse({ disk, app: { id: "a", name: "a", status: "stopped" } })).toBe(false);
    expect(isInUse({ disk, app: { id: "a", name: "a", status: "running" } })).toBe(true);
  });
});
