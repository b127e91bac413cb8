import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { applyQuery, ROLLOUT_OPTIONS, type Rollout, reportRollout } from "../rollout.js";
import { ago, fields, table, when } from "../output.js";
import { hoursOrOff, positiveInteger } from "../parse.js";
import { formatBytes } from "../progress.js";
import { confirmOrRefuse } from "../prompt.js";
import { rangeLine, SINCE_OPTION, sinceOf, stepTime } from "./metrics.js";

/** A persistent disk as the API returns it. */
type Disk = Schemas["Disk"];
type Deleted = ResponseData<"/v1/disks/{disk}", "delete", 200>;
type DiskMetrics = ResponseData<"/v1/disks/{disk}/metrics", "get", 200>;

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
    ["alert at", `${disk.alertAtPercent}% of its size or inode limit (disk.almost_full webhook)`],
  ];
  if (disk.nextSnapshotAt) rows.push(["next snapshot", when(disk.nextSnapshotAt)]);
  if (disk.snapshotSkipped) rows.push(["last skipped", disk.snapshotSkipped]);
  rows.push(["created", when(disk.createdAt)]);
  return fields(rows);
}

/** The settings flags of create and update: automatic snapshots and the alert threshold. */
const SETTINGS_OPTIONS = {
  "snapshot-every": {
    type: "string",
    value: "interval",
    description: "automatic snapshot interval in whole hours (12h, 1d, 1w, at most a week) or off; default 1d",
  },
  "snapshot-keep": { type: "string", value: "N", description: "automatic snapshots to keep (default 7; at most 7/30/90 on free/pro/business)" },
  "alert-at": {
    type: "string",
    value: "percent",
    description: "send the disk.almost_full webhook when its bytes or files reach this percent of its size or inode limit, 1-100 (default 90)",
  },
} as const;

const SETTINGS_FLAGS = { snapshotIntervalHours: "--snapshot-every", snapshotKeep: "--snapshot-keep", alertAtPercent: "--alert-at" };

/** A whole percent from 1 to 100, `80` or `80%`. */
function percent(value: string, flag: string, fail: (message: string) => Error): number {
  const n = positiveInteger(value.trim().replace(/%$/, ""), flag, fail);
  if (n > 100) throw fail(`${flag} must be a whole percent from 1 to 100, got "${value}"`);
  return n;
}

/** The body fields the settings flags that were given ask for. */
function settings(
  opts: { "snapshot-every"?: string; "snapshot-keep"?: string; "alert-at"?: string },
  fail: (message: string) => Error,
): { snapshotIntervalHours?: number; snapshotKeep?: number; alertAtPercent?: number } {
  const every = opts["snapshot-every"];
  const keep = opts["snapshot-keep"];
  const alertAt = opts["alert-at"];
  return {
    ...(every === undefined ? {} : { snapshotIntervalHours: hoursOrOff(every, "--snapshot-every", fail) }),
    ...(keep === undefined ? {} : { snapshotKeep: positiveInteger(keep, "--snapshot-keep", fail) }),
    ...(alertAt === undefined ? {} : { alertAtPercent: percent(alertAt, "--alert-at", fail) }),
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
    ...SETTINGS_OPTIONS,
  },
  examples: [
    "svc disk create --name uploads --size 10 --mount-path /data",
    "svc disk create --name cache --size 1 --snapshot-every off --alert-at 95",
  ],
  async run({ opts, out, api, fail }) {
    const sizeGb = positiveInteger(opts.size, "--size", fail);
    const mountPath = opts["mount-path"];
    const disk = await (await api()).data<Disk>(
      "POST",
      "/v1/disks",
      { name: opts.name, sizeGb, ...(mountPath === undefined ? {} : { mountPath }), ...settings(opts, fail) },
      {
        what: `create disk ${opts.name}`,
        flags: { name: "--name", sizeGb: "--size", mountPath: "--mount-path", ...SETTINGS_FLAGS },
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
  summary: "Change a disk's automatic snapshots or alert threshold; only the given options change",
  description: `A new interval starts the schedule afresh: the next snapshot is one interval from now.
--snapshot-every off stops them; the snapshots already made stay until the plan's retention ends.
A smaller --snapshot-keep deletes the oldest automatic snapshots beyond it when the next one is ready.
--alert-at sets when disk.almost_full is sent: once the disk's bytes or files reach that percent of
its size or inode limit, and again only after it fell 5 points below.`,
  args: DISK_ARG,
  options: SETTINGS_OPTIONS,
  examples: ["svc disk update uploads --snapshot-every 6h --snapshot-keep 14", "svc disk update cache --snapshot-every off", "svc disk update uploads --alert-at 80"],
  async run({ args, opts, out, api, fail }) {
    const body = settings(opts, fail);
    if (Object.keys(body).length === 0) throw fail("nothing to change: pass at least one of --snapshot-every, --snapshot-keep, --alert-at");
    const disk = await (await api()).data<Disk>(
      "PATCH",
      path`/v1/disks/${args.disk}`,
      body,
      { ...aboutDisk(`update disk ${args.disk}`, args.disk, SNAPSHOT_HINTS), flags: SETTINGS_FLAGS },
    );
    out.result(disk, `Updated disk ${disk.name}\n${describe(disk)}`);
  },
});

/** `12.0 MiB` as a share of `limit`: `3%`, `<1%`; "-" when the limit is unknown. */
function share(value: number, limit: number | null): string {
  if (limit === null || limit <= 0) return "-";
  const percent = (value / limit) * 100;
  return `${percent > 0 && percent < 1 ? "<1" : Math.round(percent)}%`;
}

const metrics = defineCommand({
  name: "metrics",
  summary: "Show a disk's use over time: bytes against its size, files against its inode limit",
  description: `The most bytes and files (inodes) the disk held in each step, as the node holding it measures it
every 10 s: --since 1h (1-minute steps), 24h (15 minutes), 7d (2 hours), 30d (6 hours). Steps without a
measure are left out of the table (--json has every step). More: docs/metrics.md.`,
  args: DISK_ARG,
  options: { since: SINCE_OPTION },
  examples: ["svc disk metrics uploads", "svc disk metrics uploads --since 7d --json"],
  async run({ args, opts, out, api, fail }) {
    const since = sinceOf(opts.since, fail);
    const data = await (await api()).data<DiskMetrics>(
      "GET",
      `${path`/v1/disks/${args.disk}/metrics`}?since=${since}`,
      undefined,
      aboutDisk(`show the metrics of disk ${args.disk}`, args.disk),
    );
    const measured = data.points.flatMap((p) => (p.usedBytes === null ? [] : [{ ...p, usedBytes: p.usedBytes, usedInodes: p.usedInodes ?? 0 }]));
    const most = measured.reduce((top, p) => (p.usedBytes > top ? p.usedBytes : top), 0);
    const head = fields([
      ["range", rangeLine(since, data.stepSeconds)],
      ["size", data.sizeBytes === null ? "not measured yet" : formatBytes(data.sizeBytes)],
      ["inode limit", data.inodeLimit === null ? "not measured yet" : String(data.inodeLimit)],
      ...(measured.length === 0 ? [] : ([["most used", `${formatBytes(most)} (${share(most, data.sizeBytes)})`]] as [string, string][])),
    ]);
    const rows =
      measured.length === 0
        ? `No measure of disk ${args.disk} in the last ${since}: its node measures it every 10 s while it holds it.`
        : table(measured, [
            ["TIME", (p) => stepTime(p.at)],
            ["USED", (p) => formatBytes(p.usedBytes)],
            ["% SIZE", (p) => share(p.usedBytes, data.sizeBytes)],
            ["FILES", (p) => String(p.usedInodes)],
            ["% INODES", (p) => share(p.usedInodes, data.inodeLimit)],
          ]);
    out.result(data, `${head}\n\n${rows}`);
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
export const disk: Group = { name: "disk", summary: "Manage persistent disks", commands: [create, list, info, update, metrics, attach, detach, remove] };
