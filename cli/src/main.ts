import { ApiClient } from "./api.js";
import { type BaseContext, type Command, defineCommand, GLOBAL_OPTIONS, type Group, helpRows } from "./command.js";
import { admin } from "./commands/admin.js";
import { apps } from "./commands/apps.js";
import { backups } from "./commands/backups.js";
import { cron } from "./commands/cron.js";
import { deploy, deployments } from "./commands/deploy.js";
import { disk } from "./commands/disk.js";
import { domains } from "./commands/domains.js";
import { metrics } from "./commands/metrics.js";
import { webhooks } from "./commands/webhooks.js";
import { env } from "./commands/env.js";
import { init } from "./commands/init.js";
import { keys } from "./commands/keys.js";
import { login, logout, whoami } from "./commands/login.js";
import { logs } from "./commands/logs.js";
import { type ResolvedConfig, resolveConfig } from "./config.js";
import { completionScript, SHELLS } from "./completion.js";
import { CliError, Output, reportError, UsageError } from "./output.js";
import { didYouMean } from "./suggest.js";
import { VERSION } from "./version.js";

/** Every noun and top-level command, in help order. A new noun is one file under commands/ and one line here. */
const COMMANDS: readonly (Group | Command)[] = [login, logout, whoami, keys, apps, env, domains, disk, backups, cron, webhooks, init, deploy, deployments, logs, metrics, admin];

const isGroup = (entry: Group | Command): entry is Group => "commands" in entry;

/** `svc help [command]`: the same screens as `--help`, reached the way git, gh and cargo offer. */
const help = defineCommand({
  name: "help",
  summary: "Show the help of svc or of a command",
  rest: { name: "command", description: "a command, e.g. keys or keys create", optional: true },
  options: {},
  examples: ["svc help", "svc help deploy", "svc help keys create"],
  async run({ rest, out }) {
    out.text(helpFor(rest));
  },
});

/** `svc completion <shell>`: a completion script made from the same declarations as parsing and help. */
const completion = defineCommand({
  name: "completion",
  summary: "Print a shell completion script for bash, zsh or fish",
  description: `Load it from your shell's start-up file:
  bash  echo 'eval "$(svc completion bash)"' >> ~/.bashrc
  zsh   svc completion zsh > "\${fpath[1]}/_svc"   (or eval "$(svc completion zsh)" after compinit)
  fish  svc completion fish > ~/.config/fish/completions/svc.fish`,
  args: [{ name: "shell", description: SHELLS.join(", ") }],
  options: {},
  examples: ["svc completion bash", "svc completion zsh > ~/.zsh/completions/_svc"],
  async run({ args, out }) {
    const shell = SHELLS.find((s) => s === args.shell);
    if (!shell) {
      const suggestion = didYouMean(args.shell, SHELLS);
      throw new UsageError(`unknown shell "${args.shell}"`, "svc completion bash|zsh|fish", "svc completion", suggestion ? `${suggestion} (svc completes in ${SHELLS.join(", ")})` : `svc completes in ${SHELLS.join(", ")}`);
    }
    out.text(completionScript(shell, ENTRIES));
  },
});

/** Everything `svc <word>` reaches, in help order. */
const ENTRIES: readonly (Group | Command)[] = [...COMMANDS, help, completion];

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

The app a command acts on is --app <app> (-a) everywhere; the first argument works too.
Configuration: svc login saves the API URL and key to $XDG_CONFIG_HOME/svc/config.json
(default ~/.config/svc/config.json); SVC_API_URL and SVC_API_KEY override the file.
Run \`svc help <command>\` or \`svc <command> --help\` for a command's options.
`;
}

function groupUsage(group: Group): string {
  return `Usage: svc ${group.name} <command> [options]

${group.summary}.

Commands:
${helpRows(group.commands.map((cmd) => [cmd.name, cmd.summary] as const))}

Run \`svc help ${group.name} <command>\` or \`svc ${group.name} <command> --help\` for a command's options.
`;
}

/** Words other tools use for ours (`svc cron pause` is `svc cron disable`): offered when no spelling is close. */
const SYNONYMS: Readonly<Record<string, readonly string[]>> = {
  pause: ["disable"],
  suspend: ["disable", "stop"],
  resume: ["enable", "restart"],
  unpause: ["enable"],
  start: ["restart", "run"],
  trigger: ["run"],
  exec: ["run"],
  show: ["info"],
  get: ["info"],
  describe: ["info"],
  status: ["info"],
  ls: ["list"],
  rm: ["delete", "remove"],
  remove: ["delete"],
  delete: ["remove"],
  create: ["add"],
  check: ["verify"],
  destroy: ["delete", "remove"],
  new: ["create"],
  add: ["create", "set"],
  edit: ["update"],
  modify: ["update"],
  history: ["runs", "list"],
  kill: ["cancel"],
  abort: ["cancel"],
};

/**
 * The usage error for a word that is not a command: the closest commands by
 * spelling, else the command another tool's word stands for (`pause`), or,
 * for a verb typed without its noun (`svc create`), the nouns that have it.
 */
function unknownCommand(word: string, known: readonly string[], prefix: string, synopsis: string, helpPath: string): UsageError {
  const path = prefix === "" ? "svc" : `svc ${prefix}`;
  const typed = prefix === "" ? word : `${prefix} ${word}`;
  let hint = didYouMean(word, known, (w) => `\`${path} ${w}\``);
  const synonym = Object.hasOwn(SYNONYMS, word) ? SYNONYMS[word]!.find((w) => known.includes(w)) : undefined;
  if (!hint && synonym) hint = `did you mean \`${path} ${synonym}\`?`;
  if (!hint && prefix === "") {
    const nouns = COMMANDS.filter(isGroup).filter((g) => g.commands.some((c) => c.name === word));
    const forms = nouns.map((g) => `\`svc ${g.name} ${word}\``);
    if (forms.length > 0) hint = `"${word}" goes after a noun: ${forms.length === 1 ? forms[0] : `${forms.slice(0, -1).join(", ")} or ${forms.at(-1)}`}`;
  }
  const help = `\`${helpPath}\` lists the commands`;
  return new UsageError(`unknown command "${typed}"`, synopsis, path, hint ? `${hint} (${help})` : help);
}

/** The help screen of `svc help <words>`: svc's, a noun's or a command's. */
function helpFor(words: readonly string[]): string {
  const [noun, verb, extra] = words;
  if (noun === undefined) return topUsage();
  const entry = ENTRIES.find((e) => e.name === noun);
  if (!entry) throw unknownCommand(noun, ENTRIES.map((e) => e.name), "", "svc help [command]", "svc help");
  if (!isGroup(entry)) {
    if (verb !== undefined) throw new UsageError(`"svc ${noun}" has no subcommands`, "svc help [command]", "svc help");
    return entry.usage(`svc ${entry.name}`);
  }
  if (verb === undefined) return groupUsage(entry);
  const command = entry.commands.find((c) => c.name === verb);
  if (!command) throw unknownCommand(verb, entry.commands.map((c) => c.name), entry.name, `svc help ${entry.name} <command>`, `svc help ${entry.name}`);
  if (extra !== undefined) throw new UsageError(`unexpected argument "${extra}"`, "svc help [command]", "svc help");
  return command.usage(`svc ${entry.name} ${command.name}`);
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
        else {
          const suggestion = didYouMean(flag, ["--json", "--help", "--version"]);
          const where = "only --json, --help and --version go before the command; a command's own options go after it";
          throw new UsageError(`unknown option ${flag} before the command`, synopsis, path, suggestion ? `${suggestion} ${where[0]!.toUpperCase()}${where.slice(1)}` : where);
        }
      }
      return i;
    };
    const nounAt = globalsFrom(0, "svc <command> [options]", "svc");
    const noun = argv[nounAt];
    if (noun === undefined) {
      // `svc` alone is a question, not a mistake: the overview, exit 0.
      out.text(flags.version ? VERSION : topUsage());
      return 0;
    }
    const entry = ENTRIES.find((e) => e.name === noun);
    if (!entry) throw unknownCommand(noun, ENTRIES.map((e) => e.name), "", "svc <command> [options]", "svc help");
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
        // Like `svc` alone: the noun's verbs.
        out.text(groupUsage(entry));
        return 0;
      }
      const found = entry.commands.find((c) => c.name === verb);
      if (!found) throw unknownCommand(verb, entry.commands.map((c) => c.name), entry.name, synopsis, `svc help ${entry.name}`);
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
