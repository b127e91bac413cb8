import { useState } from "preact/hooks";
import { api, ok, type Schemas } from "../api";
import { BYTES, Chart, COUNT, MS, PALETTE, PERCENT, type Range, RangePicker, type Series, stepWords } from "../chart";
import { formatBytes } from "../format";
import { Empty, Pending, useLoad, usePoll } from "../ui";

type App = Schemas["App"];
type AppMetrics = Awaited<ReturnType<typeof load>>["data"];
type Process = AppMetrics["processes"][number];

const load = (app: string, since: Range) => ok(api.GET("/v1/apps/{app}/metrics", { params: { path: { app }, query: { since } } }));

/**
 * The app's requests, errors and latency at the edge, and each of its
 * processes' CPU and memory, over 1 h, 24 h or 7 d (the API's `/metrics`),
 * refreshed every 10 s. A static site runs no process; a worker takes no
 * requests.
 */
export function Metrics({ app }: { app: App }) {
  const [range, setRange] = useState<Range>("1h");
  const metrics = useLoad(() => load(app.name, range), [app.name, range]);
  usePoll(() => metrics.reload(), 10_000, true);
  const data = metrics.data?.data;
  const serves = app.type !== "worker";
  const runs = app.runtime !== "static";
  return (
    <>
      <RangePicker value={range} onChange={setRange} />
      {!data ? (
        <Pending error={metrics.error} />
      ) : (
        <>
          <p class="hint">
            {serves
              ? `${data.totals.requests} requests (${data.totals.s4xx} 4xx, ${data.totals.s5xx} 5xx), p95 ${data.totals.p95Ms ?? "-"} ms, measured at the edge in ${stepWords(data.stepSeconds)} steps.`
              : `CPU and memory of the worker's processes in ${stepWords(data.stepSeconds)} steps.`}
          </p>
          <div class="charts">
            {serves && <RequestCharts data={data} />}
            {runs && <ProcessCharts data={data} />}
          </div>
        </>
      )}
    </>
  );
}

function RequestCharts({ data }: { data: AppMetrics }) {
  const times = data.points.map((p) => Date.parse(p.at) / 1000);
  const pick = (key: "s2xx" | "s3xx" | "s4xx" | "s5xx" | "p50Ms" | "p95Ms" | "p99Ms") => data.points.map((p) => p[key]);
  return (
    <>
      <Chart
        title="Requests by status"
        unit={COUNT}
        times={times}
        series={[
          { label: "2xx", values: pick("s2xx"), color: "#1a7f37" },
          { label: "3xx", values: pick("s3xx"), color: "#0969da" },
          { label: "4xx", values: pick("s4xx"), color: "#bf8700" },
          { label: "5xx", values: pick("s5xx"), color: "#cf222e" },
        ]}
      />
      <Chart
        title="Latency"
        unit={MS}
        times={times}
        series={[
          { label: "p50", values: pick("p50Ms"), color: "#1a7f37" },
          { label: "p95", values: pick("p95Ms"), color: "#bf8700" },
          { label: "p99", values: pick("p99Ms"), color: "#cf222e" },
        ]}
      />
    </>
  );
}

/** A process as its series is labelled: `prc_` and the first 6 characters, as a short commit hash. */
const shortProcessId = (id: string) => id.slice(0, 10);

/** Each process's CPU (percent of one core) and memory against its limit; gaps where a process did not run. */
function ProcessCharts({ data }: { data: AppMetrics }) {
  if (data.processes.length === 0) {
    return (
      <section class="chart" aria-label="CPU and memory">
        <h3 class="chart-title">CPU and memory</h3>
        <Empty>No process ran in this range.</Empty>
      </section>
    );
  }
  const times = data.points.map((p) => Date.parse(p.at) / 1000);
  const colour = (i: number) => PALETTE[i % PALETTE.length]!;
  const each = (read: (point: Process["points"][number]) => number | null): Series[] =>
    data.processes.map((process, i) => ({ label: shortProcessId(process.id), values: process.points.map(read), color: colour(i), gaps: true }));
  const limits = [...new Set(data.processes.map((p) => p.memoryLimitBytes))];
  const limitLines: Series[] = limits.map((limit) => ({
    label: limits.length === 1 ? "limit" : `limit ${formatBytes(limit)}`,
    values: times.map(() => limit),
    color: "#6e7781",
    dash: [6, 4],
  }));
  return (
    <>
      <Chart
        title="CPU"
        unit={PERCENT}
        times={times}
        series={each((p) => (p.cpuSeconds === null ? null : Math.round((p.cpuSeconds / data.stepSeconds) * 1000) / 10))}
      />
      <Chart title="Memory" unit={BYTES} times={times} series={[...each((p) => p.memoryBytes), ...limitLines]} />
      <p class="hint">CPU is a percent of one core (100% = one core busy all the step); memory is the most each process held in the step, against its limit.</p>
    </>
  );
}
