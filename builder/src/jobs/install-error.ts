/**
 * Why an install failed, in one line: the package manager's own first error
 * line, quoted, and what to do about it. Package managers print the cause
 * among dozens of lines of warnings and usage text (`npm ci` prints its whole
 * help after "can only install packages when … are in sync"), and a summary of
 * "exit code 1" sends every user digging through them.
 *
 * One refusal of `npm ci` is not the user's doing: a lockfile that names an
 * optional platform package (`@rolldown/binding-android-arm-eabi`) in its
 * parent's `optionalDependencies` without an entry of its own. `npm install`
 * writes exactly that when the registry (mirror) has not yet published that
 * platform's build of the newest release, and writes it again when asked to fix
 * it, so "run npm install" would send the user in a loop. {@link absentOptionalPackages}
 * tells that case from a real mismatch, and the build installs with
 * `npm install --no-save` instead (jobs/build.ts).
 */
import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import { openInside } from "../static/files.js";

/** Longest quote kept in a summary; the whole line stays in the log. */
const MAX_QUOTE_CHARS = 240;

/** A job log record: `<time> <out|err> <text>` (protocol/jobs.ts); the builder's own `svc` lines are not the tool's. */
const OUTPUT_RECORD = /^\S+ (?:out|err) (.*)$/;

/**
 * Lines that state an error: npm's `npm error …` (npm 10+) and `npm ERR! …`,
 * pnpm's ` ERR_PNPM_<CODE>  message`, yarn 1's `error message`, yarn 2+'s
 * `YN0028: │ …` (the lockfile would change), pip's `ERROR: …`, and venv's
 * complaint when the host lacks ensurepip.
 */
const ERROR_LINE = /^(?:npm (?:error|ERR!)\s|\s*ERR_PNPM_[A-Z0-9_]+|error\s|.*\bYN0028:|ERROR:\s|The virtual environment was not created successfully)/;
/** npm lines that carry no message of their own: blank, `code E…`, `errno`, `syscall`, where the debug log went. */
const NPM_FILLER = /^npm (?:error|ERR!)\s*(?:$|code\s|errno\s|syscall\s|A complete log of this run|\S+-debug-\d+\.log$)/;
/** `npm ci`'s refusal of a lockfile that does not match what package.json resolves to; the lines after it say what differs. */
const NPM_CI_OUT_OF_SYNC = /^npm (?:error|ERR!) `npm ci` can only install packages when your package\.json and package-lock\.json .*are in sync/;
/** One difference npm ci found: `Missing: <name>@<version> from lock file` (version empty when the registry has none) or `Invalid: lock file's … does not satisfy …`. */
const NPM_CI_MISMATCH = /^npm (?:error|ERR!) ((?:Missing: (\S+?)@(\S*) from lock file)|Invalid: .*)$/;
/** How many differences are kept: enough to name them, bounded whatever the log holds. */
const MAX_MISMATCHES = 200;
/** Differences quoted in a summary. */
const QUOTED_MISMATCHES = 3;

/** What to do, by what the quoted line (or the npm code before it) says. */
const FIXES: readonly [RegExp, (lockfile: string, manager: string) => string][] = [
  [
    /No matching distribution found|Could not find a version that satisfies/,
    (lockfile) =>
      `a requirement is not in the package index (or has no release for this Python): check its name and version in ${lockfile}`,
  ],
  [/ensurepip is not\s+available|virtual environment was not created/, () => "this builder cannot make python virtualenvs: install python3-venv on it"],
  [/ProxyError|Max retries exceeded|Could not fetch URL/, () => "the package index could not be reached: deploy again, and if it keeps failing the index is down"],
  [
    /in sync|ERR_PNPM_OUTDATED_LOCKFILE|lockfile needs to be updated|YN0028|Missing: .* from lock file/i,
    (lockfile, manager) => `the lockfile is out of sync with package.json: run ${manager} install and commit ${lockfile}`,
  ],
  [
    /E404|404 Not Found|not in this registry|ERR_PNPM_FETCH_404|Couldn't find package/i,
    () => "a dependency is not in the package registry: check its name in package.json (private packages are not reachable from builds)",
  ],
  [
    /ETARGET|No matching version|ERR_PNPM_NO_MATCHING_VERSION|Couldn't find any versions/i,
    (lockfile, manager) => `no published version matches a range in package.json: fix it, run ${manager} install and commit ${lockfile}`,
  ],
  [
    /ERESOLVE|ERR_PNPM_PEER_DEP/i,
    (lockfile, manager) => `the dependencies conflict: resolve it locally (${manager} install) and commit ${lockfile}`,
  ],
  [
    /ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|network/i,
    () => "the package registry could not be reached: deploy again, and if it keeps failing the registry mirror is down",
  ],
  [/EINTEGRITY|integrity/i, (lockfile) => `a download did not match the checksum in ${lockfile}: regenerate the lockfile and commit it`],
];

/** What `npm ci` found different between package-lock.json and what package.json resolves to. */
export interface LockfileRefusal {
  /** Packages the resolution needs that the lockfile has no entry for; `version` is empty when the registry has none either. */
  missing: { name: string; version: string }[];
  /** npm's `Invalid: lock file's a@1 does not satisfy a@2` lines, as written. */
  invalid: string[];
  /** Each difference as npm wrote it (`Missing: … from lock file`), in its order, for quoting. */
  said: string[];
  /** How many more differences npm listed than were read (at most {@link MAX_MISMATCHES} are). */
  omitted: number;
}

/** The cause of a failed install, read from the package manager's output. */
export interface InstallFailure {
  /** The quoted cause and the fix, or null when no line says why. */
  why: string | null;
  /** `npm ci`'s list of differences when it refused the lockfile, else null. */
  refusal: LockfileRefusal | null;
}

/** The lines of an install's output that can say why it failed, bounded: npm's error block up to its first message, and npm ci's list of differences after it. */
function errorLines(): { take(line: string): boolean; lines: string[]; omitted(): number } {
  const lines: string[] = [];
  let refused = false;
  let mismatches = 0;
  return {
    lines,
    omitted: () => Math.max(0, mismatches - MAX_MISMATCHES),
    /** Keeps `line` if it matters; false once nothing further can. */
    take(line) {
      if (refused) {
        if (NPM_FILLER.test(line)) return true;
        if (!NPM_CI_MISMATCH.test(line)) return false; // "Clean install a project" and the usage text: the list is over
        if (++mismatches <= MAX_MISMATCHES) lines.push(line);
        return true;
      }
      if (!ERROR_LINE.test(line)) return true;
      lines.push(line);
      if (NPM_FILLER.test(line)) return true;
      refused = NPM_CI_OUT_OF_SYNC.test(line);
      return refused;
    },
  };
}

/** npm ci's differences from its output lines (`omitted` more not among them), or null when it did not refuse the lockfile. */
export function lockfileRefusal(lines: Iterable<string>, omitted = 0): LockfileRefusal | null {
  let refused = false;
  const refusal: LockfileRefusal = { missing: [], invalid: [], said: [], omitted };
  for (const line of lines) {
    if (!refused) {
      refused = NPM_CI_OUT_OF_SYNC.test(line);
      continue;
    }
    const mismatch = NPM_CI_MISMATCH.exec(line);
    if (!mismatch) continue;
    const [, said, name, version] = mismatch;
    refusal.said.push(said!);
    if (name !== undefined) refusal.missing.push({ name, version: version ?? "" });
    else refusal.invalid.push(said!);
  }
  return refused ? refusal : null;
}

function quote(text: string, max = MAX_QUOTE_CHARS): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** The quoted cause of a failed install and the fix, from the install's output lines in order; null when none says why. */
export function describeInstallFailure(lines: Iterable<string>, lockfile: string, manager: string): string | null {
  const relevant = errorLines();
  for (const line of lines) if (!relevant.take(line)) break;
  return failureOf(relevant, lockfile, manager).why;
}

/** What the lines {@link errorLines} kept say: npm ci's list of differences, and the quoted cause with its fix. */
function failureOf(relevant: ReturnType<typeof errorLines>, lockfile: string, manager: string): InstallFailure {
  const refusal = lockfileRefusal(relevant.lines, relevant.omitted());
  return { why: describeErrorLines(relevant.lines, lockfile, manager, refusal), refusal };
}

function describeErrorLines(lines: string[], lockfile: string, manager: string, refusal: LockfileRefusal | null): string | null {
  if (refusal !== null && refusal.said.length > 0) {
    // npm's own sentence names no package; its list does.
    const quoted = refusal.said.slice(0, QUOTED_MISMATCHES).map((said) => `"${quote(said, MAX_QUOTE_CHARS / 2)}"`);
    const unquoted = refusal.said.length - quoted.length + refusal.omitted;
    const more = unquoted > 0 ? ` and ${unquoted} more` : "";
    return `npm ci found ${lockfile} out of sync with package.json: ${quoted.join(", ")}${more}; run ${manager} install and commit ${lockfile}`;
  }
  let npmCode = "";
  for (const line of lines) {
    const code = /^npm (?:error|ERR!) code (\S+)/.exec(line)?.[1];
    if (code) npmCode = code;
    if (NPM_FILLER.test(line)) continue;
    const text = line.trim();
    const fix = FIXES.find(([pattern]) => pattern.test(`${npmCode} ${text}`))?.[1](lockfile, manager);
    const said = `"${quote(text)}"${npmCode ? ` (${npmCode})` : ""}`;
    return fix ? `${said}; ${fix}` : `${said}; the build log above has the whole output`;
  }
  return null;
}

/**
 * The command output a step wrote to the job log from byte `offset` on, line by
 * line, never the whole log in memory (a build's output can be megabytes).
 * Stopping early (`break`) closes the file.
 */
export async function* stepOutput(logFile: string, offset: number): AsyncGenerator<string> {
  const input = createReadStream(logFile, { start: offset, encoding: "utf8" });
  const reader = createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY });
  try {
    for await (const record of reader) {
      const text = OUTPUT_RECORD.exec(record)?.[1];
      if (text !== undefined) yield text;
    }
  } finally {
    reader.close();
    input.destroy();
  }
}

/** Reads what an install step wrote to the job log from byte `offset` on and says why it failed. */
export async function installFailureFromLog(logFile: string, offset: number, lockfile: string, manager: string): Promise<InstallFailure> {
  // Only error lines matter (npm's `code` line comes before its message, npm ci's differences after it).
  const relevant = errorLines();
  for await (const line of stepOutput(logFile, offset)) if (!relevant.take(line)) break;
  return failureOf(relevant, lockfile, manager);
}

/** A package npm ci found missing that the lockfile names only as an optional dependency of packages it pins. */
export interface AbsentOptional {
  name: string;
  /** The version npm resolved it to now, or empty when the registry still lacks it. */
  version: string;
  /** `name@version` of each package whose `optionalDependencies` names it. */
  parents: string[];
}

/** Whether every difference npm ci listed (all of them read) is a package the lockfile lacks: the only refusal an absent optional package explains. */
function onlyMissing(refusal: LockfileRefusal): boolean {
  return refusal.missing.length > 0 && refusal.invalid.length === 0 && refusal.omitted === 0;
}

/** Largest package-lock.json read: lockfiles of big projects run to megabytes, but not this. */
const MAX_LOCKFILE_BYTES = 32 * 1024 * 1024;

type LockEntry = { version?: unknown; optionalDependencies?: unknown; link?: unknown };

/**
 * Whether npm ci refused the lockfile only because it lacks entries for
 * optional dependencies of packages it pins: every `Missing:` name is in the
 * `optionalDependencies` of an installed package's entry (`node_modules/…`;
 * not the project's own package.json, nor a workspace's, where a missing entry
 * means the lockfile is stale) and has no entry of its own anywhere, and nothing
 * is `Invalid:`. Returns those packages, or null for a real mismatch (then
 * running npm install and committing the lockfile is the fix).
 */
export function findAbsentOptional(lockfileText: string, refusal: LockfileRefusal): AbsentOptional[] | null {
  if (!onlyMissing(refusal)) return null;
  let lock: unknown;
  try {
    lock = JSON.parse(lockfileText);
  } catch {
    return null;
  }
  const packages = (lock as { packages?: unknown } | null)?.packages;
  if (typeof packages !== "object" || packages === null) return null; // lockfileVersion 1: npm ci rewrites it anyway
  const absent = new Map(refusal.missing.map(({ name, version }) => [name, { name, version, parents: [] as string[] }]));
  for (const [key, value] of Object.entries(packages as Record<string, unknown>)) {
    if (typeof value !== "object" || value === null) continue;
    const entry = value as LockEntry;
    const at = key.lastIndexOf("node_modules/");
    if (at === -1) continue; // the project itself and its workspaces: their dependencies are package.json's
    const name = key.slice(at + "node_modules/".length);
    if (absent.has(name)) return null; // it has an entry: npm misses something else about it
    if (entry.link === true || typeof entry.optionalDependencies !== "object" || entry.optionalDependencies === null) continue;
    for (const optional of Object.keys(entry.optionalDependencies)) {
      absent.get(optional)?.parents.push(typeof entry.version === "string" ? `${name}@${entry.version}` : name);
    }
  }
  const found = [...absent.values()];
  return found.every((optional) => optional.parents.length > 0) ? found : null;
}

/** {@link findAbsentOptional} on the project's package-lock.json (read without following links out of `root`). */
export async function absentOptionalPackages(root: string, refusal: LockfileRefusal): Promise<AbsentOptional[] | null> {
  if (!onlyMissing(refusal)) return null; // not worth reading the lockfile
  const handle = await openInside(root, "package-lock.json");
  if (handle === null) return null;
  try {
    if ((await handle.stat()).size > MAX_LOCKFILE_BYTES) return null;
    return findAbsentOptional(await handle.readFile("utf8"), refusal);
  } finally {
    await handle.close();
  }
}

/** The log line saying why npm ci refused the lockfile and what the build does instead. */
export function absentOptionalNote(absent: AbsentOptional[], command: string): string {
  const shown = absent.slice(0, 4).map(({ name, parents }) => `${name} (an optional dependency of ${parents.slice(0, 2).join(", ")}${parents.length > 2 ? ", …" : ""})`);
  const more = absent.length > 4 ? ` and ${absent.length - 4} more` : "";
  const one = absent.length === 1;
  const stillAbsent = absent.every(({ version }) => version === "");
  const registry = stillAbsent
    ? `the registry did not have ${one ? "it" : "them"} when the lockfile was written, and still does not`
    : `usually because the registry did not have ${one ? "it" : "them"} yet when the lockfile was written`;
  return (
    `npm ci refused package-lock.json: it names ${shown.join(", ")}${more} but has no entr${one ? "y" : "ies"} for ${one ? "it" : "them"} ` +
    `(${registry}); installing with \`${command}\` instead, which keeps every version the lockfile pins and leaves out optional packages the registry lacks or this platform does not use`
  );
}
