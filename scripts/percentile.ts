/** The nearest-rank `p`th percentile of `sorted` (ascending): the smallest value at least p % of them do not exceed; NaN for none. */
export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN;
}
