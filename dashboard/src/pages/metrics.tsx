import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { api, ok, type Schemas } from "../api";
import { Pending, useLoad, usePoll } from "../ui";

type App = Schemas["App"];
const RANGES = [
  ["1h", "1 hour"],
  ["24h", "24 hours"],
  ["7d", "7 days"],
] as const;
type Range = (typeof RANGES)[number][0];

/** One chart: a time axis and a few lines, as wide as its box (it follows the box's width: 390 px phones too). */
function Chart({ title, times, series, unit }: { title: string; times: number[]; series: { label: string; values: (number | null)[]; color: string }[]; unit: string }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    const element = box.current!;
    const options: uPlot.Options = {
      width: element.clientWidth,
      height: 180,
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, spanGaps: true }))],
      axes: [{}, { size: 52, values: (_, ticks) => ticks.map((t) => `${t}${unit}`) }],
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
    };
    plot.current = new uPlot(options, [times, ...series.map((s) => s.values)], element);
    const resize = new ResizeObserver(() => plot.current?.setSize({ width: element.clientWidth, height: 180 }));
    resize.observe(element);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
    };
  }, [times, series, unit]);
  return (
    <figure class="chart" aria-label={title}>
      <figcaption>{title}</figcaption>
      <div ref={box} />
    </figure>
  );
}

/** The app's requests, errors and latency at the edge over 1 h, 24 h or 7 d (the API's `/metrics`), refreshed every 10 s. */
export function Metrics({ app }: { app: App }) {
  const [range, setRange] = useState<Range>("1h");
  const metrics = useLoad(() => ok(api.GET("/v1/apps/{app}/metrics", { params: { path: { app: app.name }, query: { since: range } } })), [app.name, range]);
  usePoll(() => metrics.reload(), 10_000, true);
  const data = metrics.data?.data;
  return (
    <>
      <fieldset class="toolbar range">
        <legend class="visually-hidden">Range</legend>
        {RANGES.map(([value, label]) => (
          <button type="button" key={value} aria-pressed={range === value} class={range === value ? "primary" : undefined} onClick={() => setRange(value)}>
            {label}
          </button>
        ))}
      </fieldset>
      {!data ? (
        <Pending error={metrics.error} />
      ) : (
        <>
          <p class="hint">
            {data.totals.requests} requests ({data.totals.s4xx} 4xx, {data.totals.s5xx} 5xx), p95 {data.totals.p95Ms ?? "-"} ms, measured at the edge in{" "}
            {data.stepSeconds >= 3600 ? `${data.stepSeconds / 3600}-hour` : `${data.stepSeconds / 60}-minute`} steps.
          </p>
          <Charts data={data} />
        </>
      )}
    </>
  );
}

function Charts({ data }: { data: { points: { at: string; requests: number; s2xx: number; s3xx: number; s4xx: number; s5xx: number; p50Ms: number | null; p95Ms: number | null; p99Ms: number | null }[] } }) {
  const times = data.points.map((p) => Date.parse(p.at) / 1000);
  const pick = (key: "s2xx" | "s3xx" | "s4xx" | "s5xx" | "p50Ms" | "p95Ms" | "p99Ms") => data.points.map((p) => p[key]);
  return (
    <div class="charts">
      <Chart
        title="Requests by status"
        unit=""
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
        unit=" ms"
        times={times}
        series={[
          { label: "p50", values: pick("p50Ms"), color: "#1a7f37" },
          { label: "p95", values: pick("p95Ms"), color: "#bf8700" },
          { label: "p99", values: pick("p99Ms"), color: "#cf222e" },
        ]}
      />
    </div>
  );
}
