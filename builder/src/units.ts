/** How the node writes sizes and counts for people (logs, refusals, usage). */

/** Formats a byte count for people (disk usage). */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** Formats a count for people: 262,144. */
export function formatCount(count: number): string {
  return count.toLocaleString("en-US");
}
