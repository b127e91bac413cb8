import { index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";

/**
 * D1 schema. camelCase keys in TypeScript, snake_case in SQL; timestamps are
 * epoch milliseconds (integers sort and compare cheaply; the API renders ISO).
 * Every tenant-owned row carries `account_id` and every query filters by it.
 */

export const PLANS = ["free", "pro", "business"] as const;
export type Plan = (typeof PLANS)[number];

export const SCOPES = ["deploy", "db", "registry", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

export const accounts = sqliteTable("accounts", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  plan: text("plan", { enum: PLANS }).notNull().default("free"),
  createdAt: integer("created_at").notNull(),
});

export const apiKeys = sqliteTable(
  "api_keys",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    /** SHA-256 (hex) of the secret; the secret itself is never stored. */
    hash: text("hash").notNull(),
    /** First characters of the secret, shown in listings. */
    start: text("start").notNull(),
    /** JSON array of scopes. */
    scopes: text("scopes", { mode: "json" }).$type<Scope[]>().notNull(),
    expiresAt: integer("expires_at"),
    lastUsedAt: integer("last_used_at"),
    createdAt: integer("created_at").notNull(),
    deletedAt: integer("deleted_at"),
  },
  (t) => [
    uniqueIndex("api_keys_hash_idx").on(t.hash),
    index("api_keys_account_idx").on(t.accountId, t.createdAt),
  ],
);

/**
 * Database dumps share the account's backup quota with disk backups (spec,
 * "Backup space"). Dumps themselves are out of scope; this table is the usage
 * bookkeeping the quota check sums.
 */
export const databaseDumps = sqliteTable(
  "database_dumps",
  {
    id: text("id").primaryKey(),
    accountId: text("account_id")
      .notNull()
      .references(() => accounts.id, { onDelete: "cascade" }),
    sizeBytes: integer("size_bytes").notNull(),
    createdAt: integer("created_at").notNull(),
    deletedAt: integer("deleted_at"),
  },
  (t) => [index("database_dumps_account_idx").on(t.accountId)],
);

export type ApiKeyRow = typeof apiKeys.$inferSelect;
export type AccountRow = typeof accounts.$inferSelect;
