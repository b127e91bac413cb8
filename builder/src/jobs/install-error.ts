/**
 * Why an install failed, in one line: the package manager's own first error
 * line, quoted, and what to do about it. Package managers print the cause
 * among dozens of lines of warnings and usage text (`npm ci` prints its whole
 * help after "can only install packages when … are in sync"), and a summary of
 * "exit code 1" sends every user digging through them.
 */
import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";

/** Longest quote kept in a summary; the whole line stays in the log. */
const MAX_QUOTE_CHARS = 240;

/** A job log record: `<time> <out|err> <text>` (protocol.ts); the builder's own `svc` lines are not the tool's. */
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

/** The quoted cause of a failed install and the fix, from the install's output lines in order; null when none says why. */
export function describeInstallFailure(lines: Iterable<string>, lockfile: string, manager: string): string | null {
  let npmCode = "";
  for (const line of lines) {
    if (!ERROR_LINE.test(line)) continue;
    const code = /^npm (?:error|ERR!) code (\S+)/.exec(line)?.[1];
    if (code) npmCode = code;
    if (NPM_FILLER.test(line)) continue;
    const text = line.trim();
    const quote = text.length > MAX_QUOTE_CHARS ? `${text.slice(0, MAX_QUOTE_CHARS - 1)}…` : text;
    const fix = FIXES.find(([pattern]) => pattern.test(`${npmCode} ${text}`))?.[1](lockfile, manager);
    const said = `"${quote}"${npmCode ? ` (${npmCode})` : ""}`;
    return fix ? `${said}; ${fix}` : `${said}; the build log above has the whole output`;
  }
  return null;
}

/**
 * Reads the command output a step wrote to the job log from byte `offset` on,
 * line by line (never the whole log in memory), and describes the failure.
 */
export async function installFailureFromLog(logFile: string, offset: number, lockfile: string, manager: string): Promise<string | null> {
  const input = createReadStream(logFile, { start: offset, encoding: "utf8" });
  const reader = createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY });
  async function* outputLines(): AsyncGenerator<string> {
    for await (const record of reader) {
      const text = OUTPUT_RECORD.exec(record)?.[1];
      if (text !== undefined) yield text;
    }
  }
  // Only error lines matter (npm's `code` line comes before its message); keep those up to the first that says why.
  const errors: string[] = [];
  try {
    for await (const line of outputLines()) {
      if (!ERROR_LINE.test(line)) continue;
      errors.push(line);
      if (!NPM_FILLER.test(line)) break;
    }
  } finally {
    reader.close();
    input.destroy();
  }
  return describeInstallFailure(errors, lockfile, manager);
}
