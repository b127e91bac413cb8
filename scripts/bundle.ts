import type { Plugin } from "esbuild";

/**
 * Bundles one TypeScript entry and everything it imports into a single ES
 * module that plain `node` runs (no tsx loader), with esbuild. The CLI the
 * suites run and the builder every stack starts are made this way.
 */
export async function bundleForNode(entry: string, outfile: string, plugins: Plugin[] = []): Promise<void> {
  const { build } = await import("esbuild");
  await build({
    entryPoints: [entry],
    bundle: true,
    outfile,
    platform: "node",
    format: "esm",
    target: "node20",
    logLevel: "warning",
    // Bundled CommonJS dependencies call require().
    banner: { js: "import { createRequire as __svcRequire } from 'node:module'; const require = __svcRequire(import.meta.url);" },
    plugins,
  });
}
