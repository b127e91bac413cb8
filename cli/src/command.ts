import { parseArgs } from "node:util";
import type { ApiClient } from "./api.js";
import type { ResolvedConfig } from "./config.js";
import { Output, UsageError } from "./output.js";
import { nearestProject } from "./project.js";
import { didYouMean } from "./suggest.js";

/** A flag taking a value, shown in help as `--<name> <value>`. */
export type StringOption = {
  type: "string";
  value: string;
  description: string;
  required?: boolean;
  short?: string;
  /**
   * Said when a value of several words arrives split (an unquoted schedule gives
   * `--schedule 0` and then `unexpected argument "3"`): how to quote it.
   */
  quoteHint?: string;
};

/** An on/off flag. */
export type BooleanOption = { type: "boolean"; description: string; short?: string };

export type Options = Record<string, StringOption | BooleanOption>;

/** Parsed flag values, typed from the declaration: required flags are plain strings. */
export type Values<O extends Options> = {
  [K in keyof O]: O[K] extends BooleanOption ? boolean : O[K] extends { required: true } ? string : string | undefined;
};

/**
 * A positional argument, e.g. `<id>`. With `flag`, it may also be given as
 * `--<name> <value>` (and the short letter): the app is, everywhere. `pattern`
 * keeps a positional that cannot be one (`KEY=VALUE` for an app) from being
 * taken for it when the flag is absent.
 */
export type Arg<P extends string> = {
  name: P;
  description: string;
  flag?: { short?: string; pattern?: RegExp };
};

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

export type Context<O extends Options, P extends string, Q extends string> = BaseContext & {
  out: Output;
  opts: Values<O>;
  args: Record<P, string> & Partial<Record<Q, string>>;
  /** The variadic arguments (`KEY=VALUE…`), when the command declares `rest`. */
  rest: string[];
  /** A usage error (exit 2) for arguments that parse but make no sense, e.g. `--memory lots`. */
  fail(message: string): UsageError;
};

/** How a command is declared in its noun's file. */
export type CommandSpec<O extends Options, P extends string, Q extends string> = {
  name: string;
  summary: string;
  /** Longer explanation shown by `--help`, after the usage line. */
  description?: string;
  args?: readonly Arg<P>[];
  /** A last argument that may be left out (the command says what it then means). */
  optionalArg?: Arg<Q>;
  /** One or more trailing arguments of the same kind (none or more when `optional`). */
  rest?: { name: string; description: string; optional?: boolean };
  options: O;
  examples?: readonly string[];
  run(ctx: Context<O, P, Q>): Promise<void>;
};

/** A flag as completion and suggestions see it. */
export type FlagInfo = { name: string; short?: string; takesValue: boolean; description: string };

/** A command with its flag types erased, so nouns can list commands of different shapes. */
export type Command = {
  name: string;
  summary: string;
  /** Every flag the command accepts, its global ones included. */
  flags: readonly FlagInfo[];
  /** The help screen for the command reached as `path`. */
  usage(path: string): string;
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

/** `--yes`, for every command that asks before it acts. */
export const YES_OPTION = { type: "boolean", short: "y", description: "do it without asking (needed when stdin is not a terminal)" } as const;

/** What an app name or id looks like: a DNS label (the API's rule) or `app_…`. */
const APP_REF = /^(?:app_[0-9A-Za-z]{24}|[a-z0-9](?:[a-z0-9-]{0,50}[a-z0-9])?)$/;

/**
 * The app a command acts on: documented as `--app <app>` (`-a`), the one form
 * that works for every command; the first argument is accepted as well (the
 * spec's `svc logs <app>`, `svc cron create <app>`).
 */
export const APP_ARG = {
  name: "app",
  description: "app name or id",
  flag: { short: "a", pattern: APP_REF },
} as const satisfies Arg<"app">;

function flagLabel(name: string, option: StringOption | BooleanOption): string {
  const long = `--${name}${option.type === "string" ? ` <${option.value}>` : ""}`;
  return option.short ? `-${option.short}, ${long}` : long;
}

/** Two aligned columns, the left one padded; used by every help screen. */
export function helpRows(rows: readonly (readonly [string, string])[]): string {
  const width = Math.max(0, ...rows.map(([left]) => left.length));
  return rows.map(([left, right]) => `  ${left.padEnd(width)}   ${right}`.trimEnd()).join("\n");
}

/** The option a flag-taking argument adds, documented in the options list. */
function argOption(arg: Arg<string>, optional: boolean): StringOption {
  const option: StringOption = {
    type: "string",
    value: arg.name,
    description: `${arg.description}${arg === APP_ARG ? " (default: the app named by the nearest svc.json)" : optional ? "" : " (required)"}; also accepted as the first argument`,
  };
  if (arg.flag?.short) option.short = arg.flag.short;
  return option;
}

/** The app named by the nearest svc.json, said once on stderr; a usage error when there is none. */
function projectApp(out: Output, usageError: (message: string, hint?: string) => UsageError): string {
  const project = nearestProject(process.cwd());
  if (project?.name === undefined) {
    const hint = project ? `${project.file} names no app: add "name" to it, or pass --app <app>` : "pass --app <app>, or run it in a project folder whose svc.json names the app";
    throw usageError("missing --app <app>", hint);
  }
  out.note(`Using app ${project.name} from ${project.file} (--app overrides)`);
  return project.name;
}

/**
 * Declares a command. The flag and argument declarations drive parsing,
 * validation and the help text alike, so they cannot drift apart; the returned
 * value hides the flag types so that one noun can hold commands of any shape.
 */
export function defineCommand<const O extends Options, const P extends string = never, const Q extends string = never>(
  spec: CommandSpec<O, P, Q>,
): Command {
  const positional: readonly Arg<string>[] = [...(spec.args ?? []), ...(spec.optionalArg ? [spec.optionalArg] : [])];
  const isOptional = (arg: Arg<string>) => arg === spec.optionalArg;
  const argOptions: Options = Object.fromEntries(positional.filter((a) => a.flag).map((a) => [a.name, argOption(a, isOptional(a))]));
  const declared: Options = { ...argOptions, ...spec.options };
  const options: Options = { ...declared, ...GLOBAL_OPTIONS };

  const synopsis = (path: string) => {
    const parts = [path];
    for (const arg of positional) {
      if (arg.flag) parts.push(isOptional(arg) ? `[--${arg.name} <${arg.name}>]` : `--${arg.name} <${arg.name}>`);
      else parts.push(isOptional(arg) ? `[<${arg.name}>]` : `<${arg.name}>`);
    }
    if (spec.rest) parts.push(spec.rest.optional ? `[${spec.rest.name}...]` : `${spec.rest.name}...`);
    for (const [name, option] of Object.entries(spec.options)) {
      if (option.type === "string" && option.required) parts.push(`--${name} <${option.value}>`);
    }
    parts.push("[options]");
    return parts.join(" ");
  };

  const usage = (path: string) => {
    const sections = [`Usage: ${synopsis(path)}`, spec.description ? `${spec.summary}.\n${spec.description}` : `${spec.summary}.`];
    const rows: [string, string][] = positional
      .filter((a) => !a.flag)
      .map((a) => [isOptional(a) ? `[<${a.name}>]` : `<${a.name}>`, a.description]);
    if (spec.rest) rows.push([`${spec.rest.name}...`, spec.rest.description]);
    if (rows.length > 0) sections.push(`Arguments:\n${helpRows(rows)}`);
    const flags = Object.entries(options).map(
      ([name, option]) =>
        [flagLabel(name, option), `${option.description}${option.type === "string" && option.required ? " (required)" : ""}`] as const,
    );
    sections.push(`Options:\n${helpRows(flags)}`);
    if (spec.examples?.length) sections.push(`Examples:\n${spec.examples.map((e) => `  ${e}`).join("\n")}`);
    return `${sections.join("\n\n")}\n`;
  };

  const flags: FlagInfo[] = Object.entries(options).map(([name, option]) => ({
    name,
    ...(option.short ? { short: option.short } : {}),
    takesValue: option.type === "string",
    description: option.description,
  }));

  /** Reads the flags and positionals, refusing in our own words what does not parse. */
  const parse = (argv: readonly string[], path: string) => {
    const usageError = (message: string, hint?: string) => new UsageError(message, synopsis(path), path, hint);
    const { tokens } = parseArgs({ args: [...argv], options, allowPositionals: true, strict: false, tokens: true });
    const values: Record<string, string | boolean> = {};
    const positionals: string[] = [];
    for (const token of tokens) {
      if (token.kind === "positional") {
        positionals.push(token.value);
        continue;
      }
      if (token.kind !== "option") continue;
      // parseArgs names a declared short flag by its long name, an unknown one by its letter.
      const name = token.name;
      const option = Object.hasOwn(options, name) ? options[name] : undefined;
      if (option === undefined) {
        // Single letters are all one edit apart: only long options get suggestions.
        const suggestion = token.rawName.startsWith("--") ? didYouMean(token.rawName, Object.keys(options).map((n) => `--${n}`)) : undefined;
        const help = `\`${path} --help\` lists the options`;
        throw usageError(`unknown option ${token.rawName} for ${path}`, suggestion ? `${suggestion} (${help})` : help);
      }
      if (option.type === "boolean") {
        if (token.inlineValue) throw usageError(`--${name} takes no value (got "${token.rawName}=${token.value}")`);
        values[name] = true;
      } else if (token.value === undefined || (!token.inlineValue && token.value.startsWith("-") && token.value.length > 1)) {
        const given = token.value === undefined ? "" : ` (got "${token.value}"; for a value starting with -, write --${name}=${token.value})`;
        throw usageError(`--${name} needs a value: --${name} <${option.value}>${given}`);
      } else {
        values[name] = token.value;
      }
    }
    return { values, positionals, usageError };
  };

  const execute = async (argv: readonly string[], base: BaseContext) => {
    const { values, positionals, usageError } = parse(argv, base.path);
    const out = new Output(base.json || values.json === true);
    if (values.help) {
      out.text(usage(base.path));
      return;
    }
    const fail = (message: string) => usageError(message);
    const opts: Record<string, string | boolean | undefined> = {};
    for (const [name, option] of Object.entries(declared)) {
      if (name in argOptions) continue;
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
    const named: Record<string, string> = {};
    let next = 0;
    for (const [index, arg] of positional.entries()) {
      const flagged = arg.flag ? values[arg.name] : undefined;
      if (typeof flagged === "string") {
        if (flagged === "") throw fail(`--${arg.name} must not be empty`);
        named[arg.name] = flagged;
        continue;
      }
      const candidate = positionals[next];
      const fits = candidate !== undefined && (!spec.rest || !arg.flag?.pattern || arg.flag.pattern.test(candidate));
      // Inside a project the app may be left out: then the words left belong to the later arguments.
      const later = positional.slice(index + 1).filter((a) => !isOptional(a) && typeof values[a.name] !== "string").length;
      const needed = later + (spec.rest && !spec.rest.optional ? 1 : 0);
      if (arg === APP_ARG && (!fits || positionals.length - next <= needed)) {
        named.app = projectApp(out, usageError);
      } else if (fits) {
        named[arg.name] = candidate;
        next++;
      } else if (!isOptional(arg)) {
        throw fail(arg.flag ? `missing --${arg.name} <${arg.name}>` : `missing <${arg.name}>`);
      }
    }
    const rest = positionals.slice(next);
    if (spec.rest && !spec.rest.optional && rest.length === 0) throw fail(`missing ${spec.rest.name}`);
    if (!spec.rest && rest.length > 0) {
      const split = Object.entries(spec.options).find(
        ([name, option]) => option.type === "string" && option.quoteHint && typeof values[name] === "string" && !/\s/.test(values[name]),
      );
      const hint = split?.[1].type === "string" ? split[1].quoteHint : undefined;
      throw usageError(`unexpected argument "${rest[0]}"`, hint);
    }
    // The loops above check every declared flag and argument, so the shapes match the declaration.
    await spec.run({
      ...base,
      out,
      opts: opts as Values<O>,
      args: named as Record<P, string> & Partial<Record<Q, string>>,
      rest,
      fail,
    });
  };

  return { name: spec.name, summary: spec.summary, flags, usage, execute };
}
