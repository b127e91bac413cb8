import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { Link, navigate } from "../router";
import { Badge, Empty, ErrorNote, nameClass, Pending, Table, Time, useAction, useLoad } from "../ui";

/** What an app can be created with (the API refuses the rest). */
type Runtime = NonNullable<Schemas["CreateApp"]["runtime"]>;
const RUNTIMES: Runtime[] = ["static", "node", "python", "custom"];

function CreateApp() {
  const [name, setName] = useState("");
  const [runtime, setRuntime] = useState<Runtime>("static");
  const [memory, setMemory] = useState("1024");
  const { busy, error, run } = useAction();
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      const { data } = await ok(api.POST("/v1/apps", { body: { name, runtime, memoryMb: Number(memory) } }));
      navigate(`/apps/${encodeURIComponent(data.name)}`);
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Create an app">
      <h2>Create an app</h2>
      <label>
        Name
        <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="my-site" required aria-describedby="app-name-hint" />
      </label>
      <p class="hint" id="app-name-hint">
        The name becomes the app's subdomain: lower-case letters, digits and hyphens, unique across the service.
      </p>
      <label>
        Runtime
        <select name="runtime" value={runtime} onChange={(e) => setRuntime(e.currentTarget.value as Runtime)}>
          {RUNTIMES.map((r) => (
            <option key={r} value={r}>
              {r}
            </option>
          ))}
        </select>
      </label>
      <label>
        Memory (MB)
        <input name="memoryMb" type="number" min={128} max={16384} step={128} value={memory} onInput={(e) => setMemory(e.currentTarget.value)} required />
      </label>
      <button type="submit" class="primary" disabled={busy}>
        {busy ? "Creating…" : "Create app"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

/** Every app of the account, and creating one. */
export function AppsPage() {
  const apps = useLoad(async () => (await ok(api.GET("/v1/apps"))).data, []);
  return (
    <section>
      <h1>Apps</h1>
      {!apps.data ? (
        <Pending error={apps.error} />
      ) : apps.data.length === 0 ? (
        <Empty>No apps yet. Create one below.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Status</th>
              <th scope="col">Runtime</th>
              <th scope="col">Memory</th>
              <th scope="col">URL</th>
              <th scope="col">Created</th>
            </tr>
          </thead>
          <tbody>
            {apps.data.map((a) => (
              <tr key={a.id}>
                <td>
                  <Link href={`/apps/${encodeURIComponent(a.name)}`} class={nameClass(a.name)}>
                    {a.name}
                  </Link>
                </td>
                <td data-label="Status">
                  <Badge status={a.status} />
                </td>
                <td data-label="Runtime">{a.runtime}</td>
                <td data-label="Memory">{a.memoryMb} MB</td>
                <td data-label="URL">
                  {a.url === null ? (
                    "- (worker)"
                  ) : (
                    <a href={a.url} target="_blank" rel="noopener noreferrer">
                      {a.url}
                    </a>
                  )}
                </td>
                <td data-label="Created">
                  <Time iso={a.createdAt} />
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      <CreateApp />
    </section>
  );
}
