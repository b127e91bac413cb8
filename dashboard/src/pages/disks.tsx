import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { formatBytes } from "../format";
import { Link } from "../router";
import { Action, Empty, ErrorNote, nameClass, Pending, Table, Time, useAction, useLoad } from "../ui";

type Disk = Schemas["Disk"];
type App = Schemas["App"];

const GIB = 1024 ** 3;

/** Why a disk's used space can be unknown (`usedBytes: null`), in the API's words. */
export const NOT_MEASURED = "not measured: the node holding the disk did not answer in time, or the disk is restoring";

/**
 * "12.0 MiB of 1 GB (1%)" with a small gauge, as `svc disk list` shows it
 * (a disk's size is in GB of 2^30 bytes); a dash when the node did not say.
 */
export function DiskUsage({ disk }: { disk: Pick<Disk, "usedBytes" | "sizeGb"> }) {
  const size = disk.sizeGb * GIB;
  if (disk.usedBytes === null) {
    return (
      <span class="usage" title={NOT_MEASURED}>
        <span>
          <span class="muted">—</span> of {disk.sizeGb} GB
        </span>
      </span>
    );
  }
  const percent = (disk.usedBytes / size) * 100;
  const shown = percent > 0 && percent < 1 ? "<1" : String(Math.round(percent));
  return (
    <span class="usage">
      <span title={`${disk.usedBytes.toLocaleString("en-US")} bytes`}>
        {formatBytes(disk.usedBytes)} of {disk.sizeGb} GB ({shown}%)
      </span>
      <meter min={0} max={size} value={disk.usedBytes} low={size * 0.75} high={size * 0.9} optimum={0} aria-label="Used space" />
    </span>
  );
}

/** Attach to an app chosen from the list, or detach; the API's refusal (DISK_ATTACHED) shows beside it. */
export function Attachment({ disk, apps, onChange }: { disk: Disk; apps: App[]; onChange: (disk: Disk) => void }) {
  const [app, setApp] = useState("");
  const path = { params: { path: { disk: disk.name } } };
  if (disk.appName) {
    return (
      <span class="inline-form">
        <Link href={`/apps/${encodeURIComponent(disk.appName)}`} class={nameClass(disk.appName)}>
          {disk.appName}
        </Link>
        <Action
          label="Detach"
          confirm={`Detach ${disk.name} from ${disk.appName}?`}
          run={async () => onChange((await ok(api.POST("/v1/disks/{disk}/detach", path))).data)}
        />
      </span>
    );
  }
  return (
    <span class="inline-form">
      <label>
        <span class="visually-hidden">App to attach {disk.name} to</span>
        <select value={app} onChange={(e) => setApp(e.currentTarget.value)}>
          <option value="">choose an app…</option>
          {apps.map((a) => (
            <option key={a.id} value={a.name}>
              {a.name}
            </option>
          ))}
        </select>
      </label>
      <Action
        label="Attach"
        disabled={app === ""}
        run={async () => onChange((await ok(api.POST("/v1/disks/{disk}/attach", { ...path, body: { app } }))).data)}
      />
    </span>
  );
}

function CreateDisk({ onCreated }: { onCreated: () => void }) {
  const [name, setName] = useState("");
  const [size, setSize] = useState("1");
  const [mountPath, setMountPath] = useState("/data");
  const { busy, error, run } = useAction();
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      await ok(api.POST("/v1/disks", { body: { name, sizeGb: Number(size), mountPath } }));
      setName("");
      onCreated();
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Create a disk">
      <h2>Create a disk</h2>
      <label>
        Name
        <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="uploads" required />
      </label>
      <label>
        Size (GB)
        <input name="sizeGb" type="number" min={1} max={1000} value={size} onInput={(e) => setSize(e.currentTarget.value)} required />
      </label>
      <label>
        Mount path
        <input name="mountPath" value={mountPath} onInput={(e) => setMountPath(e.currentTarget.value)} required />
      </label>
      <button type="submit" class="primary" disabled={busy}>
        {busy ? "Creating…" : "Create disk"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

/** Persistent disks: create, attach to an app, detach, delete. */
export function DisksPage() {
  const disks = useLoad(async () => (await ok(api.GET("/v1/disks"))).data, []);
  const apps = useLoad(async () => (await ok(api.GET("/v1/apps"))).data, []);
  return (
    <section>
      <h1>Disks</h1>
      {!disks.data ? (
        <Pending error={disks.error} />
      ) : disks.data.length === 0 ? (
        <Empty>No disks yet. Create one below.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Used</th>
              <th scope="col">Mount path</th>
              <th scope="col">App</th>
              <th scope="col">In use</th>
              <th scope="col">Created</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {disks.data.map((d) => (
              <tr key={d.id}>
                <td>
                  <Link href={`/disks/${encodeURIComponent(d.name)}`} class={nameClass(d.name)}>
                    {d.name}
                  </Link>
                </td>
                <td data-label="Used">
                  <DiskUsage disk={d} />
                </td>
                <td data-label="Mount path">
                  <code>{d.mountPath}</code>
                </td>
                <td data-label="App">
                  <Attachment disk={d} apps={apps.data ?? []} onChange={() => void disks.reload()} />
                </td>
                <td data-label="In use">{d.inUse ? "yes" : "no"}</td>
                <td data-label="Created">
                  <Time iso={d.createdAt} />
                </td>
                <td>
                  <div class="actions">
                    <Action
                      label="Delete"
                      danger
                      disabled={d.appId !== null}
                      title={d.appId !== null ? "Detach the disk first" : undefined}
                      confirm={`Delete ${d.name} and all its data? Its backups are deleted too. This cannot be undone.`}
                      run={async () => {
                        await ok(api.DELETE("/v1/disks/{disk}", { params: { path: { disk: d.name } } }));
                        await disks.reload();
                      }}
                    />
                  </div>
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      <CreateDisk onCreated={() => void disks.reload()} />
    </section>
  );
}
