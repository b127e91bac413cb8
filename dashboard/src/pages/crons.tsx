import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { Link, navigate } from "../router";
import { Badge, Empty, ErrorNote, nameClass, Pending, Table, useAction, useLoad } from "../ui";
import { ScheduleField, TIME_ZONES } from "./schedule-field";

type Cron = Schemas["Cron"];
export type Policy = Cron["concurrencyPolicy"];
export const POLICIES: { value: Policy; label: string }[] = [
  { value: "forbid", label: "forbid: skip a due run while one still runs" },
  { value: "allow", label: "allow: runs may overlap" },
  { value: "replace", label: "replace: cancel the running one" },
];

/** The time-zone input with the browser's zones as suggestions. */
export function TimeZoneField({ value, onInput }: { value: string; onInput: (value: string) => void }) {
  return (
    <label>
      Time zone
      <input name="timezone" value={value} onInput={(e) => onInput(e.currentTarget.value)} list="time-zones" placeholder="UTC" spellcheck={false} required />
      <datalist id="time-zones">
        {TIME_ZONES.map((z) => (
          <option key={z} value={z} />
        ))}
      </datalist>
    </label>
  );
}

function CreateCron({ apps }: { apps: Schemas["App"][] }) {
  const [appId, setAppId] = useState("");
  const [name, setName] = useState("");
  const [schedule, setSchedule] = useState("");
  const [timezone, setTimezone] = useState("UTC");
  const [command, setCommand] = useState("");
  const [policy, setPolicy] = useState<Policy>("forbid");
  const [timeout, setTimeoutMinutes] = useState("60");
  const { busy, error, run } = useAction();
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      const { data } = await ok(
        api.POST("/v1/crons", {
          body: { appId, name, schedule, command, timezone, concurrencyPolicy: policy, timeoutSeconds: Math.round(Number(timeout) * 60), enabled: true },
        }),
      );
      navigate(`/crons/${data.id}`);
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Create a cron job">
      <h2>Create a cron job</h2>
      <label>
        App
        <select name="appId" value={appId} onChange={(e) => setAppId(e.currentTarget.value)} required>
          <option value="">choose an app…</option>
          {apps.map((a) => (
            <option key={a.id} value={a.id}>
              {a.name}
            </option>
          ))}
        </select>
      </label>
      <label>
        Name
        <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="nightly-report" required />
      </label>
      <TimeZoneField value={timezone} onInput={setTimezone} />
      <ScheduleField id="new-schedule" value={schedule} timezone={timezone} onInput={setSchedule} />
      <label>
        Command
        <input name="command" value={command} onInput={(e) => setCommand(e.currentTarget.value)} placeholder="npm run report" spellcheck={false} required />
      </label>
      <label>
        When a run is due while one still runs
        <select name="concurrencyPolicy" value={policy} onChange={(e) => setPolicy(e.currentTarget.value as Policy)}>
          {POLICIES.map((p) => (
            <option key={p.value} value={p.value}>
              {p.label}
            </option>
          ))}
        </select>
      </label>
      <label>
        Timeout (minutes)
        <input name="timeout" type="number" min={1} max={720} value={timeout} onInput={(e) => setTimeoutMinutes(e.currentTarget.value)} required />
      </label>
      <button type="submit" class="primary" disabled={busy}>
        {busy ? "Creating…" : "Create cron job"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

/** Every cron job of the account, and creating one. */
export function CronsPage() {
  const crons = useLoad(async () => (await ok(api.GET("/v1/crons"))).data, []);
  const apps = useLoad(async () => (await ok(api.GET("/v1/apps"))).data, []);
  const appName = (id: string) => apps.data?.find((a) => a.id === id)?.name ?? id;
  return (
    <section>
      <h1>Cron jobs</h1>
      {!crons.data ? (
        <Pending error={crons.error} />
      ) : crons.data.length === 0 ? (
        <Empty>No cron jobs yet. Create one below.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">App</th>
              <th scope="col">Schedule</th>
              <th scope="col">Enabled</th>
              <th scope="col">Command</th>
            </tr>
          </thead>
          <tbody>
            {crons.data.map((c) => (
              <tr key={c.id}>
                <td>
                  <Link href={`/crons/${c.id}`} class={nameClass(c.name)}>
                    {c.name}
                  </Link>
                </td>
                <td data-label="App">
                  <Link href={`/apps/${encodeURIComponent(appName(c.appId))}`} class={nameClass(appName(c.appId))}>
                    {appName(c.appId)}
                  </Link>
                </td>
                <td data-label="Schedule">
                  <code class="name">{c.schedule}</code> <span class="muted name">{c.timezone}</span>
                </td>
                <td data-label="Enabled">
                  <Badge status={c.enabled ? "enabled" : "disabled"} />
                </td>
                <td data-label="Command">
                  <code>{c.command}</code>
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      <CreateCron apps={apps.data ?? []} />
    </section>
  );
}
