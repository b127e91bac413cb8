#!/usr/bin/env node
// Entry point of the `svc` command: runs the TypeScript sources through tsx,
// so the CLI needs no build step. tsconfig: false keeps the project tsconfig
// of whatever directory svc is run from out of the CLI's own module loading.
import { register } from "tsx/esm/api";

register({ tsconfig: false });
const { main } = await import("../src/main.ts");
process.exitCode = await main(process.argv.slice(2));
