import { CronExpressionParser } from "cron-parser";

/**
 * Five-field cron expressions exactly as the spec allows them: minute 0-59,
 * hour 0-23, day of month 1-31, month 1-12 (or jan-dec), day of week 0-7 (or
 * sun-sat; 0 and 7 are Sunday), with `*`, lists, ranges, steps and stepped
 * ranges. cron-parser alone accepts more (seconds, `@daily`, `L`, `#`, `?`), so
 * the grammar is checked here first and cron-parser only computes times.
 *
 * What the times are (README "Cron schedules", with Kubernetes' behaviour):
 * - day of month and day of week both restricted: a day matching either runs
 *   (`0 0 13 * 5`: every 13th and every Friday); one of them `*`: the other alone;
 * - in the job's time zone, a time skipped by spring-forward runs once, an hour
 *   later on the wall clock (02:30 → 03:30); a time repeated by fall-back runs
 *   once, at its first occurrence; a schedule with `*` hours runs every real hour.
 */

type Field = { name: string; min: number; max: number; names?: readonly string[] };

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"] as const;
const DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"] as const;

const FIELDS: readonly Field[] = [
  { name: "minute", min: 0, max: 59 },
  { name: "hour", min: 0, max: 23 },
  { name: "day of month", min: 1, max: 31 },
  { name: "month", min: 1, max: 12, names: MONTHS },
  { name: "day of week", min: 0, max: 7, names: DAYS },
];

const ITEM = /^(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:\/([0-9]+))?$/;

export type ScheduleCheck = { ok: true } | { ok: false; message: string };

function fieldValue(field: Field, token: string): number | null {
  if (/^[0-9]{1,2}$/.test(token)) return Number(token);
  const index = field.names?.indexOf(token as never) ?? -1;
  if (index < 0) return null;
  return field === FIELDS[3] ? index + 1 : index;
}

function checkField(field: Field, text: string): string | null {
  for (const item of text.toLowerCase().split(",")) {
    const match = ITEM.exec(item);
    if (!match) return `${field.name} field "${text}" is not a number, range, list or step`;
    const [, base, step] = match;
    if (step !== undefined && (Number(step) < 1 || Number(step) > field.max)) {
      return `${field.name} step "/${step}" must be between 1 and ${field.max}`;
    }
    if (base === "*") continue;
    const [from, to] = base!.split("-");
    const start = fieldValue(field, from!);
    const end = to === undefined ? start : fieldValue(field, to);
    if (start === null || end === null) return `${field.name} field "${text}" has an unknown value`;
    for (const v of [start, end]) {
      if (v < field.min || v > field.max) return `${field.name} value ${v} is out of range ${field.min}-${field.max}`;
    }
    if (start > end) return `${field.name} range "${base}" runs backwards`;
  }
  return null;
}

/**
 * Validates a schedule; the message completes "invalid cron expression: …".
 * Besides the grammar, a schedule must fire at all: `0 0 30 2 *` (February
 * 30th) is five valid fields that no date ever matches.
 */
export function checkSchedule(schedule: string): ScheduleCheck {
  const fields = schedule.trim().split(/\s+/).filter(Boolean);
  if (fields.length !== 5) {
    return { ok: false, message: `expected 5 space-separated fields (minute hour day-of-month month day-of-week), got ${fields.length}` };
  }
  for (const [i, field] of FIELDS.entries()) {
    const problem = checkField(field, fields[i]!);
    if (problem) return { ok: false, message: problem };
  }
  try {
    nextRuns(schedule, "UTC", Date.now(), 1);
  } catch {
    return {
      ok: false,
      message: `it never fires: no date has day of month "${fields[2]}" in month "${fields[3]}" (e.g. 30 2 is February 30th)`,
    };
  }
  return { ok: true };
}

export function isTimeZone(tz: string): boolean {
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}

/** The next `count` run times strictly after `after` (epoch ms), in the job's time zone. */
export function nextRuns(schedule: string, timezone: string, after: number, count: number): number[] {
  const expression = CronExpressionParser.parse(schedule.trim().replace(/\s+/g, " "), {
    currentDate: new Date(after),
    tz: timezone,
  });
  return expression.take(count).map((d) => d.getTime());
}
