import { describe, expect, it } from "vitest";
import { PLAN_LIMITS } from "../../worker/lib/plans";
import { call, type ErrorJson, json, newAccount } from "./helpers";

const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`;

/** Answers of requests made at once: what a client racing itself gets. */
async function statuses(requests: Promise<Response>[]): Promise<number[]> {
  return (await Promise.all(requests)).map((r) => r.status).sort();
}

async function expectPlanLimit(res: Response, message: RegExp): Promise<void> {
  expect(res.status).toBe(403);
  const body = await json<ErrorJson>(res);
  expect(body.error.code).toBe("PLAN_LIMIT_EXCEEDED");
  expect(body.error.message).toMatch(message);
  expect(body.error.message).toMatch(/upgrade the plan/);
}

describe("plan limits: what an account may reserve", () => {
  it("app memory above the plan's maximum is refused (403 PLAN_LIMIT_EXCEEDED); at the maximum it is accepted", async () => {
    const free = PLAN_LIMITS.free.appMemoryMb;
    const { adminKey: key } = await newAccount("free");
    const over = await call("/v1/apps", { method: "POST", key, body: { name: unique("big"), runtime: "node", memoryMb: 16_384 } });
    await expectPlanLimit(over, new RegExp(`at most ${free} MB of memory \\(asked for 16384 MB\\) on the free plan`));
    const justOver = await call("/v1/apps", { method: "POST", key, body: { name: unique("big"), runtime: "node", memoryMb: free + 1 } });
    expect(justOver.status).toBe(403);
    const at = await call("/v1/apps", { method: "POST", key, body: { name: unique("fits"), runtime: "node", memoryMb: free } });
    expect(at.status).toBe(201);

    const { adminKey: business } = await newAccount("business");
    const big = await call("/v1/apps", { method: "POST", key: business, body: { name: unique("big"), runtime: "node", memoryMb: 16_384 } });
    expect(big.status).toBe(201);
  });

  it("app count and the apps' total memory are bounded, even for creations made at once (issue 28)", async () => {
    const { apps, totalAppMemoryMb, appMemoryMb } = PLAN_LIMITS.pro;
    const { adminKey: key } = await newAccount("pro");
    // Four apps at the plan's largest memory, made at once: only what the plan's total holds is made.
    const fit = Math.floor(totalAppMemoryMb / appMemoryMb);
    const made = await statuses(
      Array.from({ length: fit + 2 }, () => call("/v1/apps", { method: "POST", key, body: { name: unique("big"), runtime: "node", memoryMb: appMemoryMb } })),
    );
    expect(made.filter((s) => s === 201)).toHaveLength(fit);
    expect(made.filter((s) => s === 403)).toHaveLength(2);
    const over = await call("/v1/apps", { method: "POST", key, body: { name: unique("one-more"), runtime: "python", memoryMb: 128 } });
    await expectPlanLimit(
      over,
      new RegExp(`apps may reserve ${totalAppMemoryMb} MB of memory in all; ${fit * appMemoryMb} MB are reserved and this app asks for 128 MB`),
    );
    // Static sites run no process: they reserve no memory, and count as apps.
    const listed = await json<{ data: unknown[] }>(await call("/v1/apps", { key }));
    const statics = await statuses(
      Array.from({ length: apps - listed.data.length + 1 }, () => call("/v1/apps", { method: "POST", key, body: { name: unique("site"), runtime: "static" } })),
    );
    expect(statics.filter((s) => s === 403)).toHaveLength(1);
    await expectPlanLimit(
      await call("/v1/apps", { method: "POST", key, body: { name: unique("site"), runtime: "static" } }),
      new RegExp(`may have ${apps} apps and has ${apps}`),
    );
    expect((await json<{ data: unknown[] }>(await call("/v1/apps", { key }))).data).toHaveLength(apps);
  });

  it("a disk larger than the plan allows is refused before anything is made", async () => {
    const { adminKey: key } = await newAccount("free");
    const max = PLAN_LIMITS.free.diskSizeGb;
    const over = await call("/v1/disks", { method: "POST", key, body: { name: "huge", sizeGb: 1000 } });
    await expectPlanLimit(over, new RegExp(`at most ${max} GB \\(asked for 1000 GB\\)`));
    const list = await json<{ data: unknown[] }>(await call("/v1/disks", { key }));
    expect(list.data).toEqual([]);
  });

  it("disk count and total size are bounded, even for creations made at once", async () => {
    const { adminKey: key } = await newAccount("free");
    const { disks, totalDiskGb } = PLAN_LIMITS.free;
    // More small disks at once than the plan allows: exactly `disks` of them are made.
    const made = await statuses(Array.from({ length: disks + 3 }, (_, i) => call("/v1/disks", { method: "POST", key, body: { name: `d${i}`, sizeGb: 1 } })));
    expect(made.filter((s) => s === 201)).toHaveLength(disks);
    expect(made.filter((s) => s === 403)).toHaveLength(3);
    const refused = await call("/v1/disks", { method: "POST", key, body: { name: "one-more", sizeGb: 1 } });
    await expectPlanLimit(refused, new RegExp(`may have ${disks} disks and has ${disks}`));
    const listed = await json<{ data: { name: string }[] }>(await call("/v1/disks", { key }));
    expect(listed.data).toHaveLength(disks);
    for (const disk of listed.data) await call(`/v1/disks/${disk.name}`, { method: "DELETE", key });

    // Two disks that each fit but not together: one of them is made.
    const half = Math.floor(totalDiskGb / 2) + 1;
    const both = await statuses([0, 1].map((i) => call("/v1/disks", { method: "POST", key, body: { name: `half${i}`, sizeGb: half } })));
    expect(both).toEqual([201, 403]);
    const total = await call("/v1/disks", { method: "POST", key, body: { name: "third", sizeGb: half } });
    await expectPlanLimit(total, new RegExp(`may hold ${totalDiskGb} GB in all; ${half} GB are taken and this disk asks for ${half} GB`));
  });

  it("cron jobs are bounded per account, even when created at once", async () => {
    const { adminKey: key } = await newAccount("free");
    const app = unique("crons");
    await call("/v1/apps", { method: "POST", key, body: { name: app, runtime: "node" } });
    const { cronJobs } = PLAN_LIMITS.free;
    const create = (name: string) =>
      call("/v1/crons", { method: "POST", key, body: { appId: app, name, schedule: "0 3 * * *", command: "true", enabled: false } });
    const made = await statuses(Array.from({ length: cronJobs + 4 }, (_, i) => create(`job${i}`)));
    expect(made.filter((s) => s === 201)).toHaveLength(cronJobs);
    expect(made.filter((s) => s === 403)).toHaveLength(4);
    await expectPlanLimit(await create("late"), new RegExp(`may have ${cronJobs} cron jobs`));
    const listed = await json<{ data: unknown[] }>(await call("/v1/crons", { key }));
    expect(listed.data).toHaveLength(cronJobs);
  });
});
