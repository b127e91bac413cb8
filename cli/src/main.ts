import { ApiClient } from "./api.js";
import { type BaseContext, type Command, GLOBAL_OPTIONS, type Group, helpRows } from "./command.js";
import { apps } from "./commands/apps.js";
import { backups } from "./commands/backups.js";
import { cron } from "./commands/cron.js";
import { deploy, deployments } from "./commands/deploy.js";
import { disk } from "./commands/disk.js";
import { env } from "./commands/env.js";
import { init } from "./commands/init.js";
import { keys } from "./commands/keys.js";
import { login, logout } from "./commands/login.js";
import { logs } from "./commands/logs.js";
import { type ResolvedConfig, resolveConfig } from "./config.js";
import { CliError, Output, reportError, UsageError } from "./output.js";
import { VERSION } from "./version.js";

/** Every top-level entry, in help order. A new noun is one file under commands/ and one line here. */
const ENTRIES: readonly (Group | Command)[] = [login, logout, keys, apps, env, disk, backups, cron, init, deploy, deployments, logs];

const isGroup = (entry: Group | Command): entry is Group => "commands" in entry;

function topUsage(): string {
  const rows: [string, string][] = [];
  for (const entry of ENTRIES) {
    if (isGroup(entry)) for (const cmd of entry.commands) rows.push([`${entry.name} ${cmd.name}`, cmd.summary]);
    else rows.push([entry.name, entry.summary]);
  }
  const globals: [string, string][] = [
    ["--json", GLOBAL_OPTIONS.json.description],
    ["-h, --help", "show help (works after any command)"],
    ["--version", "print the version"],
  ];
  return `svc: the command-line tool of the svc platform

Usage: svc <command> [options]

Commands:
${helpRows(rows)}

Global options:
${helpRows(globals)}

Configuration: svc login saves the API URL and key to $XDG_CONFIG_HOME/svc/config.json
(default ~/.config/svc/config.json); SVC_API_URL and SVC_API_KEY override the file.
Run \`svc <command> --help\` for a command's options.
`;
}

function groupUsage(group: Group): string {
  return `Usage: svc ${group.name} <command> [options]

${group.summary}.

Commands:
${helpRows(group.commands.map((cmd) => [cmd.name, cmd.summary] as const))}

Run \`svc ${group.name} <command> --help\` for a command's options.
`;
}

function baseContext(path: string, json: boolean): BaseContext {
  let config: Promise<ResolvedConfig> | undefined;
  const getConfig = () => {
    config ??= resolveConfig(process.env);
    return config;
  };
  return {
    json,
    path,
    env: process.env,
    interactive: process.stdin.isTTY === true,
    config: getConfig,
    api: async () => {
      const { apiUrl, apiKey, apiKeySource } = await getConfig();
      if (!apiKey || !apiKeySource) {
        throw new CliError("not logged in", ["no API key configured"], "run `svc login` or set SVC_API_KEY");
      }
      return new ApiClient({ apiUrl, apiKey, keySource: apiKeySource, command: path });
    },
  };
}

/**
 * Runs one `svc` invocation and returns its exit code: 0 on success, 1 when
 * the API or the environment says no, 2 for a command line that does not parse.
 * Flags before the noun may only be the global ones.
 */
export async function main(argv: readonly string[]): Promise<number> {
  const out = new Output(false);
  try {
    const flags = { json: false, help: false, version: false };
    /** Consumes the global flags standing before a noun or verb; returns the index of the next word. */
    const globalsFrom = (start: number, synopsis: string, path: string) => {
      let i = start;
      for (; i < argv.length && argv[i]!.startsWith("-"); i++) {
        const flag = argv[i]!;
        if (flag === "--json") flags.json = true;
        else if (flag === "--help" || flag === "-h") flags.help = true;
        else if (flag === "--version" && start === 0) flags.version = true;
        else throw new UsageError(`unknown option "${flag}" before the command`, synopsis, path);
      }
      return i;
    };
    const nounAt = globalsFrom(0, "svc <command> [options]", "svc");
    const noun = argv[nounAt];
    if (noun === undefined) {
      if (flags.version) out.text(VERSION);
      else if (flags.help) out.text(topUsage());
      else throw new UsageError("missing command", "svc <command> [options]", "svc");
      return 0;
    }
    const entry = ENTRIES.find((e) => e.name === noun);
    if (!entry) throw new UsageError(`unknown command "${noun}"`, "svc <command> [options]", "svc");
    let command: Command;
    let rest: readonly string[];
    if (!isGroup(entry)) {
      command = entry;
      rest = argv.slice(nounAt + 1);
    } else {
      const path = `svc ${entry.name}`;
      const synopsis = `${path} <command> [options]`;
      const verbAt = globalsFrom(nounAt + 1, synopsis, path);
      const verb = argv[verbAt];
      if (verb === undefined) {
        if (!flags.help) throw new UsageError(`missing command after "${path}"`, synopsis, path);
        out.text(groupUsage(entry));
        return 0;
      }
      const found = entry.commands.find((c) => c.name === verb);
      if (!found) throw new UsageError(`unknown command "${path} ${verb}"`, synopsis, path);
      command = found;
      rest = argv.slice(verbAt + 1);
    }
    const path = isGroup(entry) ? `svc ${entry.name} ${command.name}` : `svc ${command.name}`;
    await command.execute(flags.help ? ["--help", ...rest] : rest, baseContext(path, flags.json));
    return 0;
  } catch (err) {
    return reportError(err);
  }
}
