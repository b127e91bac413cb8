import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group } from "../command.js";
import { ago, table } from "../output.js";

/** An env var as listed; `value` only with `?reveal=true`. */
type EnvVar = Schemas["EnvVar"];
type Unset = ResponseData<"/v1/apps/{app}/env/{name}", "delete", 200>;

/** Shell-style variable names, the ones a process can actually read from its environment. */
const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

function aboutApp(what: string, app: string): Call {
  return {
    what,
    hints: {
      APP_NOT_FOUND: `no app "${app}" in this account: \`svc apps list\` shows the names and ids`,
      ENV_VAR_NOT_FOUND: `\`svc env list --app ${app}\` shows the variables that are set`,
    },
  };
}

const set = defineCommand({
  name: "set",
  summary: "Set env vars of an app (others are kept)",
  description: `Each argument is KEY=VALUE; the value is everything after the first "=" and may be empty.
Values are encrypted at rest and injected into deployments and cron runs.`,
  args: [APP_ARG],
  rest: { name: "KEY=VALUE", description: "a variable to set" },
  options: {},
  examples: ["svc env set DATABASE_URL=postgres://db/app NODE_ENV=production --app api"],
  async run({ args, rest, out, api, fail }) {
    const vars: Record<string, string> = {};
    for (const arg of rest) {
      const eq = arg.indexOf("=");
      if (eq <= 0) throw fail(`"${arg}" is not KEY=VALUE`);
      const name = arg.slice(0, eq);
      if (!NAME.test(name)) throw fail(`"${name}" is not a valid variable name (letters, digits and _, not starting with a digit)`);
      vars[name] = arg.slice(eq + 1);
    }
    const list = await (await api()).data<EnvVar[]>(
      "PATCH",
      path`/v1/apps/${args.app}/env`,
      { vars },
      aboutApp(`set env vars on app ${args.app}`, args.app),
    );
    out.result(list, `Set ${Object.keys(vars).join(", ")} on app ${args.app}`);
  },
});

const unset = defineCommand({
  name: "unset",
  summary: "Remove env vars from an app",
  args: [APP_ARG],
  rest: { name: "KEY", description: "a variable to remove" },
  options: {},
  examples: ["svc env unset DEBUG LOG_LEVEL --app api"],
  async run({ args, rest, out, api, fail }) {
    const names = [...new Set(rest)];
    const bad = names.find((n) => !NAME.test(n));
    if (bad !== undefined) throw fail(`"${bad}" is not a variable name${bad.includes("=") ? " (unset takes names only, not KEY=VALUE)" : ""}`);
    const client = await api();
    const results: Unset[] = [];
    for (const name of names) {
      results.push(
        await client.data<Unset>(
          "DELETE",
          path`/v1/apps/${args.app}/env/${name}`,
          undefined,
          aboutApp(`unset ${name} on app ${args.app}`, args.app),
        ),
      );
      out.step(`Unset ${name} on app ${args.app}`);
    }
    out.result(results);
  },
});

const list = defineCommand({
  name: "list",
  summary: "List an app's env vars (names only unless --reveal)",
  args: [APP_ARG],
  options: {
    reveal: { type: "boolean", description: "also show the values" },
  },
  async run({ args, opts, out, api }) {
    const vars = await (await api()).data<EnvVar[]>(
      "GET",
      `${path`/v1/apps/${args.app}/env`}${opts.reveal ? "?reveal=true" : ""}`,
      undefined,
      aboutApp(`list env vars of app ${args.app}`, args.app),
    );
    const human =
      vars.length === 0
        ? `No env vars on app ${args.app}. Set one: svc env set KEY=VALUE --app ${args.app}`
        : table(vars, [
            ["NAME", (v) => v.name],
            ["UPDATED", (v) => ago(v.updatedAt)],
            ...(opts.reveal ? ([["VALUE", (v: EnvVar) => v.value ?? ""]] as const) : []),
          ]);
    out.result(vars, human);
  },
});

/** `svc env …`: an app's environment variables. */
export const env: Group = { name: "env", summary: "Manage an app's environment variables", commands: [set, unset, list] };
