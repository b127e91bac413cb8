/**
 * The rules of a disk's automatic snapshots (issue 19), in one place for the
 * API that takes the settings and the watchdog pass that follows them.
 */

export const HOUR_MS = 3_600_000;
export const DEFAULT_SNAPSHOT_INTERVAL_HOURS = 24;
/** Longest interval between automatic snapshots: a week, so even the shortest retention (7 days) always holds one. */
export const MAX_SNAPSHOT_INTERVAL_HOURS = 168;
/** Kept by default: a week of daily snapshots, what the free plan's retention holds. */
export const DEFAULT_SNAPSHOT_KEEP = 7;
/** The description of every automatic snapshot, as the backups list shows it. */
export const AUTOMATIC_DESCRIPTION = "automatic snapshot";

/** When a disk made (or re-scheduled) at `now` takes its first snapshot: one interval later; null when they are off. */
export function firstSnapshotAt(intervalHours: number, now: number): number | null {
  return intervalHours > 0 ? now + intervalHours * HOUR_MS : null;
}

/**
 * When the snapshot after the one due at `due` is due. On time (or a little
 * late) the schedule keeps its time of day; a disk that missed a whole
 * interval (one that existed before snapshots, or a watchdog that did not run
 * for long) starts its schedule again from now, so a backlog spreads over the
 * day instead of coming due all at once again.
 */
export function nextSnapshotAt(due: number, intervalHours: number, now: number): number {
  const interval = intervalHours * HOUR_MS;
  return now - due < interval ? due + interval : now + interval;
}
