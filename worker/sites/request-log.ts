import { openDb } from "../db/client";
import { requestLogs } from "../db/schema";

export type RequestLogEntry = typeof requestLogs.$inferInsert;

/** Entries written per flush; D1 binds at most 100 parameters per statement (7 columns each). */
const CHUNK = 14;
const FLUSH_DELAY_MS = 1_000;

let buffer: RequestLogEntry[] = [];
let pending: Promise<void> | null = null;

/**
 * Request logging off the serving path: entries collect in the isolate and
 * are written in batches about once a second inside `waitUntil`, so a request
 * never waits for D1 and a burst costs one write per chunk, not per request.
 */
export function logRequest(db: D1Database, entry: RequestLogEntry, waitUntil: (p: Promise<unknown>) => void): void {
  buffer.push(entry);
  if (pending) return;
  pending = new Promise<void>((resolve) => setTimeout(resolve, FLUSH_DELAY_MS)).then(async () => {
    const entries = buffer;
    buffer = [];
    pending = null;
    const orm = openDb(db);
    const statements = [];
    for (let i = 0; i < entries.length; i += CHUNK) statements.push(orm.insert(requestLogs).values(entries.slice(i, i + CHUNK)));
    const [first, ...rest] = statements;
    if (first) await orm.batch([first, ...rest]).catch((err: unknown) => console.error("request log write failed", err));
  });
  waitUntil(pending);
}
