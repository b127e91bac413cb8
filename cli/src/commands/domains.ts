import type { Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group, YES_OPTION } from "../command.js";
import { CliError, fields, table, when } from "../output.js";
import { confirmOrRefuse } from "../prompt.js";

/** A custom domain as the API returns it (docs/domains.md). */
type Domain = Schemas["Domain"];
type Redirect = Domain["redirect"];

const REDIRECTS = ["none", "to-www", "to-apex"] as const satisfies readonly Redirect[];

const HOSTNAME_ARG = { name: "hostname", description: "the full domain name, e.g. www.example.com" } as const;

/** API field → what the user typed, so VALIDATION_ERROR hints name it. */
const DOMAIN_FLAGS = { hostname: "<hostname>", redirect: "--redirect", httpsOnly: "--https-only / --no-https-only" };

/** Error context for a call about an app's domains, naming the app and the hostname in its hints. */
function aboutDomain(what: string, app: string, hostname?: string): Call {
  const other = hostname ?? "<hostname>";
  return {
    what,
    flags: DOMAIN_FLAGS,
    hints: {
      APP_NOT_FOUND: `no app "${app}" in this account: \`svc apps list\` shows the names and ids`,
      DOMAIN_NOT_FOUND: `\`svc domains list --app ${app}\` shows the app's domains (add one: svc domains add ${other} --app ${app})`,
      DOMAIN_TAKEN: `another account has verified ${other} (it is free again only once that account removes it), or one of your apps has it already (\`svc domains list --app <app>\`)`,
      PLAN_LIMIT_EXCEEDED: `remove a domain of the app first (svc domains remove <hostname> --app ${app})`,
    },
  };
}

/**
 * The two arguments in their places: an app name never has a dot, a hostname
 * always does, so `svc domains add www.example.com my-site` is caught before
 * any request instead of looking for an app called www.example.com.
 */
function target(args: { app: string; hostname: string }, fail: (message: string) => Error): { app: string; hostname: string } {
  if (args.app.includes(".")) {
    throw fail(`"${args.app}" is a hostname, not an app: give the app with --app <app> (or first: <app> <hostname>)`);
  }
  // The API takes `WWW.Example.com.` as www.example.com, in a path as in a body.
  return args;
}

/** The records to create, as a table: what `add` and `info` print. */
function recordsTable(domain: Domain): string {
  return table(domain.records, [
    ["TYPE", (r) => r.type],
    ["NAME", (r) => r.name],
    ["VALUE", (r) => r.value],
  ]);
}

function statusLine(domain: Domain): string {
  return domain.reason ? `${domain.status} (${domain.reason})` : domain.status;
}

function redirectLine(domain: Domain): string {
  if (domain.redirect === "to-www") return `to-www (to www.${domain.hostname}, 308)`;
  if (domain.redirect === "to-apex") return `to-apex (to ${domain.hostname.replace(/^www\./, "")}, 308)`;
  return "none";
}

function describe(domain: Domain): string {
  const text = fields([
    ["hostname", domain.hostname],
    ["id", domain.id],
    ["app", domain.app],
    ["status", statusLine(domain)],
    ["certificate", domain.certificate],
    ["redirect", redirectLine(domain)],
    ["https only", domain.httpsOnly ? "yes (where the edge has TLS)" : "no"],
    ["verification", domain.verification.method === "dns" ? "dns (a TXT record)" : "http (this stack's own edge answers)"],
    ["checked", when(domain.verification.checkedAt)],
    ["verified", when(domain.verification.verifiedAt)],
    ["created", when(domain.createdAt)],
  ]);
  return domain.records.length === 0 ? text : `${text}\n\nDNS records:\n${recordsTable(domain)}`;
}

/** What to do while a domain is not active: said by add, and by verify when it exits 1. */
function nextStep(domain: Domain): string {
  const verify = `svc domains verify ${domain.hostname} --app ${domain.app}`;
  const txt = domain.records.find((r) => r.type === "TXT");
  const cname = domain.records.find((r) => r.type === "CNAME");
  switch (domain.status) {
    case "pending_verification":
      if (domain.verification.method === "http") return `run \`${verify}\`: this stack proves ownership over HTTP, without DNS`;
      return txt
        ? `create the TXT record ${txt.name} with the value ${txt.value}, then run \`${verify}\` (DNS changes can take minutes to show)`
        : `create the records \`svc domains info ${domain.hostname} --app ${domain.app}\` lists, then run \`${verify}\``;
    case "pending_certificate":
      return `the certificate is being issued${cname ? ` (the CNAME ${cname.name} → ${cname.value} must be in place)` : ""}: run \`${verify}\` again in a minute`;
    case "failed":
      return domain.reason?.includes("another account")
        ? `the hostname belongs to the account that proved it first: remove it here (svc domains remove ${domain.hostname} --app ${domain.app}), or have that account remove it and verify again`
        : `fix what the reason says${cname ? ` (is ${cname.name} a CNAME to ${cname.value}?)` : ""}, then run \`${verify}\``;
    default:
      return "";
  }
}

/** How to reach an active domain of a local stack from this machine: its edge, with the domain's Host. */
function tryLocally(domain: Domain, apiUrl: string): string {
  return `Try it: curl -H 'Host: ${domain.hostname}' ${apiUrl}/`;
}

const add = defineCommand({
  name: "add",
  summary: "Add a custom domain to an app; prints the DNS records that prove and route it",
  description: `The domain serves nothing until it is verified: create the TXT record printed (production), then
\`svc domains verify\`. A hostname another account has verified is refused (DOMAIN_TAKEN); the API bounds
the domains of an app (PLAN_LIMIT_EXCEEDED names it). --redirect to-www sends the apex to www (308), to-apex sends www to the apex; add
both hostnames for it to serve. More: docs/domains.md.`,
  args: [APP_ARG, HOSTNAME_ARG],
  options: {
    redirect: { type: "string", value: "none|to-www|to-apex", description: "redirect this hostname to its www or apex counterpart (default none)" },
    "no-https-only": { type: "boolean", description: "also answer plain http where the edge has TLS (by default http redirects to https there)" },
  },
  examples: [
    "svc domains add www.example.com --app my-site",
    "svc domains add example.com --app my-site --redirect to-www",
    "svc domains add my-site shop.example.com --json",
  ],
  async run({ args, opts, out, api, fail }) {
    const { app, hostname } = target(args, fail);
    const redirect = opts.redirect === undefined ? undefined : redirectOf(opts.redirect, fail);
    const client = await api();
    const domain = await client.data<Domain>(
      "POST",
      path`/v1/apps/${app}/domains`,
      { hostname, ...(redirect ? { redirect } : {}), ...(opts["no-https-only"] ? { httpsOnly: false } : {}) },
      aboutDomain(`add domain ${hostname} to app ${app}`, app, hostname),
    );
    const lines = [`Added ${domain.hostname} to app ${domain.app}: ${statusLine(domain)}`];
    if (domain.records.length > 0) lines.push("", "Create these DNS records:", recordsTable(domain));
    if (domain.verification.method === "http") {
      lines.push("", "This stack proves ownership over HTTP (its own edge answers the check), so no DNS record is needed here.");
    }
    lines.push("", `Next: svc domains verify ${domain.hostname} --app ${domain.app}`);
    out.result(domain, lines.join("\n"));
  },
});

const list = defineCommand({
  name: "list",
  summary: "List an app's custom domains",
  args: [APP_ARG],
  options: {},
  async run({ args, out, api }) {
    const domains = await (await api()).data<Domain[]>("GET", path`/v1/apps/${args.app}/domains`, undefined, aboutDomain(`list domains of app ${args.app}`, args.app));
    const human =
      domains.length === 0
        ? `No custom domains on app ${args.app}. Add one: svc domains add <hostname> --app ${args.app}`
        : table(domains, [
            ["HOSTNAME", (d) => d.hostname],
            ["STATUS", (d) => d.status],
            ["CERTIFICATE", (d) => d.certificate],
            ["REDIRECT", (d) => d.redirect],
            ["REASON", (d) => d.reason ?? ""],
          ]);
    out.result(domains, human);
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show a custom domain: its status, why, and the DNS records to create",
  args: [APP_ARG, HOSTNAME_ARG],
  options: {},
  examples: ["svc domains info www.example.com --app my-site"],
  async run({ args, out, api, fail }) {
    const { app, hostname } = target(args, fail);
    const domain = await (await api()).data<Domain>("GET", path`/v1/apps/${app}/domains/${hostname}`, undefined, aboutDomain(`show domain ${hostname} of app ${app}`, app, hostname));
    out.result(domain, describe(domain));
  },
});

const verify = defineCommand({
  name: "verify",
  summary: "Check a custom domain now: ownership, then its certificate; exit 1 until it is active",
  description: `Asks the API to check the domain at once and prints what it found. Exits 0 once the domain is
active (serving the app), 1 while it is pending or failed, with what to do next; run it again after
creating the records (DNS changes can take minutes to show). On a local stack ownership is proven over
HTTP by the stack's own edge, so a domain is active after the first verify.`,
  args: [APP_ARG, HOSTNAME_ARG],
  options: {},
  examples: ["svc domains verify www.example.com --app my-site", "until svc domains verify www.example.com --app my-site; do sleep 30; done"],
  async run({ args, out, api, fail }) {
    const { app, hostname } = target(args, fail);
    const client = await api();
    const domain = await client.data<Domain>(
      "POST",
      path`/v1/apps/${app}/domains/${hostname}/verify`,
      undefined,
      aboutDomain(`verify domain ${hostname} of app ${app}`, app, hostname),
    );
    if (domain.status === "active") {
      const local = domain.verification.method === "http" ? `\n${tryLocally(domain, client.target.apiUrl)}` : "";
      out.result(domain, `${domain.hostname} is active: it serves app ${domain.app}${local}`);
      return;
    }
    if (out.json) out.result(domain);
    throw new CliError(`${domain.hostname} is not active yet`, [`status: ${domain.status}`, ...(domain.reason ? [`reason: ${domain.reason}`] : [])], nextStep(domain));
  },
});

function redirectOf(value: string, fail: (message: string) => Error): Redirect {
  const redirect = REDIRECTS.find((r) => r === value);
  if (!redirect) throw fail(`--redirect must be one of ${REDIRECTS.join(", ")}, got "${value}"`);
  return redirect;
}

const update = defineCommand({
  name: "update",
  summary: "Change a custom domain's redirect or HTTPS setting",
  args: [APP_ARG, HOSTNAME_ARG],
  options: {
    redirect: { type: "string", value: "none|to-www|to-apex", description: "to-www: the apex redirects to www; to-apex: www redirects to the apex; none" },
    "https-only": { type: "boolean", description: "redirect plain http to https where the edge has TLS (the default)" },
    "no-https-only": { type: "boolean", description: "answer plain http as well" },
  },
  examples: ["svc domains update example.com --app my-site --redirect to-www", "svc domains update www.example.com --app my-site --no-https-only"],
  async run({ args, opts, out, api, fail }) {
    const { app, hostname } = target(args, fail);
    if (opts["https-only"] && opts["no-https-only"]) throw fail("use either --https-only or --no-https-only, not both");
    const body = {
      ...(opts.redirect === undefined ? {} : { redirect: redirectOf(opts.redirect, fail) }),
      ...(opts["https-only"] || opts["no-https-only"] ? { httpsOnly: opts["https-only"] } : {}),
    };
    if (Object.keys(body).length === 0) throw fail("nothing to change: pass --redirect, --https-only or --no-https-only");
    const domain = await (await api()).data<Domain>(
      "PATCH",
      path`/v1/apps/${app}/domains/${hostname}`,
      body,
      aboutDomain(`update domain ${hostname} of app ${app}`, app, hostname),
    );
    out.result(domain, `Updated ${domain.hostname}\n${describe(domain)}`);
  },
});

const remove = defineCommand({
  name: "remove",
  summary: "Remove a custom domain from an app: it stops serving, and any account may claim it again",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: [APP_ARG, HOSTNAME_ARG],
  options: { yes: YES_OPTION },
  examples: ["svc domains remove www.example.com --app my-site --yes"],
  async run({ args, opts, out, api, interactive, fail }) {
    const { app, hostname } = target(args, fail);
    await confirmOrRefuse(interactive, opts.yes, {
      action: `remove domain ${hostname} from app ${app}`,
      question: `Remove ${hostname} from app ${app}? It stops serving within seconds, and any account may then claim it.`,
      retry: `svc domains remove ${hostname} --app ${app}`,
    });
    await (await api()).request("DELETE", path`/v1/apps/${app}/domains/${hostname}`, undefined, aboutDomain(`remove domain ${hostname} from app ${app}`, app, hostname));
    out.result({ app, hostname, deleted: true }, `Removed ${hostname} from app ${app}`);
  },
});

/** `svc domains …`: an app's custom domains. */
export const domains: Group = { name: "domains", summary: "Manage an app's custom domains", commands: [add, list, info, verify, update, remove] };
