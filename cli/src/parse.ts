/**
 * Parsers for flag values shared by several commands. Each takes the flag's
 * name for the message and a `fail` that builds the usage error, so a bad
 * value is reported before any request is sent.
 */

type Fail = (message: string) => Error;

/** A whole number ≥ 1, e.g. `--memory 512`. */
export function positiveInteger(value: string, flag: string, fail: Fail): number {
  const n = /^\d+$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < 1) throw fail(`${flag} must be a whole number of at least 1, got "${value}"`);
  return n;
}

const UNIT_HOURS: Record<string, number> = { h: 1, d: 24, w: 168 };

/** An interval of whole hours such as `24h`, `1d`, `1w` (or a bare number of hours); `off` (or 0) is 0. */
export function hoursOrOff(value: string, flag: string, fail: Fail): number {
  const text = value.trim().toLowerCase();
  if (text === "off") return 0;
  const match = /^(\d+)\s*([hdw]?)$/.exec(text);
  const hours = match ? Number(match[1]) * UNIT_HOURS[match[2] || "h"]! : Number.NaN;
  if (!Number.isSafeInteger(hours)) throw fail(`${flag} must be whole hours such as 12h, 1d or 1w, or off, got "${value}"`);
  return hours;
}

const UNIT_SECONDS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 };

/** A duration such as `90s`, `15m`, `1h`, `30d`, `2w` (or a bare number of seconds), in seconds. */
export function durationSeconds(value: string, flag: string, fail: Fail): number {
  const match = /^(\d+)\s*([smhdw]?)$/.exec(value.trim());
  const seconds = match ? Number(match[1]) * UNIT_SECONDS[match[2] || "s"]! : Number.NaN;
  if (!Number.isSafeInteger(seconds)) throw fail(`${flag} must be a duration such as 30m, 12h or 30d, got "${value}"`);
  return seconds;
}

/** Any date/time `Date` understands (`2027-01-01`, `2027-01-01T12:00:00+02:00`), as the API's ISO 8601 UTC form. */
export function isoTime(value: string, flag: string, fail: Fail): string {
  const iso = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?$/i.test(value.trim());
  const ms = iso ? Date.parse(value.trim()) : Number.NaN;
  if (Number.isNaN(ms)) throw fail(`${flag} must be an ISO 8601 time such as 2027-01-01T00:00:00Z, got "${value}"`);
  return new Date(ms).toISOString();
}
