/** ISO 8601 UTC with milliseconds, the one timestamp format of the API (DESIGN §3). */
export function iso(ms: number): string {
  return new Date(ms).toISOString();
}

export function isoOrNull(ms: number | null | undefined): string | null {
  return ms == null ? null : iso(ms);
}
