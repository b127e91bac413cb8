/**
 * Why a build command failed, in one line: the build tool's first error with
 * its file and line (`src/App.tsx:3:7: error TS2322: Type 'number' is not
 * assignable to type 'string'.`), instead of only "exit code 1". Each tool
 * reports an error its own way, over several lines, among progress output and
 * stack traces; {@link BuildErrorScanner} knows the reports of TypeScript,
 * Vite (Rollup and Rolldown), esbuild, webpack, Next.js and Astro, and falls
 * back on a shell's "not found" or an uncaught Node error. The samples it is
 * tested on are real outputs (build-error.unit.test.ts).
 */
import { SANDBOX_WORK_DIR, withoutAnsi } from "../sandbox/sandbox.js";
import { stepOutput } from "./install-error.js";

/** Longest cause kept in a summary; the whole report stays in the log. */
const MAX_CAUSE_CHARS = 240;

/** How a tool's error report starts, how many lines (the first included) it may take, and what it says. */
interface Report {
  start: RegExp;
  lines: number;
  /** The cause, or null when the lines do not read as the tool's report after all. */
  read(lines: string[], start: RegExpExecArray): string | null;
}

const WORK_PREFIX = `${SANDBOX_WORK_DIR}/`;

/** A path as the user knows it: relative to the project, without `./`. */
function projectPath(path: string): string {
  const trimmed = path.trim();
  const relative = trimmed.startsWith(WORK_PREFIX) ? trimmed.slice(WORK_PREFIX.length) : trimmed;
  return relative.startsWith("./") ? relative.slice(2) : relative;
}

/** Absolute paths inside the sandbox's project folder, made relative, in a message. */
function projectPaths(text: string): string {
  return text.replaceAll(new RegExp(`(^|[\\s"'(\\[,=])${WORK_PREFIX}`, "g"), "$1");
}

/** `location: message`, unless the message already says where. */
function at(location: string | null, message: string): string {
  const said = projectPaths(message.trim());
  return location && !said.includes(location) ? `${location}: ${said}` : said;
}

/** A stack frame (`    at fn (file:1:2)`): where a report's own lines end. */
const STACK_FRAME = /^\s+at\s/;
/** The bare `Error: ` (or Rollup's `RollupError: `) before a message, which says nothing of its own; `TypeError: ` does. */
const ERROR_PREFIX = /^(?:(?:Rollup|Rolldown)?Error:\s+)+/;
/** esbuild's own one-line report, as Vite's esbuild plugin passes it on: `/work/src/a.ts:1:6: ERROR: Expected …`. */
const ESBUILD_LINE = /^(.+?):(\d+):(\d+): ERROR: (.+)$/;

/** The first line of `lines` from `from` on that is not blank. */
function nextText(lines: string[], from: number): number {
  let index = from;
  while (index < lines.length && lines[index]!.trim() === "") index++;
  return index;
}

/**
 * Where a Vite, Rollup, Rolldown or Astro report says the error is: Rollup's
 * `file: /work/src/a.ts:1:6`, Rolldown's `╭─[ src/App.tsx:1:21 ]`, Astro's
 * `Location:` or `File:` followed by the path, swc's `,-[/work/app/page.tsx:1:1]`.
 */
function reportedLocation(lines: string[]): string | null {
  for (let index = 0; index < lines.length; index++) {
    const line = lines[index]!;
    if (STACK_FRAME.test(line)) break;
    const file = /^file: (.+?)(?: \(.*\))?$/.exec(line) ?? /^\s*(?:╭─|,-)\[ ?(.+?) ?\]$/.exec(line);
    if (file) return projectPath(file[1]!);
    if (/^\s+(?:Location|File):$/.test(line) && lines[index + 1]?.trim()) return projectPath(lines[index + 1]!).replace(/:0:0$/, "");
  }
  return null;
}

const REPORTS: readonly Report[] = [
  {
    // tsc, and tools running it (Next.js 16): `src/App.tsx(3,7): error TS2322: …`.
    start: /^(.+?)\((\d+),(\d+)\): error (TS\d+): (.+)$/,
    lines: 1,
    read: (_, [, file, line, column, code, message]) => `${projectPath(file!)}:${line}:${column}: error ${code}: ${message}`,
  },
  {
    // tsc --pretty (`tsc -b` on a terminal): `src/App.tsx:3:7 - error TS2322: …`.
    start: /^(.+?):(\d+):(\d+) - error (TS\d+): (.+)$/,
    lines: 1,
    read: (_, [, file, line, column, code, message]) => `${projectPath(file!)}:${line}:${column}: error ${code}: ${message}`,
  },
  {
    // tsc about its configuration: `error TS5083: Cannot read file '/work/tsconfig.base.json'.`
    start: /^error (TS\d+): (.+)$/,
    lines: 1,
    read: (_, [, code, message]) => `error ${code}: ${projectPaths(message!)}`,
  },
  {
    // Vite: `error during build:` and the message, Rolldown's `Build failed with 1 error:` before it; where it is follows.
    start: /^error during build:$/,
    lines: 14,
    read(lines) {
      let index = nextText(lines, 1);
      if (/^Build failed with \d+ errors?:$/.test(lines[index] ?? "")) index = nextText(lines, index + 1);
      const message = lines[index]?.replace(ERROR_PREFIX, "").trim();
      if (!message || STACK_FRAME.test(lines[index]!)) return null;
      // Vite's esbuild plugins: `[vite:esbuild] Transform failed with 1 error:` and esbuild's own line under it.
      const esbuild = /Transform failed with \d+ errors?:$/.test(message) ? ESBUILD_LINE.exec(lines[index + 1] ?? "") : null;
      if (esbuild) {
        const plugin = /^\[[^\]]+\] /.exec(message)?.[0] ?? "";
        return at(`${projectPath(esbuild[1]!)}:${esbuild[2]}:${esbuild[3]}`, `${plugin}${esbuild[4]}`);
      }
      return at(reportedLocation(lines.slice(index + 1)), message);
    },
  },
  {
    // esbuild: `✘ [ERROR] Could not resolve "./nope"`, a blank line, `    src/e.ts:1:14:`.
    start: /^[✘X] \[ERROR\] (.+)$/,
    lines: 4,
    read(lines, [, message]) {
      const location = lines.slice(1).map((line) => /^\s+(.+?:\d+:\d+):$/.exec(line)?.[1]).find((found) => found !== undefined);
      return at(location ? projectPath(location) : null, message!);
    },
  },
  {
    // webpack: `ERROR in ./src/index.js 1:0-23`, the message on the next line.
    start: /^ERROR in (.+?)(?: (\d+:\d+(?:-\d+)?))?$/,
    lines: 3,
    read(lines, [, file, position]) {
      const message = lines[nextText(lines, 1)];
      if (!message) return null;
      return at(`${projectPath(file!)}${position ? `:${position}` : ""}`, message);
    },
  },
  {
    // Next.js with webpack: `Failed to compile.`, a blank line, `./app/page.tsx:1:7` (or just the file), the message.
    start: /^Failed to compile\.?$/,
    lines: 6,
    read: (lines) => nextLocatedMessage(lines),
  },
  {
    // Next.js with Turbopack: `> Build error occurred`, `Error: Turbopack build failed with 1 error:`, `./app/page.tsx:1:1`, the message.
    start: /^> Build error occurred$/,
    lines: 6,
    read: (lines) => nextLocatedMessage(lines),
  },
  {
    // Astro 3+: `12:00:00 [ERROR] [vite] ✗ Build failed in 1.96s` (or `[build] Failed to …`), the message under it, then `Location:`.
    start: /^(?:\d\d:\d\d:\d\d(?: [AP]M)? )?\[ERROR\] (?:\[[\w:-]+\] ?)*(.*)$/,
    lines: 14,
    read(lines, [, headline]) {
      const detail = lines[1] !== undefined && /^\S/.test(lines[1]) && !STACK_FRAME.test(lines[1]) ? lines[1] : "";
      const message = detail || (/^✗? ?Build failed in /.test(headline!) ? "" : headline!);
      return message ? at(reportedLocation(lines.slice(1)), message) : null;
    },
  },
  {
    // Astro 2: ` error   Could not resolve "../nope.astro" from "src/pages/index.astro"`, then `  File:` and the path.
    start: /^\s*(?:\d\d:\d\d:\d\d(?: [AP]M)? )?error {2,}(\S.*)$/,
    lines: 6,
    read: (lines, [, message]) => at(reportedLocation(lines.slice(1)), message!),
  },
];

/** Next.js's reports: skip `… failed with N errors:`, then an optional `./file[:line:col]` line, then the message. */
function nextLocatedMessage(lines: string[]): string | null {
  let index = nextText(lines, 1);
  if (/failed with \d+ errors?:$/.test(lines[index] ?? "")) index = nextText(lines, index + 1);
  const location = /^\.\/(\S+?)(?::(\d+):(\d+))?$/.exec(lines[index] ?? "");
  if (location) index = nextText(lines, index + 1);
  // swc's syntax errors: `Error:   x Unterminated regexp literal`.
  const message = lines[index]?.replace(ERROR_PREFIX, "").replace(/^x\s+/, "").trim();
  if (!message) return null;
  const where = location ? `${location[1]}${location[2] ? `:${location[2]}:${location[3]}` : ""}` : null;
  return at(where, message);
}

/**
 * Lines quoted only when no tool's report is found: the shell not finding the
 * build tool (`sh: 1: vite: not found`: it is not in the dependencies), npm's
 * `Missing script: "build"`, and an uncaught Node error (`TypeError: …`,
 * `Error [ERR_MODULE_NOT_FOUND]: …`) from a build script.
 */
const PLAIN_ERRORS: readonly RegExp[] = [
  /^(?:sh|bash): (?:\d+: |line \d+: )?.+: (?:command )?not found$/,
  /^npm (?:error|ERR!) (Missing script: .+)$/,
  /^(?:Uncaught )?((?:[A-Z][A-Za-z]*)?Error(?: \[[A-Z_]+\])?: .+)$/,
];

/**
 * Reads a build's output a line at a time and keeps the first error a tool
 * reports: {@link push} each line until it answers true, then {@link cause}.
 * Holds at most one report's lines, whatever the output's length.
 */
export class BuildErrorScanner {
  #open: { report: Report; start: RegExpExecArray; lines: string[] } | null = null;
  #cause: string | null = null;
  #plain: string | null = null;

  /** Takes the next line of output; true once the cause is known (later lines cannot change it). */
  push(output: string): boolean {
    const line = (output.includes("\x1b") ? withoutAnsi(Buffer.from(output)).toString() : output).trimEnd();
    if (this.#open) {
      this.#open.lines.push(line);
      return this.#open.lines.length >= this.#open.report.lines && this.#close();
    }
    for (const report of REPORTS) {
      const start = report.start.exec(line);
      if (!start) continue;
      this.#open = { report, start, lines: [line] };
      return report.lines === 1 && this.#close();
    }
    if (this.#plain === null) {
      const plain = PLAIN_ERRORS.map((pattern) => pattern.exec(line)).find((found) => found !== null);
      if (plain) this.#plain = projectPaths(plain[1] ?? plain[0]);
    }
    return false;
  }

  /** The first tool error, else the first plain error line, else null; one line of bounded length. */
  cause(): string | null {
    if (this.#open) this.#close();
    const cause = (this.#cause ?? this.#plain)?.replace(/\s+/g, " ").trim();
    if (!cause) return null;
    return cause.length > MAX_CAUSE_CHARS ? `${cause.slice(0, MAX_CAUSE_CHARS - 1)}…` : cause;
  }

  #close(): boolean {
    const { report, start, lines } = this.#open!;
    this.#open = null;
    this.#cause = report.read(lines, start);
    return this.#cause !== null;
  }
}

/** The first error a build tool reported in `lines` (a build's output in order), or null when none reads as one. */
export function describeBuildFailure(lines: Iterable<string>): string | null {
  const scanner = new BuildErrorScanner();
  for (const line of lines) if (scanner.push(line)) break;
  return scanner.cause();
}

/** Reads what the build step wrote to the job log from byte `offset` on, a line at a time, and says what failed. */
export async function buildFailureFromLog(logFile: string, offset: number): Promise<string | null> {
  const scanner = new BuildErrorScanner();
  for await (const line of stepOutput(logFile, offset)) if (scanner.push(line)) break;
  return scanner.cause();
}
