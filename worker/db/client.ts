import { drizzle } from "drizzle-orm/d1";
import * as schema from "./schema";

const connect = (d1: D1Database) => drizzle(d1, { schema });

export type Db = ReturnType<typeof connect>;

/** One drizzle instance per binding: building one reads the whole schema (tens of µs), and it holds no per-request state. */
const instances = new WeakMap<D1Database, Db>();

export function openDb(d1: D1Database): Db {
  let db = instances.get(d1);
  if (!db) {
    db = connect(d1);
    instances.set(d1, db);
  }
  return db;
}

/**
 * The same database, counting every statement prepared on it (each one D1
 * runs): how the cron objects measure what a scheduled run costs D1.
 */
export function countingD1(d1: D1Database, count: () => void): D1Database {
  return new Proxy(d1, {
    get(target, property) {
      if (property === "prepare") {
        return (query: string) => {
          count();
          return target.prepare(query);
        };
      }
      const value: unknown = Reflect.get(target, property);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** D1 reports constraint violations as errors (sometimes wrapped by drizzle); names are checked this way. */
export function isUniqueViolation(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    if (e.message.includes("UNIQUE constraint failed")) return true;
  }
  return false;
}
