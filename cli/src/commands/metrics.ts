import type { ResponseData } from "../../../openapi/types.js";
import { path } from "../api.js";
import { APP_ARG, defineCommand } from "../command.js";
import { fields, table } from "../output.js";
import { formatBytes } from "../progress.js";

type Metrics = ResponseData<"/v1/apps/{app}/metrics", "get", 200>;

const RANGES = ["1h", "24h", "7d", "30d"] as const;

const ms = (value: number | null) => (value === null ? "-" : value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`);

/** `svc metrics <app>`: the app's requests, errors and latency at the edge, as a compact table. */
export const metrics = defineCommand({
  name: "metrics",
  summary: "Show an app's requests, errors and latency at the edge",
  description: `Requests by status class, bytes out and latency percentiles (p50, p95, p99) as the edge measured them,
in steps: --since 1h (1 minute), 24h (15 minutes), 7d (2 hours), 30d (6 hours). Steps without requests are
left out of the table (--json has every step). About a second behind. More: docs/metrics.md.`,
  args: [APP_ARG],
  options: { since: { type: "string", value: "range", description: "1h (default), 24h, 7d or 30d" } },
  examples: ["svc metrics web", "svc metrics web --since 24h --json"],
  async run({ args, opts, out, api, fail }) {
    const since = opts.since ?? "1h";
    if (!(RANGES as readonly string[]).includes(since)) throw fail(`--since must be one of ${RANGES.join(", ")}, got "${since}"`);
    const data = await (await api()).data<Metrics>("GET", `${path`/v1/apps/${args.app}/metrics`}?since=${since}`, undefined, {
      what: `show the metrics of app ${args.app}`,
      hints: { APP_NOT_FOUND: `no app "${args.app}" in this account: \`svc apps list\` shows the names and ids` },
    });
    const t = data.totals;
    const errors = t.requests === 0 ? "-" : `${(((t.s5xx + t.s4xx) / t.requests) * 100).toFixed(1)} % (${t.s4xx} 4xx, ${t.s5xx} 5xx)`;
    const head = fields([
      ["range", `last ${since}, ${data.stepSeconds / 60 >= 60 ? `${data.stepSeconds / 3600} h` : `${data.stepSeconds / 60} min`} steps`],
      ["requests", `${t.requests} (${t.s2xx} 2xx, ${t.s3xx} 3xx, ${t.s4xx} 4xx, ${t.s5xx} 5xx)`],
      ["errors", errors],
      ["latency", `p50 ${ms(t.p50Ms)}, p95 ${ms(t.p95Ms)}, p99 ${ms(t.p99Ms)}`],
      ["bytes out", formatBytes(t.bytes)],
    ]);
    const busy = data.points.filter((p) => p.requests > 0);
    const steps =
      busy.length === 0
        ? `No requests in the last ${since}.`
        : table(busy, [
            ["TIME", (p) => p.at.replace("T", " ").slice(0, 16)],
            ["REQUESTS", (p) => String(p.requests)],
            ["2XX", (p) => String(p.s2xx)],
            ["3XX", (p) => String(p.s3xx)],
            ["4XX", (p) => String(p.s4xx)],
            ["5XX", (p) => String(p.s5xx)],
            ["P50", (p) => ms(p.p50Ms)],
            ["P95", (p) => ms(p.p95Ms)],
            ["P99", (p) => ms(p.p99Ms)],
            ["BYTES", (p) => formatBytes(p.bytes)],
          ]);
    out.result(data, `${head}\n\n${steps}`);
  },
});
