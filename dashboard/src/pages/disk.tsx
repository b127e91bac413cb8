import { useEffect, useState } from "preact/hooks";
import { ApiError, api, asApiError, ok, type Schemas } from "../api";
import { BYTES, Chart, COUNT, type Range, RangePicker, type Series, stepWords } from "../chart";
import { formatBytes } from "../format";
import { Link } from "../router";
import { putObject, putParts } from "../upload";
import { Action, Badge, Bytes, Empty, ErrorNote, Pending, ProgressBar, Table, Time, useAction, useLoad, usePoll } from "../ui";
import { Attachment, DiskUsage, NOT_MEASURED } from "./disks";

type Disk = Schemas["Disk"];
type Backup = Schemas["Backup"];
type RestoreJob = Schemas["RestoreJob"];

/** A refused restore: DISK_IN_USE, from the API or from the disk's own `inUse`. */
const inUseError = (disk: Disk) => new ApiError("DISK_IN_USE", `disk ${disk.name} is attached to app ${disk.appName ?? disk.appId}, which is running`, 409);

/**
 * DISK_IN_USE, explained as a block of its own: what the refusal protects and
 * the two ways out, each one click away (the CLI's hint, as buttons).
 */
function InUse({ disk, error, what, onDiskChange }: { disk: Disk; error: ApiError; what?: string; onDiskChange: () => void }) {
  const app = disk.appName ?? disk.appId ?? "its app";
  return (
    <div class="notice in-use" role="alert" aria-label="Restore refused: the disk is in use">
      <p>
        {what && <strong>{what} was refused. </strong>}
        <code>DISK_IN_USE</code> {error.message}
      </p>
      <p>A restore replaces the disk's data, so it is refused while a running app uses the disk. Either:</p>
      <ul>
        <li>
          stop <strong class="name">{app}</strong>; the restore starts it again when it finishes,
        </li>
        <li>or detach the disk, restore, then attach it again.</li>
      </ul>
      <div class="actions">
        {disk.appName && (
          <Action
            label={`Stop ${disk.appName}`}
            run={async () => {
              await ok(api.POST("/v1/apps/{app}/stop", { params: { path: { app: disk.appName! } } }));
              onDiskChange();
            }}
          />
        )}
        <Action
          label="Detach disk"
          run={async () => {
            await ok(api.POST("/v1/disks/{disk}/detach", { params: { path: { disk: disk.name } } }));
            onDiskChange();
          }}
        />
      </div>
    </div>
  );
}

type RestoreStep =
  | { kind: "idle" }
  | { kind: "confirm" }
  | { kind: "uploading"; sent: number; total: number }
  | { kind: "restoring"; job: RestoreJob | null; jobId: string };

type RestoreProps = {
  disk: Disk;
  from: Backup | null;
  onDiskChange: () => void;
  onFinished: () => void;
  /** Where a DISK_IN_USE refusal goes (null when a new attempt starts); without it, it is explained here. */
  onRefused?: (error: ApiError | null) => void;
};

/** Restoring: upload an archive straight to its presigned URL (progress shown), or restore a ready backup; then the job's status. */
function Restore({ disk, from, onDiskChange, onFinished, onRefused }: RestoreProps) {
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
      const failure = asApiError(err);
      if (failure.code === "DISK_IN_USE" && onRefused) {
        // The page's copy of the disk was out of date: read it again, so the notice and the facts agree.
        onRefused(failure);
        onDiskChange();
      } else {
        setError(failure);
      }
      setStep({ kind: "idle" });
    }
  };

  const ask = () => {
    setError(null);
    onRefused?.(null);
    if (!disk.inUse) setStep({ kind: "confirm" });
    else if (onRefused) onRefused(inUseError(disk));
    else setError(inUseError(disk));
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
          <span>
            Replace all data on <strong>{disk.name}</strong> with {source}? This cannot be undone.
          </span>
          <button type="button" class="danger" onClick={() => void start()}>
            Restore
          </button>
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

const GIB = 1024 ** 3;
const LIMIT = { color: "#6e7781", dash: [6, 4] };
const ALERT = { color: "#bf8700", dash: [2, 4] };

/**
 * The disk's use over 1 h, 24 h or 7 d (the API's `/metrics`, the most in
 * each step as its node measures it every 10 s): bytes against its size and
 * files against its inode limit, each with the line where `disk.almost_full`
 * goes out. Refreshed every 10 s.
 */
function Use({ disk }: { disk: Disk }) {
  const [range, setRange] = useState<Range>("1h");
  const metrics = useLoad(
    async () => (await ok(api.GET("/v1/disks/{disk}/metrics", { params: { path: { disk: disk.id }, query: { since: range } } }))).data,
    [disk.id, range],
  );
  usePoll(() => metrics.reload(), 10_000, true);
  const data = metrics.data;
  const times = data?.points.map((p) => Date.parse(p.at) / 1000) ?? [];
  const flat = (value: number) => times.map(() => value);
  const against = (limit: number | null): Series[] =>
    limit === null
      ? []
      : [
          { label: "limit", values: flat(limit), ...LIMIT },
          { label: `alert at ${disk.alertAtPercent}%`, values: flat((limit * disk.alertAtPercent) / 100), ...ALERT },
        ];
  const measured = data?.points.some((p) => p.usedBytes !== null) ?? false;
  return (
    <section aria-label="Use">
      <h2>Use</h2>
      <RangePicker value={range} onChange={setRange} />
      {!data ? (
        <Pending error={metrics.error} />
      ) : (
        <>
          <p class="hint">
            The most the disk held in each {stepWords(data.stepSeconds)} step, as the node holding it measures it every 10 s.
            {!measured && " No measure in this range yet: the first comes within about 10 s of the disk being on a node."}
          </p>
          <div class="charts">
            <Chart
              title="Space"
              unit={BYTES}
              times={times}
              series={[{ label: "used", values: data.points.map((p) => p.usedBytes), color: "#0969da" }, ...against(data.sizeBytes ?? disk.sizeGb * GIB)]}
            />
            <Chart
              title="Files"
              unit={COUNT}
              times={times}
              series={[{ label: "files", values: data.points.map((p) => p.usedInodes), color: "#8250df" }, ...against(data.inodeLimit)]}
            />
          </div>
        </>
      )}
    </section>
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

/** The disk's alert threshold, changed in place: `disk.almost_full` goes out at it. */
function AlertAt({ disk, onSaved }: { disk: Disk; onSaved: () => void }) {
  const [percent, setPercent] = useState(String(disk.alertAtPercent));
  const { busy, error, run } = useAction();
  const save = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      await ok(api.PATCH("/v1/disks/{disk}", { params: { path: { disk: disk.id } }, body: { alertAtPercent: Number(percent) } }));
      onSaved();
    });
  };
  return (
    <>
      <form class="inline-form" onSubmit={save} aria-label="Alert threshold">
        <label>
          <input name="alertAtPercent" type="number" min={1} max={100} step={1} value={percent} onInput={(e) => setPercent(e.currentTarget.value)} required />% of
          its size or inode limit
        </label>{" "}
        <button type="submit" disabled={busy || Number(percent) === disk.alertAtPercent}>
          {busy ? "Saving…" : "Save"}
        </button>
      </form>
      <p class="hint">
        A <code>disk.almost_full</code> webhook goes out then (again only after it fell 5 points below).
      </p>
      <ErrorNote error={error} />
    </>
  );
}

function Backups({ disk, onDiskChange }: { disk: Disk; onDiskChange: () => void }) {
  const backups = useLoad(async () => (await ok(api.GET("/v1/disks/{diskId}/backups", { params: { path: { diskId: disk.id } } }))).data, [disk.id]);
  // A backup's restore refused with DISK_IN_USE: explained above the table, full width, not in the row's cell,
  // until the disk is no longer in use (one of its ways out was taken).
  const [refused, setRefused] = useState<{ backup: Backup; error: ApiError } | null>(null);
  useEffect(() => {
    if (!disk.inUse) setRefused(null);
  }, [disk.inUse]);
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
      {refused && <InUse disk={disk} error={refused.error} what={`Restoring backup ${refused.backup.id}`} onDiskChange={onDiskChange} />}
      {!backups.data ? (
        <Pending error={backups.error} />
      ) : backups.data.length === 0 ? (
        <Empty>No backups of {disk.name} yet.</Empty>
      ) : (
        <Table live>
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
                  <code class="name">{b.id}</code>
                  {b.description && <div class="muted">{b.description}</div>}
                </td>
                <td data-label="Status">
                  <Badge status={b.status} />
                  {b.phase === "queued" && <div class="muted">queued: {b.waiting ?? "waiting for a slot"}</div>}
                  {b.failureReason && <div class="error-text">{b.failureReason}</div>}
                </td>
                <td data-label="Size">{b.status === "ready" ? <Bytes value={b.sizeBytes} /> : "-"}</td>
                <td data-label="Created">
                  <Time iso={b.createdAt} />
                </td>
                <td data-label="Completed">
                  <Time iso={b.completedAt} />
                </td>
                <td data-label="Expires">
                  <Time iso={b.expiresAt} />
                </td>
                <td>
                  <div class="actions">
                    {b.status === "ready" && (
                      <>
                        <Action label="Download" run={() => download(disk, b)} title={`${formatBytes(b.sizeBytes)} .tar.gz; the link is valid for 1 hour`} />
                        <Restore
                          disk={disk}
                          from={b}
                          onDiskChange={onDiskChange}
                          onFinished={onDiskChange}
                          onRefused={(error) => setRefused(error && { backup: b, error })}
                        />
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
                  </div>
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
    </>
  );
}

/** One disk: where it is attached, its use over time, its backups (create, watch, download, delete) and restores. */
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
      <h1 class="name">{name}</h1>
      {!d ? (
        <Pending error={disk.error} />
      ) : (
        <>
          <dl class="facts">
            <dt>Used</dt>
            <dd>
              <DiskUsage disk={d} />
              {d.usedBytes === null && <p class="hint">{NOT_MEASURED}</p>}
            </dd>
            <dt>Mount path</dt>
            <dd>
              <code>{d.mountPath}</code>
            </dd>
            <dt>App</dt>
            <dd>
              <Attachment disk={d} apps={apps.data ?? []} onChange={reload} />
            </dd>
            <dt>Alert at</dt>
            <dd>
              <AlertAt disk={d} onSaved={reload} />
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
          <Use disk={d} />
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
