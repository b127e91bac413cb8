import { RequestFailed } from "./api.js";

/**
 * Where a command's results go. With `--json` stdout carries exactly the API's
 * data, so scripts can pipe it to `jq`; human text never mixes into it, and
 * notes for people (warnings, progress) go to stderr in both modes.
 */
export class Output {
  constructor(readonly json: boolean) {}

  /** The command's result: `data` as JSON with `--json`, else the human rendering (none when steps said it all). */
  result(data: unknown, human?: string): void {
    if (this.json) this.text(JSON.stringify(data, null, 2));
    else if (human !== undefined) this.text(human);
  }

  /** One finished step of a multi-request command, so a failure half-way shows what was done; silent with --json. */
  step(line: string): void {
    if (!this.json) this.text(line);
  }

  /** Plain text on stdout (help screens, results). */
  text(text: string): void {
    process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
  }

  /** A line for the person at the terminal, on stderr so stdout stays parseable. */
  note(text: string): void {
    process.stderr.write(`${text}\n`);
  }
}

/** A column of a table: header and how to render one row's cell. */
export type Column<T> = readonly [header: string, cell: (row: T) => string];

/** Renders rows as an aligned table with a header row; the last column is not padded. */
export function table<T>(rows: readonly T[], columns: readonly Column<T>[]): string {
  const cells = [columns.map(([header]) => header), ...rows.map((row) => columns.map(([, cell]) => oneLine(cell(row))))];
  const widths = columns.map((_, i) => Math.max(...cells.map((line) => line[i]!.length)));
  return cells.map((line) => line.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()).join("\n");
}

/** Renders one object as `label  value` lines, labels aligned; a multi-line value stays in the value column. */
export function fields(pairs: readonly (readonly [label: string, value: string])[]): string {
  const width = Math.max(...pairs.map(([label]) => label.length));
  const indent = `\n${" ".repeat(width + 2)}`;
  return pairs.map(([label, value]) => `${label.padEnd(width)}  ${value.split("\n").join(indent)}`).join("\n");
}

/** Control characters would break a table's alignment; show them escaped. */
function oneLine(text: string): string {
  return text.replace(/\p{Cc}/gu, (c) => JSON.stringify(c).slice(1, -1));
}

const relative = new Intl.RelativeTimeFormat("en", { numeric: "always" });
/** Each unit is used below its limit (in seconds), rounded: "45 minutes ago", then "1 hour ago". */
const UNITS: [limit: number, size: number, unit: Intl.RelativeTimeFormatUnit][] = [
  [45, 1, "second"],
  [59.5 * 60, 60, "minute"],
  [23.5 * 3600, 3600, "hour"],
  [59.5 * 86_400, 86_400, "day"],
];

/**
 * A relative time for tables and details: "5 minutes ago", "in 5 minutes",
 * "in 30 seconds"; "just now" only for the last 45 seconds, never for a time
 * still to come; the date beyond two months; `never` for null.
 */
export function ago(iso: string | null | undefined, never = "never", now = Date.now()): string {
  if (!iso) return never;
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return iso;
  const seconds = (then - now) / 1000;
  if (seconds <= 0 && seconds > -45) return "just now";
  const found = UNITS.find(([limit]) => Math.abs(seconds) < limit);
  if (!found) return iso.slice(0, 10);
  const [, size, unit] = found;
  return relative.format(seconds > 0 ? Math.max(1, Math.round(seconds / size)) : Math.round(seconds / size), unit);
}

/** The exact ISO time followed by the relative one, for key/value blocks. */
export function when(iso: string | null | undefined, never = "never"): string {
  return iso ? `${iso} (${ago(iso)})` : never;
}

/**
 * A failure the user can act on, printed in three parts: what failed, the
 * detail, and how to fix it.
 */
export class CliError extends Error {
  constructor(
    readonly what: string,
    readonly detail: readonly string[] = [],
    readonly hint?: string,
    readonly exitCode = 1,
  ) {
    super(what);
    this.name = "CliError";
  }
}

/** A command line that does not parse: exit code 2 and the usage line; the hint defaults to the help screen. */
export class UsageError extends CliError {
  constructor(message: string, synopsis: string, path: string, hint = `see \`${path} --help\``) {
    super(message, [`usage: ${synopsis}`], hint, 2);
    this.name = "UsageError";
  }
}

/** Which list command shows the things a *_NOT_FOUND code is about. */
const LIST_COMMANDS: Record<string, string> = {
  KEY_NOT_FOUND: "svc keys list",
  APP_NOT_FOUND: "svc apps list",
  DISK_NOT_FOUND: "svc disk list",
  ENV_VAR_NOT_FOUND: "svc env list --app <app>",
  DOMAIN_NOT_FOUND: "svc domains list --app <app>",
};

function orList(items: readonly string[]): string {
  return items.length <= 1 ? (items[0] ?? "") : `${items.slice(0, -1).join(", ")} and ${items.at(-1)}`;
}

/** The flag behind an API field (`scopes.1` → `--scopes`); the field itself when the command did not map it. */
function flagOf(field: string, flags: Record<string, string> = {}): string {
  const top = field.replace(/^(path|query|header)\./, "").split(".")[0] ?? field;
  return flags[field] ?? flags[top] ?? top;
}

/** The fix-it line for an API or network failure, chosen by error code. */
function hintFor(err: RequestFailed): string | undefined {
  const { failure, call, target } = err;
  if (failure.kind === "network") {
    return `is the API running at ${target.apiUrl}? start it with \`npm start\`, or point SVC_API_URL / \`svc login --api-url\` at it`;
  }
  if (failure.kind === "bad-response") {
    return `is ${target.apiUrl} the svc API? check SVC_API_URL or run \`svc login --api-url <url>\``;
  }
  const { code, message, details } = failure.error;
  const override = call.hints?.[code];
  if (override) return override;
  switch (code) {
    case "UNAUTHORIZED":
      return target.keySource === "env"
        ? "SVC_API_KEY is set and overrides the saved login: set it to a valid key, or unset it and run `svc login`"
        : "run `svc login` with a valid key or set SVC_API_KEY";
    case "INSUFFICIENT_SCOPE": {
      const scope = /"([a-z]+)" scope/.exec(message)?.[1] ?? "<scope>";
      return `use a key with the "${scope}" scope (create one with an admin key: svc keys create --name <name> --scopes ${scope})`;
    }
    case "VALIDATION_ERROR": {
      const named = [...new Set(details.map((d) => flagOf(d.field, call.flags)))];
      return named.length > 0
        ? `fix ${orList(named)} and try again (\`${target.command} --help\` lists the options)`
        : `check the arguments (\`${target.command} --help\`)`;
    }
    case "NAME_TAKEN":
      return "choose another name";
    case "DOMAIN_TAKEN":
      return "another account has verified this hostname (it is free again once that account removes it), or one of your apps has it already: `svc domains list --app <app>`";
    case "INVALID_CRON_EXPRESSION":
      return 'a schedule is five fields, quoted in the shell: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12) day-of-week (0-7, 0 and 7 are Sunday), e.g. "*/15 * * * *" or "0 9 * * 1-5"';
    case "NOT_FOUND":
    case "METHOD_NOT_ALLOWED":
      return `the API at ${target.apiUrl} does not offer this operation: is it the svc API, and up to date?`;
    case "DISK_ATTACHED":
      return "detach the disk first: svc disk detach <disk>";
    case "APP_HAS_DISK":
      return "an app has one disk: detach its disk first (svc disk detach <disk>)";
    case "DISK_BUSY":
      return "wait until the backup or job using the disk has ended (svc backups list <disk>), then try again";
    case "PLAN_LIMIT_EXCEEDED":
      return "ask for less, delete what you no longer need, or move to a larger plan";
    case "INSUFFICIENT_STORAGE":
      return "the builder has no room for a disk this size: ask for a smaller one, or ask the operator for more space";
    case "DISK_IN_USE":
      return "detach the disk or stop the app first";
    case "APP_STOPPED":
      return "start the app again: svc apps restart --app <app>";
    case "RATE_LIMITED":
      return `wait${failure.retryAfter ? ` ${failure.retryAfter} s` : " a moment"} and try again`;
    case "PAYLOAD_TOO_LARGE":
      return "send less data in one request";
    case "BUILDER_UNAVAILABLE":
      return "the builder service is not reachable; locally, `npm start` runs it next to the API";
    case "NODE_UNREACHABLE":
      return `the node holding it is not answering: try again${failure.retryAfter ? ` in ${failure.retryAfter} s` : " in a moment"}; the message says what happens meanwhile`;
    case "INTERNAL":
      return "this is a server-side fault: try again, and report the request id if it keeps happening";
    default: {
      const list = LIST_COMMANDS[code];
      if (list) return `check the id or name: \`${list}\` shows what exists`;
      return code.endsWith("_NOT_FOUND") ? "check the id or name" : undefined;
    }
  }
}

/** The second part of an API failure: code and message, each field detail, the request id of server faults. */
function detailOf(err: RequestFailed): string[] {
  const { failure } = err;
  if (failure.kind === "network") return [failure.message];
  if (failure.kind === "bad-response") return [`HTTP ${failure.status}: ${failure.body || "(empty body)"}`];
  const lines = [`${failure.error.code}: ${failure.error.message}`];
  for (const d of failure.error.details) lines.push(`  ${d.field}: ${d.message}`);
  if (failure.status >= 500 && failure.requestId) lines.push(`request id: ${failure.requestId}`);
  return lines;
}

/** Renders any error as the three-part message on stderr and returns the exit code. */
export function reportError(err: unknown): number {
  let what: string;
  let detail: readonly string[];
  let hint: string | undefined;
  let exitCode = 1;
  if (err instanceof RequestFailed) {
    what = `could not ${err.what}`;
    detail = detailOf(err);
    hint = hintFor(err);
  } else if (err instanceof CliError) {
    ({ what, detail, hint, exitCode } = err);
  } else {
    what = "unexpected failure";
    detail = [err instanceof Error ? (err.stack ?? err.message) : String(err)];
    hint = "this is a bug in svc; please report it with the output above";
  }
  const lines = [`Error: ${what}`, ...detail.map((line) => `  ${line}`)];
  if (hint) lines.push(`  Hint: ${hint}`);
  process.stderr.write(`${lines.join("\n")}\n`);
  return exitCode;
}
