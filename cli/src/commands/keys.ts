import type { Schemas } from "../../../openapi/types.js";
import { path } from "../api.js";
import { defineCommand, type Group, YES_OPTION } from "../command.js";
import { ago, fields, type Output, table, when } from "../output.js";
import { durationSeconds, isoTime } from "../parse.js";
import { confirmOrRefuse } from "../prompt.js";

/** An API key as listed by `GET /v1/api-keys` (never carries the secret). */
export type ApiKey = Schemas["ApiKey"];

/** The creation (and roll) response: the only time the secret `key` is returned. */
type CreatedKey = Schemas["CreatedApiKey"];
type RolledKey = Schemas["RolledApiKey"];

const KEY_FLAGS = { name: "--name", scopes: "--scopes", expiresAt: "--expires-at / --expires-in" };

/** Prints a fresh secret once, with the warning on stderr so it is seen even when stdout is captured. */
function showSecret(out: Output, created: CreatedKey, headline: string, extra: [string, string][] = []): void {
  const block = fields([
    ["id", created.id],
    ["name", created.name],
    ["scopes", created.scopes.join(", ")],
    ["expires", when(created.expiresAt)],
    ...extra,
  ]);
  out.result(created, `${headline}\n${block}\n\n  ${created.key}\n`);
  if (!out.json) out.note("Save this key now (e.g. in your CI's secret store): it cannot be shown again.");
}

const create = defineCommand({
  name: "create",
  summary: "Create an API key (its secret is shown once)",
  description: `Needs a key with the "admin" scope. Scopes: deploy (apps, env vars, disks, deployments, crons,
backups), db, registry, admin (managing API keys).`,
  options: {
    name: { type: "string", value: "name", description: "label to tell the key apart (1-100 characters)", required: true },
    scopes: { type: "string", value: "list", description: "comma-separated scopes: deploy, db, registry, admin", required: true },
    "expires-at": { type: "string", value: "time", description: "expiry time, ISO 8601 (e.g. 2027-01-01T00:00:00Z); default never" },
    "expires-in": { type: "string", value: "duration", description: "expiry relative to now: 90m, 12h, 30d, 2w" },
  },
  examples: ["svc keys create --name ci --scopes deploy", "svc keys create --name ops --scopes deploy,admin --expires-in 30d"],
  async run({ opts, out, api, fail }) {
    const scopes = opts.scopes
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    if (scopes.length === 0) throw fail("--scopes must name at least one scope, e.g. --scopes deploy");
    if (opts["expires-at"] && opts["expires-in"]) throw fail("use either --expires-at or --expires-in, not both");
    let expiresAt: string | undefined;
    if (opts["expires-at"]) expiresAt = isoTime(opts["expires-at"], "--expires-at", fail);
    if (opts["expires-in"]) {
      const seconds = durationSeconds(opts["expires-in"], "--expires-in", fail);
      expiresAt = new Date(Date.now() + seconds * 1000).toISOString();
    }
    const created = await (await api()).json<CreatedKey>(
      "POST",
      "/v1/api-keys",
      { name: opts.name, scopes, ...(expiresAt ? { expiresAt } : {}) },
      { what: "create API key", flags: KEY_FLAGS },
    );
    showSecret(out, created, `Created API key ${created.id}`);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List the account's API keys (secrets are never shown)",
  options: {},
  async run({ out, api }) {
    const keys = await (await api()).json<ApiKey[]>("GET", "/v1/api-keys", undefined, { what: "list API keys" });
    const human =
      keys.length === 0
        ? "No API keys."
        : table(keys, [
            ["ID", (k) => k.id],
            ["NAME", (k) => k.name],
            ["PREFIX", (k) => `${k.start}…`],
            ["SCOPES", (k) => k.scopes.join(",")],
            ["CREATED", (k) => ago(k.createdAt)],
            ["LAST USED", (k) => ago(k.lastUsedAt)],
            ["EXPIRES", (k) => ago(k.expiresAt)],
          ]);
    out.result(keys, human);
  },
});

const remove = defineCommand({
  name: "delete",
  summary: "Delete an API key; requests with it fail at once",
  description: "Asks for confirmation on a terminal; scripts must pass --yes.",
  args: [{ name: "id", description: "the key's id (key_…), from svc keys list" }],
  options: { yes: YES_OPTION },
  examples: ["svc keys delete key_3hY8aQ0mVfK2pR7sT1uW9xZc --yes"],
  async run({ args, opts, out, api, interactive }) {
    await confirmOrRefuse(interactive, opts.yes, {
      action: `delete API key ${args.id}`,
      question: `Delete API key ${args.id}? Every request with it fails from now on; this cannot be undone.`,
      retry: `svc keys delete ${args.id}`,
    });
    await (await api()).request("DELETE", path`/v1/api-keys/${args.id}`, undefined, {
      what: `delete API key ${args.id}`,
      hints: { VALIDATION_ERROR: "pass the key's id (key_…), as shown by `svc keys list`" },
    });
    out.result({ id: args.id, deleted: true }, `Deleted API key ${args.id}`);
  },
});

const roll = defineCommand({
  name: "roll",
  summary: "Replace a key's secret, keeping its name, scopes and expiry",
  description: "The new key gets a new id. The old secret keeps working for the grace period (default 0, at most 24h).",
  args: [{ name: "id", description: "the key's id (key_…), from svc keys list" }],
  options: {
    grace: { type: "string", value: "duration", description: "how long the old secret keeps working: 0, 30m, 1h, 24h" },
  },
  examples: ["svc keys roll key_3hY8aQ0mVfK2pR7sT1uW9xZc --grace 1h"],
  async run({ args, opts, out, api, fail }) {
    const body = opts.grace === undefined ? {} : { gracePeriodSeconds: durationSeconds(opts.grace, "--grace", fail) };
    const rolled = await (await api()).json<RolledKey>("POST", path`/v1/api-keys/${args.id}/roll`, body, {
      what: `roll API key ${args.id}`,
      flags: { gracePeriodSeconds: "--grace" },
      hints: { VALIDATION_ERROR: "pass the key's id (key_…) and a --grace of at most 24h" },
    });
    showSecret(out, rolled, `Rolled API key ${args.id}: new key ${rolled.id}`, [
      ["old key", `${rolled.previousKey.id} stops working ${when(rolled.previousKey.expiresAt)}`],
    ]);
  },
});

/** `svc keys …`: API keys for CI and scripts. */
export const keys: Group = { name: "keys", summary: "Manage API keys", commands: [create, list, remove, roll] };
