/**
 * Colour for people at a terminal, never for pipes, files or `--json`. Stored
 * build logs are plain text (the builder strips the build tools' escape codes),
 * so `svc deploy` colours the log it streams itself: the same rule
 * picocolors and most CLIs follow: NO_COLOR (any value) turns colour off,
 * FORCE_COLOR (not "0") turns it on, else a terminal that is not `dumb`.
 */

/** Whether text written to `stream` should carry colour. */
export function colourWanted(stream: { isTTY?: boolean }, env: NodeJS.ProcessEnv): boolean {
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== "") return false;
  if (env.FORCE_COLOR !== undefined) return env.FORCE_COLOR !== "0";
  return stream.isTTY === true && env.TERM !== "dumb";
}

const paint = (code: string) => (text: string) => `\x1b[${code}m${text}\x1b[0m`;
const dim = paint("2");
const cyan = paint("36");
const yellow = paint("33");
const red = paint("31");
const green = paint("32");

/** A job log record (`<time> <out|err|svc> <text>`): the time dimmed, the builder's lines and outcomes coloured. */
export function colourLogLine(line: string): string {
  const match = /^(\S+) (out|err|svc) (.*)$/.exec(line);
  if (!match) return line;
  const time = match[1]!;
  const stream = match[2]!;
  const text = match[3]!;
  if (stream === "svc") {
    const body = /^job (failed|cancelled)\b/.test(text) ? red(text) : /^job succeeded\b/.test(text) ? green(text) : cyan(text);
    return `${dim(time)} ${dim(stream)} ${body}`;
  }
  return `${dim(time)} ${stream === "err" ? yellow(stream) : dim(stream)} ${text}`;
}

/**
 * Wraps a writer of log text so that each complete line is coloured; a line is
 * held back until its newline arrives (the builder writes whole lines).
 */
export function colouredLines(write: (text: string) => void): (text: string) => void {
  let partial = "";
  return (text) => {
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    if (lines.length > 0) write(`${lines.map(colourLogLine).join("\n")}\n`);
  };
}
