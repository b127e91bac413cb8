import type { Schemas } from "../../openapi/types.js";
import type { ApiClient } from "./api.js";
import { colouredLines, colourWanted } from "./colour.js";
import type { BooleanOption } from "./command.js";
import { CliError, type Output } from "./output.js";
import { followBuild, followRollout, hasRollout } from "./commands/deploy.js";

/** What became of a change of an app's configuration (the API's `rollout`). */
export type Rollout = Schemas["Rollout"];

/** The flags every command that changes an app's configuration takes. */
export const ROLLOUT_OPTIONS = {
  "no-apply": {
    type: "boolean",
    description: "record the change without rolling it out: several changes then roll out together with `svc apps apply <app>` (or a restart or deploy)",
  },
  "no-follow": { type: "boolean", description: "start the rollout and return without waiting for it" },
} as const satisfies Record<string, BooleanOption>;

/** `?apply=false` for a change made with --no-apply. */
export const applyQuery = (opts: { "no-apply": boolean }) => (opts["no-apply"] ? "?apply=false" : "");

/**
 * Says what became of a change (`GREETING set; rolling out to api`) and,
 * unless told not to, follows its rollout as `svc deploy` follows a deploy:
 * the new process's output and phases until the new configuration serves
 * (exit 1 if it does not start; the previous one then keeps serving). With
 * --json it follows without narrating: the exit code says how it ended.
 */
export async function reportRollout(
  out: Output,
  client: ApiClient,
  app: string,
  rollout: Rollout,
  options: { follow: boolean; env: NodeJS.ProcessEnv },
): Promise<void> {
  out.step(`${rollout.message}${rollout.deploymentId ? ` (deployment ${rollout.deploymentId})` : ""}`);
  if (!rollout.deploymentId || !options.follow) return;
  const stream = process.stdout;
  const plain = (text: string) => void stream.write(text);
  const write = out.json ? () => undefined : colourWanted(stream, options.env) ? colouredLines(plain) : plain;
  let deployment = await followBuild(client, app, rollout.deploymentId, write);
  if (hasRollout(deployment)) deployment = await followRollout(client, app, rollout.deploymentId, write);
  if (deployment.status === "ready") {
    out.step(`Rolled out to ${app}: the new configuration serves${deployment.url ? ` at ${deployment.url}` : ""}`);
    return;
  }
  const excerpt = deployment.logExcerpt ?? [];
  if (excerpt.length > 0 && !out.json) process.stderr.write(`last log lines of the new process:\n${excerpt.map((line) => `  ${line}`).join("\n")}\n`);
  throw new CliError(
    `the rollout to ${app} ${deployment.status === "cancelled" ? "was cancelled" : "failed"} (deployment ${deployment.id})`,
    deployment.error ? [deployment.error] : [],
    `the change is saved; the app keeps its previous configuration until a rollout succeeds. Its output: svc logs --runtime --app ${app}`,
  );
}
