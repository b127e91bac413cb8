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
