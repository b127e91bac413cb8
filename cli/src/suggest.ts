/**
 * "Did you mean …": the known words closest to a mistyped one, the way git,
 * gh and cargo answer a typo. Close means a small edit distance (a letter
 * missing, extra, wrong, or two swapped), or the typed word being the start of
 * exactly the known one.
 */

/** Edit distance with transpositions (optimal string alignment), bounded: anything above `limit` is `limit + 1`. */
function editDistance(a: string, b: string, limit: number): number {
  if (Math.abs(a.length - b.length) > limit) return limit + 1;
  const rows: number[][] = [];
  for (let i = 0; i <= a.length; i++) rows.push([i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 0; j <= b.length; j++) rows[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    let best = Number.POSITIVE_INFINITY;
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let value = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) value = Math.min(value, rows[i - 2]![j - 2]! + 1);
      rows[i]![j] = value;
      best = Math.min(best, value);
    }
    if (best > limit) return limit + 1;
  }
  return Math.min(rows[a.length]![b.length]!, limit + 1);
}

/**
 * The candidates within reach of `typed`, closest first: an edit distance of at
 * most a third of the word (at least 1, at most 3), or the one candidate that
 * starts with it.
 */
function suggest(typed: string, candidates: Iterable<string>): string[] {
  const word = typed.toLowerCase();
  const limit = Math.max(1, Math.min(3, Math.floor(word.length / 3)));
  const scored: [string, number][] = [];
  const prefixed: string[] = [];
  for (const candidate of new Set(candidates)) {
    const distance = editDistance(word, candidate.toLowerCase(), limit);
    if (distance <= limit) scored.push([candidate, distance]);
    else if (word.length >= 2 && candidate.startsWith(word)) prefixed.push(candidate);
  }
  scored.sort((a, b) => a[1] - b[1] || a[0].localeCompare(b[0]));
  const close = scored.map(([candidate]) => candidate);
  return close.length > 0 ? close : prefixed.length === 1 ? prefixed : [];
}

/** "did you mean a?" / "did you mean a or b?", or undefined when nothing is close. */
export function didYouMean(typed: string, candidates: Iterable<string>, render: (word: string) => string = (w) => w): string | undefined {
  const close = suggest(typed, candidates).slice(0, 3).map(render);
  if (close.length === 0) return undefined;
  return `did you mean ${close.length === 1 ? close[0] : `${close.slice(0, -1).join(", ")} or ${close.at(-1)}`}?`;
}
