import type { Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, fields, table, when } from "../output.js";
import { confirmOrRefuse } from "../prompt.js";

/** A webhook as the API returns it (docs/webhooks.md). */
type Webhook = Schemas["Webhook"];
type WithSecret = Schemas["WebhookWithSecret"];
type Delivery = Schemas["WebhookDelivery"];
type Event = Webhook["events"][number];

/** The events the API takes: a record of every one, so a new event in the API fails to compile here until it is listed (the CLI is built from cli/ and builder/src/ alone). */
const EVENT_NAMES: Record<Event, true> = {
  "deploy.succeeded": true,
  "deploy.failed": true,
  "app.crash_loop": true,
  "app.recovered": true,
  "cron.failed": true,
  "cron.disabled": true,
  "disk.almost_full": true,
  "node.unreachable": true,
  "node.lost": true,
  "backup.failed": true,
  "restore.failed": true,
};
const EVENTS = Object.keys(EVENT_NAMES) as Event[];

const ID_ARG = { name: "webhook", description: "webhook id (whk_…), from svc webhooks list" } as const;

/** Error context for a call about webhooks, naming the list command when one is not found. */
function about(what: string): Call {
  return {
    what,
    flags: { url: "<url>", events: "--events", description: "--description" },
    hints: {
      WEBHOOK_NOT_FOUND: "`svc webhooks list` shows the account's webhooks and their ids",
      PLAN_LIMIT_EXCEEDED: "remove a webhook first (svc webhooks remove <webhook>)",
    },
  };
}

/** `--events a,b`: the names, checked here so a typo is caught before any request. */
function parseEvents(value: string, fail: (message: string) => Error): Event[] {
  const names = value
    .split(",")
    .map((name) => name.trim())
    .filter(Boolean);
  const unknown = names.filter((name) => !(EVENTS as string[]).includes(name));
  if (names.length === 0 || unknown.length > 0) {
    throw fail(`${unknown.length > 0 ? `unknown event ${unknown.join(", ")}` : "no event given"}: choose from ${EVENTS.join(", ")}`);
  }
  return names as Event[];
}

function describe(webhook: Webhook): string {
  return fields([
    ["id", webhook.id],
    ["url", webhook.url],
    ["events", webhook.events.join(", ")],
    ["description", webhook.description ?? "-"],
    ["previous secret", webhook.previousSecretExpiresAt ? `also signs until ${when(webhook.previousSecretExpiresAt)}` : "-"],
    ["created", when(webhook.createdAt)],
  ]);
}

/** The secret, said once with how to use it. */
function secretNote(secret: string): string {
  return `Secret (shown only now; verify webhook-signature with it, as Standard Webhooks says): ${secret}`;
}

const add = defineCommand({
  name: "add",
  summary: "Send the account's events to a URL, signed (Standard Webhooks)",
  description: `Events: ${EVENTS.join(", ")}. Each is POSTed as {type, timestamp, data} with the webhook-id,
webhook-timestamp and webhook-signature headers, retried with backoff for 24 hours until the URL answers 2xx.
The signing secret is printed once. Production refuses http and private, loopback or link-local targets.`,
  args: [{ name: "url", description: "where to POST events (https://…)" }],
  options: {
    events: { type: "string", value: "a,b", description: "the events to send (comma-separated)", required: true },
    description: { type: "string", value: "text", description: "what the webhook is for" },
  },
  examples: ["svc webhooks add https://hooks.example.com/svc --events deploy.failed,app.crash_loop,cron.failed"],
  async run({ args, opts, out, api, fail }) {
    const events = parseEvents(opts.events, fail);
    const made = await (await api()).data<WithSecret>(
      "POST",
      "/v1/webhooks",
      { url: args.url, events, ...(opts.description === undefined ? {} : { description: opts.description }) },
      about(`add a webhook for ${args.url}`),
    );
    out.result(made, `Added webhook ${made.id}\n${describe(made)}\n${secretNote(made.secret)}\nTry it: svc webhooks test ${made.id}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List the account's webhooks",
  options: {},
  async run({ out, api }) {
    const hooks = await (await api()).data<Webhook[]>("GET", "/v1/webhooks", undefined, about("list webhooks"));
    const human =
      hooks.length === 0
        ? "No webhooks. Add one: svc webhooks add <url> --events deploy.failed,app.crash_loop"
        : table(hooks, [
            ["ID", (w) => w.id],
            ["URL", (w) => w.url],
            ["EVENTS", (w) => w.events.join(",")],
            ["CREATED", (w) => ago(w.createdAt)],
          ]);
    out.result(hooks, human);
  },
});

const info = defineCommand({
  name: "info",
  summary: "Show a webhook and its last deliveries",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const client = await api();
    const webhook = await client.data<Webhook>("GET", path`/v1/webhooks/${args.webhook}`, undefined, about(`show webhook ${args.webhook}`));
    const deliveries = await client.data<Delivery[]>("GET", path`/v1/webhooks/${args.webhook}/deliveries`, undefined, about(`list the deliveries of ${args.webhook}`));
    const recent = deliveries.length === 0 ? "No deliveries yet." : deliveriesTable(deliveries.slice(0, 10));
    out.result({ ...webhook, deliveries }, `${describe(webhook)}\n\nDeliveries (newest first):\n${recent}`);
  },
});

function deliveriesTable(deliveries: Delivery[]): string {
  return table(deliveries, [
    ["ID", (d) => d.id],
    ["EVENT", (d) => d.event],
    ["STATUS", (d) => d.status],
    ["ATTEMPTS", (d) => String(d.attempts)],
    ["LAST ANSWER", (d) => (d.responseStatus !== null ? `HTTP ${d.responseStatus}` : (d.error ?? "-"))],
    ["CREATED", (d) => ago(d.createdAt)],
  ]);
}

const deliveries = defineCommand({
  name: "deliveries",
  summary: "A webhook's deliveries: each event sent, its status, attempts and last answer",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const rows = await (await api()).data<Delivery[]>("GET", path`/v1/webhooks/${args.webhook}/deliveries`, undefined, about(`list the deliveries of ${args.webhook}`));
    out.result(rows, rows.length === 0 ? "No deliveries yet." : deliveriesTable(rows));
  },
});

const update = defineCommand({
  name: "update",
  summary: "Change a webhook's URL, events or description",
  args: [ID_ARG],
  options: {
    url: { type: "string", value: "url", description: "where to POST events" },
    events: { type: "string", value: "a,b", description: "the events to send (comma-separated)" },
    description: { type: "string", value: "text", description: "what the webhook is for" },
  },
  async run({ args, opts, out, api, fail }) {
    const body = {
      ...(opts.url === undefined ? {} : { url: opts.url }),
      ...(opts.events === undefined ? {} : { events: parseEvents(opts.events, fail) }),
      ...(opts.description === undefined ? {} : { description: opts.description }),
    };
    if (Object.keys(body).length === 0) throw fail("say what to change: --url, --events or --description");
    const webhook = await (await api()).data<Webhook>("PATCH", path`/v1/webhooks/${args.webhook}`, body, about(`update webhook ${args.webhook}`));
    out.result(webhook, `Updated webhook ${webhook.id}\n${describe(webhook)}`);
  },
});

const test = defineCommand({
  name: "test",
  summary: "Send a webhook.test event now and say how it went",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const client = await api();
    const queued = await client.data<Delivery>("POST", path`/v1/webhooks/${args.webhook}/test`, undefined, about(`test webhook ${args.webhook}`));
    // The first attempt comes within seconds: its answer, or the delivery still pending.
    let delivery = queued;
    for (let i = 0; i < 20 && delivery.attempts === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 500));
      const rows = await client.data<Delivery[]>("GET", path`/v1/webhooks/${args.webhook}/deliveries`, undefined, about(`list the deliveries of ${args.webhook}`));
      delivery = rows.find((d) => d.id === queued.id) ?? delivery;
    }
    const how =
      delivery.status === "delivered"
        ? `delivered (HTTP ${delivery.responseStatus})`
        : delivery.attempts === 0
          ? "queued; not tried yet"
          : `not taken (${delivery.error ?? `HTTP ${delivery.responseStatus}`}); tried again with backoff for 24 hours (svc webhooks deliveries ${args.webhook})`;
    out.result(delivery, `Test event ${delivery.id}: ${how}`);
  },
});

const rollSecret = defineCommand({
  name: "roll-secret",
  summary: "Give a webhook a new signing secret; the old one also signs for 24 hours",
  args: [ID_ARG],
  options: {},
  async run({ args, out, api }) {
    const rolled = await (await api()).data<WithSecret>("POST", path`/v1/webhooks/${args.webhook}/roll-secret`, undefined, about(`roll the secret of ${args.webhook}`));
    out.result(rolled, `${secretNote(rolled.secret)}\nUntil ${when(rolled.previousSecretExpiresAt)} deliveries carry a signature with the old secret too.`);
  },
});

const remove = defineCommand({
  name: "remove",
  summary: "Remove a webhook (its pending deliveries go with it)",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: [ID_ARG],
  options: { yes: YES_OPTION },
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `remove webhook ${args.webhook}`,
      question: `Remove webhook ${args.webhook}? Its pending deliveries are dropped.`,
      retry: `svc webhooks remove ${args.webhook}`,
    });
    await (await api()).request("DELETE", path`/v1/webhooks/${args.webhook}`, undefined, about(`remove webhook ${args.webhook}`));
    out.result({ id: args.webhook, deleted: true }, `Removed webhook ${args.webhook}`);
  },
});

/** `svc webhooks …`: alerts as signed webhooks. */
export const webhooks: Group = { name: "webhooks", summary: "Send the account's events to URLs, signed", commands: [add, list, info, deliveries, update, test, rollSecret, remove] };
