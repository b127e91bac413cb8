import { useEffect, useState } from "preact/hooks";
import { type ApiError, api, asApiError, ok, type Schemas } from "../api";
import { Link, navigate } from "../router";
import { Action, Badge, Bytes, Empty, ErrorNote, LogView, Pending, Table, Time, useAction, useLoad, usePoll } from "../ui";
import { Deployments } from "./deployments";
import { Domains } from "./domains";
import { Metrics } from "./metrics";

type App = Schemas["App"];

const TABS = [
  ["overview", "Overview"],
  ["deployments", "Deployments"],
  ["env", "Environment"],
  ["domains", "Domains"],
  ["metrics", "Metrics"],
  ["logs", "Request log"],
  ["runtime", "Runtime log"],
] as const;

/**
 * Tabs an app shows: the runtime log belongs to apps that run a process, not to static sites; a worker has no request log nor domains
 * (its Metrics tab shows its processes' CPU and memory only).
 */
const tabsOf = (app: App | undefined) =>
  TABS.filter(([id]) => (id !== "runtime" || (app !== undefined && app.runtime !== "static")) && ((id !== "logs" && id !== "domains") || app?.type !== "worker"));

function Overview({ app, onChange }: { app: App; onChange: (app: App) => void }) {
  const path = { params: { path: { app: app.name } } };
  return (
    <>
      <dl class="facts">
        <dt>URL</dt>
        <dd>
          {app.url === null ? (
            "none: a worker takes no HTTP traffic"
          ) : (
            <a href={app.url} target="_blank" rel="noopener noreferrer">
              {app.url}
            </a>
          )}
        </dd>
        <dt>Status</dt>
        <dd>
          <Badge status={app.status} />
        </dd>
        <dt>Runtime</dt>
        <dd>{app.runtime}</dd>
        <dt>Memory</dt>
        <dd>{app.memoryMb} MB (builds and cron runs above it are OOMKilled)</dd>
        <dt>Serving</dt>
        <dd>{app.activeDeploymentId ? <code class="name">{app.activeDeploymentId}</code> : "nothing deployed yet"}</dd>
        {app.pendingChanges.length > 0 && (
          <>
            <dt>Not applied</dt>
            <dd>
              <span class="changes">{app.pendingChanges.join(", ")}</span>
              <Action
                label="Apply changes"
                run={async () => onChange((await ok(api.POST("/v1/apps/{app}/apply", path))).data)}
              />
            </dd>
          </>
        )}
        {app.process !== undefined && (app.instances?.length ?? 0) < 2 && (
          <>
            <dt>Process</dt>
            <dd>
              <ProcessFacts process={app.process} />
            </dd>
          </>
        )}
        {app.runtime !== "static" && (
          <>
            <dt>Instances</dt>
            <dd>
              <Scale app={app} onChange={onChange} />
            </dd>
          </>
        )}
        <dt>Disks</dt>
        <dd>
          {app.disks.length === 0
            ? "none"
            : app.disks.map((d) => (
                <span key={d.id} class="pill">
                  <Link href={`/disks/${encodeURIComponent(d.name)}`}>{d.name}</Link> at <code>{d.mountPath}</code> ({d.sizeGb} GB)
                </span>
              ))}
        </dd>
        <dt>Created</dt>
        <dd>
          <Time iso={app.createdAt} />
        </dd>
        <dt>Restarted</dt>
        <dd>
          <Time iso={app.restartedAt} empty="never" />
        </dd>
      </dl>
      <div class="toolbar">
        {app.status === "running" && (
          <Action
            label="Stop"
            confirm={`Stop ${app.name}? Its site answers 503 and its cron jobs do not run until it is restarted.`}
            run={async () => onChange((await ok(api.POST("/v1/apps/{app}/stop", path))).data)}
          />
        )}
        <Action
          label={app.status === "running" ? "Restart" : "Start"}
          run={async () => onChange((await ok(api.POST("/v1/apps/{app}/restart", path))).data)}
        />
        <Action
          label="Delete app"
          danger
          confirm={`Delete ${app.name} and its env vars? Attached disks are detached, not deleted. This cannot be undone.`}
          run={async () => {
            await ok(api.DELETE("/v1/apps/{app}", path));
            navigate("/apps");
          }}
        />
      </div>
    </>
  );
}

/** How many processes serve the app (changed in place), and each one that does: node, state, release, start, restarts, last exit. */
function Scale({ app, onChange }: { app: App; onChange: (app: App) => void }) {
  const [count, setCount] = useState(String(app.instanceCount));
  const { busy, error, run } = useAction();
  const instances = app.instances ?? [];
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      const body = { instances: Number(count) };
      onChange((await ok(api.PATCH("/v1/apps/{app}", { params: { path: { app: app.name } }, body }))).data);
    });
  };
  return (
    <>
      <form class="inline-form" onSubmit={submit} aria-label="Scale the app">
        <label>
          Wanted{" "}
          <input name="instances" type="number" min={1} max={100} value={count} onInput={(e) => setCount(e.currentTarget.value)} required />
        </label>{" "}
        <button type="submit" disabled={busy || Number(count) === app.instanceCount || app.autoscaling !== null}>
          {busy ? "Scaling…" : "Scale"}
        </button>
        {app.disks.length > 0 && <span class="hint"> An app with a disk runs one instance.</span>}
      </form>
      <ErrorNote error={error} />
      {app.autoscaling && (
        <p class="hint">
          Scales on load between {app.autoscaling.minInstances} and {app.autoscaling.maxInstances} instances, at {app.autoscaling.targetConcurrency}{" "}
          requests in flight each (<code>svc apps scale {app.name} --max …</code>; <code>--no-autoscaling</code> turns it off).
        </p>
      )}
      {app.scaleEvents.length > 0 && (
        <ul class="scale-events" aria-label="Scaling decisions">
          {app.scaleEvents.slice(0, 5).map((event) => (
            <li key={event.at}>
              <Time iso={event.at} />: {event.from} → {event.to}: {event.reason}
            </li>
          ))}
        </ul>
      )}
      {instances.length > 0 && (
        <Table class="instances">
          <thead>
            <tr>
              <th>Process</th>
              <th>Node</th>
              <th>State</th>
              <th>Release</th>
              <th>Started</th>
              <th>Restarts</th>
              <th>Last exit</th>
            </tr>
          </thead>
          <tbody>
            {instances.map((i) => (
              <tr key={i.id}>
                <td>
                  <code class="name">{i.id}</code>
                </td>
                <td>{i.nodeName}</td>
                <td>
                  <Badge status={i.state} /> {i.ready ? "ready" : ""}
                </td>
                <td>{i.deploymentId ? <code class="name">{i.deploymentId}</code> : "-"}</td>
                <td>
                  <Time iso={i.startedAt} empty="-" />
                </td>
                <td>{i.restarts}</td>
                <td>{i.lastExit ? i.lastExit.message : "-"}</td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
    </>
  );
}

/** What the app's node says of its process: state, readiness, restarts, and why the last one ended. */
function ProcessFacts({ process }: { process: App["process"] }) {
  if (!process) return <>none running</>;
  return (
    <>
      <Badge status={process.state} /> {process.ready ? "ready" : "not ready"}
      {process.restarts > 0 && `, ${process.restarts} restart${process.restarts === 1 ? "" : "s"}`}
      {process.lastExit && (
        <p class="hint">
          Last exit <Time iso={process.lastExit.at} />: {process.lastExit.message}
        </p>
      )}
      {process.lastLines.length > 0 && <pre class="log">{process.lastLines.join("\n")}</pre>}
    </>
  );
}

/** Lines of the runtime log the tab opens with (it then follows). */
const RUNTIME_LOG_LINES = 500;

/** The app's runtime log, streamed: its processes' output and the platform's own lines, the newest in view. */
function RuntimeLogTab({ app }: { app: App }) {
  const [text, setText] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  useEffect(() => {
    const abort = new AbortController();
    void (async () => {
      const stream = await ok(
        api.GET("/v1/apps/{app}/runtime-logs", {
          params: { path: { app: app.name }, query: { follow: "true", lines: RUNTIME_LOG_LINES } },
          parseAs: "stream",
          signal: abort.signal,
        }),
      );
      const decoder = new TextDecoder();
      let all = "";
      // A reader loop rather than `for await`: Safari cannot iterate a ReadableStream.
      const reader = stream?.getReader();
      for (let chunk = await reader?.read(); chunk && !chunk.done; chunk = await reader?.read()) {
        all = (all + decoder.decode(chunk.value, { stream: true })).slice(-256 * 1024);
        setText(all);
      }
    })().catch((err: unknown) => {
      if (!abort.signal.aborted) setError(asApiError(err));
    });
    return () => abort.abort();
  }, [app.name]);
  return (
    <>
      <p class="hint">
        What the app's processes print (stdout and stderr), across restarts and deploys, each line with the release and process that wrote it; <code>svc</code>{" "}
        lines say what the platform did. The last {RUNTIME_LOG_LINES} lines, then new ones as they come.
      </p>
      <ErrorNote error={error} />
      {text === "" ? <Empty>Nothing logged yet.</Empty> : <LogView text={text} label={`Runtime log of ${app.name}`} />}
    </>
  );
}

function EnvVars({ app }: { app: App }) {
  const [reveal, setReveal] = useState(false);
  const vars = useLoad(
    async () => (await ok(api.GET("/v1/apps/{app}/env", { params: { path: { app: app.name }, query: reveal ? { reveal: "true" } : {} } }))).data,
    [app.name, reveal],
  );
  const [name, setName] = useState("");
  const [value, setValue] = useState("");
  const [applyNow, setApplyNow] = useState(true);
  const [rollout, setRollout] = useState<string | null>(null);
  const { busy, error, run } = useAction();
  const query = applyNow ? {} : { apply: "false" as const };
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      const changed = await ok(api.PATCH("/v1/apps/{app}/env", { params: { path: { app: app.name }, query }, body: { vars: { [name]: value } } }));
      setRollout(changed.rollout.message);
      setName("");
      setValue("");
      await vars.reload();
    });
  };
  return (
    <>
      <p class="hint">
        Values are encrypted at rest. A change reaches the app: an app that runs starts its release again with it (without downtime unless it has a disk), a
        static site is built again; cron runs read them at each run. Names are shown; values only on request.
      </p>
      {rollout && (
        <p class="ok" role="status">
          {rollout} (see Deployments)
        </p>
      )}
      <div class="toolbar">
        <button type="button" aria-pressed={reveal} onClick={() => setReveal(!reveal)}>
          {reveal ? "Hide values" : "Reveal values"}
        </button>
      </div>
      {!vars.data ? (
        <Pending error={vars.error} />
      ) : vars.data.length === 0 ? (
        <Empty>No env vars set.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              {reveal && <th scope="col">Value</th>}
              <th scope="col">Updated</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {vars.data.map((v) => (
              <tr key={v.name}>
                <td>
                  <code class="name">{v.name}</code>
                </td>
                {reveal && (
                  <td data-label="Value">
                    <code class="value">{v.value}</code>
                  </td>
                )}
                <td data-label="Updated">
                  <Time iso={v.updatedAt} />
                </td>
                <td>
                  <div class="actions">
                    <Action
                      label="Unset"
                      danger
                      confirm={`Unset ${v.name}?`}
                      run={async () => {
                        const unset = await ok(api.DELETE("/v1/apps/{app}/env/{name}", { params: { path: { app: app.name, name: v.name }, query } }));
                        setRollout(unset.data.rollout.message);
                        await vars.reload();
                      }}
                    />
                  </div>
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      <form onSubmit={submit} class="card" aria-label="Set an env var">
        <h2>Set a variable</h2>
        <label>
          Name
          <input name="envName" value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="DATABASE_URL" required spellcheck={false} />
        </label>
        <label>
          Value
          <input name="envValue" value={value} onInput={(e) => setValue(e.currentTarget.value)} spellcheck={false} autoComplete="off" />
        </label>
        <label class="check">
          <input type="checkbox" name="applyNow" checked={applyNow} onChange={(e) => setApplyNow(e.currentTarget.checked)} />
          Roll out now (unchecked: the change waits, to roll out with others from the Overview)
        </label>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Saving…" : "Set"}
        </button>
        <ErrorNote error={error} />
      </form>
    </>
  );
}

type RequestLog = Schemas["RequestLog"];
const KEEP_ROWS = 1000;

/** The colour class of an HTTP status: 2xx, 3xx, 4xx, 5xx. */
const statusClass = (status: number) => `http-${Math.floor(status / 100)}xx`;

function RequestLogTab({ app }: { app: App }) {
  const [rows, setRows] = useState<RequestLog[] | null>(null);
  const [tail, setTail] = useState(true);
  const first = useLoad(async () => {
    const { data } = await ok(api.GET("/v1/apps/{app}/logs", { params: { path: { app: app.name }, query: { limit: 100 } } }));
    setRows(data);
    return data;
  }, [app.name]);
  const { error, run } = useAction();
  usePoll(
    () =>
      run(async () => {
        const after = rows?.at(-1)?.id ?? 0;
        const { data } = await ok(api.GET("/v1/apps/{app}/logs", { params: { path: { app: app.name }, query: { after, limit: 1000 } } }));
        if (data.length > 0) setRows((current) => [...(current ?? []), ...data].slice(-KEEP_ROWS));
      }),
    1000,
    tail && rows !== null,
  );
  return (
    <>
      <label class="check">
        <input type="checkbox" checked={tail} onChange={(e) => setTail(e.currentTarget.checked)} /> Live tail (new requests appear as they are served)
      </label>
      <ErrorNote error={error ?? first.error} />
      {rows === null ? (
        <Pending error={first.error} />
      ) : rows.length === 0 ? (
        <Empty>No requests to {app.url} logged yet.</Empty>
      ) : (
        <Table class="requests" live>
          <thead>
            <tr>
              <th scope="col">Time</th>
              <th scope="col">Method</th>
              <th scope="col">Path</th>
              <th scope="col">Status</th>
              <th scope="col">Bytes</th>
              <th scope="col">Duration</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.id}>
                <td>
                  <Time iso={r.time} />
                </td>
                <td class="method">{r.method}</td>
                <td class="path">
                  <code>{r.path}</code>
                </td>
                <td class="status-cell">
                  <span class={`status ${statusClass(r.status)}`}>{r.status}</span>
                </td>
                <td>
                  <Bytes value={r.bytes} />
                </td>
                <td>{r.durationMs} ms</td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
    </>
  );
}

/** One app: its facts and lifecycle, deployments, env vars and request log, a tab each. */
export function AppPage({ name, tab }: { name: string; tab: string }) {
  const loaded = useLoad(async () => (await ok(api.GET("/v1/apps/{app}", { params: { path: { app: name } } }))).data, [name]);
  const [changed, setChanged] = useState<App | null>(null);
  const app = changed?.name === name ? changed : loaded.data;
  const base = `/apps/${encodeURIComponent(name)}`;
  return (
    <section>
      <p class="crumbs">
        <Link href="/apps">Apps</Link> /
      </p>
      <h1>
        <span class="name">{name}</span> {app && <Badge status={app.status} />}
      </h1>
      <nav class="tabs" aria-label="App sections">
        {tabsOf(app).map(([id, label]) => (
          <Link key={id} href={id === "overview" ? base : `${base}/${id}`} aria-current={tab === id ? "page" : undefined}>
            {label}
          </Link>
        ))}
      </nav>
      {!app ? (
        <Pending error={loaded.error} />
      ) : tab === "deployments" ? (
        <Deployments key={app.id} app={app} onAppChange={setChanged} />
      ) : tab === "env" ? (
        <EnvVars key={app.id} app={app} />
      ) : tab === "domains" ? (
        <Domains key={app.id} app={app} />
      ) : tab === "metrics" ? (
        <Metrics key={app.id} app={app} />
      ) : tab === "logs" ? (
        <RequestLogTab key={app.id} app={app} />
      ) : tab === "runtime" ? (
        <RuntimeLogTab key={app.id} app={app} />
      ) : (
        <Overview app={app} onChange={setChanged} />
      )}
    </section>
  );
}
