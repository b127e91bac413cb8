import type { ResponseData, Schemas } from "../../../openapi/types.js";
import { type Call, path } from "../api.js";
import { APP_ARG, defineCommand, type Group } from "../command.js";
import { ago, table } from "../output.js";
import { applyQuery, ROLLOUT_OPTIONS, type Rollout, reportRollout } from "../rollout.js";

/** An env var as listed; `value` only with `?reveal=true`. */
type EnvVar = Schemas["EnvVar"];
type Unset = ResponseData<"/v1/apps/{app}/env/{name}", "delete", 200>;
type SetResult = { data: EnvVar[]; rollout: Rollout };

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

/** What an env change does to the app, said the same way by set and unset. */
const REACHES = `The change reaches the app: an app that runs starts its release again with the new environment
(without downtime, unless it has a disk: then stop-then-start), recorded in its deployments as
"config: KEY set", and this command follows it like svc deploy; a static site is built again from
the same source (its variables are read at build time). Cron runs read the variables at each run.
With --no-apply the change waits for \`svc apps apply <app>\`, to roll several out together.`;

const set = defineCommand({
  name: "set",
  summary: "Set env vars of an app (others are kept); the change rolls out to the app",
  description: `Each argument is KEY=VALUE; the value is everything after the first "=" and may be empty.
Values are encrypted at rest. ${REACHES}`,
  args: [APP_ARG],
  rest: { name: "KEY=VALUE", description: "a variable to set" },
  options: { ...ROLLOUT_OPTIONS },
  examples: ["svc env set DATABASE_URL=postgres://db/app NODE_ENV=production --app api", "svc env set A=1 --app api --no-apply"],
  async run({ args, rest, opts, out, api, env, fail }) {
    const vars: Record<string, string> = {};
    for (const arg of rest) {
      const eq = arg.indexOf("=");
      if (eq <= 0) throw fail(`"${arg}" is not KEY=VALUE`);
      const name = arg.slice(0, eq);
      if (!NAME.test(name)) throw fail(`"${name}" is not a valid variable name (letters, digits and _, not starting with a digit)`);
      vars[name] = arg.slice(eq + 1);
    }
    const client = await api();
    const changed = await client.json<SetResult>(
      "PATCH",
      `${path`/v1/apps/${args.app}/env`}${applyQuery(opts)}`,
      { vars },
      aboutApp(`set env vars on app ${args.app}`, args.app),
    );
    await reportRollout(out, client, args.app, changed.rollout, { follow: !opts["no-follow"], env });
    out.result(changed.data);
  },
});

const unset = defineCommand({
  name: "unset",
  summary: "Remove env vars from an app; the change rolls out to the app",
  description: REACHES,
  args: [APP_ARG],
  rest: { name: "KEY", description: "a variable to remove" },
  options: { ...ROLLOUT_OPTIONS },
  examples: ["svc env unset DEBUG LOG_LEVEL --app api"],
  async run({ args, rest, opts, out, api, env, fail }) {
    const names = [...new Set(rest)];
    const bad = names.find((n) => !NAME.test(n));
    if (bad !== undefined) throw fail(`"${bad}" is not a variable name${bad.includes("=") ? " (unset takes names only, not KEY=VALUE)" : ""}`);
    const client = await api();
    const results: Unset[] = [];
    // Each but the last waits: the names roll out together, as one change of the app.
    for (const [i, name] of names.entries()) {
      const last = i === names.length - 1;
      const query = last ? applyQuery(opts) : "?apply=false";
      results.push(await client.data<Unset>("DELETE", `${path`/v1/apps/${args.app}/env/${name}`}${query}`, undefined, aboutApp(`unset ${name} on app ${args.app}`, args.app)));
    }
    const last = results.at(-1);
    if (last) await reportRollout(out, client, args.app, last.rollout, { follow: !opts["no-follow"], env });
    out.result(results.map(({ name, deleted }) => ({ name, deleted })));
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
