import { parseArgs } from "node:util";
import type { ApiClient } from "./api.js";
import type { ResolvedConfig } from "./config.js";
import { Output, UsageError } from "./output.js";

/** A flag taking a value, shown in help as `--<name> <value>`. */
export type StringOption = {
  type: "string";
  value: string;
  description: string;
  required?: boolean;
  short?: string;
};

/** An on/off flag. */
export type BooleanOption = { type: "boolean"; description: string; short?: string };

export type Options = Record<string, StringOption | BooleanOption>;

/** Parsed flag values, typed from the declaration: required flags are plain strings. */
export type Values<O extends Options> = {
  [K in keyof O]: O[K] extends BooleanOption ? boolean : O[K] extends { required: true } ? string : string | undefined;
};

/** A required positional argument, e.g. `<id>`. */
export type Arg<P extends string> = { name: P; description: string };

/** What every command gets from the dispatcher, whatever its flags. */
export type BaseContext = {
  /** True when `--json` came before the noun (`svc --json keys list`). */
  json: boolean;
  /** The command as typed, e.g. `svc keys create`, for hints that point back at it. */
  path: string;
  env: NodeJS.ProcessEnv;
  /** True when a person can answer prompts (stdin is a terminal). */
  interactive: boolean;
  /** The API URL and key after SVC_API_URL / SVC_API_KEY overrides. */
  config(): Promise<ResolvedConfig>;
  /** A client for the configured API; fails with a fix-it hint when no key is configured. */
  api(): Promise<ApiClient>;
};

export type Context<O extends Options, P extends string> = BaseContext & {
  out: Output;
  opts: Values<O>;
  args: Record<P, string>;
  /** The variadic arguments (`KEY=VALUE…`), when the command declares `rest`. */
  rest: string[];
  /** A usage error (exit 2) for arguments that parse but make no sense, e.g. `--memory lots`. */
  fail(message: string): UsageError;
};

/** How a command is declared in its noun's file. */
export type CommandSpec<O extends Options, P extends string> = {
  name: string;
  summary: string;
  /** Longer explanation shown by `--help`, after the usage line. */
  description?: string;
  args?: readonly Arg<P>[];
  /** One or more trailing arguments of the same kind. */
  rest?: { name: string; description: string };
  options: O;
  examples?: readonly string[];
  run(ctx: Context<O, P>): Promise<void>;
};

/** A command with its flag types erased, so nouns can list commands of different shapes. */
export type Command = {
  name: string;
  summary: string;
  /** Parses `argv` (the words after the verb), prints help or runs the command. */
  execute(argv: readonly string[], base: BaseContext): Promise<void>;
};

/** A noun grouping verbs: `svc <noun> <verb>`. */
export type Group = { name: string; summary: string; commands: readonly Command[] };

/** Flags every command accepts; `--version` is handled before dispatch. */
export const GLOBAL_OPTIONS = {
  json: { type: "boolean", description: "print the API's data as JSON on stdout" },
  help: { type: "boolean", short: "h", description: "show this help" },
} as const satisfies Options;

function flagLabel(name: string, option: StringOption | BooleanOption): string {
  const long = `--${name}${option.type === "string" ? ` <${option.value}>` : ""}`;
  return option.short ? `-${option.short}, ${long}` : long;
}

/** Two aligned columns, the left one padded; used by every help screen. */
export function helpRows(rows: readonly (readonly [string, string])[]): string {
  const width = Math.max(0, ...rows.map(([left]) => left.length));
  return rows.map(([left, right]) => `  ${left.padEnd(width)}   ${right}`.trimEnd()).join("\n");
}

/**
 * Declares a command. The flag and argument declarations drive parsing,
 * validation and the help text alike, so they cannot drift apart; the returned
 * value hides the flag types so that one noun can hold commands of any shape.
 */
export function defineCommand<const O extends Options, const P extends string = never>(spec: CommandSpec<O, P>): Command {
  const options: Options = { ...spec.options, ...GLOBAL_OPTIONS };
  const args: readonly Arg<string>[] = spec.args ?? [];

  const synopsis = (path: string) => {
    const parts = [path, ...args.map((a) => `<${a.name}>`)];
    if (spec.rest) parts.push(`${spec.rest.name}...`);
    for (const [name, option] of Object.entries(spec.options)) {
      if (option.type === "string" && option.required) parts.push(`--${name} <${option.value}>`);
    }
    parts.push("[options]");
    return parts.join(" ");
  };

  const usage = (path: string) => {
    const sections = [`Usage: ${synopsis(path)}`, spec.description ? `${spec.summary}.\n${spec.description}` : `${spec.summary}.`];
    const positional: [string, string][] = args.map((a) => [`<${a.name}>`, a.description]);
    if (spec.rest) positional.push([`${spec.rest.name}...`, spec.rest.description]);
    if (positional.length > 0) sections.push(`Arguments:\n${helpRows(positional)}`);
    const flags = Object.entries(options).map(
      ([name, option]) =>
        [flagLabel(name, option), `${option.description}${option.type === "string" && option.required ? " (required)" : ""}`] as const,
    );
    sections.push(`Options:\n${helpRows(flags)}`);
    if (spec.examples?.length) sections.push(`Examples:\n${spec.examples.map((e) => `  ${e}`).join("\n")}`);
    return `${sections.join("\n\n")}\n`;
  };

  const execute = async (argv: readonly string[], base: BaseContext) => {
    let parsed: { values: Record<string, string | boolean | undefined>; positionals: string[] };
    try {
      parsed = parseArgs({ args: [...argv], options, allowPositionals: true, strict: true });
    } catch (err) {
      throw new UsageError(err instanceof Error ? err.message : String(err), synopsis(base.path), base.path);
    }
    const { values, positionals } = parsed;
    const out = new Output(base.json || values.json === true);
    if (values.help) {
      out.text(usage(base.path));
      return;
    }
    const fail = (message: string) => new UsageError(message, synopsis(base.path), base.path);
    const opts: Record<string, string | boolean | undefined> = {};
    for (const [name, option] of Object.entries(options)) {
      const value = values[name];
      if (option.type === "boolean") {
        opts[name] = value === true;
      } else if (typeof value === "string") {
        if (value === "" && option.required) throw fail(`--${name} must not be empty`);
        opts[name] = value;
      } else if (option.required) {
        throw fail(`missing --${name} <${option.value}>`);
      }
    }
    const missing = args[positionals.length];
    if (missing) throw fail(`missing <${missing.name}>`);
    const named: Record<string, string> = {};
    for (const [i, arg] of args.entries()) named[arg.name] = positionals[i]!;
    const rest = positionals.slice(args.length);
    if (spec.rest && rest.length === 0) throw fail(`missing ${spec.rest.name}`);
    if (!spec.rest && rest.length > 0) throw fail(`unexpected argument "${rest[0]}"`);
    // The loops above check every declared flag and argument, so the shapes match the declaration.
    await spec.run({ ...base, out, opts: opts as Values<O>, args: named as Record<P, string>, rest, fail });
  };

  return { name: spec.name, summary: spec.summary, execute };
}
