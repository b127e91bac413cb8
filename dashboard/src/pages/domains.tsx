import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { Action, Badge, Empty, ErrorNote, Pending, Table, Time, useAction, useLoad } from "../ui";

type App = Schemas["App"];
type Domain = Schemas["Domain"];
type Redirect = Domain["redirect"];

const REDIRECTS: [Redirect, string][] = [
  ["none", "No redirect"],
  ["to-www", "Apex → www"],
  ["to-apex", "www → apex"],
];

/** The DNS records a domain still needs, exactly as the API gives them. */
function Records({ domain }: { domain: Domain }) {
  if (domain.records.length === 0) return null;
  return (
    <Table>
      <thead>
        <tr>
          <th scope="col">Type</th>
          <th scope="col">Name</th>
          <th scope="col">Value</th>
        </tr>
      </thead>
      <tbody>
        {domain.records.map((record) => (
          <tr key={`${record.type} ${record.name}`} title={record.purpose}>
            <td data-label="Type">{record.type}</td>
            <td data-label="Name">
              <code class="value">{record.name}</code>
            </td>
            <td data-label="Value">
              <code class="value">{record.value}</code>
            </td>
          </tr>
        ))}
      </tbody>
    </Table>
  );
}

/** An app's custom domains: add one, see the records to create, verify, change its redirect, remove it (docs/domains.md). */
export function Domains({ app }: { app: App }) {
  const domains = useLoad(async () => (await ok(api.GET("/v1/apps/{app}/domains", { params: { path: { app: app.name } } }))).data, [app.name]);
  const [hostname, setHostname] = useState("");
  const [redirect, setRedirect] = useState<Redirect>("none");
  const { busy, error, run } = useAction();
  const path = (domain: Domain) => ({ params: { path: { app: app.name, hostname: domain.hostname } } });
  const submit = (event: Event) => {
    event.preventDefault();
    void run(async () => {
      await ok(api.POST("/v1/apps/{app}/domains", { params: { path: { app: app.name } }, body: { hostname, redirect, httpsOnly: true } }));
      setHostname("");
      setRedirect("none");
      await domains.reload();
    });
  };
  return (
    <>
      <p class="hint">
        A domain serves this app only once its owner is proven: create the TXT record shown, then Verify. Point the domain at the platform with the CNAME
        record; the certificate follows on its own.
      </p>
      {!domains.data ? (
        <Pending error={domains.error} />
      ) : domains.data.length === 0 ? (
        <Empty>No custom domains.</Empty>
      ) : (
        domains.data.map((domain) => (
          <section class="card" key={domain.id} aria-label={`Domain ${domain.hostname}`}>
            <h2>
              <span class="name">{domain.hostname}</span> <Badge status={domain.status} />
            </h2>
            {domain.reason && <p class="hint">{domain.reason}</p>}
            <p class="hint">
              Certificate {domain.certificate}; {REDIRECTS.find(([value]) => value === domain.redirect)?.[1]}; last checked{" "}
              <Time iso={domain.verification.checkedAt} empty="never" />
            </p>
            <Records domain={domain} />
            <div class="actions">
              <Action
                label="Verify"
                run={async () => {
                  await ok(api.POST("/v1/apps/{app}/domains/{hostname}/verify", path(domain)));
                  await domains.reload();
                }}
              />
              {domain.redirect !== "none" && (
                <Action
                  label="Drop the redirect"
                  run={async () => {
                    await ok(api.PATCH("/v1/apps/{app}/domains/{hostname}", { ...path(domain), body: { redirect: "none" } }));
                    await domains.reload();
                  }}
                />
              )}
              <Action
                label="Remove"
                danger
                confirm={`Remove ${domain.hostname}? It stops serving within seconds and any account may claim it again.`}
                run={async () => {
                  await ok(api.DELETE("/v1/apps/{app}/domains/{hostname}", path(domain)));
                  await domains.reload();
                }}
              />
            </div>
          </section>
        ))
      )}
      <form onSubmit={submit} class="card" aria-label="Add a domain">
        <h2>Add a domain</h2>
        <label>
          Hostname
          <input name="hostname" value={hostname} onInput={(e) => setHostname(e.currentTarget.value)} placeholder="www.example.com" required spellcheck={false} />
        </label>
        <label>
          Redirect
          <select name="redirect" value={redirect} onChange={(e) => setRedirect(e.currentTarget.value as Redirect)}>
            {REDIRECTS.map(([value, label]) => (
              <option key={value} value={value}>
                {label}
              </option>
            ))}
          </select>
        </label>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Adding…" : "Add"}
        </button>
        <ErrorNote error={error} />
      </form>
    </>
  );
}
