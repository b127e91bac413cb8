import { createRoute, z } from "@hono/zod-openapi";
import { requireScope } from "../auth/middleware";
import { BACKUP_STATUSES, RESTORE_STATUSES } from "../db/schema";
import { ApiError } from "../lib/errors";
import { authErrors, errorResponse, jsonBody, newRouter } from "../lib/router";
import { Ref } from "../lib/schemas";
import {
  backupArchive,
  backupViews,
  deleteBackup,
  listBackups,
  presignRestoreUpload,
  requireReady,
  resolveBackup,
  resolveRestore,
  restoreViewOf,
  startBackup,
  startRestore,
  uploadedArchive,
} from "../services/backups";
import { resolveDisk } from "../services/disks";
import { presign } from "../storage/presign";

/** Disk-backup responses carry `{data, status}` (spec, "Endpoints"). */
const envelope = <T extends z.ZodType>(schema: T) => z.object({ data: schema, status: z.number().int() });
const json = <T extends z.ZodType>(description: string, schema: T) => ({
  description,
  content: { "application/json": { schema: envelope(schema) } },
});

const BackupSchema = z
  .object({
    id: z.string().openapi({ example: "bak_0aB1cD2eF3gH4iJ5kL6mN7oP" }),
    diskId: z.string(),
    sizeBytes: z.number().int(),
    status: z.enum(BACKUP_STATUSES).openapi({ description: "`failed` (not in the spec) carries failureReason" }),
    phase: z.enum(["queued", "running"]).optional().openapi({
      description:
        "Only while `creating`: `queued` until the builder starts the snapshot (the account runs as many jobs as its plan allows, or the builder is full), then `running`",
    }),
    waiting: z.string().optional().openapi({ description: "Only while queued: why the snapshot waits" }),
    description: z.string(),
    automatic: z.boolean().openapi({
      description: "Made by the disk's snapshot schedule (description `automatic snapshot`); only these are pruned to the disk's `snapshotKeep`",
    }),
    createdAt: z.string(),
    completedAt: z.string().optional(),
    sha256: z.string().optional().openapi({ description: "SHA-256 of the .tar.gz, checked on restore" }),
    failureReason: z.string().optional(),
    expiresAt: z.string().optional().openapi({ description: "Deleted after this time (plan retention)" }),
  })
  .openapi("Backup");

const RestoreSchema = z
  .object({
    jobId: z.string(),
    diskId: z.string(),
    status: z.enum(RESTORE_STATUSES),
    phase: z.enum(["queued", "running"]).optional().openapi({
      description: "Only while `running`: `queued` until the builder starts the restore, then `running`",
    }),
    waiting: z.string().optional().openapi({ description: "Only while queued: why the restore waits" }),
    error: z.string().nullable(),
    createdAt: z.string(),
    finishedAt: z.string().nullable(),
  })
  .openapi("RestoreJob");

const DiskParam = z.object({ diskId: Ref.openapi({ description: "Disk id (or name)" }) });
const BackupParam = DiskParam.extend({ backupId: z.string().min(1).max(64) });
const security = [{ bearerAuth: [] }];
const diskNotFound = errorResponse("No such disk in this account (DISK_NOT_FOUND)");

export const backupRoutes = newRouter();
backupRoutes.use("*", requireScope("deploy"));

backupRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{diskId}/backups",
    summary: "Create a backup of a disk",
    description: "Refused when the account's backup space (disk backups plus database dumps) is full.",
    tags: ["Disk backups"],
    security,
    request: {
      params: DiskParam,
      body: jsonBody(z.strictObject({ description: z.string().max(500).default("") }).openapi("CreateBackup")),
    },
    responses: {
      201: json("Created; status `creating`", BackupSchema),
      ...authErrors,
      404: diskNotFound,
      409: errorResponse("Backup space full (BACKUP_QUOTA_EXCEEDED)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const accountId = c.get("principal").accountId;
    const { disk } = await resolveDisk(db, accountId, c.req.valid("param").diskId);
    const backup = await startBackup(db, c.env, accountId, disk, c.req.valid("json").description);
    const [view] = await backupViews(c.env, [backup]);
    return c.json({ data: view!, status: 201 }, 201);
  },
);

backupRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{diskId}/backups",
    summary: "List a disk's backups",
    tags: ["Disk backups"],
    security,
    request: { params: DiskParam },
    responses: { 200: json("Backups, newest first", z.array(BackupSchema)), ...authErrors, 404: diskNotFound },
  }),
  async (c) => {
    const { disk } = await resolveDisk(c.get("db"), c.get("principal").accountId, c.req.valid("param").diskId);
    return c.json({ data: await backupViews(c.env, await listBackups(c.get("db"), disk.id)), status: 200 }, 200);
  },
);

backupRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{diskId}/backups/{backupId}/download",
    summary: "A presigned download URL for a ready backup (valid 1 hour, supports Range)",
    tags: ["Disk backups"],
    security,
    request: { params: BackupParam },
    responses: {
      200: json("Download link", z.object({ url: z.string(), expiresAt: z.string() })),
      ...authErrors,
      404: errorResponse("No such backup (BACKUP_NOT_FOUND)"),
      409: errorResponse("Still being created, or failed (BACKUP_NOT_READY)"),
    },
  }),
  async (c) => {
    const { diskId, backupId } = c.req.valid("param");
    const { disk } = await resolveDisk(c.get("db"), c.get("principal").accountId, diskId);
    const backup = await resolveBackup(c.get("db"), disk.id, backupId);
    requireReady(backup);
    const link = await presign(c.get("config"), {
      method: "GET",
      key: backup.objectKey,
      expiresInSeconds: c.get("config").PRESIGNED_URL_TTL_SECONDS,
    });
    return c.json({ data: { url: link.url, expiresAt: new Date(link.expiresAt).toISOString() }, status: 200 }, 200);
  },
);

backupRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{diskId}/backups/restore/presign",
    summary: "A presigned upload URL for a restore archive of exactly sizeBytes (valid 1 hour)",
    description: "Above 100 MiB the response also lists part URLs for a multipart upload; pass the parts' ETags to restore.",
    tags: ["Disk backups"],
    security,
    request: {
      params: DiskParam,
      body: jsonBody(z.strictObject({ sizeBytes: z.number().int().min(1) }).openapi("PresignRestore")),
    },
    responses: {
      200: json(
        "Upload URL",
        z.object({
          uploadUrl: z.string(),
          uploadId: z.string(),
          expiresAt: z.string(),
          parts: z.array(z.object({ partNumber: z.number().int(), url: z.string(), sizeBytes: z.number().int() })).optional(),
        }),
      ),
      ...authErrors,
      404: diskNotFound,
      413: errorResponse("Archive larger than the restore limit (PAYLOAD_TOO_LARGE)"),
    },
  }),
  async (c) => {
    const config = c.get("config");
    const { sizeBytes } = c.req.valid("json");
    const accountId = c.get("principal").accountId;
    const { disk } = await resolveDisk(c.get("db"), accountId, c.req.valid("param").diskId);
    if (sizeBytes > config.MAX_RESTORE_ARCHIVE_BYTES) {
      throw new ApiError("PAYLOAD_TOO_LARGE", `restore archives are limited to ${config.MAX_RESTORE_ARCHIVE_BYTES} bytes`);
    }
    const upload = await presignRestoreUpload(c.get("db"), c.env, config, accountId, disk, sizeBytes);
    return c.json({ data: upload, status: 200 }, 200);
  },
);

const RestoreBody = z
  .union([
    z.strictObject({
      uploadId: z.string().min(1).max(64),
      parts: z
        .array(z.strictObject({ partNumber: z.number().int().min(1).max(10_000), etag: z.string().min(1).max(200) }))
        .max(10_000)
        .optional(),
    }),
    z.strictObject({ backupId: z.string().min(1).max(64) }),
  ])
  .openapi("Restore", { example: { uploadId: "upl_0aB1cD2eF3gH4iJ5kL6mN7oP" } });

backupRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{diskId}/backups/restore",
    summary: "Restore the disk from an uploaded archive (uploadId) or a ready backup (backupId)",
    description:
      "Replaces the disk's data; cannot be undone. Refused while the disk is attached to a running app. On success the attached app restarts.",
    tags: ["Disk backups"],
    security,
    request: { params: DiskParam, body: jsonBody(RestoreBody) },
    responses: {
      202: json("Restore started", z.object({ jobId: z.string(), status: z.enum(RESTORE_STATUSES) })),
      ...authErrors,
      404: errorResponse("UPLOAD_NOT_FOUND, BACKUP_NOT_FOUND or DISK_NOT_FOUND"),
      409: errorResponse("DISK_IN_USE, UPLOAD_INCOMPLETE or BACKUP_NOT_READY"),
      410: errorResponse("The upload window passed without an upload (PRESIGNED_URL_EXPIRED)"),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const accountId = c.get("principal").accountId;
    const diskRef = c.req.valid("param").diskId;
    const body = c.req.valid("json");
    const { disk } = await resolveDisk(db, accountId, diskRef);
    const source =
      "backupId" in body
        ? backupArchive(await resolveBackup(db, disk.id, body.backupId))
        : await uploadedArchive(db, c.env, disk.id, body.uploadId, body.parts);
    const restore = await startRestore(db, c.env, accountId, disk.id, source);
    return c.json({ data: { jobId: restore.id, status: restore.status }, status: 202 }, 202);
  },
);

backupRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{diskId}/backups/restore/{jobId}",
    summary: "A restore job's status",
    tags: ["Disk backups"],
    security,
    request: { params: DiskParam.extend({ jobId: z.string().min(1).max(64) }) },
    responses: { 200: json("The restore job", RestoreSchema), ...authErrors, 404: errorResponse("No such restore job") },
  }),
  async (c) => {
    const { diskId, jobId } = c.req.valid("param");
    const { disk } = await resolveDisk(c.get("db"), c.get("principal").accountId, diskId);
    return c.json({ data: await restoreViewOf(c.env, await resolveRestore(c.get("db"), disk.id, jobId)), status: 200 }, 200);
  },
);

backupRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{diskId}/backups/{backupId}",
    summary: "Delete a backup (frees its quota)",
    tags: ["Disk backups"],
    security,
    request: { params: BackupParam },
    responses: {
      200: json("Deleted", z.object({ id: z.string(), deleted: z.literal(true) })),
      ...authErrors,
      404: errorResponse("No such backup (BACKUP_NOT_FOUND)"),
      409: errorResponse("Still being created (BACKUP_NOT_READY)"),
    },
  }),
  async (c) => {
    const { diskId, backupId } = c.req.valid("param");
    const { disk } = await resolveDisk(c.get("db"), c.get("principal").accountId, diskId);
    const backup = await resolveBackup(c.get("db"), disk.id, backupId);
    await deleteBackup(c.get("db"), c.env, backup);
    return c.json({ data: { id: backup.id, deleted: true as const }, status: 200 }, 200);
  },
);
