import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { ApiClient } from "../api.js";
import { defineCommand } from "../command.js";
import { configFile, DEFAULT_API_URL, normalizeApiUrl, removeConfig, saveConfig } from "../config.js";
import { CliError, fields } from "../output.js";
import { ask, askSecret } from "../prompt.js";
import type { Schemas } from "../../../openapi/types.js";
import type { ApiKey } from "./keys.js";

async function readStdin(): Promise<string> {
  let text = "";
  process.stdin.setEncoding("utf8");
  for await (const chunk of process.stdin) text += chunk;
  return text;
}

/** Where `npm start` of this checkout keeps its address and admin key (scripts/local-stack.ts writes them). */
const LOCAL_STATE = fileURLToPath(new URL("../../../.svc/", import.meta.url));

/** The API URL and admin key of the stack `npm start` runs from this checkout. */
async function localStack(): Promise<{ apiUrl: string; apiKey: string }> {
  const read = (name: string) => readFile(`${LOCAL_STATE}${name}`, "utf8").then((text) => text.trim());
  try {
    return { apiUrl: await read("local-api-url"), apiKey: await read("local-admin-key") };
  } catch {
    throw new CliError(
      "no local stack to log in to",
      [`${LOCAL_STATE} has no local-api-url and local-admin-key`],
      "start it with `npm start` in the repository (it writes them once it is up), then run svc login --local again",
    );
  }
}

/** `svc login`: verifies the key before saving it, so a typo is caught now rather than at the next deploy. */
export const login = defineCommand({
  name: "login",
  summary: "Verify an API key and save it with the API URL",
  description: `The key is checked with GET /v1/api-keys, then saved to $XDG_CONFIG_HOME/svc/config.json
(default ~/.config/svc/config.json, mode 0600). Missing values are asked for when stdin is a
terminal; otherwise --api-key is required. --local takes both from the stack \`npm start\` runs from
this checkout (.svc/local-api-url and .svc/local-admin-key). SVC_API_URL and SVC_API_KEY override the
saved values.`,
  options: {
    local: { type: "boolean", description: "log in to the stack `npm start` runs from this checkout (its URL and admin key)" },
    "api-url": { type: "string", value: "url", description: `API address (default: the current one, else ${DEFAULT_API_URL})` },
    "api-key": { type: "string", value: "key", description: 'API key (svc_…); "-" reads it from stdin, keeping it out of the process list' },
  },
  examples: [
    "svc login",
    "svc login --local",
    "svc login --api-url http://127.0.0.1:8787 --api-key - < .svc/local-admin-key",
  ],
  async run(ctx) {
    const { opts, out, interactive, env } = ctx;
    if (opts.local && (opts["api-url"] !== undefined || opts["api-key"] !== undefined)) {
      throw ctx.fail("--local takes the URL and the key from the local stack: leave out --api-url and --api-key");
    }
    const local = opts.local ? await localStack() : undefined;
    let rawUrl = local?.apiUrl ?? opts["api-url"];
    if (rawUrl === undefined) {
      const current = await ctx.config().then(
        (c) => c.apiUrl,
        () => DEFAULT_API_URL,
      );
      rawUrl = interactive ? await ask("API URL", current) : current;
    }
    const apiUrl = normalizeApiUrl(rawUrl);
    if (!apiUrl) throw ctx.fail(`--api-url must be an http(s) URL such as ${DEFAULT_API_URL}, got "${rawUrl}"`);

    let apiKey = local?.apiKey ?? (opts["api-key"] === "-" ? (await readStdin()).trim() : opts["api-key"]?.trim());
    if (apiKey === undefined) {
      if (!interactive) throw ctx.fail("missing --api-key <key> (stdin is not a terminal, so svc cannot ask for it)");
      apiKey = await askSecret("API key");
    }
    if (!apiKey) throw ctx.fail("the API key is empty");

    const api = new ApiClient({ apiUrl, apiKey, keySource: "flag", command: ctx.path });
    const keys = await api.json<ApiKey[]>("GET", "/v1/api-keys", undefined, {
      what: `verify the API key with ${apiUrl}`,
      hints: {
        UNAUTHORIZED:
          "the API did not accept this key: check it was copied whole, or create one (svc keys create; locally, npm start prints an admin key)",
      },
    });
    const file = configFile(env);
    await saveConfig(file, { apiUrl, apiKey });

    const self = keys.find((k) => apiKey.startsWith(k.start));
    const rows: [string, string][] = [["API", apiUrl]];
    if (self) rows.push(["Key", `${self.name} (${self.id}), scopes: ${self.scopes.join(", ")}`]);
    rows.push(["Saved to", `${file} (mode 0600)`]);
    out.result({ apiUrl, configFile: file, key: self ?? null }, `Logged in.\n${fields(rows)}`);
    if (env.SVC_API_KEY) out.note("Note: SVC_API_KEY is set in this environment and overrides the saved key.");
    if (env.SVC_API_URL) out.note("Note: SVC_API_URL is set in this environment and overrides the saved API URL.");
  },
});

/** `svc logout`: forgets the saved login; an env key, if set, still applies and is pointed out. */
export const logout = defineCommand({
  name: "logout",
  summary: "Remove the saved API URL and key",
  options: {},
  async run({ out, env }) {
    const file = configFile(env);
    const removed = await removeConfig(file);
    out.result({ configFile: file, removed }, removed ? `Logged out: removed ${file}` : `Not logged in (no ${file})`);
    if (env.SVC_API_KEY) out.note("Note: SVC_API_KEY is still set in this environment, so svc commands keep using it.");
  },
});

/** `svc whoami`: which key (and account) svc commands use now, and where it comes from. */
export const whoami = defineCommand({
  name: "whoami",
  summary: "Show the API key svc uses now: its name, scopes and account, and the API it talks to",
  options: {},
  examples: ["svc whoami", "svc whoami --json"],
  async run({ out, api, config }) {
    const { apiUrl, apiKeySource, file } = await config();
    const me = await (await api()).json<Schemas["WhoAmI"]>("GET", "/v1/whoami", undefined, { what: "ask the API who this key is" });
    const from = apiKeySource === "env" ? "SVC_API_KEY" : `the saved login (${file})`;
    out.result(
      { ...me, apiUrl },
      fields([
        ["key", `${me.keyName} (${me.keyId}), from ${from}`],
        ["scopes", me.scopes.join(", ") || "none"],
        ["account", me.accountId],
        ["api", apiUrl],
      ]),
    );
  },
});
