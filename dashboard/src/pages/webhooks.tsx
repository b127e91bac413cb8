import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { Action, Badge, Empty, ErrorNote, Pending, Table, Time, useAction, useLoad } from "../ui";
import { Secret } from "./keys";

type Webhook = Schemas["Webhook"];
type EventName = Webhook["events"][number];

const EVENTS: { event: EventName; when: string }[] = [
  { event: "deploy.succeeded", when: "a deployment is ready" },
  { event: "deploy.failed", when: "a deployment failed" },
  { event: "app.crash_loop", when: "an app's process keeps exiting" },
  { event: "app.recovered", when: "it runs again" },
  { event: "cron.failed", when: "a cron run failed" },
  { event: "cron.disabled", when: "a cron job disabled itself" },
  { event: "backup.failed", when: "a backup failed" },
  { event: "restore.failed", when: "a restore failed" },
  { event: "disk.almost_full", when: "a disk reached its alert threshold" },
];

/** The operator's events (the fleet's nodes): the API refuses them (FORBIDDEN) unless the operator flagged the account for them. */
const OPERATOR_EVENTS: { event: EventName; when: string }[] = [
  { event: "node.unreachable", when: "a node stopped answering" },
  { event: "node.lost", when: "a node was declared lost and its disks restored elsewhere" },
];

function AddWebhook({ onAdded }: { onAdded: (made: Schemas["WebhookWithSecret"]) => void }) {
  const [url, setUrl] = useState("");
  const [events, setEvents] = useState<EventName[]>(["deploy.failed", "app.crash_loop", "cron.failed"]);
  const { busy, error, run } = useAction();
  const toggle = (event: EventName, on: boolean) => setEvents((all) => (on ? [...all, event] : all.filter((e) => e !== event)));
  const box = ({ event, when }: { event: EventName; when: string }) => (
    <label key={event} class="check">
      <input type="checkbox" name="events" value={event} checked={events.includes(event)} onChange={(e) => toggle(event, e.currentTarget.checked)} />
      <code>{event}</code> <span class="muted">{when}</span>
    </label>
  );
  const submit = (e: Event) => {
    e.preventDefault();
    void run(async () => {
      onAdded((await ok(api.POST("/v1/webhooks", { body: { url, events } }))).data);
      setUrl("");
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Add a webhook">
      <h2>Add a webhook</h2>
      <label>
        URL
        <input name="url" type="url" value={url} onInput={(e) => setUrl(e.currentTarget.value)} placeholder="https://hooks.example.com/svc" required spellcheck={false} />
      </label>
      <fieldset>
        <legend>Events</legend>
        {EVENTS.map(box)}
      </fieldset>
      <fieldset>
        <legend>Operator events</legend>
        <p class="hint">Only accounts the operator flagged for operator events may subscribe to these; for any other account the API refuses them.</p>
        {OPERATOR_EVENTS.map(box)}
      </fieldset>
      <button type="submit" class="primary" disabled={busy || events.length === 0}>
        {busy ? "Adding…" : "Add"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

/** A webhook's newest deliveries: event, status, attempts, the last answer. */
function Deliveries({ webhook }: { webhook: Webhook }) {
  const deliveries = useLoad(() => ok(api.GET("/v1/webhooks/{webhook}/deliveries", { params: { path: { webhook: webhook.id } } })), [webhook.id]);
  if (!deliveries.data) return <Pending error={deliveries.error} />;
  if (deliveries.data.data.length === 0) return <p class="muted">No deliveries yet.</p>;
  return (
    <Table class="deliveries">
      <thead>
        <tr>
          <th scope="col">Event</th>
          <th scope="col">Status</th>
          <th scope="col">Attempts</th>
          <th scope="col">Last answer</th>
          <th scope="col">Sent</th>
        </tr>
      </thead>
      <tbody>
        {deliveries.data.data.slice(0, 10).map((d) => (
          <tr key={d.id}>
            <td>
              <code>{d.event}</code>
            </td>
            <td data-label="Status">
              <Badge status={d.status} />
            </td>
            <td data-label="Attempts">{d.attempts}</td>
            <td data-label="Last answer">{d.responseStatus !== null ? `HTTP ${d.responseStatus}` : (d.error ?? "-")}</td>
            <td data-label="Sent">
              <Time iso={d.createdAt} />
            </td>
          </tr>
        ))}
      </tbody>
    </Table>
  );
}

/** Webhooks: the account's events sent to URLs, signed (docs/webhooks.md): add, test, roll the secret, remove, and each one's deliveries. */
export function WebhooksPage() {
  const hooks = useLoad(() => ok(api.GET("/v1/webhooks")), []);
  const [secret, setSecret] = useState<{ title: string; value: string } | null>(null);
  const [tested, setTested] = useState(0);
  const path = (webhook: Webhook) => ({ params: { path: { webhook: webhook.id } } });
  return (
    <section>
      <h1>Webhooks</h1>
      <p class="hint">
        Events of this account are POSTed to each URL as <code>{"{type, timestamp, data}"}</code>, signed as Standard Webhooks says (<code>webhook-id</code>,{" "}
        <code>webhook-timestamp</code>, <code>webhook-signature</code>), and tried again with backoff for 24 hours until answered 2xx.
      </p>
      {secret && (
        <Secret title={secret.title} secret={secret.value} noun="signing secret" use="your receiver verifies webhook-signature with it" onDone={() => setSecret(null)} />
      )}
      {!hooks.data ? (
        <Pending error={hooks.error} />
      ) : hooks.data.data.length === 0 ? (
        <Empty>No webhooks.</Empty>
      ) : (
        hooks.data.data.map((webhook) => (
          <section class="card" key={webhook.id} aria-label={`Webhook ${webhook.url}`}>
            <h2>
              <code class="name">{webhook.url}</code>
            </h2>
            <p>
              {webhook.events.map((e) => (
                <span class="pill" key={e}>
                  {e}
                </span>
              ))}
            </p>
            <p class="hint">
              <code class="name">{webhook.id}</code>, added <Time iso={webhook.createdAt} />
              {webhook.previousSecretExpiresAt && (
                <>
                  ; the previous secret also signs until <Time iso={webhook.previousSecretExpiresAt} />
                </>
              )}
            </p>
            <div class="toolbar">
              <Action
                label="Send a test event"
                run={async () => {
                  await ok(api.POST("/v1/webhooks/{webhook}/test", path(webhook)));
                  setTested((n) => n + 1);
                }}
              />
              <Action
                label="Roll secret"
                confirm="Issue a new signing secret? For 24 hours deliveries carry both signatures."
                run={async () => setSecret({ title: `New secret of ${webhook.id}`, value: (await ok(api.POST("/v1/webhooks/{webhook}/roll-secret", path(webhook)))).data.secret })}
              />
              <Action
                label="Remove"
                danger
                confirm={`Remove the webhook to ${webhook.url}? Its pending deliveries are dropped.`}
                run={async () => {
                  await ok(api.DELETE("/v1/webhooks/{webhook}", path(webhook)));
                  await hooks.reload();
                }}
              />
            </div>
            <Deliveries key={`${webhook.id}-${tested}`} webhook={webhook} />
          </section>
        ))
      )}
      <AddWebhook
        onAdded={(made) => {
          setSecret({ title: `Secret of the webhook to ${made.url}`, value: made.secret });
          void hooks.reload();
        }}
      />
    </section>
  );
}
