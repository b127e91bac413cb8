import { LOG_LIMIT_BYTES } from "../builder/src/protocol/jobs";
import { parseAppLogLine } from "../builder/src/protocol/processes";

/** Which part of the history to give, as the node's own log reads it: from a time, the last lines, or the last bytes; one process's lines. */
export type HistoryWindow = ({ since: number } | { lines: number } | { tail: number }) & { process?: string };

/** Chunks whose arrival is this much before `since` may still hold lines at or after it (their node's clock, the round's delay). */
const SINCE_SLACK_MS = 5 * 60_000;

type ChunkRow = { seq: number; node: string; at: number; text: string };

/**
 * An app's runtime log as its nodes shipped it (builder/src/processes/log-shipper.ts),
 * kept in its AppRuntime object's SQLite storage: one row per shipment, the
 * newest {@link LOG_LIMIT_BYTES} kept (what a node keeps of an app's log), so
 * the log outlives the node that wrote it (docs/fleet.md, "Logs that outlive
 * their node"). Read newest first, so a tail reads only what it gives.
 */
export class ShippedLog {
  readonly #sql: SqlStorage;

  constructor(storage: DurableObjectStorage) {
    this.#sql = storage.sql;
    this.#sql.exec("CREATE TABLE IF NOT EXISTS shipped_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, at INTEGER NOT NULL, bytes INTEGER NOT NULL, text TEXT NOT NULL)");
  }

  /** Keeps a shipment from `node`, then drops the oldest past the bound. */
  keep(node: string, text: string, now = Date.now()): void {
    const bytes = new TextEncoder().encode(text).length;
    this.#sql.exec("INSERT INTO shipped_log (node, at, bytes, text) VALUES (?, ?, ?, ?)", node, now, bytes, text);
    let total = this.#sql.exec<{ total: number }>("SELECT coalesce(sum(bytes), 0) AS total FROM shipped_log").one().total;
    for (const oldest of this.#sql.exec<{ seq: number; bytes: number }>("SELECT seq, bytes FROM shipped_log ORDER BY seq").toArray()) {
      if (total <= LOG_LIMIT_BYTES) break;
      this.#sql.exec("DELETE FROM shipped_log WHERE seq = ?", oldest.seq);
      total -= oldest.bytes;
    }
  }

  /**
   * The lines nodes other than those in `except` shipped, oldest first, cut
   * to `window`, with a `svc` line where the writing node changes (`names`
   * names nodes); and which node wrote the last of them, when.
   */
  history(except: string[], window: HistoryWindow, names: Record<string, string>): { text: string; last: { node: string; time: string } | null } {
    const kept: { node: string; lines: string[] }[] = [];
    let bytes = 0;
    let count = 0;
    const enough = () => ("lines" in window ? count >= window.lines : "tail" in window ? bytes >= window.tail : false);
    const from = "since" in window ? window.since - SINCE_SLACK_MS : 0;
    const cursor = this.#sql.exec<ChunkRow>(
      `SELECT seq, node, at, text FROM shipped_log WHERE node NOT IN (${except.map(() => "?").join(", ") || "''"}) AND at >= ? ORDER BY seq DESC`,
      ...except,
      from,
    );
    for (const row of cursor) {
      if (enough()) break;
      let lines = row.text.split("\n").filter((line) => line !== "");
      if (window.process !== undefined) lines = lines.filter((line) => parseAppLogLine(line)?.process === window.process);
      if ("since" in window) lines = lines.filter((line) => Date.parse(line.slice(0, 24)) >= window.since);
      if ("lines" in window) lines = lines.slice(Math.max(0, lines.length - (window.lines - count)));
      if ("tail" in window) {
        let first = lines.length;
        while (first > 0 && bytes + lines[first - 1]!.length + 1 <= window.tail) bytes += lines[--first]!.length + 1;
        lines = lines.slice(first);
        // A line longer than what is left of the window ends it.
        if (first > 0) bytes = window.tail;
      }
      count += lines.length;
      if (lines.length > 0) kept.unshift({ node: row.node, lines });
    }
    const out: string[] = [];
    let lastNode: string | null = null;
    for (const chunk of kept) {
      if (lastNode !== null && chunk.node !== lastNode) out.push(movedLine(chunk.lines[0]!.slice(0, 24), names[lastNode] ?? lastNode, names[chunk.node] ?? chunk.node));
      lastNode = chunk.node;
      out.push(...chunk.lines);
    }
    const last = lastNode === null ? null : { node: lastNode, time: out.at(-1)!.slice(0, 24) };
    return { text: out.map((line) => `${line}\n`).join(""), last };
  }

  /** Forgets everything shipped (the app is gone). */
  drop(): void {
    this.#sql.exec("DELETE FROM shipped_log");
  }
}

/** The `svc` line where an app's log goes on from another node. */
export function movedLine(time: string, from: string, to: string): string {
  return `${time} svc -/fleet the app moved from node ${from} to node ${to}`;
}
