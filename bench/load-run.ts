/**
 * Issue 10's load run: 32 clients for 60 s across three accounts, creating,
 * listing and deleting keys, apps, cron jobs and backups against the local
 * stack (`npm start`'s Worker + builder). Prints the request and error
 * counts, and whether D1 ends as the clients were told (test/e2e/load.e2e.test.ts
 * asserts the same at a smaller scale).
 *
 *     npx tsx bench/load-run.ts [clients] [seconds]      (default 32, 60)
 */
import { loadavg } from "node:os";
import { startStack } from "../test/cli/svc.js";
import { runLoad } from "../test/e2e/load.js";

const clients = Number(process.argv[2] ?? 32);
const seconds = Number(process.argv[3] ?? 60);
const stack = await startStack();
try {
  const started = Date.now();
  const report = await runLoad(stack, { clients, seconds });
  const elapsed = (Date.now() - started) / 1000;
  console.log(`load run: ${clients} clients, ${seconds} s, 3 accounts, load average ${loadavg()[0]!.toFixed(2)}`);
  console.log(`  requests ${report.requests} (${(report.requests / seconds).toFixed(0)}/s), ${elapsed.toFixed(0)} s with settling`);
  console.log(`  2xx ${report.ok}, 4xx ${report.refused}, 429 ${report.rateLimited}, 5xx ${report.serverErrors}, transport errors ${report.transportErrors}`);
  console.log(`  cross-account rows ${report.crossAccount.length}, D1 mismatches ${report.mismatches.length}`);
  for (const line of [...report.serverErrorSamples, ...report.crossAccount, ...report.mismatches].slice(0, 10)) console.log(`  ! ${line}`);
  if (report.serverErrors + report.transportErrors + report.crossAccount.length + report.mismatches.length > 0) process.exitCode = 1;
} finally {
  await stack.stop();
}
