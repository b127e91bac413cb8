import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { getTableColumns, getTableName, type Table } from "drizzle-orm";
import { newAccountRows } from "../worker/auth/rows.js";
import { accounts, apiKeys, PLANS, type Plan } from "../worker/db/schema.js";
import { ROOT } from "./local-stack.js";

/**
 * Operator command: `npm run account:create -- --name <name> [--plan free|pro|business] [--operator-events] [--remote]`.
 * Creates an account and its first admin key directly in D1 (local state by
 * default, the production database with --remote) and prints the key once.
 * `--operator-events`: the account's webhooks may subscribe to the fleet's
 * node events (docs/webhooks.md), as the operator's own account.
 */
const USAGE = "usage: npm run account:create -- --name <name> [--plan free|pro|business] [--operator-events] [--remote]";

const { values } = parseArgs({
  options: {
    name: { type: "string" },
    plan: { type: "string", default: "free" },
    "operator-events": { type: "boolean", default: false },
    remote: { type: "boolean", default: false },
    help: { type: "boolean", short: "h" },
  },
});
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
const name = values.name?.trim() ?? "";
if (!name || name.length > 100) {
  console.error(`--name is required (1-100 characters)\n${USAGE}`);
  process.exit(2);
}
if (!(PLANS as readonly string[]).includes(values.plan)) {
  console.error(`--plan must be one of ${PLANS.join(", ")}\n${USAGE}`);
  process.exit(2);
}

function literal(value: unknown): string {
  if (value === null || value === undefined) return "NULL";
  if (typeof value === "number") return String(value);
  return `'${String(value).replaceAll("'", "''")}'`;
}

/** INSERT for one row, column names and encodings taken from the drizzle table itself. */
function insertSql(table: Table, row: Record<string, unknown>): string {
  const columns = Object.entries(getTableColumns(table)).filter(([key]) => row[key] !== undefined);
  const names = columns.map(([, column]) => `"${column.name}"`).join(", ");
  const vals = columns.map(([key, column]) => literal(column.mapToDriverValue(row[key]))).join(", ");
  return `INSERT INTO "${getTableName(table)}" (${names}) VALUES (${vals});`;
}

const { account, key } = await newAccountRows({ name, plan: values.plan as Plan, operatorEvents: values["operator-events"], now: Date.now() });
const sql = [insertSql(accounts, account), insertSql(apiKeys, key.row)].join("\n");
const where = values.remote ? ["--remote"] : ["--local", "--persist-to", join(ROOT, ".wrangler", "state")];
const env = { ...process.env, WRANGLER_SEND_METRICS: "false" };
const wrangler = join(ROOT, "node_modules", ".bin", "wrangler");

if (!values.remote) {
  const migrate = spawnSync(wrangler, ["d1", "migrations", "apply", "DB", ...where], { cwd: ROOT, env, encoding: "utf8" });
  if (migrate.status !== 0) {
    console.error(`applying migrations failed:\n${migrate.stdout}${migrate.stderr}`);
    process.exit(1);
  }
}
const result = spawnSync(wrangler, ["d1", "execute", "DB", ...where, "--command", sql], { cwd: ROOT, env, encoding: "utf8" });
if (result.status !== 0) {
  console.error(`creating the account failed:\n${result.stdout}${result.stderr}`);
  process.exit(1);
}
console.log(`Account    ${account.id} (${account.name}, plan ${account.plan}${values.remote ? ", remote" : ", local"})
Admin key  ${key.secret}

Store the key now (a secret manager or an environment variable); it cannot be shown again.`);
