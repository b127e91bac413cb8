import { createHash, type Hash } from "node:crypto";
import { createReadStream } from "node:fs";
import { type FileHandle, open, rename, rm, stat } from "node:fs/promises";
import { type IncomingMessage, request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type ApiClient, type Call, path } from "../api.js";
import { defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, CliError, fields, type Output, table, when } from "../output.js";
import { formatBytes, Progress } from "../progress.js";
import { confirmOrRefuse } from "../prompt.js";
import { VERSION } from "../version.js";

/** A disk backup as the API returns it; the optional fields appear as the backup moves on. */
type Backup = Schemas["Backup"];

/** What restore needs to know about the disk: whether a running app holds it. */
type Disk = Schemas["Disk"];

type DownloadLink = ResponseData<"/v1/disks/{diskId}/backups/{backupId}/download", "get", 200>;
type Presigned = ResponseData<"/v1/disks/{diskId}/backups/restore/presign", "post", 200>;
/** The restore's answer is the job's id and status; polling the job adds the rest. */
type RestoreJob = Pick<Schemas["RestoreJob"], "jobId" | "status"> & Partial<Schemas["RestoreJob"]>;
type Deleted = ResponseData<"/v1/disks/{diskId}/backups/{backupId}", "delete", 200>;

/** How often a backup or restore in progress is looked at. */
const POLL_INTERVAL_MS = 2000;

/** Error context for a call about one disk's backups, so "not found" names the disk and its list command. */
function aboutDisk(what: string, disk: string, extra: Call["hints"] = {}): Call {
  return {
    what,
    flags: { description: "--description", sizeBytes: "--file", uploadId: "--file", backupId: "--backup" },
    hints: {
      DISK_NOT_FOUND: `no disk "${disk}" in this account: \`svc disk list\` shows the names and ids`,
      BACKUP_NOT_FOUND: `\`svc backups list ${disk}\` shows the disk's backups`,
      BACKUP_NOT_READY: `the backup is still being made or has failed: \`svc backups list ${disk}\` shows its status`,
      BACKUP_QUOTA_EXCEEDED: `delete old backups (svc backups list ${disk}, then svc backups delete ${disk} <backup>) or upgrade the plan`,
      ...extra,
    },
  };
}

/** The storage's error code and a one-line detail, from a failed presigned request's status and body. */
function storageFailure(status: number, body: string): { code: string | undefined; detail: string } {
  const text = body.trim();
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null && "error" in parsed) {
      const { error } = parsed;
      if (typeof error === "object" && error !== null && "code" in error && "message" in error) {
        return { code: String(error.code), detail: `HTTP ${status}: ${String(error.code)}: ${String(error.message)}` };
      }
    }
  } catch {
    // not JSON: S3 answers XML
  }
  const code = /<Code>([^<]+)<\/Code>/.exec(text)?.[1];
  return { code, detail: `HTTP ${status}: ${text.length > 300 ? `${text.slice(0, 300)}…` : text || "(empty body)"}` };
}

/** The most specific message of a failed fetch or file operation. */
function reason(err: unknown): string {
  const cause = err instanceof Error ? err.cause : undefined;
  if (cause instanceof Error) return cause.message;
  return err instanceof Error ? err.message : String(err);
}

/** A backup's status as people read it: a backup still being made says whether its snapshot waits for a slot. */
function statusOf(backup: Backup, long = false): string {
  if (backup.failureReason) return `${backup.status}: ${backup.failureReason}`;
  if (backup.status === "creating" && backup.phase === "queued") return long && backup.waiting ? `creating (queued: ${backup.waiting})` : "creating (queued)";
  return backup.status;
}

function describe(backup: Backup): string {
  const rows: [string, string][] = [
    ["id", backup.id],
    ["disk", backup.diskId],
    ["status", statusOf(backup, true)],
    ["made by", backup.automatic ? "the disk's snapshot schedule (automatic)" : "a person (manual)"],
    ["size", backup.status === "ready" ? formatBytes(backup.sizeBytes) : "-"],
    ["description", backup.description || "-"],
    ["created", when(backup.createdAt)],
    ["completed", when(backup.completedAt, "-")],
  ];
  if (backup.sha256) rows.push(["sha256", backup.sha256]);
  rows.push(["expires", when(backup.expiresAt, "-")]);
  return fields(rows);
}

async function listBackups(client: ApiClient, disk: string): Promise<Backup[]> {
  return client.data<Backup[]>("GET", path`/v1/disks/${disk}/backups`, undefined, aboutDisk(`list backups of disk ${disk}`, disk));
}

const DISK_ARG = { name: "disk", description: "disk name or id" } as const;
const BACKUP_ARGS = [DISK_ARG, { name: "backup", description: "backup id (bak_…), from svc backups list" }] as const;

const create = defineCommand({
  name: "create",
  summary: "Back up a disk (a point-in-time tar.gz snapshot)",
  description: "The backup starts as `creating` and takes a few minutes; --wait follows it until it is ready.",
  args: [DISK_ARG],
  options: {
    description: { type: "string", value: "text", description: "free text to tell the backup apart (at most 500 characters)" },
    wait: { type: "boolean", description: "wait until the backup is ready (exit 1 if it fails)" },
  },
  examples: ['svc backups create uploads --description "before the migration" --wait'],
  async run({ args, opts, out, api }) {
    const client = await api();
    const body = opts.description === undefined ? {} : { description: opts.description };
    let backup = await client.data<Backup>("POST", path`/v1/disks/${args.disk}/backups`, body, aboutDisk(`back up disk ${args.disk}`, args.disk));
    const queued = backup.phase === "queued" ? ` (queued: ${backup.waiting ?? "waiting for a slot"})` : "";
    if (!opts.wait) {
      out.result(backup, `Creating backup ${backup.id} of disk ${args.disk}${queued}; \`svc backups list ${args.disk}\` shows when it is ready`);
      return;
    }
    out.note(`Creating backup ${backup.id} of disk ${args.disk}${queued}…`);
    while (backup.status === "creating") {
      await sleep(POLL_INTERVAL_MS);
      const found = (await listBackups(client, args.disk)).find((b) => b.id === backup.id);
      if (!found) throw new CliError(`backup ${backup.id} disappeared`, ["it is no longer in the disk's list: it was deleted while being made"]);
      backup = found;
    }
    if (backup.status === "failed") {
      if (out.json) out.result(backup);
      throw new CliError(`backup ${backup.id} of disk ${args.disk} failed`, [backup.failureReason ?? "no reason recorded"], "the disk is unchanged; try again, and check the disk with svc disk info");
    }
    out.result(backup, `Backup ${backup.id} of disk ${args.disk} is ready\n${describe(backup)}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List a disk's backups, newest first",
  args: [DISK_ARG],
  options: {},
  async run({ args, out, api }) {
    const backups = await listBackups(await api(), args.disk);
    const human =
      backups.length === 0
        ? `No backups of disk ${args.disk} yet. Create one: svc backups create ${args.disk}`
        : table(backups, [
            ["ID", (b) => b.id],
            ["STATUS", (b) => statusOf(b)],
            ["KIND", (b) => (b.automatic ? "automatic" : "manual")],
            ["SIZE", (b) => (b.status === "ready" ? formatBytes(b.sizeBytes) : "-")],
            ["CREATED", (b) => ago(b.createdAt)],
            ["EXPIRES", (b) => ago(b.expiresAt, "-")],
            ["DESCRIPTION", (b) => b.description ?? ""],
          ]);
    out.result(backups, human);
  },
});

/** How many times a download is attempted, resuming where a dropped connection left off. */
const DOWNLOAD_ATTEMPTS = 3;
const RETRY_DELAY_MS = 1000;

/** Builds the command's error from a detail and a hint. */
type Fail = (detail: string[], hint: string) => CliError;

/**
 * Streams a presigned GET into the open file chunk by chunk (nothing is held
 * in memory), hashing as it goes. A connection that drops mid-way is resumed
 * with a `Range` request from the last byte written. Resolves to the byte count.
 */
async function fetchInto(url: string, handle: FileHandle, hash: Hash, progress: Progress, fail: Fail): Promise<number> {
  let size = 0;
  for (let attempt = 1; ; attempt++) {
    if (attempt > 1) await sleep(RETRY_DELAY_MS);
    const retry = attempt < DOWNLOAD_ATTEMPTS;
    let res: Response;
    try {
      res = await fetch(url, size > 0 ? { headers: { Range: `bytes=${size}-` } } : {});
    } catch (err) {
      if (retry) continue;
      throw fail([reason(err)], "check the connection to the storage and try again");
    }
    if (!res.ok || !res.body) {
      const { detail } = storageFailure(res.status, await res.text().catch(() => ""));
      throw fail([detail], "try again: the command asks for a fresh link each time");
    }
    if (size > 0 && res.status !== 206) {
      await res.body.cancel();
      throw fail([`the connection dropped after ${formatBytes(size)} and the storage did not resume (HTTP ${res.status})`], "try again");
    }
    try {
      for await (const chunk of Readable.fromWeb(res.body) as AsyncIterable<Uint8Array>) {
        await handle.write(chunk).catch((err: unknown) => {
          throw fail([reason(err)], "check the free space and permissions where -o points");
        });
        hash.update(chunk);
        size += chunk.length;
        progress.add(chunk.length);
      }
      return size;
    } catch (err) {
      if (err instanceof CliError) throw err;
      if (!retry) throw fail([`the connection dropped after ${formatBytes(size)}: ${reason(err)}`], "try again");
    }
  }
}

const download = defineCommand({
  name: "download",
  summary: "Download a ready backup's archive (tar.gz); the newest ready one unless named",
  description: `Streams the archive to the file through a link valid for 1 hour, and checks its SHA-256
against the one recorded for the backup. The file is written as <file>.part and renamed when complete.
Without <backup>, downloads the disk's newest ready backup.`,
  args: [DISK_ARG],
  optionalArg: { name: "backup", description: "backup id (bak_…), from svc backups list (default: the newest ready one)" },
  options: { output: { type: "string", short: "o", value: "file", description: "where to write it (default <disk>-<backup>.tar.gz)" } },
  examples: ["svc backups download uploads -o uploads.tar.gz", "svc backups download uploads bak_7Qm2xY9pL4sK8vN1cR6tW3zA -o uploads.tar.gz"],
  async run({ args, opts, out, api }) {
    const client = await api();
    const backups = await listBackups(client, args.disk);
    const newest = args.backup === undefined ? backups.find((b) => b.status === "ready") : undefined;
    const id = args.backup ?? newest?.id;
    if (id === undefined) {
      const creating = backups.some((b) => b.status === "creating");
      throw new CliError(
        `could not download a backup of disk ${args.disk}`,
        [creating ? "its backups are still being made" : "it has no ready backup"],
        creating ? `wait for it: svc backups list ${args.disk}` : `create one: svc backups create ${args.disk} --wait`,
      );
    }
    if (newest) out.note(`Newest ready backup of disk ${args.disk}: ${newest.id} (${when(newest.createdAt)})`);
    const call = aboutDisk(`download backup ${id} of disk ${args.disk}`, args.disk);
    const link = await client.data<DownloadLink>("GET", path`/v1/disks/${args.disk}/backups/${id}/download`, undefined, call);
    const backup = backups.find((b) => b.id === id);
    const file = opts.output ?? `${args.disk}-${id}.tar.gz`;
    const partial = `${file}.part`;
    const failed: Fail = (detail, hint) => new CliError(`could not download backup ${id} to ${file}`, detail, hint);

    let handle: FileHandle;
    try {
      handle = await open(partial, "w");
    } catch (err) {
      throw failed([reason(err)], "choose a writable path with -o");
    }
    const progress = new Progress("Downloading", backup?.sizeBytes || undefined);
    const hash = createHash("sha256");
    let size: number;
    try {
      size = await fetchInto(link.url, handle, hash, progress, failed);
    } catch (err) {
      await handle.close().catch(() => undefined);
      await rm(partial, { force: true });
      throw err;
    } finally {
      progress.end();
    }
    await handle.close();
    const sha256 = hash.digest("hex");
    if (backup?.sha256 && backup.sha256 !== sha256) {
      await rm(partial, { force: true });
      throw failed(
        [`the received ${formatBytes(size)} have SHA-256 ${sha256}`, `the backup recorded ${backup.sha256}`],
        "try again; if it keeps happening, the stored archive is damaged",
      );
    }
    await rename(partial, file);
    const verified = Boolean(backup?.sha256);
    out.result(
      { id, file, sizeBytes: size, sha256, verified },
      `Downloaded backup ${id} to ${file} (${formatBytes(size)}, ${verified ? "SHA-256 verified" : "no SHA-256 recorded to check"})`,
    );
  },
});

/** The first 64 KiB of a response body, for an error message. */
async function bodyText(res: IncomingMessage): Promise<string> {
  let text = "";
  for await (const chunk of res) {
    if (text.length < 65_536) text += String(chunk);
  }
  return text;
}

/**
 * Sends one byte range of the file to a presigned URL and returns the
 * storage's ETag. Uses node:http rather than fetch: Node's fetch keeps every
 * chunk of a streamed request body in memory until the request ends
 * (nodejs/undici#4058), while a piped http request holds a few chunks at most.
 */
async function put(url: string, file: string, start: number, length: number, progress: Progress): Promise<string | null> {
  const target = new URL(url);
  const req = (target.protocol === "https:" ? httpsRequest : httpRequest)(target, {
    method: "PUT",
    headers: { "Content-Length": String(length), "User-Agent": `svc-cli/${VERSION}` },
  });
  const response = new Promise<IncomingMessage>((resolve, reject) => {
    req.once("response", resolve);
    req.once("error", reject);
  });
  const sent = await pipeline(
    createReadStream(file, { start, end: start + length - 1 }),
    async function* (chunks: AsyncIterable<Buffer>) {
      for await (const chunk of chunks) {
        progress.add(chunk.length);
        yield chunk;
      }
    },
    req,
  ).then(
    () => undefined,
    (err: unknown) => err,
  );
  // A storage that refuses the upload may answer and close before the body is sent: its answer explains more.
  let res: IncomingMessage;
  try {
    res = await response;
  } catch (err) {
    throw new CliError(`could not upload ${file}`, [reason(sent ?? err)], "check the connection to the storage and try again");
  }
  const status = res.statusCode ?? 0;
  if (status < 200 || status > 299) {
    const { code, detail } = storageFailure(status, await bodyText(res));
    const hint =
      code === "PRESIGNED_URL_EXPIRED" || code === "AccessDenied"
        ? "the storage refused the upload link (links expire after 1 hour): run the restore again, it asks for a fresh one"
        : "make sure the file does not change while it is uploaded, and try again";
    throw new CliError(`could not upload ${file}`, [detail], hint);
  }
  res.resume();
  if (sent) throw new CliError(`could not upload ${file}`, [reason(sent)], "try again");
  return res.headers.etag ?? null;
}

/** Uploads the archive to the presigned URL(s), in parts when the API asked for them. */
async function upload(presigned: Presigned, file: string, size: number): Promise<{ partNumber: number; etag: string }[] | undefined> {
  const progress = new Progress("Uploading", size);
  try {
    if (!presigned.parts) {
      await put(presigned.uploadUrl, file, 0, size, progress);
      return undefined;
    }
    const parts = [...presigned.parts].sort((a, b) => a.partNumber - b.partNumber);
    const total = parts.reduce((sum, p) => sum + p.sizeBytes, 0);
    if (total !== size) {
      throw new CliError(`could not upload ${file}`, [`the API planned parts of ${total} bytes for a file of ${size}`], "run the restore again");
    }
    const etags: { partNumber: number; etag: string }[] = [];
    let offset = 0;
    for (const part of parts) {
      const etag = await put(part.url, file, offset, part.sizeBytes, progress);
      if (!etag) throw new CliError(`could not upload ${file}`, [`the storage returned no ETag for part ${part.partNumber}`], "run the restore again");
      etags.push({ partNumber: part.partNumber, etag });
      offset += part.sizeBytes;
    }
    return etags;
  } finally {
    progress.end();
  }
}

/** What to do about DISK_IN_USE, naming the app when the disk says which it is. */
function inUseHint(disk: string, app: string | null): string {
  const name = app ?? "<app>";
  return `stop the app first (svc apps stop --app ${name}; the restore starts it again), or detach the disk (svc disk detach ${disk}), restore, then svc disk attach ${disk} --app ${name}`;
}

/** The archive's size, checked before any request: a typo in --file should not cost an API round trip. */
async function archiveSize(file: string): Promise<number> {
  let size: number;
  try {
    const info = await stat(file);
    size = info.isFile() ? info.size : 0;
  } catch (err) {
    throw new CliError(`could not read ${file}`, [reason(err)], "check the path given to --file");
  }
  if (size === 0) throw new CliError(`could not read ${file}`, ["it is not a file with data in it"], "pass a tar.gz archive, e.g. one from svc backups download");
  return size;
}

/** Asks for upload URLs sized to the archive and uploads it; returns what restore needs. */
async function uploadArchive(client: ApiClient, out: Output, disk: string, archive: { file: string; size: number }, call: Call): Promise<RestoreSource> {
  const { file, size } = archive;
  const presigned = await client.data<Presigned>("POST", path`/v1/disks/${disk}/backups/restore/presign`, { sizeBytes: size }, call);
  const parts = await upload(presigned, file, size);
  out.step(`Uploaded ${file} (${formatBytes(size)})`);
  return parts ? { uploadId: presigned.uploadId, parts } : { uploadId: presigned.uploadId };
}

type RestoreSource = { uploadId: string; parts?: { partNumber: number; etag: string }[] } | { backupId: string };

const restore = defineCommand({
  name: "restore",
  summary: "Replace a disk's data with an archive or a backup (cannot be undone)",
  description: `--file uploads a tar.gz archive (e.g. one from svc backups download) and restores from it;
--backup restores a ready backup of the disk without uploading anything; with neither, the disk's
newest ready backup (named before anything happens). The disk must not be in
use: stop its app (the restore starts it again) or detach the disk. Waits for the restore to end;
a failed restore leaves the disk as it was. Asks for confirmation on a terminal; scripts must pass --yes.`,
  args: [DISK_ARG],
  options: {
    file: { type: "string", value: "archive", description: "tar.gz archive to upload and restore from" },
    backup: { type: "string", value: "id", description: "a ready backup of this disk to restore from (default: the newest ready one)" },
    yes: YES_OPTION,
  },
  examples: [
    "svc apps stop --app my-app && svc backups restore uploads --file uploads.tar.gz --yes",
    "svc backups restore uploads --backup bak_7Qm2xY9pL4sK8vN1cR6tW3zA",
    "svc backups restore uploads --yes",
  ],
  async run({ args, opts, out, api, fail, interactive }) {
    const { file, backup } = opts;
    if (file !== undefined && backup !== undefined) throw fail("pass --file <archive> or --backup <id>, not both");
    let from: { file: string; size: number } | { backupId: string };
    if (file !== undefined) from = { file, size: await archiveSize(file) };
    else if (backup !== undefined) from = { backupId: backup };
    else {
      const newest = (await listBackups(await api(), args.disk)).find((b) => b.status === "ready");
      if (!newest) {
        throw new CliError(`cannot restore disk ${args.disk}`, ["it has no ready backup"], `restore an archive: svc backups restore ${args.disk} --file <archive.tar.gz>`);
      }
      out.note(`Newest ready backup of disk ${args.disk}: ${newest.id} (${when(newest.createdAt)})`);
      from = { backupId: newest.id };
    }
    await confirmOrRefuse(interactive, opts.yes, {
      action: `restore disk ${args.disk}`,
      question: `Replace all data on disk ${args.disk} with ${"file" in from ? from.file : `backup ${from.backupId}`}? This cannot be undone.`,
      retry: `svc backups restore ${args.disk} ${"file" in from ? `--file ${from.file}` : `--backup ${from.backupId}`}`,
    });
    const client = await api();
    const what = `restore disk ${args.disk}`;
    const disk = await client.data<Disk>("GET", path`/v1/disks/${args.disk}`, undefined, aboutDisk(what, args.disk));
    const call = aboutDisk(what, args.disk, {
      DISK_IN_USE: inUseHint(args.disk, disk.appName),
      UPLOAD_NOT_FOUND: "run the restore again: it uploads the archive anew",
      UPLOAD_INCOMPLETE: "the archive did not fully arrive: run the restore again",
      PRESIGNED_URL_EXPIRED: "the upload took longer than its link is valid (1 hour): run the restore again",
      PAYLOAD_TOO_LARGE: "the archive is larger than a restore accepts",
    });
    // Refuse before uploading what the API would refuse afterwards; the API checks again.
    if (disk.inUse && "file" in from) {
      const detail = `DISK_IN_USE: disk ${disk.name} is attached to app ${disk.appName ?? disk.appId}, which is running`;
      throw new CliError(`could not ${what}`, [detail], inUseHint(args.disk, disk.appName));
    }
    const source = "file" in from ? await uploadArchive(client, out, args.disk, from, call) : from;
    let job = await client.data<RestoreJob>("POST", path`/v1/disks/${args.disk}/backups/restore`, source, call);
    out.note(`Restoring disk ${args.disk} (job ${job.jobId})…`);
    while (job.status === "running") {
      await sleep(POLL_INTERVAL_MS);
      job = await client.data<RestoreJob>("GET", path`/v1/disks/${args.disk}/backups/restore/${job.jobId}`, undefined, call);
    }
    if (job.status === "failed") {
      if (out.json) out.result(job);
      const hint = "file" in from ? `check the archive (tar tzf ${from.file}) and try again` : "try again, or restore another backup";
      throw new CliError(`restore of disk ${args.disk} failed`, [job.error ?? "no reason recorded"], `the disk's data is unchanged; ${hint}`);
    }
    const origin = "file" in from ? from.file : `backup ${from.backupId}`;
    out.result(job, `Restored disk ${args.disk} from ${origin}${disk.appName ? `; app ${disk.appName} restarts with the restored data` : ""}`);
  },
});

const remove = defineCommand({
  name: "delete",
  summary: "Delete a backup and free its space in the quota",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: BACKUP_ARGS,
  options: { yes: YES_OPTION },
  examples: ["svc backups delete uploads bak_7Qm2xY9pL4sK8vN1cR6tW3zA --yes"],
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `delete backup ${args.backup} of disk ${args.disk}`,
      question: `Delete backup ${args.backup} of disk ${args.disk}? This cannot be undone.`,
      retry: `svc backups delete ${args.disk} ${args.backup}`,
    });
    const deleted = await (await api()).data<Deleted>(
      "DELETE",
      path`/v1/disks/${args.disk}/backups/${args.backup}`,
      undefined,
      aboutDisk(`delete backup ${args.backup} of disk ${args.disk}`, args.disk),
    );
    out.result(deleted, `Deleted backup ${deleted.id} of disk ${args.disk}`);
  },
});

/** `svc backups …`: snapshots of persistent disks, their download and restore. */
export const backups: Group = {
  name: "backups",
  summary: "Back up, download and restore persistent disks",
  commands: [create, list, download, restore, remove],
};
