import { useEffect, useRef, useState } from "preact/hooks";
import { type ApiError, api, asApiError, ok, type Schemas } from "../api";
import { formatBytes, formatDuration } from "../format";
import { MAX_UPLOAD_BYTES, megabytes, type Packed, packSource, type SourceFile, selectSource } from "../pack";
import { putObject } from "../upload";
import { Action, Badge, Bytes, Empty, ErrorNote, LogView, Pending, ProgressBar, Table, Time, useLoad, usePoll } from "../ui";

type App = Schemas["App"];
type Deployment = Schemas["Deployment"];

/** Runtimes a deployment from source builds (the builder's: a static site, or a release of an app that runs). */
const BUILT_RUNTIMES: readonly string[] = ["static", "node", "python", "custom"];

/** Statuses a deployment does not leave. */
const FINAL = new Set<Deployment["status"]>(["ready", "failed", "cancelled"]);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Follows a deployment live and resolves to it once it has stopped moving:
 * its build log, then (an app that runs) what happened after the build (its
 * progress) and the new process's own output (its lines of the runtime log).
 * Each (re)connection reads the build log from its start, so a dropped stream
 * loses nothing; at the end the stored log is shown whole.
 */
async function followBuild(app: string, id: string, onLog: (text: string) => void, signal: AbortSignal): Promise<Deployment> {
  const path = { app, id };
  const get = async () => (await ok(api.GET("/v1/apps/{app}/deployments/{id}", { params: { path }, signal }))).data;
  let build = "";
  let process = "";
  let deployment = await get();
  const show = () => {
    const steps = deployment.progress.map((step) => `${step.at} svc ${step.text}\n`).join("");
    onLog(build + steps + process);
  };
  const readLog = async (follow: boolean) => {
    const stream = await ok(
      api.GET("/v1/apps/{app}/deployments/{id}/logs", { params: { path, query: follow ? { follow: "true" } : {} }, parseAs: "stream", signal }),
    );
    let text = "";
    await readStream(stream, (piece) => {
      text += piece;
      build = text;
      show();
    });
    build = text;
    show();
  };
  /** The new process's lines of the runtime log, without their release/process tag (they are all this one's). */
  const followProcess = async (processId: string) => {
    const stream = await ok(
      api.GET("/v1/apps/{app}/runtime-logs", {
        params: { path: { app }, query: { follow: "true", process: processId, since: deployment.createdAt } },
        parseAs: "stream",
        signal: processAbort.signal,
      }),
    );
    await readStream(stream, (piece) => {
      process += piece.replace(/^(\S+ \S+) \S+\/prc_\w+ /gm, "$1 ");
      show();
    });
  };
  const processAbort = new AbortController();
  signal.addEventListener("abort", () => processAbort.abort(), { once: true });
  let following: Promise<void> | null = null;
  while (!FINAL.has(deployment.status) && !signal.aborted) {
    const started = Date.now();
    if (deployment.status !== "deploying") await readLog(true).catch(() => undefined);
    deployment = await get();
    if (following === null && deployment.processId !== null) following = followProcess(deployment.processId).catch(() => undefined);
    show();
    // A stream that ended at once (the release is starting, or the connection dropped) is polled, not hammered.
    if (!FINAL.has(deployment.status) && Date.now() - started < 500) await sleep(500);
  }
  await readLog(false);
  await Promise.race([following, sleep(1_000)]);
  processAbort.abort();
  return deployment;
}

/** Reads a text stream to its end, piece by piece (a reader loop: Safari cannot iterate a ReadableStream). */
async function readStream(stream: ReadableStream<Uint8Array> | null | undefined, onPiece: (text: string) => void): Promise<void> {
  const decoder = new TextDecoder();
  const reader = stream?.getReader();
  for (let chunk = await reader?.read(); chunk && !chunk.done; chunk = await reader?.read()) onPiece(decoder.decode(chunk.value, { stream: true }));
}

/** The live (or stored) build log of one deployment, with its outcome. */
function BuildLog({ app, deployment, onDone }: { app: App; deployment: Deployment; onDone: (d: Deployment) => void }) {
  const [text, setText] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [final, setFinal] = useState<Deployment | null>(FINAL.has(deployment.status) ? deployment : null);
  const done = useRef(onDone);
  done.current = onDone;
  useEffect(() => {
    const abort = new AbortController();
    setText("");
    setError(null);
    followBuild(app.name, deployment.id, setText, abort.signal).then(
      (d) => {
        if (abort.signal.aborted) return;
        setFinal(d);
        done.current(d);
      },
      (err: unknown) => {
        if (!abort.signal.aborted) setError(asApiError(err));
      },
    );
    return () => abort.abort();
  }, [app.name, deployment.id]);
  return (
    <section class="card" aria-label={`Build log of ${deployment.id}`}>
      <h3>
        Build log of <code>{deployment.id}</code> {final ? <Badge status={final.status} /> : <span class="live">live</span>}
      </h3>
      <LogView text={text} label={`Build log of ${deployment.id}`} />
      <ErrorNote error={error} />
      {final?.status === "ready" && (
        <p class="ok" role="status">
          Deployed: {final.url === null ? "a worker, running (it takes no HTTP traffic)" : <a href={final.url}>{final.url}</a>}
          {final.buildMs !== null && ` (built in ${formatDuration(final.buildMs)})`}
        </p>
      )}
      {final?.status === "failed" && (
        <div class="error" role="status">
          <p>
            <code>failed</code> {final.error ?? "no reason recorded"}
          </p>
          {final.logExcerpt && final.logExcerpt.length > 0 && <pre class="log">{final.logExcerpt.join("\n")}</pre>}
          {final.processId !== null && (
            <p class="hint">The build succeeded; the new release did not start. Its output is in the Runtime log tab; the app keeps what served it before, if anything did.</p>
          )}
        </div>
      )}
      {final?.status === "cancelled" && <p role="status">Cancelled: the app still serves its previous deployment.</p>}
    </section>
  );
}

/** The files of an `<input webkitdirectory>` pick, relative to the chosen folder (the browser names them `<folder>/<path>`). */
function pickedFiles(files: FileList): SourceFile[] {
  return [...files].map((file) => ({
    path: file.webkitRelativePath.slice(file.webkitRelativePath.indexOf("/") + 1) || file.name,
    blob: file,
    lastModified: file.lastModified,
  }));
}

type Step =
  | { kind: "idle" }
  | { kind: "packing"; read: number; total: number }
  | { kind: "packed"; packed: Packed; from: string }
  | { kind: "uploading"; sent: number; total: number }
  | { kind: "started"; deployment: Deployment };

const isArchive = (name: string) => /\.(tar\.gz|tgz)$/i.test(name);

/**
 * Deploying from the browser: a project folder is packed here (honouring its
 * .gitignore files, at most 100 MB compressed), or a ready .tar.gz is taken as
 * it is; then the source is uploaded with progress and the build log followed.
 */
function DeployPanel({ app, onUploading, onStarted }: { app: App; onUploading: () => void; onStarted: (d: Deployment) => void }) {
  const [step, setStep] = useState<Step>({ kind: "idle" });
  const [error, setError] = useState<ApiError | null>(null);
  const busy = step.kind === "packing" || step.kind === "uploading";

  const fail = (err: unknown) => {
    setError(asApiError(err));
    setStep({ kind: "idle" });
  };

  const chooseFolder = async (files: FileList | null) => {
    if (!files || files.length === 0) return;
    setError(null);
    try {
      const selection = await selectSource(pickedFiles(files));
      if (selection.files.length === 0) throw new Error("the folder has no files to deploy once .gitignore, node_modules and .git are left out");
      setStep({ kind: "packing", read: 0, total: selection.totalBytes });
      const packed = await packSource(selection, { onProgress: (read) => setStep({ kind: "packing", read, total: selection.totalBytes }) });
      const folder = files[0]!.webkitRelativePath.split("/")[0] ?? "the folder";
      setStep({ kind: "packed", packed, from: folder });
    } catch (err) {
      fail(err);
    }
  };

  const chooseArchive = (files: FileList | null) => {
    const file = files?.[0];
    if (!file) return;
    setError(null);
    if (!isArchive(file.name)) return fail(new Error(`${file.name} is not a .tar.gz archive; choose a project folder instead`));
    if (file.size > MAX_UPLOAD_BYTES) {
      const bytes = (n: number) => n.toLocaleString("en-US");
      return fail(
        new Error(`${file.name} is ${bytes(file.size)} bytes, over the build upload limit of ${megabytes(MAX_UPLOAD_BYTES)} (${bytes(MAX_UPLOAD_BYTES)} bytes); nothing was uploaded`),
      );
    }
    setStep({ kind: "packed", packed: { archive: file, sizeBytes: file.size, fileCount: 0, totalBytes: 0, ignored: [] }, from: file.name });
  };

  const deploy = async (packed: Packed, from: string) => {
    setError(null);
    try {
      const path = { params: { path: { app: app.name } } };
      const created = await ok(api.POST("/v1/apps/{app}/deployments", { ...path, body: { sizeBytes: packed.sizeBytes } }));
      setStep({ kind: "uploading", sent: 0, total: packed.sizeBytes });
      onUploading();
      await putObject(created.data.uploadUrl, packed.archive, (sent) => setStep({ kind: "uploading", sent, total: packed.sizeBytes }));
      const started = await ok(
        api.POST("/v1/apps/{app}/deployments/{id}/start", { params: { path: { app: app.name, id: created.data.deployment.id } } }),
      );
      setStep({ kind: "started", deployment: started.data });
      onStarted(started.data);
    } catch (err) {
      setError(asApiError(err));
      setStep({ kind: "packed", packed, from });
    }
  };

  return (
    <section class="card" aria-label="Deploy">
      <h2>Deploy</h2>
      {BUILT_RUNTIMES.includes(app.runtime) ? (
        app.runtime !== "static" && (
          <p class="hint">
            Deploying builds a release of this <code>{app.runtime}</code> app: dependencies installed, the build command run, started with the
            start command from <code>svc.json</code>, a <code>Procfile</code> or the runtime's conventions.
          </p>
        )
      ) : (
        <p class="notice">
          Deploying from source builds static sites and node, python and custom apps; this app's runtime is <code>{app.runtime}</code>.
        </p>
      )}
      <div class="choices">
        <label>
          Project folder
          <input
            type="file"
            name="folder"
            ref={(el) => {
              if (el) el.webkitdirectory = true;
            }}
            multiple disabled={busy} onChange={(e) => void chooseFolder(e.currentTarget.files)} />
        </label>
        <label>
          or a .tar.gz archive
          <input type="file" name="archive" accept=".tar.gz,.tgz,application/gzip" disabled={busy} onChange={(e) => chooseArchive(e.currentTarget.files)} />
        </label>
      </div>
      <p class="hint">
        A folder is packed in this page the way <code>svc deploy</code> packs it: files its <code>.gitignore</code> files exclude, <code>node_modules</code> and{" "}
        <code>.git</code> stay behind; the archive may be at most {megabytes(MAX_UPLOAD_BYTES)}.
      </p>
      {step.kind === "packing" && <ProgressBar label="Packing" value={step.read} max={step.total} />}
      {step.kind === "packed" && (
        <div role="status">
          <p>
            {step.packed.fileCount > 0
              ? `Packed ${step.packed.fileCount} file${step.packed.fileCount === 1 ? "" : "s"} (${formatBytes(step.packed.totalBytes)}) from ${step.from} into ${formatBytes(step.packed.sizeBytes)}.`
              : `Archive ${step.from}, ${formatBytes(step.packed.sizeBytes)}.`}
          </p>
          {step.packed.ignored.length > 0 && (
            <details>
              <summary>Left out by .gitignore: {step.packed.ignored.length}</summary>
              <ul class="paths">
                {step.packed.ignored.map((p) => (
                  <li key={p}>
                    <code>{p}</code>
                  </li>
                ))}
              </ul>
            </details>
          )}
          <button type="button" class="primary" onClick={() => void deploy(step.packed, step.from)}>
            Deploy to {app.name}
          </button>
        </div>
      )}
      {step.kind === "uploading" && <ProgressBar label="Uploading" value={step.sent} max={step.total} />}
      <ErrorNote error={error} />
    </section>
  );
}

/** An app's deployments: deploy, the list with status and timings, the build log, rollback and cancel. */
export function Deployments({ app, onAppChange }: { app: App; onAppChange: (app: App) => void }) {
  const list = useLoad(async () => (await ok(api.GET("/v1/apps/{app}/deployments", { params: { path: { app: app.name } } }))).data, [app.name]);
  const [shown, setShown] = useState<Deployment | null>(null);
  const moving = list.data?.some((d) => !FINAL.has(d.status)) ?? false;
  usePoll(list.reload, 2000, moving);

  const path = (d: Deployment) => ({ params: { path: { app: app.name, id: d.id } } });
  return (
    <>
      <DeployPanel
        app={app}
        onUploading={() => setShown(null)}
        onStarted={(d) => {
          setShown(d);
          void list.reload();
        }}
      />
      {shown && (
        <BuildLog
          key={shown.id}
          app={app}
          deployment={shown}
          onDone={() => {
            void list.reload();
            void api.GET("/v1/apps/{app}", { params: { path: { app: app.name } } }).then((r) => r.data && onAppChange(r.data.data));
          }}
        />
      )}
      <h2>History</h2>
      {!list.data ? (
        <Pending error={list.error} />
      ) : list.data.length === 0 ? (
        <Empty>No deployments yet.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Deployment</th>
              <th scope="col">Status</th>
              <th scope="col">Created</th>
              <th scope="col">Build time</th>
              <th scope="col">Files</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {list.data.map((d) => (
              <tr key={d.id} class={d.active ? "current" : undefined}>
                <td>
                  <code class="name">{d.id}</code>
                  {d.active && <strong class="pill">serving</strong>}
                  {d.framework && <span class="muted"> {d.framework}</span>}
                </td>
                <td data-label="Status">
                  <Badge status={d.status} />
                  {d.waiting && <div class="muted">{d.waiting}</div>}
                  {d.error && <div class="error-text">{d.error}</div>}
                </td>
                <td data-label="Created">
                  <Time iso={d.createdAt} />
                </td>
                <td data-label="Build time">{formatDuration(d.buildMs)}</td>
                <td data-label="Files">
                  {d.fileCount === null ? (
                    "-"
                  ) : (
                    <>
                      {d.fileCount} (<Bytes value={d.totalBytes} />)
                    </>
                  )}
                </td>
                <td>
                  <div class="actions">
                    <button type="button" onClick={() => setShown(d)}>
                      Log
                    </button>
                    {d.status === "ready" && !d.active && (
                      <Action
                        label="Roll back"
                        confirm={`Serve ${d.id} again?`}
                        run={async () => {
                          onAppChange((await ok(api.POST("/v1/apps/{app}/deployments/{id}/activate", path(d)))).data);
                          await list.reload();
                        }}
                      />
                    )}
                    {(d.status === "queued" || d.status === "building") && (
                      <Action
                        label="Cancel"
                        danger
                        run={async () => {
                          await ok(api.POST("/v1/apps/{app}/deployments/{id}/cancel", path(d)));
                          await list.reload();
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
