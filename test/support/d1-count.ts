/**
 * Counts the statements a D1 binding runs, split into reads (SELECT) and
 * writes, by wrapping it: `prepare`d statements are counted when they run
 * (`first`, `all`, `raw`, `run`), batches by their statements. Shared by the
 * auth-cost test (inside workerd) and bench/api-auth (through wrangler's
 * platform proxy), so "one read per authenticated request" is counted, not
 * estimated. Structural types only: it works on either side.
 */

/** What was run so far. */
export interface D1Counts {
  reads: number;
  writes: number;
  /** The SQL of every statement run, in order. */
  statements: string[];
}

type Fn = (...args: unknown[]) => unknown;
const RUNS = new Set(["first", "all", "raw", "run"]);
const isRead = (sql: string) => /^\s*(select|with|explain)\b/i.test(sql);

/** A binding that behaves like `d1` and counts into `counts`. */
export function countingD1<T extends object>(d1: T): { db: T; counts: D1Counts } {
  const counts: D1Counts = { reads: 0, writes: 0, statements: [] };
  /** Each wrapped statement's own statement and SQL, for batches (which take the binding's own statements). */
  const originals = new WeakMap<object, { statement: object; sql: string }>();
  const record = (sql: string) => {
    counts.statements.push(sql);
    if (isRead(sql)) counts.reads++;
    else counts.writes++;
  };
  const wrapStatement = (statement: object, sql: string): object => {
    const proxy = new Proxy(statement, {
      get(target, property, receiver) {
        const value: unknown = Reflect.get(target, property, receiver);
        if (typeof value !== "function") return value;
        if (property === "bind") return (...args: unknown[]) => wrapStatement((value as Fn).apply(target, args) as object, sql);
        if (typeof property === "string" && RUNS.has(property)) {
          return (...args: unknown[]) => {
            record(sql);
            return (value as Fn).apply(target, args);
          };
        }
        return (value as Fn).bind(target);
      },
    });
    originals.set(proxy, { statement, sql });
    return proxy;
  };
  const db = new Proxy(d1, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (typeof value !== "function") return value;
      if (property === "prepare") return (sql: string) => wrapStatement((value as Fn).call(target, sql) as object, sql);
      if (property === "batch") {
        return (statements: object[]) => {
          for (const statement of statements) record(originals.get(statement)?.sql ?? "");
          return (value as Fn).call(target, statements.map((statement) => originals.get(statement)?.statement ?? statement));
        };
      }
      return (value as Fn).bind(target);
    },
  });
  return { db, counts };
}
