import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, fields, table, when } from "../output.js";
import { positiveInteger } from "../parse.js";
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

function describe(disk: Disk): string {
  return fields([
    ["id", disk.id],
    ["name", disk.name],
    ["size", `${disk.sizeGb} GB`],
    ["mount path", disk.mountPath],
    ["app", disk.appName ? `${disk.appName} (${disk.appId})` : "not attached"],
    ["in use", disk.inUse ? "yes (attached to a running app)" : "no"],
    ["created", when(disk.createdAt)],
  ]);
}

const DISK_ARG = [{ name: "disk", description: "disk name or id" }] as const;

const create = defineCommand({
  name: "create",
  summary: "Create a persistent disk",
  options: {
    name: { type: "string", value: "name", description: "disk name", required: true },
    size: { type: "string", value: "GB", description: "size in GB", required: true },
    "mount-path": { type: "string", value: "path", description: "where apps see it (default chosen by the API, e.g. /data)" },
  },
  examples: ["svc disk create --name uploads --size 10 --mount-path /data"],
  async run({ opts, out, api, fail }) {
    const sizeGb = positiveInteger(opts.size, "--size", fail);
    const mountPath = opts["mount-path"];
    const disk = await (await api()).data<Disk>(
      "POST",
      "/v1/disks",
      { name: opts.name, sizeGb, ...(mountPath === undefined ? {} : { mountPath }) },
      {
        what: `create disk ${opts.name}`,
        flags: { name: "--name", sizeGb: "--size", mountPath: "--mount-path" },
        hints: { NAME_TAKEN: "this account already has a disk with that name: choose another --name" },
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
            ["MOUNT PATH", (d) => d.mountPath],
            ["APP", (d) => d.appName ?? "-"],
            ["IN USE", (d) => (d.inUse ? "yes" : "no")],
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

const attach = defineCommand({
  name: "attach",
  summary: "Attach a disk to an app",
  args: [...DISK_ARG, APP_ARG],
  options: {},
  examples: ["svc disk attach uploads --app my-site"],
  async run({ args, out, api }) {
    const disk = await (await api()).data<Disk>(
      "POST",
      path`/v1/disks/${args.disk}/attach`,
      { app: args.app },
      aboutDisk(`attach disk ${args.disk} to app ${args.app}`, args.disk, {
        APP_NOT_FOUND: `no app "${args.app}" in this account: \`svc apps list\` shows the names and ids`,
        DISK_ATTACHED: "a disk serves one app: detach it from the app named above first (svc disk detach <disk>)",
        APP_HAS_DISK: `an app has one disk: detach the disk named above first (svc disk detach <disk>), then attach ${args.disk}`,
      }),
    );
    out.result(disk, `Attached disk ${disk.name} to app ${disk.appName ?? args.app} at ${disk.mountPath}`);
  },
});

const detach = defineCommand({
  name: "detach",
  summary: "Detach a disk from its app",
  args: DISK_ARG,
  options: {},
  async run({ args, out, api }) {
    const disk = await (await api()).data<Disk>(
      "POST",
      path`/v1/disks/${args.disk}/detach`,
      undefined,
      aboutDisk(`detach disk ${args.disk}`, args.disk),
    );
    out.result(disk, `Detached disk ${disk.name}`);
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
export const disk: Group = { name: "disk", summary: "Manage persistent disks", commands: [create, list, info, attach, detach, remove] };
