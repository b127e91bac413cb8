import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { ROOT } from "./local-stack.js";

/**
 * `npm run deploy` runs this first: it refuses a production configuration that
 * still points at this machine or at the placeholders wrangler.toml ships with
 * (a Worker whose callbacks go to 127.0.0.1, or whose presigned URLs name
 * example.com, fails in ways that are slow to trace), or that still carries
 * the placeholder database id. Exits 1 with every problem listed.
 */
const PLACEHOLDER = /localhost|127\.0\.0\.1|\[::1\]|example\.com|ACCOUNT_ID|^ZONE_ID$|^0{8}-0{4}-0{4}-0{4}-0{12}$/;
const CHECKED = ["PUBLIC_URL", "APPS_DOMAIN", "S3_ENDPOINT", "BUILDER_URL", "database_id", "DOMAIN_CNAME_TARGET", "CF_ZONE_ID"];

export function placeholderProblems(toml: string): string[] {
  const start = toml.indexOf("[env.production]");
  if (start === -1) return ["wrangler.toml has no [env.production] section"];
  const problems: string[] = [];
  for (const line of toml.slice(start).split("\n")) {
    const match = /^\s*([A-Za-z0-9_]+)\s*=\s*"([^"]*)"/.exec(line);
    if (!match || !CHECKED.includes(match[1]!)) continue;
    const [, name, value] = match;
    if (name === "BUILDER_URL") problems.push("BUILDER_URL is set: production nodes join with join tokens instead (svc admin nodes token; docs/fleet.md)");
    else if (PLACEHOLDER.test(value!)) problems.push(`${name} = "${value}" is a placeholder or this machine: set your own in [env.production]`);
  }
  return problems;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const problems = placeholderProblems(await readFile(join(ROOT, "wrangler.toml"), "utf8"));
  if (problems.length > 0) {
    console.error(`npm run deploy refused:\n  ${problems.join("\n  ")}`);
    process.exit(1);
  }
}
