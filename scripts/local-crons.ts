import { readFile } from "node:fs/promises";
import { nextRuns } from "../worker/lib/cron.js";

/**
 * The Worker's cron triggers, locally. `wrangler dev` does not run
 * `scheduled()` by itself ("Scheduled Workers are not automatically triggered
 * during local development"), but the platform needs it: the hourly retention
 * sweep and the cron watchdog every 5 minutes. So the local stack fires each
 * trigger of wrangler.toml at its time through the `/__scheduled?cron=<expr>`
 * route of the local Worker's entry (worker-dev-entry.ts, as `wrangler dev
 * --test-scheduled` has it),
 * which is how the trigger reaches `scheduled()` in production too
 * (`controller.cron` is the expression). Nothing fires between the real times,
 * so a test stack is not disturbed.
 */

/** The expressions of `[triggers] crons = [...]` in wrangler.toml's text. */
export function wranglerCrons(toml: string): string[] {
  const list = /^\s*crons\s*=\s*\[([^\]]*)\]/m.exec(toml)?.[1] ?? "";
  return [...list.matchAll(/"([^"]+)"|'([^']+)'/g)].map((m) => (m[1] ?? m[2])!);
}

/** Reads the triggers from a wrangler.toml file. */
export async function cronsOf(wranglerToml: string): Promise<string[]> {
  return wranglerCrons(await readFile(wranglerToml, "utf8"));
}

/** What {@link scheduleTriggers} needs: the expressions (UTC, as Cloudflare reads them) and how to fire one. */
export type TriggerOptions = {
  crons: readonly string[];
  fire(cron: string): Promise<void>;
};

/**
 * Fires each cron at its next time, then the one after, until `stop()`. One
 * timer for the earliest time; expressions due at the same minute fire
 * together. The timer does not keep the process alive by itself.
 */
export function scheduleTriggers({ crons, fire }: TriggerOptions): { stop(): void } {
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const arm = (after: number) => {
    if (stopped || crons.length === 0) return;
    const due = crons.map((cron) => ({ cron, at: nextRuns(cron, "UTC", after, 1)[0]! }));
    const at = Math.min(...due.map((d) => d.at));
    timer = setTimeout(() => {
      for (const { cron } of due.filter((d) => d.at === at)) {
        fire(cron).catch((error: unknown) => console.error(`local stack: cron trigger "${cron}": ${String(error)}`));
      }
      arm(at);
    }, Math.max(0, at - Date.now()));
    timer.unref();
  };
  arm(Date.now());
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
