import { useState } from "preact/hooks";
import { ApiError, api, asApiError, ok, type Schemas } from "../api";
import { formatBytes } from "../format";
import { Link } from "../router";
import { putObject, putParts } from "../upload";
import { Action, Badge, Bytes, Empty, ErrorNote, Pending, ProgressBar, Time, useAction, useLoad, usePoll } from "../ui";
import { Attachment } from "./disks";

type Disk = Schemas["Disk"];
type Backup = Schemas["Backup"];
type RestoreJob = Schemas["RestoreJob"];

/**
 * DISK_IN_USE, explained: what the refusal protects and the two ways out, each
 * one click away (the CLI's hint, as buttons).
 */
function InUse({ disk, error, onDiskChange }: { disk: Disk; error: ApiError | null; onDiskChange: () => void }) {
  const app = disk.appName ?? disk.appId ?? "its app";
  return (
    <div class="notice" role="alert">
      <p>
        <code>DISK_IN_USE</code> {error?.message ?? `disk ${disk.name} is attached to app ${app}, which is running`}
      </p>
      <p>A restore replaces the disk's data, so it is refused while a running app uses the disk. Either:</p>
      <ul>
        <li>
          stop <strong>{app}</strong>; the restore starts it again when it finishes{" "}
          {disk.appName && (
            <Action
              label={`Stop ${disk.appName}`}
              run={async () => {
                await ok(api.POST("/v1/apps/{app}/stop", { params: { path: { app: disk.appName! } } }));
                onDiskChange();
              }}
            />
          )}
        </li>
        <li>
          or detach the disk, restore, then attach it again{" "}
          <Action
            label="Detach disk"
            run={async () => {
              await ok(api.POST("/v1/disks/{disk}/detach", { params: { path: { disk: disk.name } } }));
              onDiskChange();
            }}
          />
        </li>
      </ul>
    </div>
  );
}

type RestoreStep =
  | { kind: "idle" }
  | { kind: "confirm" }
  | { kind: "uploading"; sent: number; total: number }
  | { kind: "restoring"; job: RestoreJob | null; jobId: string };

/** Restoring: upload an archive straight to its presigned URL (progress shown), or restore a ready backup; then the job's status. */
function Restore({ disk, from, onDiskChange, onFinished }: { disk: Disk; from: Backup | null; onDiskChange: () => void; onFinished: () => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [step, setStep] = useState<RestoreStep>({ kind: "idle" });
  const [error, setError] = useState<ApiError | null>(null);
  const [result, setResult] = useState<RestoreJob | null>(null);
  const diskPath = { diskId: disk.id };
  const source = from ? `backup ${from.id}` : (file?.name ?? "");

  usePoll(
    async () => {
      if (step.kind !== "restoring") return;
      try {
        const { data } = await ok(api.GET("/v1/disks/{diskId}/backups/restore/{jobId}", { params: { path: { ...diskPath, jobId: step.jobId } } }));
        if (data.status === "running") {
          setStep({ ...step, job: data });
        } else {
          setStep({ kind: "idle" });
          setResult(data);
          onFinished();
        }
      } catch (err) {
        setError(asApiError(err));
      }
    },
    1500,
    step.kind === "restoring",
  );

  const start = async () => {
    setError(null);
    setResult(null);
    try {
      let body: { uploadId: string; parts?: { partNumber: number; etag: string }[] } | { backupId: string };
      if (from) {
        body = { backupId: from.id };
      } else {
        if (!file) throw new ApiError("NO_FILE", "choose a .tar.gz archive to restore from", 0);
        const { data: presigned } = await ok(api.POST("/v1/disks/{diskId}/backups/restore/presign", { params: { path: diskPath }, body: { sizeBytes: file.size } }));
        setStep({ kind: "uploading", sent: 0, total: file.size });
        const progress = (sent: number) => setStep({ kind: "uploading", sent, total: file.size });
        if (presigned.parts) {
          body = { uploadId: presigned.uploadId, parts: await putParts(presigned.parts, file, progress) };
        } else {
          await putObject(presigned.uploadUrl, file, progress);
          body = { uploadId: presigned.uploadId };
        }
      }
      const { data } = await ok(api.POST("/v1/disks/{diskId}/backups/restore", { params: { path: diskPath }, body }));
      setStep({ kind: "restoring", jobId: data.jobId, job: null });
    } catch (err) {
      setError(asApiError(err));
      setStep({ kind: "idle" });
    }
  };

  const ask = () => {
    setError(null);
    if (disk.inUse) setError(new ApiError("DISK_IN_USE", `disk ${disk.name} is attached to app ${disk.appName ?? disk.appId}, which is running`, 409));
    else setStep({ kind: "confirm" });
  };
  const busy = step.kind === "uploading" || step.kind === "restoring";

  return (
    <div class="restore">
      {!from && (
        <label>
          Archive (.tar.gz, e.g. a downloaded backup)
          <input type="file" name="restoreArchive" accept=".tar.gz,.tgz,application/gzip" disabled={busy} onChange={(e) => setFile(e.currentTarget.files?.[0] ?? null)} />
        </label>
      )}
      {step.kind === "confirm" ? (
        <p class="confirm">
          Replace all data on <strong>{disk.name}</strong> with {source}? This cannot be undone.{" "}
          <button type="button" class="danger" onClick={() => void start()}>
            Restore
          </button>{" "}
          <button type="button" onClick={() => setStep({ kind: "idle" })}>
            Cancel
          </button>
        </p>
      ) : (
        <button type="button" class={from ? undefined : "primary"} disabled={busy || (!from && !file)} onClick={ask}>
          {from ? "Restore" : "Restore from archive"}
        </button>
      )}
      {step.kind === "uploading" && <ProgressBar label="Uploading" value={step.sent} max={step.total} />}
      {step.kind === "restoring" && (
        <p role="status">
          Restoring {disk.name} from {source}: <Badge status="running" /> <span class="muted">job {step.jobId}</span>
        </p>
      )}
      {result?.status === "succeeded" && (
        <p class="ok" role="status">
          Restore <Badge status="succeeded" /> {disk.name} now holds the data of {source}
          {disk.appName ? `; ${disk.appName} restarts with it.` : "."}
        </p>
      )}
      {result?.status === "failed" && (
        <p class="error" role="status">
          Restore <Badge status="failed" /> {result.error ?? "no reason recorded"}. The disk's data is unchanged.
        </p>
      )}
      {error?.code === "DISK_IN_USE" ? <InUse disk={disk} error={error} onDiskChange={onDiskChange} /> : <ErrorNote error={error} />}
    </div>
  );
}

/** Starts a browser download of a ready backup through its presigned link (valid 1 hour). */
async function download(disk: Disk, backup: Backup): Promise<void> {
  const { data } = await ok(api.GET("/v1/disks/{diskId}/backups/{backupId}/download", { params: { path: { diskId: disk.id, backupId: backup.id } } }));
  const link = document.createElement("a");
  link.href = data.url;
  link.download = `${disk.name}-${backup.id}.tar.gz`;
  document.body.append(link);
  link.click();
  link.remove();
}

function Backups({ disk, onDiskChange }: { disk: Disk; onDiskChange: () => void }) {
  const backups = useLoad(async () => (await ok(api.GET("/v1/disks/{diskId}/backups", { params: { path: { diskId: disk.id } } }))).data, [disk.id]);
  const creating = backups.data?.some((b) => b.status === "creating") ?? false;
  usePoll(backups.reload, 2000, creating);
  const [description, setDescription] = useState("");
  const { busy, error, run } = useAction();
  const create = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      await ok(api.POST("/v1/disks/{diskId}/backups", { params: { path: { diskId: disk.id } }, body: { description } }));
      setDescription("");
      await backups.reload();
    });
  };
  return (
    <>
      <form onSubmit={create} class="card" aria-label="Back up this disk">
        <h2>Back up</h2>
        <label>
          Description
          <input name="description" value={description} maxLength={500} onInput={(e) => setDescription(e.currentTarget.value)} placeholder="before the migration" />
        </label>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Starting…" : "Create backup"}
        </button>
        <ErrorNote error={error} />
      </form>
      <h2>Backups</h2>
      {!backups.data ? (
        <Pending error={backups.error} />
      ) : backups.data.length === 0 ? (
        <Empty>No backups of {disk.name} yet.</Empty>
      ) : (
        <table aria-live="polite">
          <thead>
            <tr>
              <th scope="col">Backup</th>
              <th scope="col">Status</th>
              <th scope="col">Size</th>
              <th scope="col">Created</th>
              <th scope="col">Completed</th>
              <th scope="col">Expires</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {backups.data.map((b) => (
              <tr key={b.id}>
                <td>
                  <code>{b.id}</code>
                  {b.description && <div class="muted">{b.description}</div>}
                </td>
                <td>
                  <Badge status={b.status} />
                  {b.phase === "queued" && <div class="muted">queued: {b.waiting ?? "waiting for a slot"}</div>}
                  {b.failureReason && <div class="error-text">{b.failureReason}</div>}
                </td>
                <td>{b.status === "ready" ? <Bytes value={b.sizeBytes} /> : "-"}</td>
                <td>
                  <Time iso={b.createdAt} />
                </td>
                <td>
                  <Time iso={b.completedAt} />
                </td>
                <td>
                  <Time iso={b.expiresAt} />
                </td>
                <td class="actions">
                  {b.status === "ready" && (
                    <>
                      <Action label="Download" run={() => download(disk, b)} title={`${formatBytes(b.sizeBytes)} .tar.gz; the link is valid for 1 hour`} />
                      <Restore disk={disk} from={b} onDiskChange={onDiskChange} onFinished={onDiskChange} />
                    </>
                  )}
                  {b.status !== "creating" && (
                    <Action
                      label="Delete"
                      danger
                      confirm={`Delete backup ${b.id}?`}
                      run={async () => {
                        await ok(api.DELETE("/v1/disks/{diskId}/backups/{backupId}", { params: { path: { diskId: disk.id, backupId: b.id } } }));
                        await backups.reload();
                      }}
                    />
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </>
  );
}

/** One disk: where it is attached, its backups (create, watch, download, delete) and restores. */
export function DiskPage({ name }: { name: string }) {
  const disk = useLoad(async () => (await ok(api.GET("/v1/disks/{disk}", { params: { path: { disk: name } } }))).data, [name]);
  const apps = useLoad(async () => (await ok(api.GET("/v1/apps"))).data, []);
  const d = disk.data;
  const reload = () => void disk.reload();
  return (
    <section>
      <p class="crumbs">
        <Link href="/disks">Disks</Link> /
      </p>
      <h1>{name}</h1>
      {!d ? (
        <Pending error={disk.error} />
      ) : (
        <>
          <dl class="facts">
            <dt>Size</dt>
            <dd>{d.sizeGb} GB</dd>
            <dt>Mount path</dt>
            <dd>
              <code>{d.mountPath}</code>
            </dd>
            <dt>App</dt>
            <dd>
              <Attachment disk={d} apps={apps.data ?? []} onChange={reload} />
            </dd>
            <dt>In use</dt>
            <dd>{d.inUse ? "yes: attached to a running app (restores are refused)" : "no"}</dd>
            {d.placement && (
              <>
                <dt>What happened</dt>
                <dd>{d.placement}</dd>
              </>
            )}
            <dt>Created</dt>
            <dd>
              <Time iso={d.createdAt} />
            </dd>
          </dl>
          <Backups disk={d} onDiskChange={reload} />
          <section class="card" aria-label="Restore from an archive">
            <h2>Restore from an archive</h2>
            <p class="hint">The archive goes straight to storage through a presigned URL, then the disk's data is replaced by it. A failed restore leaves the data as it was.</p>
            <Restore disk={d} from={null} onDiskChange={reload} onFinished={reload} />
          </section>
        </>
      )}
    </section>
  );
}
