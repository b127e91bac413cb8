import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { applyQuery, ROLLOUT_OPTIONS, type Rollout, reportRollout } from "../rollout.js";
import { ago, fields, table, when } from "../output.js";
import { hoursOrOff, positiveInteger } from "../parse.js";
import { formatBytes } from "../progress.js";
import { confirmOrRefuse } from "../prompt.js";

/** A persistent disk as the API returns it. */
type Disk = Schemas["Disk"];
type Deleted = ResponseData<"/v1/disks/{disk}", "delete", 200>;

/** Error context for a call about one disk, so "not found" and "attached" name the disk. */
function aboutDisk(what: string, disk: string, extra: Call["hints"] = {}): Call {
  return {
    what,
    hints: {
      DISK_NOT_FOUND: `no disk "${disk}" in this account: \`svc disk list\` shows the names and ids`,
      DISK_ATTACHED: `detach it first: svc disk detach ${disk}`,
      ...extra,
    },
  };
}

/** How often a disk is snapshotted, as people say it: "daily", "every 6 hours", "off". */
export function snapshotEvery(hours: number): string {
  if (hours === 0) return "off";
  const named: Record<number, string> = { 1: "hourly", 24: "daily", 168: "weekly" };
  if (named[hours]) return named[hours];
  return hours % 24 === 0 ? `every ${hours / 24} days` : `every ${hours} hours`;
}

function snapshots(disk: Disk): string {
  return disk.snapshotIntervalHours === 0 ? "off" : `${snapshotEvery(disk.snapshotIntervalHours)}, keeping ${disk.snapshotKeep}`;
}

/** `12.0 MiB (1%)` of the disk's size; "-" when the node holding it did not say (see Disk.usedBytes). */
function used(disk: Pick<Disk, "usedBytes" | "sizeGb">): string {
  if (disk.usedBytes === null) return "-";
  const percent = (disk.usedBytes / (disk.sizeGb * 1024 ** 3)) * 100;
  return `${formatBytes(disk.usedBytes)} (${percent > 0 && percent < 1 ? "<1" : Math.round(percent)}%)`;
}

function describe(disk: Disk): string {
  const rows: [string, string][] = [
    ["id", disk.id],
    ["name", disk.name],
    ["size", `${disk.sizeGb} GB`],
    ...(disk.usedBytes === null ? [] : ([["used", used(disk)]] as [string, string][])),
    ["mount path", disk.mountPath],
    ["app", disk.appName ? `${disk.appName} (${disk.appId})` : "not attached"],
    ["in use", disk.inUse ? "yes (attached to a running app)" : "no"],
    ["snapshots", snapshots(disk)],
  ];
  if (disk.nextSnapshotAt) rows.push(["next snapshot", when(disk.nextSnapshotAt)]);
  if (disk.snapshotSkipped) rows.push(["last skipped", disk.snapshotSkipped]);
  rows.push(["created", when(disk.createdAt)]);
  return fields(rows);
}

/** The snapshot flags of create and update. */
const SNAPSHOT_OPTIONS = {
  "snapshot-every": {
    type: "string",
    value: "interval",
    description: "automatic snapshot interval in whole hours (12h, 1d, 1w, at most a week) or off; default 1d",
  },
  "snapshot-keep": { type: "string", value: "N", description: "automatic snapshots to keep (default 7; at most 7/30/90 on free/pro/business)" },
} as const;

const SNAPSHOT_FLAGS = { snapshotIntervalHours: "--snapshot-every", snapshotKeep: "--snapshot-keep" };

/** The body fields the snapshot flags that were given ask for. */
function snapshotSettings(
  opts: { "snapshot-every"?: string; "snapshot-keep"?: string },
  fail: (message: string) => Error,
): { snapshotIntervalHours?: number; snapshotKeep?: number } {
  const every = opts["snapshot-every"];
  const keep = opts["snapshot-keep"];
  return {
    ...(every === undefined ? {} : { snapshotIntervalHours: hoursOrOff(every, "--snapshot-every", fail) }),
    ...(keep === undefined ? {} : { snapshotKeep: positiveInteger(keep, "--snapshot-keep", fail) }),
  };
}

const SNAPSHOT_HINTS = {
  PLAN_LIMIT_EXCEEDED: "keep fewer automatic snapshots (--snapshot-keep), or upgrade the plan",
};

const DISK_ARG = [{ name: "disk", description: "disk name or id" }] as const;

const create = defineCommand({
  name: "create",
  summary: "Create a persistent disk",
  options: {
    name: { type: "string", value: "name", description: "disk name", required: true },
    size: { type: "string", value: "GB", description: "size in GB", required: true },
    "mount-path": { type: "string", value: "path", description: "where apps see it (default chosen by the API, e.g. /data)" },
    ...SNAPSHOT_OPTIONS,
  },
  examples: ["svc disk create --name uploads --size 10 --mount-path /data", "svc disk create --name cache --size 1 --snapshot-every off"],
  async run({ opts, out, api, fail }) {
    const sizeGb = positiveInteger(opts.size, "--size", fail);
    const mountPath = opts["mount-path"];
    const disk = await (await api()).data<Disk>(
      "POST",
      "/v1/disks",
      { name: opts.name, sizeGb, ...(mountPath === undefined ? {} : { mountPath }), ...snapshotSettings(opts, fail) },
      {
        what: `create disk ${opts.name}`,
        flags: { name: "--name", sizeGb: "--size", mountPath: "--mount-path", ...SNAPSHOT_FLAGS },
        hints: { NAME_TAKEN: "this account already has a disk with that name: choose another --name", ...SNAPSHOT_HINTS },
      },
    );
    out.result(disk, `Created disk ${disk.name}\n${describe(disk)}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List your disks",
  options: {},
  async run({ out, api }) {
    const disks = await (await api()).data<Disk[]>("GET", "/v1/disks", undefined, { what: "list disks" });
    const human =
      disks.length === 0
        ? "No disks yet. Create one: svc disk create --name <name> --size <GB>"
        : table(disks, [
            ["NAME", (d) => d.name],
            ["ID", (d) => d.id],
            ["SIZE", (d) => `${d.sizeGb} GB`],
            ["USED", used],
            ["MOUNT PATH", (d) => d.mountPath],
            ["APP", (d) => d.appName ?? "-"],
            ["IN USE", (d) => (d.inUse ? "yes" : "no")],
            ["SNAPSHOTS", (d) => (d.snapshotIntervalHours === 0 ? "off" : `${snapshotEvery(d.snapshotIntervalHours)} (keep ${d.snapshotKeep})`)],
            ["CREATED", (d) => ago(d.createdAt)],
          ]);
    out.result(disks, human);
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show a disk's details",
  args: DISK_ARG,
  options: {},
  async run({ args, out, api }) {
    const disk = await (await api()).data<Disk>("GET", path`/v1/disks/${args.disk}`, undefined, aboutDisk(`show disk ${args.disk}`, args.disk));
    out.result(disk, describe(disk));
  },
});

const update = defineCommand({
  name: "update",
  summary: "Change a disk's automatic snapshots; only the given options change",
  description: `A new interval starts the schedule afresh: the next snapshot is one interval from now.
--snapshot-every off stops them; the snapshots already made stay until the plan's retention ends.
A smaller --snapshot-keep deletes the oldest automatic snapshots beyond it when the next one is ready.`,
  args: DISK_ARG,
  options: SNAPSHOT_OPTIONS,
  examples: ["svc disk update uploads --snapshot-every 6h --snapshot-keep 14", "svc disk update cache --snapshot-every off"],
  async run({ args, opts, out, api, fail }) {
    const body = snapshotSettings(opts, fail);
    if (Object.keys(body).length === 0) throw fail("nothing to change: pass --snapshot-every, --snapshot-keep or both");
    const disk = await (await api()).data<Disk>(
      "PATCH",
      path`/v1/disks/${args.disk}`,
      body,
      { ...aboutDisk(`update disk ${args.disk}`, args.disk, SNAPSHOT_HINTS), flags: SNAPSHOT_FLAGS },
    );
    out.result(disk, `Updated disk ${disk.name}\n${describe(disk)}`);
  },
});

type Changed = { data: Disk; rollout: Rollout };

const attach = defineCommand({
  name: "attach",
  summary: "Attach a disk to an app; an app that runs starts again with it mounted",
  description: `An app that runs is stopped and started again with the disk at its mountPath (one process writes
a disk at a time), recorded in its deployments as "config: disk … attached", and this command follows
it like svc deploy. With --no-apply the change waits for \`svc apps apply <app>\`.`,
  args: [...DISK_ARG, APP_ARG],
  options: { ...ROLLOUT_OPTIONS },
  examples: ["svc disk attach uploads --app my-site"],
  async run({ args, opts, out, api, env }) {
    const client = await api();
    const changed = await client.json<Changed>(
      "POST",
      `${path`/v1/disks/${args.disk}/attach`}${applyQuery(opts)}`,
      { app: args.app },
      aboutDisk(`attach disk ${args.disk} to app ${args.app}`, args.disk, {
        APP_NOT_FOUND: `no app "${args.app}" in this account: \`svc apps list\` shows the names and ids`,
        DISK_ATTACHED: "a disk serves one app: detach it from the app named above first (svc disk detach <disk>)",
        APP_HAS_DISK: `an app has one disk: detach the disk named above first (svc disk detach <disk>), then attach ${args.disk}`,
      }),
    );
    const disk = changed.data;
    out.step(`Attached disk ${disk.name} to app ${disk.appName ?? args.app} at ${disk.mountPath}`);
    await reportRollout(out, client, disk.appName ?? args.app, changed.rollout, { follow: !opts["no-follow"], env });
    out.result(changed.data);
  },
});

const detach = defineCommand({
  name: "detach",
  summary: "Detach a disk from its app; an app that runs starts again without it",
  args: DISK_ARG,
  options: { ...ROLLOUT_OPTIONS },
  async run({ args, opts, out, api, env }) {
    const client = await api();
    const before = await client.data<Disk>("GET", path`/v1/disks/${args.disk}`, undefined, aboutDisk(`look at disk ${args.disk}`, args.disk));
    const changed = await client.json<Changed>("POST", `${path`/v1/disks/${args.disk}/detach`}${applyQuery(opts)}`, undefined, aboutDisk(`detach disk ${args.disk}`, args.disk));
    out.step(`Detached disk ${changed.data.name}${before.appName ? ` from app ${before.appName}` : ""}`);
    if (before.appName) await reportRollout(out, client, before.appName, changed.rollout, { follow: !opts["no-follow"], env });
    out.result(changed.data);
  },
});

const remove = defineCommand({
  name: "delete",
  summary: "Delete a disk, its data and its backups (refused while attached)",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: DISK_ARG,
  options: { yes: YES_OPTION },
  examples: ["svc disk delete uploads --yes"],
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `delete disk ${args.disk}`,
      question: `Delete disk ${args.disk} with all its data and all its backups? This cannot be undone.`,
      retry: `svc disk delete ${args.disk}`,
    });
    const deleted = await (await api()).data<Deleted>(
      "DELETE",
      path`/v1/disks/${args.disk}`,
      undefined,
      aboutDisk(`delete disk ${args.disk}`, args.disk),
    );
    out.result(deleted, `Deleted disk ${args.disk} (${deleted.id})`);
  },
});

/** `svc disk …`: persistent disks and where they are attached. */
export const disk: Group = { name: "disk", summary: "Manage persistent disks", commands: [create, list, info, update, attach, detach, remove] };
