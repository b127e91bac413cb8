import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

/**
 * The dashboard is built into `dashboard/dist`, the Worker's static assets
 * (wrangler.toml `[assets]`). Hashed files go to `assets/`, which the Worker
 * serves as immutable; nothing is inlined into index.html, so the page runs
 * under a Content-Security-Policy without 'unsafe-inline'.
 */
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  logLevel: "warn",
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    reportCompressedSize: false,
  },
});
