import { createInterface } from "node:readline/promises";
import { CliError } from "./output.js";

const cancelled = () => new CliError("cancelled", [], undefined, 130);

/** Asks one question on the terminal (prompt on stderr, so stdout stays clean); empty input takes the default. */
export async function ask(question: string, fallback?: string): Promise<string> {
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  const abort = new AbortController();
  rl.once("SIGINT", () => abort.abort());
  try {
    const answer = await rl.question(fallback ? `${question} [${fallback}]: ` : `${question}: `, { signal: abort.signal });
    return answer.trim() || fallback || "";
  } catch {
    throw cancelled();
  } finally {
    rl.close();
  }
}

/** Asks a yes/no question; anything but y/yes is no, so a stray Enter never destroys anything. */
export async function confirm(question: string): Promise<boolean> {
  return /^y(es)?$/i.test(await ask(`${question} [y/N]`));
}

/** What a command that cannot be undone says when it asks, when it refuses, and when it was told no. */
export type Confirmation = {
  /** Lower case, as in "refusing to <action>": `delete app my-site`. */
  action: string;
  /** The question on a terminal, without the `[y/N]`. */
  question: string;
  /** The command to run again with --yes. */
  retry: string;
};

/**
 * Asks before something that cannot be undone, unless `--yes` was given. Without
 * a terminal to ask on it refuses (exit 1) rather than acting, so a script has
 * to say --yes; anything but y/yes at the prompt is a no.
 */
export async function confirmOrRefuse(interactive: boolean, yes: boolean, confirmation: Confirmation): Promise<void> {
  if (yes) return;
  const { action, question, retry } = confirmation;
  if (!interactive) {
    throw new CliError(`refusing to ${action} without confirmation`, ["stdin is not a terminal, so svc cannot ask"], `pass --yes: ${retry} --yes`);
  }
  if (!(await confirm(question))) throw new CliError(`did not ${action}`, ["the question was not answered with y"]);
}

/**
 * Reads a secret without echoing it, so an API key typed or pasted at the
 * prompt does not stay on the screen or in terminal scrollback.
 */
export async function askSecret(question: string): Promise<string> {
  const stdin = process.stdin;
  process.stderr.write(`${question}: `);
  stdin.setRawMode(true);
  stdin.setEncoding("utf8");
  stdin.resume();
  return new Promise<string>((resolve, reject) => {
    let value = "";
    const finish = (err?: CliError) => {
      stdin.off("data", onData);
      stdin.setRawMode(false);
      stdin.pause();
      process.stderr.write("\n");
      if (err) reject(err);
      else resolve(value.trim());
    };
    const onData = (chunk: string) => {
      for (const ch of chunk) {
        if (ch === "\r" || ch === "\n" || ch === "\u0004") return finish();
        if (ch === "\u0003") return finish(cancelled());
        if (ch === "\u007f" || ch === "\b") value = value.slice(0, -1);
        else if (ch >= " ") value += ch;
      }
    };
    stdin.on("data", onData);
  });
}
