/**
 * `wrangler dev`'s output as npm start shows it, less one report that reads
 * like a failure and is not: workerd logs a client that closed its connection
 * before the response ended (a browser navigating away, a `--follow` stopped
 * with Ctrl-C) as
 *
 *     ✘ [ERROR] kj::getCaughtExceptionAsKj() = kj/async-io-unix.c++:186:
 *               disconnected: ::write(fd, buffer.begin(), buffer.size()): Broken pipe
 *
 * (newer workerd on one line) with indented stack lines after it. Such a
 * block is replaced, the first time only, by one line saying what it was;
 * every other line passes unchanged.
 */

/** What workerd's "disconnected" reports mean, said once. */
export const DISCONNECT_NOTE =
  "npm start: a client closed its connection before its response ended (workerd reports it as kj … disconnected … Broken pipe); harmless, not shown again";

/** A report of a connection the client closed. */
const DISCONNECTED = /disconnected: .*(?:Broken pipe|Connection reset by peer)/;

// biome-ignore lint/suspicious/noControlCharactersInRegex: ANSI colour codes are what is stripped
const ANSI = /\u001b\[[0-9;]*m/g;

/** A line filter: feed it chunks as they come; it writes whole lines to `write`. */
export function quietDisconnects(write: (text: string) => void): (chunk: string) => void {
  let partial = "";
  let held: string | null = null; // a kj exception line, until the next says whether it is a disconnect
  let skipping = false;
  let noted = false;
  /** Drops a disconnect report (its stack lines after it too), saying what it was the first time. */
  const quiet = () => {
    skipping = true;
    if (!noted) write(`${DISCONNECT_NOTE}\n`);
    noted = true;
  };
  const line = (text: string) => {
    const plain = text.replace(ANSI, "");
    if (skipping) {
      if (plain.trim() === "" || /^\s/.test(plain)) return; // the report's continuation and stack lines
      skipping = false;
    }
    if (held !== null) {
      const exception = held;
      held = null;
      if (/^\s*disconnected: /.test(plain) && DISCONNECTED.test(plain)) return quiet();
      write(`${exception}\n`);
    }
    if (plain.includes("kj::getCaughtExceptionAsKj()")) {
      // Newer workerd prints the report on one line; older, its "disconnected" on the next.
      if (DISCONNECTED.test(plain)) return quiet();
      held = text;
      return;
    }
    write(`${text}\n`);
  };
  return (chunk) => {
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    for (const text of lines) line(text);
  };
}
