import { Fragment } from "preact";
import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import type { Me } from "../app";
import { Action, Empty, ErrorNote, nameClass, Pending, Table, Time, useAction, useLoad } from "../ui";

type Scope = Schemas["ApiKey"]["scopes"][number];
const SCOPES: { scope: Scope; grants: string }[] = [
  { scope: "deploy", grants: "apps, env vars, deployments, disks, backups, cron jobs, logs" },
  { scope: "admin", grants: "managing API keys" },
  { scope: "db", grants: "databases (reserved)" },
  { scope: "registry", grants: "the image registry (reserved)" },
];
const EXPIRIES = [
  ["never", "Never"],
  ["7", "In 7 days"],
  ["30", "In 30 days"],
  ["90", "In 90 days"],
  ["365", "In 1 year"],
] as const;
const GRACE = [
  ["0", "old secret ends at once"],
  ["3600", "old secret ends in 1 h"],
  ["86400", "old secret ends in 24 h"],
] as const;

/** A key's name (free text) that wraps between its words, never at a hyphen inside one. */
function Words({ text }: { text: string }) {
  return (
    <>
      {text.split(" ").map((word, i) => (
        <Fragment key={i}>
          {i > 0 && " "}
          <span class={nameClass(word)}>{word}</span>
        </Fragment>
      ))}
    </>
  );
}

/** A secret the API returns once (an API key, a webhook's signing secret): shown with a copy button and a warning, forgotten when dismissed. */
export function Secret({ title, secret, onDone, noun = "API key", use = "store it in your CI's secret store or a password manager" }: { title: string; secret: string; onDone: () => void; noun?: string; use?: string }) {
  const [copied, setCopied] = useState<"no" | "yes" | "failed">("no");
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(secret);
      setCopied("yes");
    } catch {
      setCopied("failed");
    }
  };
  return (
    <section class="secret" aria-label={`New ${noun}`}>
      <h3>{title}</h3>
      <p class="warning">
        <strong>Copy this {noun === "API key" ? "key" : "secret"} now.</strong> It is shown only this once and cannot be retrieved later; {use}.
      </p>
      <output class="secret-value" aria-label={noun === "API key" ? "Secret key" : "Secret"}>
        {secret}
      </output>
      <div class="actions">
        <button type="button" onClick={copy}>
          {copied === "yes" ? "Copied" : "Copy"}
        </button>
        <button type="button" class="primary" onClick={onDone}>
          I have saved it
        </button>
      </div>
      {copied === "failed" && <p class="hint">The browser refused the clipboard: select it and copy it by hand.</p>}
    </section>
  );
}

function CreateKey({ onCreated }: { onCreated: (key: Schemas["CreatedApiKey"]) => void }) {
  const [name, setName] = useState("");
  const [scopes, setScopes] = useState<Scope[]>(["deploy"]);
  const [expiry, setExpiry] = useState<(typeof EXPIRIES)[number][0]>("never");
  const { busy, error, run } = useAction();
  const toggle = (scope: Scope, on: boolean) => setScopes((s) => (on ? [...s, scope] : s.filter((x) => x !== scope)));
  const submit = (event: Event) => {
    event.preventDefault();
    const expiresAt = expiry === "never" ? undefined : new Date(Date.now() + Number(expiry) * 86_400_000).toISOString();
    void run(async () => {
      onCreated(await ok(api.POST("/v1/api-keys", { body: { name, scopes, ...(expiresAt ? { expiresAt } : {}) } })));
      setName("");
    });
  };
  return (
    <form onSubmit={submit} class="card" aria-label="Create an API key">
      <h2>Create a key</h2>
      <label>
        Name
        <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="ci-deploy" maxLength={100} required />
      </label>
      <fieldset>
        <legend>Scopes</legend>
        {SCOPES.map(({ scope, grants }) => (
          <label key={scope} class="check">
            <input type="checkbox" name="scopes" value={scope} checked={scopes.includes(scope)} onChange={(e) => toggle(scope, e.currentTarget.checked)} />
            <code>{scope}</code> <span class="muted">{grants}</span>
          </label>
        ))}
      </fieldset>
      <label>
        Expires
        <select name="expiry" value={expiry} onChange={(e) => setExpiry(e.currentTarget.value as typeof expiry)}>
          {EXPIRIES.map(([value, label]) => (
            <option key={value} value={value}>
              {label}
            </option>
          ))}
        </select>
      </label>
      <button type="submit" class="primary" disabled={busy}>
        {busy ? "Creating…" : "Create key"}
      </button>
      <ErrorNote error={error} />
    </form>
  );
}

function RollKey({ apiKey, onRolled }: { apiKey: Schemas["ApiKey"]; onRolled: (key: Schemas["RolledApiKey"]) => void }) {
  const [grace, setGrace] = useState<(typeof GRACE)[number][0]>("0");
  return (
    <span class="inline-form">
      <select value={grace} onChange={(e) => setGrace(e.currentTarget.value as typeof grace)} aria-label={`When the old secret of ${apiKey.name} stops working after a roll`}>
        {GRACE.map(([value, label]) => (
          <option key={value} value={value}>
            {label}
          </option>
        ))}
      </select>
      <Action
        label="Roll"
        confirm={`Issue a new secret for ${apiKey.name}?`}
        run={async () =>
          onRolled(
            await ok(api.POST("/v1/api-keys/{id}/roll", { params: { path: { id: apiKey.id } }, body: { gracePeriodSeconds: Number(grace) } })),
          )
        }
      />
    </span>
  );
}

/** API keys: list (name, prefix, scopes, created, last used, expiry), create, roll, delete. Managing them needs `admin`. */
export function KeysPage({ me }: { me: Me }) {
  const keys = useLoad(() => ok(api.GET("/v1/api-keys")), []);
  const [secret, setSecret] = useState<{ title: string; key: string } | null>(null);
  // A key the list does not show (null) may still try: the API's answer then says what is missing.
  const isAdmin = me === null || (me?.scopes.includes("admin") ?? false);
  const adminReason = me
    ? `This key (${me.name}) has the scopes ${me.scopes.join(", ")}. Creating, rolling and deleting keys needs a key with the admin scope, so a key cannot grant more than it holds.`
    : "";

  const shown = (title: string, created: Schemas["CreatedApiKey"]) => {
    setSecret({ title, key: created.key });
    void keys.reload();
  };

  return (
    <section>
      <h1>API keys</h1>
      {secret && <Secret title={secret.title} secret={secret.key} onDone={() => setSecret(null)} />}
      {me && !isAdmin && (
        <p class="notice" role="note">
          <strong>Key management is disabled.</strong> {adminReason}
        </p>
      )}
      {!keys.data ? (
        <Pending error={keys.error} />
      ) : keys.data.length === 0 ? (
        <Empty>No keys.</Empty>
      ) : (
        <Table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Key</th>
              <th scope="col">Scopes</th>
              <th scope="col">Created</th>
              <th scope="col">Last used</th>
              <th scope="col">Expires</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {keys.data.map((k) => (
              <tr key={k.id}>
                <td>
                  <Words text={k.name} />
                  {me?.id === k.id && <span class="muted"> (this key)</span>}
                </td>
                <td data-label="Key">
                  <code class="name">{k.start}…</code>
                </td>
                <td data-label="Scopes">{k.scopes.join(", ")}</td>
                <td data-label="Created">
                  <Time iso={k.createdAt} />
                </td>
                <td data-label="Last used">
                  <Time iso={k.lastUsedAt} empty="never" />
                </td>
                <td data-label="Expires">
                  <Time iso={k.expiresAt} empty="never" />
                </td>
                <td>
                  {isAdmin ? (
                    <div class="actions">
                      <RollKey apiKey={k} onRolled={(rolled) => shown(`New secret for ${rolled.name}`, rolled)} />
                      <Action
                        label="Delete"
                        danger
                        confirm={`Delete key ${k.name}? Requests with it fail at once.`}
                        run={async () => {
                          await ok(api.DELETE("/v1/api-keys/{id}", { params: { path: { id: k.id } } }));
                          await keys.reload();
                        }}
                      />
                    </div>
                  ) : (
                    me && (
                      <span class="muted" title={adminReason}>
                        needs admin
                      </span>
                    )
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </Table>
      )}
      {isAdmin ? (
        <CreateKey onCreated={(created) => shown(`Created key ${created.name}`, created)} />
      ) : (
        me && (
          <fieldset disabled class="card" aria-describedby="admin-reason">
            <legend>Create a key</legend>
            <p id="admin-reason">{adminReason}</p>
            <button type="button">Create key</button>
          </fieldset>
        )
      )}
    </section>
  );
}
