import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { formatBytes, formatDuration } from "./format";

/** The charts every metrics view shares (an app's requests and processes, a disk's use, a cron job's runs): one uPlot figure, its axes' units and the range picker. */

export const RANGES = [
  ["1h", "1 hour"],
  ["24h", "24 hours"],
  ["7d", "7 days"],
] as const;
export type Range = (typeof RANGES)[number][0];

/** The API's ranges as buttons, the chosen one pressed. */
export function RangePicker({ value, onChange }: { value: Range; onChange: (range: Range) => void }) {
  return (
    <fieldset class="toolbar range">
      <legend class="visually-hidden">Range</legend>
      {RANGES.map(([range, label]) => (
        <button type="button" key={range} aria-pressed={value === range} class={value === range ? "primary" : undefined} onClick={() => onChange(range)}>
          {label}
        </button>
      ))}
    </fieldset>
  );
}

/** A step as the hint under a range says it: "1-minute", "15-minute", "2-hour". */
export const stepWords = (stepSeconds: number) => (stepSeconds >= 3600 ? `${stepSeconds / 3600}-hour` : `${stepSeconds / 60}-minute`);

/** How a y axis labels its ticks, and (when the unit has round numbers of its own, as bytes do) where it puts them. */
export type Unit = { format: (value: number) => string; incrs?: number[] };

/** Whole numbers of things (requests, runs): no tick at 0.5. */
export const COUNT: Unit = { format: String, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 1e6, 1e7, 1e8] };
/** Bytes, ticked at powers of two so the labels read 64 MiB, 128 MiB rather than 47.7 MiB. */
export const BYTES: Unit = { format: formatBytes, incrs: Array.from({ length: 50 }, (_, i) => 2 ** i) };
export const PERCENT: Unit = { format: (v) => `${v}%` };
export const MS: Unit = { format: (v) => `${v} ms` };
export const DURATION: Unit = { format: (v) => (v < 1000 ? `${v} ms` : formatDuration(v)) };

export type Series = {
  label: string;
  values: (number | null)[];
  color: string;
  /** A dashed line: a limit, not a measure. */
  dash?: number[];
  /** Drawn as bars, left of the step's time (-1), on it (0) or right of it (1): two bar series side by side. */
  bars?: -1 | 0 | 1;
  /** Read against the right-hand axis (the chart's `right` unit). */
  right?: boolean;
  /** Leave a gap where a value is null (a process that did not run then) instead of joining its neighbours. */
  gaps?: boolean;
};

const AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
let measure: CanvasRenderingContext2D | null = null;

/** How wide `text` is drawn in the axes' font. */
function textWidth(text: string): number {
  measure ??= document.createElement("canvas").getContext("2d");
  if (!measure) return text.length * 8;
  measure.font = AXIS_FONT;
  return measure.measureText(text).width;
}

/** Room for the longest tick label plus the tick and its gap (uPlot's fixed default is sized for short numbers; "512 MiB" needs more). */
const axisSize = (_: uPlot, values: string[] | null) => Math.ceil(Math.max(16, ...(values ?? []).map(textWidth)) + 22);

/** A scale from 0 up, so a small change does not fill the chart, with room above the highest value. */
const fromZero = (_: uPlot, _min: number | null, max: number | null): uPlot.Range.MinMax => [0, max !== null && max > 0 ? max * 1.1 : 1];

/** A y axis: on the left (uPlot's side 3) with the grid, or on the right (side 1) without. */
function axis(unit: Unit, scale: string, side: 1 | 3): uPlot.Axis {
  // Only keys with a value: uPlot takes an explicit `undefined` over its default.
  return { scale, side, font: AXIS_FONT, size: axisSize, values: (_, ticks) => ticks.map((t) => unit.format(t)), ...(unit.incrs ? { incrs: unit.incrs } : {}), grid: { show: side === 3 } };
}

/**
 * One chart: a time axis and a few series, as wide as its box (it follows the
 * box's width: 390 px phones too), values against `unit` on the left and,
 * for the series marked `right`, against `right` on the right.
 */
export function Chart({ title, times, series, unit, right }: { title: string; times: number[]; series: Series[]; unit: Unit; right?: Unit }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    const element = box.current!;
    const options: uPlot.Options = {
      width: element.clientWidth,
      height: 180,
      scales: { y: { range: fromZero }, ...(right ? { right: { range: fromZero } } : {}) },
      series: [
        {},
        ...series.map(
          (s): uPlot.Series => ({
            label: s.label,
            stroke: s.color,
            width: 1.5,
            spanGaps: !s.gaps,
            scale: s.right ? "right" : "y",
            ...(s.dash ? { dash: s.dash, points: { show: false } } : {}),
            ...(s.bars !== undefined ? { fill: `${s.color}99`, paths: uPlot.paths.bars?.({ align: s.bars, size: [s.bars === 0 ? 0.6 : 0.4, 24, 3] }), points: { show: false } } : {}),
          }),
        ),
      ],
      axes: [{}, axis(unit, "y", 3), ...(right ? [axis(right, "right", 1)] : [])],
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
  }, [times, series, unit, right]);
  return (
    <figure class="chart" aria-label={title}>
      <figcaption>{title}</figcaption>
      <div ref={box} />
    </figure>
  );
}

/** Colours for series that are many of a kind (an app's processes), in turn. */
export const PALETTE = ["#0969da", "#1a7f37", "#8250df", "#bf8700", "#cf222e", "#1b7c83", "#bc4c00", "#6e7781"];
