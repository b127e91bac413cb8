import { describe, expect, it } from "vitest";
import { describeBuildFailure } from "../../builder/src/jobs/build-error.js";

/**
 * Real outputs, trimmed to the lines around the error: each tool run on a
 * broken project (a fresh `npm create vite` scaffold, vite 6 with webpack 5 and
 * esbuild, Next.js 15 and 16, Astro 2 and 5) with CI=true and no terminal, as
 * builds run. The project folder is written as the sandbox shows it, /work.
 */
const said = (output: string) => describeBuildFailure(output.split("\n"));

describe("describeBuildFailure: TypeScript", () => {
  it("quotes tsc's first error with file, line and column", () => {
    // `npm run build` of the Vite react-ts scaffold (tsc -b && vite build, TypeScript 7) with `const bad: string = 3`.
    const tsc = `
> x@0.0.0 build
> tsc -b && vite build

src/App.tsx(7,7): error TS2322: Type 'number' is not assignable to type 'string'.
src/App.tsx(7,7): error TS6133: 'bad' is declared but its value is never read.`;
    expect(said(tsc)).toBe("src/App.tsx:7:7: error TS2322: Type 'number' is not assignable to type 'string'.");
  });

  it("reads tsc --pretty, colour codes and all", () => {
    // TypeScript 5.9.3 `tsc --pretty`, as written (a log stores it without the codes; the scanner takes either).
    const pretty = [
      "\x1b[96msrc/App.tsx\x1b[0m:\x1b[93m7\x1b[0m:\x1b[93m7\x1b[0m - \x1b[91merror\x1b[0m\x1b[90m TS2322: \x1b[0mType 'number' is not assignable to type 'string'.",
      "",
      "\x1b[7m7\x1b[0m const bad: string = 3",
    ];
    expect(describeBuildFailure(pretty)).toBe("src/App.tsx:7:7: error TS2322: Type 'number' is not assignable to type 'string'.");
  });
});

describe("describeBuildFailure: Vite", () => {
  it("reads Rolldown's report (vite 8): the error code, the message and the location in its frame", () => {
    const unresolved = `✗ Build failed in 137ms
error during build:
Build failed with 1 error:

[UNRESOLVED_IMPORT] Could not resolve './missing' in src/App.tsx
   ╭─[ src/App.tsx:1:21 ]
   │
 1 │ import missing from "./missing";`;
    expect(said(unresolved)).toBe("src/App.tsx:1:21: [UNRESOLVED_IMPORT] Could not resolve './missing' in src/App.tsx");
    const syntax = `error during build:
Build failed with 1 error:

[builtin:vite-transform] Unexpected token
   ╭─[ src/App.tsx:7:24 ]
   │
 7 │ function App() { const = ;`;
    expect(said(syntax)).toBe("src/App.tsx:7:24: [builtin:vite-transform] Unexpected token");
    const bare = `error during build:
Build failed with 1 error:

Error: [vite]: Rolldown failed to resolve import "no-such-pkg" from "/work/src/App.tsx".
This is most likely unintended because it can break your application at runtime.
If you do want to externalize this module explicitly add it to
\`build.rolldownOptions.external\`
    at viteLog (file:///work/node_modules/vite/dist/node/chunks/node.js:34880:57)`;
    expect(said(bare)).toBe('[vite]: Rolldown failed to resolve import "no-such-pkg" from "src/App.tsx".');
  });

  it("reads Rollup's and esbuild's reports (vite 6)", () => {
    const unresolved = `error during build:
Could not resolve "./missing" from "src/main.ts"
file: /work/src/main.ts
    at getRollupError (file:///work/node_modules/rollup/dist/es/shared/parseAst.js:355:41)`;
    expect(said(unresolved)).toBe('Could not resolve "./missing" from "src/main.ts"');
    const external = `error during build:
[vite]: Rollup failed to resolve import "no-such-pkg" from "/work/src/main.ts".
This is most likely unintended because it can break your application at runtime.`;
    expect(said(external)).toBe('[vite]: Rollup failed to resolve import "no-such-pkg" from "src/main.ts".');
    const esbuild = `✗ Build failed in 159ms
error during build:
[vite:esbuild] Transform failed with 1 error:
/work/src/other.ts:1:6: ERROR: Expected identifier but found "="
file: /work/src/other.ts:1:6

Expected identifier but found "="`;
    expect(said(esbuild)).toBe('src/other.ts:1:6: [vite:esbuild] Expected identifier but found "="');
  });

  it("does not take a warning of a build that went on for its error", () => {
    // vite 8 warns about a misplaced @import and builds anyway; what fails later is what counts.
    const output = `[vite:css][postcss] @import statements must precede all other statements (besides @charset or empty @layer) and be consecutive
112 |  @import "./nope.css";
✓ 20 modules transformed.
sh: 1: vite-plugin-thing: not found`;
    expect(said(output)).toBe("sh: 1: vite-plugin-thing: not found");
  });
});

describe("describeBuildFailure: esbuild and webpack", () => {
  it("reads esbuild's report", () => {
    const output = `✘ [ERROR] Could not resolve "./nope"

    src/e.ts:1:14:
      1 │ import x from "./nope";

1 error`;
    expect(said(output)).toBe('src/e.ts:1:14: Could not resolve "./nope"');
  });

  it("reads webpack's ERROR in with the module's position and the message under it", () => {
    const missing = `./src/index.js 40 bytes [built] [code generated]

ERROR in ./src/index.js 1:0-23
Module not found: Error: Can't resolve './nope' in '/work/src'
resolve './nope' in '/work/src'`;
    expect(said(missing)).toBe("src/index.js:1:0-23: Module not found: Error: Can't resolve './nope' in 'src'");
    const syntax = `ERROR in ./src/index.js 1:10
Module parse failed: Unexpected token (1:10)
File was parsed as module type 'javascript/esm'.`;
    expect(said(syntax)).toBe("src/index.js:1:10: Module parse failed: Unexpected token (1:10)");
  });
});

describe("describeBuildFailure: Next.js", () => {
  it("reads Failed to compile. (webpack builds, Next.js 15 and 16)", () => {
    const typeError = `   Linting and checking validity of types ...
Failed to compile.

./app/page.tsx:1:7
Type error: Type 'number' is not assignable to type 'string'.

> 1 | const x: string = 3;`;
    expect(said(typeError)).toBe("app/page.tsx:1:7: Type error: Type 'number' is not assignable to type 'string'.");
    const missing = `Failed to compile.

./app/page.tsx
Module not found: Can't resolve './nope'

https://nextjs.org/docs/messages/module-not-found`;
    expect(said(missing)).toBe("app/page.tsx: Module not found: Can't resolve './nope'");
    const swc = `Failed to compile.

./app/page.tsx
Error:   x Unterminated regexp literal
   ,-[/work/app/page.tsx:1:1]`;
    expect(said(swc)).toBe("app/page.tsx: Unterminated regexp literal");
  });

  it("reads Turbopack's Build error occurred and the type checker's tsc lines (Next.js 16)", () => {
    const missing = `  Creating an optimized production build ...

> Build error occurred
Error: Turbopack build failed with 1 error:
./app/page.tsx:1:1
Error: Module not found: Can't resolve './nope'
> 1 | import x from "./nope";`;
    expect(said(missing)).toBe("app/page.tsx:1:1: Module not found: Can't resolve './nope'");
    const syntax = `> Build error occurred
Error: Turbopack build failed with 1 error:
./app/page.tsx:1:48
Error: Unterminated regexp literal`;
    expect(said(syntax)).toBe("app/page.tsx:1:48: Unterminated regexp literal");
    const types = `  Running TypeScript ...
app/page.tsx(1,7): error TS2322: Type 'number' is not assignable to type 'string'.
Failed to type check.`;
    expect(said(types)).toBe("app/page.tsx:1:7: error TS2322: Type 'number' is not assignable to type 'string'.");
  });
});

describe("describeBuildFailure: Astro", () => {
  it("reads [ERROR] with the message under it and its Location (Astro 5)", () => {
    const syntax = `19:37:45 [build] Building static entrypoints...
19:37:46 [ERROR] [vite] ✗ Build failed in 950ms
Expected identifier but found "="
  Location:
    /work/src/pages/index.astro:2:6
  Stack trace:
    at failureErrorWithLog (/work/node_modules/vite/node_modules/esbuild/lib/main.js:1467:15)`;
    expect(said(syntax)).toBe('src/pages/index.astro:2:6: Expected identifier but found "="');
    const unresolved = `19:37:42 [ERROR] [vite] ✗ Build failed in 1.96s
Could not resolve "../nope.astro" from "src/pages/index.astro"
file: /work/src/pages/index.astro
  Stack trace:`;
    expect(said(unresolved)).toBe('Could not resolve "../nope.astro" from "src/pages/index.astro"');
    const staticPaths = `19:37:58 ▶ src/pages/[slug].astro
19:37:58 [ERROR] [build] Failed to call getStaticPaths for src/pages/[slug].astro
[GetStaticPathsRequired] \`getStaticPaths()\` function is required for dynamic routes. Make sure that you \`export\` a \`getStaticPaths\` function from your dynamic route.
  Hint:
    See https://docs.astro.build/en/guides/routing/#dynamic-routes for more information on dynamic routes.
    
    	If you meant for this route to be server-rendered, set \`export const prerender = false;\` in the page.
  Error reference:
    https://docs.astro.build/en/reference/errors/get-static-paths-required/
  Location:
    src/pages/[slug].astro:0:0
  Stack trace:`;
    expect(said(staticPaths)).toBe(
      "src/pages/[slug].astro: [GetStaticPathsRequired] `getStaticPaths()` function is required for dynamic routes. Make sure that you `export` a `getStaticPaths` function from your dynamic route.",
    );
  });

  it("reads Astro 2's error with its File", () => {
    const output = `07:39:35 PM [build] Building static entrypoints...
Could not resolve "../nope.astro" from "src/pages/index.astro"
file: /work/src/pages/index.astro
 error   Could not resolve "../nope.astro" from "src/pages/index.astro"
  File:
    /work/src/pages/index.astro
  Stacktrace:
RollupError: Could not resolve "../nope.astro" from "src/pages/index.astro"`;
    expect(said(output)).toBe('Could not resolve "../nope.astro" from "src/pages/index.astro"');
  });
});

describe("describeBuildFailure: anything else", () => {
  it("falls back on a missing command, a missing script or an uncaught Node error", () => {
    expect(said("> build\n> vite build\n\nsh: 1: vite: not found")).toBe("sh: 1: vite: not found");
    expect(said('npm error Missing script: "build"\nnpm error\nnpm error To see a list of scripts, run:')).toBe('Missing script: "build"');
    const node = `file:///work/b.mjs:1
throw new TypeError("bad config");
      ^

TypeError: bad config
    at file:///work/b.mjs:1:7

Node.js v20.20.2`;
    expect(said(node)).toBe("TypeError: bad config");
  });

  it("prefers a tool's report to a plain error line before it, and says nothing when no line tells", () => {
    expect(said("Error: retrying the download\nsrc/a.ts(1,1): error TS1005: ';' expected.")).toBe("src/a.ts:1:1: error TS1005: ';' expected.");
    expect(said("building...\nKilled")).toBeNull();
  });

  it("keeps the cause to one line of bounded length", () => {
    const cause = said(`src/a.ts(1,1): error TS2322: ${"x".repeat(400)}`)!;
    expect(cause).toHaveLength(240);
    expect(cause.endsWith("…")).toBe(true);
    expect(said("ERROR in ./src/a.js\nModule not found:\tError:  Can't\tresolve")).toBe("src/a.js: Module not found: Error: Can't resolve");
  });
});
