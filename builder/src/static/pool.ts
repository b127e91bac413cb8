/**
 * Runs an async function over many items with a bounded number in flight:
 * hashing and uploading thousands of small files one at a time would spend
 * most of the build waiting on single round trips.
 */

/** Calls `task` for every item, at most `limit` at once; rejects with the first failure (the others stop picking up work). */
export async function forEachLimited<T>(items: readonly T[], limit: number, task: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failed = false;
  const lane = async (): Promise<void> => {
    while (!failed && next < items.length) {
      const item = items[next++]!;
      try {
        await task(item);
      } catch (error) {
        failed = true;
        throw error;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
}
