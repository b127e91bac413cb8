/** How often the progress line may be redrawn. */
const PROGRESS_INTERVAL_MS = 250;

/** `1536` → `1.5 KiB`. */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/**
 * A transfer's progress as one redrawn line on stderr (percent, bytes, rate),
 * at most four times a second; silent unless stderr is a terminal, so logs and
 * pipes get no carriage-return noise.
 */
export class Progress {
  private readonly started = Date.now();
  private drawn = 0;
  private done = 0;

  constructor(
    private readonly label: string,
    private readonly total: number | undefined,
    private readonly enabled = process.stderr.isTTY === true,
  ) {}

  add(n: number): void {
    this.done += n;
    const now = Date.now();
    const finished = this.total !== undefined && this.done >= this.total;
    if (!this.enabled || (now - this.drawn < PROGRESS_INTERVAL_MS && !finished)) return;
    this.drawn = now;
    const percent = this.total ? `${Math.floor((this.done / this.total) * 100)}% ` : "";
    const of = this.total ? ` of ${formatBytes(this.total)}` : "";
    const rate = formatBytes(this.done / Math.max((now - this.started) / 1000, 0.001));
    process.stderr.write(`\r\x1b[K${this.label} ${percent}${formatBytes(this.done)}${of}, ${rate}/s`);
  }

  /** Clears the line, so what follows starts at the left margin. */
  end(): void {
    if (this.enabled && this.drawn > 0) process.stderr.write("\r\x1b[K");
  }
}
