import { randomInt } from "node:crypto";
import { runChaos } from "./chaos/run.js";

/**
 * `npm run chaos -- [--minutes N] [--seed S]`: the chaos run (docs/fleet.md,
 * "The chaos run") for N minutes (10 by default), on a fresh local stack of
 * three nodes. Prints the seed first (the same seed replays the same
 * schedule of faults), the faults as they happen, then the checker's table;
 * exits 1 when a row that must be 0 is not. Needs root, nft and a cgroup v2
 * hierarchy, as the partition tests do.
 */
function flag(name: string): string | undefined {
  const at = process.argv.indexOf(name);
  return at === -1 ? undefined : process.argv[at + 1];
}

const minutes = Number(flag("--minutes") ?? 10);
const seed = Number(flag("--seed") ?? randomInt(1, 2 ** 31));
if (!Number.isFinite(minutes) || minutes <= 0 || minutes > 24 * 60) {
  console.error(`--minutes must be a number of minutes from 0 to 1440, got ${flag("--minutes")}`);
  process.exit(2);
}
if (!Number.isSafeInteger(seed) || seed < 0) {
  console.error(`--seed must be a whole number, got ${flag("--seed")}`);
  process.exit(2);
}

console.log(`chaos run: seed ${seed} (npm run chaos -- --minutes ${minutes} --seed ${seed} replays its schedule)`);
const report = await runChaos({ seconds: Math.round(minutes * 60), seed, log: (line) => console.log(line) });
console.log(`\n${report.table}\n\nseed ${seed}: ${report.failed.length === 0 ? "every bounded row holds" : `${report.failed.length} rows FAILED`}`);
process.exit(report.failed.length === 0 ? 0 : 1);
