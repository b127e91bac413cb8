import { createRoute, z } from "@hono/zod-openapi";
import { mountPathProblem } from "../../builder/src/protocol/jobs";
import { appChanged } from "../services/cron-targets";
import { requireScope } from "../auth/middleware";
import { DISK_STATUSES } from "../db/schema";
import { authErrors, errorResponse, jsonBody, newRouter, planLimited } from "../lib/router";
import { ApplyQuery, DnsLabel, Deleted, dataOf, MetricsQuery, Ref, withRollout } from "../lib/schemas";
import type { Db } from "../db/client";
import type { AppRow } from "../db/schema";
import type { Env } from "../env";
import { runsProcess } from "../services/app-runtime";
import { configChanged, type Rollout } from "../services/rollout";
import { resolveApp } from "../services/apps";
import { DEFAULT_SNAPSHOT_INTERVAL_HOURS, DEFAULT_SNAPSHOT_KEEP, MAX_SNAPSHOT_INTERVAL_HOURS } from "../lib/snapshot-schedule";
import { PLAN_LIMITS } from "../lib/plans";
import { attachDisk, createDisk, deleteDisk, detachDisk, diskView, listDisks, resolveDisk, updateDisk } from "../services/disks";
import { diskMetrics } from "../services/metrics";

const ALERT_DESCRIPTION = "Send `disk.almost_full` when the disk's bytes or files reach this percent of its size or inode limit (again only after it fell 5 points below)";
const AlertAt = z.number().int().min(1).max(100).openapi({ description: ALERT_DESCRIPTION });

const DiskSchema = z
  .object({
    id: z.string().openapi({ example: "disk_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    name: z.string(),
    sizeGb: z.number().int(),
    mountPath: z.string(),
    status: z.enum(DISK_STATUSES),
    appId: z.string().nullable(),
    appName: z.string().nullable(),
    inUse: z.boolean().openapi({ description: "Attached to a running app (restores are refused while true)" }),
    snapshotIntervalHours: z.number().int().openapi({ description: "Hours between automatic snapshots; 0 when they are off", example: 24 }),
    snapshotKeep: z.number().int().openapi({ description: "Ready automatic snapshots kept; older ones are deleted when a new one is ready", example: 7 }),
    nextSnapshotAt: z.string().nullable().openapi({
      description: "When the next automatic snapshot starts (within 5 minutes of it; a time past means at the next pass); null when off",
    }),
    snapshotSkipped: z.string().nullable().openapi({
      description: "Why the last automatic snapshot that was due did not start (backup space full, disk busy…); null once one starts",
    }),
    placement: z.string().nullable().openapi({
      description:
        "What happened to the disk when the machine holding it was lost or emptied: where it was restored, from which backup, and what was lost; null when nothing did",
      example: "node local-2 was lost at 2026-11-24T03:12:09Z; restored on node local-1 from the backup begun at 2026-11-24T03:00:00Z (bak_…); writes since it began may be lost",
    }),
    alertAtPercent: z.number().int().openapi({ description: ALERT_DESCRIPTION, example: 90 }),
    usedBytes: z
      .number()
      .int()
      .nullable()
      .openapi({
        description:
          "Bytes the disk's files take (allocated blocks, so a sparse file counts what it holds), measured when the disk is read or listed; null when the node holding it did not answer in time, while it is restoring, and in responses to changes",
        example: 52428800,
      }),
    createdAt: z.string(),
    updatedAt: z.string(),
  })
  .openapi("Disk");

const MountPath = z
  .string()
  .max(255)
  .regex(/^\/[A-Za-z0-9._\-/]*$/, "must be an absolute path of letters, digits, '.', '_', '-' and '/'")
  .superRefine((path, context) => {
    // Jobs see the disk at this path inside their sandbox, whose own directories it may not cover.
    const problem = mountPathProblem(path);
    if (problem) context.addIssue({ code: "custom", message: problem });
  });

const INTERVAL_DESCRIPTION = `Hours between automatic snapshots, 1-${MAX_SNAPSHOT_INTERVAL_HOURS}; 0 turns them off`;
const KEEP_DESCRIPTION = "Automatic snapshots kept, at most the plan's limit (free 7, pro 30, business 90)";
const SnapshotInterval = z.number().int().min(0).max(MAX_SNAPSHOT_INTERVAL_HOURS).openapi({ description: INTERVAL_DESCRIPTION, example: 24 });
const SnapshotKeep = z.number().int().min(1).max(PLAN_LIMITS.business.snapshotKeep).openapi({ description: KEEP_DESCRIPTION, example: 7 });

const CreateDiskBody = z
  .strictObject({
    name: DnsLabel,
    sizeGb: z.number().int().min(1).max(1000),
    mountPath: MountPath.default("/data"),
    // Optional rather than defaulted here, so generated clients need not send them; createDisk applies the defaults.
    snapshotIntervalHours: SnapshotInterval.optional().openapi({
      description: `${INTERVAL_DESCRIPTION}. Default ${DEFAULT_SNAPSHOT_INTERVAL_HOURS} (daily); the first one interval after creation`,
    }),
    snapshotKeep: SnapshotKeep.optional().openapi({ description: `${KEEP_DESCRIPTION}. Default ${DEFAULT_SNAPSHOT_KEEP}` }),
    alertAtPercent: AlertAt.optional().openapi({ description: `${ALERT_DESCRIPTION}. Default 90` }),
  })
  .openapi("CreateDisk", { example: { name: "uploads", sizeGb: 10, mountPath: "/var/data" } });

const UpdateDiskBody = z
  .strictObject({ snapshotIntervalHours: SnapshotInterval.optional(), snapshotKeep: SnapshotKeep.optional(), alertAtPercent: AlertAt.optional() })
  .refine((b) => Object.keys(b).length > 0, "supply at least one field to change")
  .openapi("UpdateDisk", { example: { snapshotIntervalHours: 12, snapshotKeep: 14 } });

const AttachBody = z.strictObject({ app: Ref.openapi({ description: "App id or name" }) }).openapi("AttachDisk");

const DiskParam = z.object({ disk: Ref.openapi({ description: "Disk id or name" }) });
const security = [{ bearerAuth: [] }];
const diskResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: dataOf(DiskSchema) } },
});
const notFound = { 404: errorResponse("No such disk in this account (DISK_NOT_FOUND)") };

/**
 * A disk came or went: an app that runs starts again with it mounted (or
 * without it), stopping first since one process writes a disk at a time; a
 * static site's cron runs simply see it from their next run.
 */
async function diskChanged(env: Env, db: Db, app: AppRow, cause: string, apply: boolean): Promise<Rollout> {
  if (runsProcess(app.runtime)) return configChanged(env, db, app, cause, apply);
  await appChanged(env, db, app.id);
  return { applied: true, deploymentId: null, message: `${cause}; ${app.name}'s cron runs see it from their next run` };
}
const builderDown = { 502: errorResponse("The builder could not be reached (BUILDER_UNAVAILABLE); nothing changed") };

export const diskRoutes = newRouter();
diskRoutes.use("*", requireScope("deploy"));

diskRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Create a persistent disk",
    tags: ["Disks"],
    security,
    request: { body: jsonBody(CreateDiskBody) },
    responses: {
      201: diskResponse("Created"),
      ...authErrors,
      ...planLimited,
      409: errorResponse("Name taken (NAME_TAKEN)"),
      ...builderDown,
      507: errorResponse("No builder has room for a disk of this size (INSUFFICIENT_STORAGE); nothing changed"),
    },
  }),
  async (c) => {
    const disk = await createDisk(c.get("db"), c.env, c.get("principal").accountId, c.req.valid("json"));
    return c.json({ data: disk }, 201);
  },
);

diskRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List disks",
    tags: ["Disks"],
    security,
    responses: {
      200: { description: "Disks, newest first", content: { "application/json": { schema: dataOf(z.array(DiskSchema)) } } },
      ...authErrors,
    },
  }),
  async (c) => c.json({ data: await listDisks(c.get("db"), c.env, c.get("principal").accountId) }, 200),
);

diskRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{disk}",
    summary: "Get a disk",
    tags: ["Disks"],
    security,
    request: { params: DiskParam },
    responses: { 200: diskResponse("The disk"), ...authErrors, ...notFound },
  }),
  async (c) => c.json({ data: await diskView(c.get("db"), c.env, c.get("principal").accountId, c.req.valid("param").disk) }, 200),
);

diskRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{disk}/metrics",
    summary: "A disk's use over time",
    description:
      "The most bytes and files (inodes) the disk held in each step, as the node holding it measures it every 10 s, against its size and inode limit; kept per minute for 7 days and per hour for 30 (docs/metrics.md). A disk past its `alertAtPercent` sends `disk.almost_full`.",
    tags: ["Disks"],
    security,
    request: { params: DiskParam, query: MetricsQuery },
    responses: {
      200: {
        description: "Every step of the range, oldest first (null: not measured then)",
        content: {
          "application/json": {
            schema: dataOf(
              z.object({
                since: z.string(),
                stepSeconds: z.number().int(),
                sizeBytes: z.number().int().nullable().openapi({ description: "As last measured; null before the first measure" }),
                inodeLimit: z.number().int().nullable(),
                points: z.array(z.object({ at: z.string(), usedBytes: z.number().int().nullable(), usedInodes: z.number().int().nullable() })),
              }),
            ),
          },
        },
      },
      ...authErrors,
      ...notFound,
    },
  }),
  async (c) => {
    const { disk } = await resolveDisk(c.get("db"), c.get("principal").accountId, c.req.valid("param").disk);
    const since = c.req.valid("query").since;
    return c.json({ data: { since, ...(await diskMetrics(c.env, disk.id, since)) } }, 200);
  },
);

diskRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{disk}",
    summary: "Change a disk's automatic snapshots or alert threshold",
    description:
      "Only the supplied fields change. A new interval starts the schedule afresh (the next snapshot one interval from now); 0 turns snapshots off, keeping those already made until their retention ends. A smaller snapshotKeep deletes the oldest automatic snapshots beyond it when the next one is ready.",
    tags: ["Disks"],
    security,
    request: { params: DiskParam, body: jsonBody(UpdateDiskBody) },
    responses: { 200: diskResponse("The disk after the change"), ...authErrors, ...planLimited, ...notFound },
  }),
  async (c) =>
    c.json({ data: await updateDisk(c.get("db"), c.get("principal").accountId, c.req.valid("param").disk, c.req.valid("json")) }, 200),
);

diskRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{disk}/attach",
    summary: "Attach a disk to an app",
    tags: ["Disks"],
    security,
    request: { params: DiskParam, query: ApplyQuery, body: jsonBody(AttachBody) },
    responses: {
      200: withRollout(DiskSchema, "The disk, attached, and the app's rollout with it mounted"),
      ...authErrors,
      404: errorResponse("No such disk (DISK_NOT_FOUND) or app (APP_NOT_FOUND)"),
      409: errorResponse("Attached to another app (DISK_ATTACHED), or the app already has a disk (APP_HAS_DISK)"),
    },
  }),
  async (c) => {
    const accountId = c.get("principal").accountId;
    const app = await resolveApp(c.get("db"), accountId, c.req.valid("json").app);
    const disk = await attachDisk(c.get("db"), accountId, c.req.valid("param").disk, app);
    const rollout = await diskChanged(c.env, c.get("db"), app, `disk ${disk.name} attached at ${disk.mountPath}`, c.req.valid("query").apply !== "false");
    return c.json({ data: disk, rollout }, 200);
  },
);

diskRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{disk}/detach",
    summary: "Detach a disk from its app",
    tags: ["Disks"],
    security,
    request: { params: DiskParam, query: ApplyQuery },
    responses: { 200: withRollout(DiskSchema, "The disk, detached, and its former app's rollout without it"), ...authErrors, ...notFound },
  }),
  async (c) => {
    const db = c.get("db");
    const accountId = c.get("principal").accountId;
    const { disk, formerAppId } = await detachDisk(db, accountId, c.req.valid("param").disk);
    const app = formerAppId ? await resolveApp(db, accountId, formerAppId) : null;
    const rollout = app
      ? await diskChanged(c.env, db, app, `disk ${disk.name} detached`, c.req.valid("query").apply !== "false")
      : { applied: true, deploymentId: null, message: `disk ${disk.name} was not attached to an app` };
    return c.json({ data: disk, rollout }, 200);
  },
);

diskRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{disk}",
    summary: "Delete a disk and its data",
    description: "Refused while the disk is attached to an app.",
    tags: ["Disks"],
    security,
    request: { params: DiskParam },
    responses: {
      200: { description: "Deleted", content: { "application/json": { schema: dataOf(Deleted) } } },
      ...authErrors,
      ...notFound,
      409: errorResponse("Still attached (DISK_ATTACHED), being restored (DISK_IN_USE) or backed up (DISK_BUSY)"),
      ...builderDown,
    },
  }),
  async (c) => {
    const id = await deleteDisk(c.get("db"), c.env, c.get("principal").accountId, c.req.valid("param").disk);
    return c.json({ data: { id, deleted: true as const } }, 200);
  },
);
