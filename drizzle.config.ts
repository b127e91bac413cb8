import { defineConfig } from "drizzle-kit";

/** drizzle-kit writes flat NNNN_name.sql files into the folder wrangler and the tests apply. */
export default defineConfig({
  dialect: "sqlite",
  schema: "./worker/db/schema.ts",
  out: "./migrations",
});
