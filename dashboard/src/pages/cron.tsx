import { useEffect, useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { Chart, COUNT, DURATION, type Range, RangePicker, stepWords } from "../chart";
import { elapsed, formatDuration, inZone } from "../format";
import { Link, navigate } from "../router";
import { Action, Badge, Empty, ErrorNote, LogView, Pending, Table, Time, useAction, useLoad, usePoll } from "../ui";
import { POLICIES, type Policy, TimeZoneField } from "./crons";
import { ScheduleField } from "./schedule-field";

type CronDetail = Schemas["CronDetail"];
type CronRun = Schemas["CronRun"];

/** The API's cron job ids (`cron_` and 24 letters or digits); job names are DNS labels, so the two never meet. */

function EditCron({ cron, onSaved }: { cron: CronDetail; onSaved: (cron: CronDetail) => void }) {
  const [schedule, setSchedule] = useState(cron.schedule);
  const [timezone, setTimezone] = useState(cron.timezone);
  const [command, setCommand] = useState(cron.command);
  const [policy, setPolicy] = useState<Policy>(cron.concurrencyPolicy);
  const [timeout, setTimeoutMinutes] = useState(String(cron.timeoutSeconds / 60));
  const [disableAfter, setDisableAfter] = useState(cron.disableAfterFailures === null ? "" : String(cron.disableAfterFailures));
  const [notifyAfter, setNotifyAfter] = useState(String(cron.notifyAfterFailures));
  const { busy, error, run } = useAction();
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      const body = {
        schedule,
        timezone,
        command,
        concurrencyPolicy: policy,
        timeoutSeconds: Math.round(Number(timeout) * 60),
        disableAfterFailures: disableAfter.trim() === "" ? null : Number(disableAfter),
        notifyAfterFailures: Number(notifyAfter),
      };
      onSaved((await ok(api.PATCH("/v1/crons/{id}", { params: { path: { id: cron.id } }, body }))).data);
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Edit the cron job">
      <h2>Edit</h2>
      <TimeZoneField value={timezone} onInput={setTimezone} />
      <ScheduleField id="edit-schedule" value={schedule} timezone={timezone} onInput={setSchedule} />
      <label>
        Command
        <input name="command" value={command} onInput={(e) => setCommand(e.currentTarget.value)} spellcheck={false} required />
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
        <input name="timeout" type="number" min={1} max={720} step="any" value={timeout} onInput={(e) => setTimeoutMinutes(e.currentTarget.value)} required />
      </label>
      <label>
        Send <code>cron.failed</code> from this many failed runs in a row on
        <input name="notifyAfter" type="number" min={1} max={1000} step={1} value={notifyAfter} onInput={(e) => setNotifyAfter(e.currentTarget.value)} required />
      </label>
      <label>
        Disable the job after this many failed runs in a row (empty: never)
        <input name="disableAfter" type="number" min={1} max={1000} step={1} value={disableAfter} onInput={(e) => setDisableAfter(e.currentTarget.value)} />
      </label>
      <button type="submit" class="primary" disabled={busy}>
        {busy ? "Saving…" : "Save changes"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

/**
 * The job's finished runs over 1 h, 24 h or 7 d (the API's `/metrics`):
 * succeeded and failed runs per step as bars side by side, their mean
 * duration as a line against the right-hand axis. Refreshed every 10 s.
 */
function RunsChart({ id }: { id: string }) {
  const [range, setRange] = useState<Range>("1h");
  const metrics = useLoad(async () => (await ok(api.GET("/v1/crons/{id}/metrics", { params: { path: { id }, query: { since: range } } }))).data, [id, range]);
  usePoll(() => metrics.reload(), 10_000, true);
  const data = metrics.data;
  const t = data?.totals;
  return (
    <section aria-label="Runs over time">
      <h2>Runs over time</h2>
      <RangePicker value={range} onChange={setRange} />
      {!data || !t ? (
        <Pending error={metrics.error} />
      ) : (
        <>
          <p class="hint">
            {t.runs} finished runs ({t.succeeded} succeeded, {t.failed} failed), mean {formatDuration(t.meanDurationMs)}, longest {formatDuration(t.maxDurationMs)}, in{" "}
            {stepWords(data.stepSeconds)} steps.
          </p>
          <div class="charts">
            <Chart
              title="Runs"
              unit={COUNT}
              right={DURATION}
              times={data.points.map((p) => Date.parse(p.at) / 1000)}
              series={[
                { label: "succeeded", values: data.points.map((p) => p.succeeded), color: "#1a7f37", bars: -1 },
                { label: "failed", values: data.points.map((p) => p.failed), color: "#cf222e", bars: 1 },
                { label: "mean duration", values: data.points.map((p) => p.meanDurationMs), color: "#0969da", right: true },
              ]}
            />
          </div>
        </>
      )}
    </section>
  );
}

/** A run's log, read again every second while the run is running. */
function RunLog({ cronId, run }: { cronId: string; run: CronRun }) {
  const log = useLoad(
    async () => (await ok(api.GET("/v1/crons/{id}/runs/{jobName}/logs", { params: { path: { id: cronId, jobName: run.jobName } } }))).data.logs,
    [cronId, run.jobName],
  );
  usePoll(log.reload, 1000, run.status === "running");
  // Once the run has finished, read the stored log one last time.
  const { reload } = log;
  useEffect(() => {
    if (run.status !== "running") void reload();
  }, [run.status, reload]);
  return (
    <section class="card" aria-label={`Log of ${run.jobName}`}>
      <h3>
        Log of <code>{run.jobName}</code> <Badge status={stateOf(run)} />
      </h3>
      {log.data === undefined ? <Pending error={log.error} /> : <LogView text={log.data} label={`Log of ${run.jobName}`} empty="(the run printed nothing)" />}
      <ErrorNote error={log.data === undefined ? null : log.error} />
    </section>
  );
}

/** `queued` while the builder holds the run for a slot (its status is still `running`), else the run's status. */
const stateOf = (run: CronRun) => (run.status === "running" && run.phase === "queued" ? "queued" : run.status);

function outcome(run: CronRun): string {
  if (run.status === "running") return run.waiting ?? "";
  return run.error ?? (run.exitCode === null ? "" : `exit code ${run.exitCode}`);
}

/**
 * A cron job's page at `/crons/<id>` or `/crons/<name>`: the API takes either
 * (names are unique in the account); the dashboard's own links use ids.
 */
export function CronPage({ idOrName }: { idOrName: string }) {
  return <CronJob id={idOrName} />;
}

/** One cron job: its schedule and next runs, its runs over time, edit, enable/disable, run now, its runs (live), their logs, cancel, delete. */
function CronJob({ id }: { id: string }) {
  const cron = useLoad(async () => (await ok(api.GET("/v1/crons/{id}", { params: { path: { id } } }))).data, [id]);
  const runs = useLoad(async () => (await ok(api.GET("/v1/crons/{id}/runs", { params: { path: { id } } }))).data, [id]);
  const apps = useLoad(async () => (await ok(api.GET("/v1/apps"))).data, []);
  const [shown, setShown] = useState<string | null>(null);
  const running = runs.data?.some((r) => r.status === "running") ?? false;
  // Runs appear on schedule too: look every 5 s, every second while one runs.
  usePoll(runs.reload, running ? 1000 : 5000, runs.data !== undefined);

  const c = cron.data;
  const path = { params: { path: { id } } };
  const shownRun = runs.data?.find((r) => r.jobName === shown) ?? null;
  const appName = c ? (apps.data?.find((a) => a.id === c.appId)?.name ?? c.appId) : "";
  const saved = () => void cron.reload();

  return (
    <section>
      <p class="crumbs">
        <Link href="/crons">Cron jobs</Link> /
      </p>
      <h1>
        <span class="name">{c?.name ?? id}</span> {c && <Badge status={c.enabled ? "enabled" : "disabled"} />}
      </h1>
      {!c ? (
        <Pending error={cron.error} />
      ) : (
        <>
          {c.disabledReason && (
            <p class="notice" role="note">
              <strong>It disabled itself:</strong> {c.disabledReason}. Enabling it starts the count of failed runs again.
            </p>
          )}
          <dl class="facts">
            <dt>App</dt>
            <dd>
              <Link href={`/apps/${encodeURIComponent(appName)}`} class="name">
                {appName}
              </Link>
            </dd>
            <dt>Schedule</dt>
            <dd>
              <code>{c.schedule}</code> in {c.timezone}
            </dd>
            <dt>Command</dt>
            <dd>
              <code>{c.command}</code>
            </dd>
            <dt>Disable after</dt>
            <dd>{c.disableAfterFailures === null ? "never (it keeps running however often it fails)" : `${c.disableAfterFailures} failed runs in a row`}</dd>
            <dt>Notify after</dt>
            <dd>
              {c.notifyAfterFailures === 1 ? "1 failed run: every failed run sends" : `${c.notifyAfterFailures} failed runs in a row: each failed run from then on sends`} a{" "}
              <code>cron.failed</code> webhook
            </dd>
            <dt>Next runs</dt>
            <dd>
              {c.nextRuns.length === 0 ? (
                "none (disabled)"
              ) : (
                <ol class="next-runs">
                  {c.nextRuns.map((r) => (
                    <li key={r}>
                      <time dateTime={r}>{inZone(r, c.timezone)}</time>
                    </li>
                  ))}
                </ol>
              )}
            </dd>
            <dt>Last run</dt>
            <dd>
              <Time iso={c.lastRun} empty="never" />
            </dd>
            <dt>Concurrency</dt>
            <dd>{c.concurrencyPolicy}</dd>
            <dt>Timeout</dt>
            <dd>{formatDuration(c.timeoutSeconds * 1000)} (then the run is killed)</dd>
          </dl>
          <div class="toolbar">
            <Action
              label="Run now"
              run={async () => {
                const { data } = await ok(api.POST("/v1/crons/{id}/run", path));
                setShown(data.jobName);
                await Promise.all([runs.reload(), cron.reload()]);
              }}
            />
            <Action
              label={c.enabled ? "Disable" : "Enable"}
              run={async () => {
                await ok(api.PATCH("/v1/crons/{id}", { ...path, body: { enabled: !c.enabled } }));
                saved();
              }}
            />
            <Action
              label="Delete job"
              danger
              confirm={`Delete ${c.name} with its schedule, runs and logs?`}
              run={async () => {
                await ok(api.DELETE("/v1/crons/{id}", path));
                navigate("/crons");
              }}
            />
          </div>
          <RunsChart id={id} />
          <h2>Runs</h2>
          {!runs.data ? (
            <Pending error={runs.error} />
          ) : runs.data.length === 0 ? (
            <Empty>No runs yet.</Empty>
          ) : (
            <Table live>
              <thead>
                <tr>
                  <th scope="col">Run</th>
                  <th scope="col">Status</th>
                  <th scope="col">Trigger</th>
                  <th scope="col">Started</th>
                  <th scope="col">Duration</th>
                  <th scope="col">Outcome</th>
                  <th scope="col">Actions</th>
                </tr>
              </thead>
              <tbody>
                {runs.data.map((r) => (
                  <tr key={r.jobName} class={r.jobName === shown ? "current" : undefined}>
                    <td>
                      <code class="name">{r.jobName}</code>
                    </td>
                    <td data-label="Status">
                      <Badge status={stateOf(r)} />
                    </td>
                    <td data-label="Trigger">{r.trigger}</td>
                    <td data-label="Started">
                      <Time iso={r.startedAt} />
                    </td>
                    <td data-label="Duration">{formatDuration(elapsed(r.startedAt, r.finishedAt))}</td>
                    <td data-label="Outcome">{outcome(r)}</td>
                    <td>
                      <div class="actions">
                        <button type="button" onClick={() => setShown(r.jobName)} aria-pressed={r.jobName === shown}>
                          Log
                        </button>
                        {r.status === "running" && (
                          <Action
                            label="Cancel"
                            danger
                            run={async () => {
                              await ok(api.POST("/v1/crons/{id}/runs/{jobName}/cancel", { params: { path: { id, jobName: r.jobName } } }));
                              await runs.reload();
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
          {shownRun && <RunLog cronId={id} run={shownRun} />}
          <EditCron key={c.updatedAt} cron={c} onSaved={saved} />
        </>
      )}
    </section>
  );
}
