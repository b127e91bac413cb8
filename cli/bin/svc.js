#!/usr/bin/env node
// Entry point of the `svc` command: the CLI's TypeScript sources, bundled into
// one file and run with V8's compiled code kept beside it (cli/bin/bundle.js),
// so the CLI needs no build step and a command starts in ~0.3 s.
import { runCli } from "./bundle.js";

process.exitCode = await runCli(process.argv.slice(2));
