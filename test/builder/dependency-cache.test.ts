import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { lstat, mkdir, mkdtemp, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DependencyCache } from "../../builder/src/jobs/dependency-cache.js";
import type { BuildSpec } from "../../builder/src/protocol/static.js";
import { type FakeWorker, startFakeWorker, svcLines } from "./build-support.js";
import { type BuilderProcess, startBuilder } from "./builder-process.js";
import { appsDir, copyApp, extractRelease, releaseSpec, releaseToEnd } from "./release-support.js";
import { type FakeStorage, startFakeStorage } from "./snapshot-storage.js";

/**
 * The node's per-app dependency cache (builder/src/jobs/dependency-cache.ts):
 * through a real builder process whose builds install from the npm registry,
 * then the cache itself against a hostile tree and its bound.
 */
let builder: BuilderProcess;
let worker: FakeWorker;
let storage: FakeStorage;
const scratch: string[] = [];
beforeAll(async () => {
  builder = await startBuilder({ env: { NPM_CONFIG_REGISTRY: "https://registry.npmjs.org/" } });
  worker = await startFakeWorker(builder.secret);
  storage = await startFakeStorage(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await storage?.close();
  await builder?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** A release build of `dir` for app `app` of tenant `tenant`, to its end. */
async function build(tag: string, dir: string, app: string, tenant = "tenant-cache-a", overrides?: BuildSpec["overrides"]) {
  const runtime = dir.endsWith("custom") ? "custom" : "node";
  const outcome = await releaseToEnd(builder, storage, releaseSpec(worker, storage, tag, dir, runtime, { app, tenant, ...(overrides ? { overrides } : {}) }));
  expect(outcome.status, outcome.log).toMatchObject({ status: "succeeded" });
  return { ...outcome, lines: svcLines(outcome.log) };
}

const installed = (lines: string[]) => lines.some((line) => line.startsWith("$ npm ci"));
const fromCache = (lines: string[]) => lines.some((line) => line.startsWith("dependencies: from cache (lockfile unchanged)"));

describe("a redeploy whose lockfile is unchanged", () => {
  let first: Awaited<ReturnType<typeof build>>;
  let second: Awaited<ReturnType<typeof build>>;
  beforeAll(async () => {
    const dir = join(appsDir, "node-express");
    first = await build("express-1", dir, "app-express");
    second = await build("express-2", dir, "app-express");
    console.log(`dependency cache: first build ${first.ms} ms, second ${second.ms} ms (${(second.ms / first.ms).toFixed(2)}x)`);
  }, 240_000);

  it("installs the first time and keeps what the install wrote", () => {
    expect(installed(first.lines), first.log).toBe(true);
    expect(first.lines.some((line) => /^dependencies cached for the next build with this lockfile \(\d+\.\d MiB\)$/.test(line)), first.log).toBe(true);
  });

  it("installs nothing the second time: the release holds the same packages, from the cache", async () => {
    expect(fromCache(second.lines), second.log).toBe(true);
    expect(installed(second.lines), second.log).toBe(false);
    const dir = await extractRelease(second.archive, second.result!);
    scratch.push(dir);
    expect(JSON.parse(await readFile(join(dir, "node_modules", "express", "package.json"), "utf8")).name).toBe("express");
    expect(second.result!.files).toBe(first.result!.files);
  });

  it("installs again for a changed lockfile and for another account's app of the same name", async () => {
    const changed = await copyApp("node-express");
    scratch.push(changed);
    await writeFile(join(changed, "package-lock.json"), `${await readFile(join(changed, "package-lock.json"), "utf8")}\n`);
    for (const [tag, dir, app, tenant] of [
      ["express-lock", changed, "app-express", "tenant-cache-a"],
      ["express-other-account", join(appsDir, "node-express"), "app-express", "tenant-cache-b"],
    ] as const) {
      const again = await build(tag, dir, app, tenant);
      expect(installed(again.lines), `${tag}:\n${again.log}`).toBe(true);
      expect(fromCache(again.lines), tag).toBe(false);
    }
  }, 240_000);
});

describe("the account's package cache", () => {
  it("keeps what npm downloaded for the account's other apps, and shows another account none of it", async () => {
    // A new app of the same account, the same lockfile: no entry of its own yet, so it installs, from the account's ~/.npm.
    const again = await build("express-new-app", join(appsDir, "node-express"), "app-express-two");
    expect(installed(again.lines), again.log).toBe(true);
    expect(existsSync(join(builder.dataDir, "package-cache", "tenant-cache-a", "npm", "_cacache"))).toBe(true);
    console.log(`package cache: a new app of the account installed in ${again.ms} ms`);
    // Builds see their own account's cache in HOME, and another account's builds see theirs alone.
    const list = { buildCommand: "ls -A /home/svc/.npm | tr '\\n' ' '; echo '<- npm cache'" };
    const own = await build("custom-own", join(appsDir, "custom"), "app-custom", "tenant-cache-a", list);
    expect(own.log).toMatch(/_cacache.*<- npm cache/);
    const other = await build("custom-other", join(appsDir, "custom"), "app-custom", "tenant-cache-c", list);
    expect(other.log).toMatch(/ out\s+<- npm cache/);
    expect(other.log).not.toMatch(/_cacache/);
  }, 240_000);
});

describe("an install the cache leaves alone", () => {
  it("runs every time when package.json has its own install script, and says why", async () => {
    const dir = await copyApp("node-lean");
    scratch.push(dir);
    const pkg = JSON.parse(await readFile(join(dir, "package.json"), "utf8"));
    pkg.scripts.postinstall = "node -e \"require('fs').writeFileSync('generated.txt', 'made at install')\"";
    await writeFile(join(dir, "package.json"), JSON.stringify(pkg, null, 2));
    for (const tag of ["hook-1", "hook-2"]) {
      const { lines, log } = await build(tag, dir, "app-hook");
      expect(installed(lines), log).toBe(true);
      expect(lines, log).toContain('dependencies: package.json runs a "postinstall" script at install, so its install is not cached');
    }
  }, 240_000);
});

describe("the cache itself", () => {
  const tenant = { uid: 65534, gid: 65534 };
  let root: string;
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "svc-dep-cache-"));
    scratch.push(root);
  });
  const within = () => AbortSignal.timeout(30_000);

  /** A work folder owned by the tenant, as a build's /work is. */
  async function work(name: string, files: Record<string, string>): Promise<string> {
    const dir = join(root, name);
    await mkdir(join(dir, "node_modules"), { recursive: true });
    for (const [path, text] of Object.entries(files)) await writeFile(join(dir, "node_modules", path), text);
    execFileSync("chown", ["-R", `${tenant.uid}:${tenant.gid}`, dir]);
    return dir;
  }

  it("copies a tree the tenant shaped as that shape: links stay links, a FIFO is not read, owners are kept", async () => {
    const cache = await DependencyCache.open(join(root, "cache-links"), 64 * 1024 * 1024);
    const dir = await work("links", { "a.js": "module.exports = 1" });
    await symlink("/etc/shadow", join(dir, "node_modules", "shadow"));
    await symlink("/root", join(dir, "node_modules", "root-dir"));
    execFileSync("mkfifo", [join(dir, "node_modules", "pipe")]);
    const scope = { tenant: "t1", app: "a1" };
    expect(await cache.save(scope, "k1", "node_modules", dir, within())).toMatch(/^dependencies cached/);
    const kept = join(root, "cache-links", "t1", "a1", "k1", "node_modules");
    expect(await readlink(join(kept, "shadow"))).toBe("/etc/shadow");
    expect(await readlink(join(kept, "root-dir"))).toBe("/root");
    expect((await lstat(join(kept, "pipe"))).isFIFO()).toBe(true);
    expect((await lstat(join(kept, "a.js"))).uid).toBe(tenant.uid);
    // Restored into a fresh work folder whose node_modules is a planted link: the link goes, the copy comes, and /root is untouched.
    const target = await work("restore", {});
    await rm(join(target, "node_modules"), { recursive: true });
    await symlink("/root", join(target, "node_modules"));
    expect(await cache.restore(scope, "k1", target, within())).toBe(true);
    expect((await lstat(join(target, "node_modules"))).isDirectory()).toBe(true);
    expect(await readFile(join(target, "node_modules", "a.js"), "utf8")).toBe("module.exports = 1");
    expect(existsSync("/root/a.js")).toBe(false);
  });

  it("keeps nothing when the install's node_modules is a link", async () => {
    const cache = await DependencyCache.open(join(root, "cache-refuse"), 64 * 1024 * 1024);
    const linked = await work("linked", {});
    await rm(join(linked, "node_modules"), { recursive: true });
    await symlink("/root", join(linked, "node_modules"));
    const scope = { tenant: "t1", app: "a1" };
    expect(await cache.save(scope, "k1", "node_modules", linked, within())).toBe("dependencies: not cached (the install left no node_modules folder)");
    expect(cache.has(scope, "k1")).toBe(false);
  });

  it("keeps within its bound, dropping the least recently used entry, and finds its entries again when the node restarts", async () => {
    const dir = join(root, "cache-bound");
    const cache = await DependencyCache.open(dir, 2 * 1024 * 1024);
    const big = "x".repeat(900 * 1024);
    const scope = { tenant: "t1", app: "a1" };
    for (const key of ["k1", "k2"]) {
      expect(await cache.save(scope, key, "node_modules", await work(`bound-${key}`, { "big.js": big }), within())).toMatch(/^dependencies cached/);
    }
    // k1 used again: k2 is now the least recently used, and goes when k3 comes.
    expect(await cache.restore(scope, "k1", await work("bound-use", {}), within())).toBe(true);
    const said = await cache.save(scope, "k3", "node_modules", await work("bound-k3", { "big.js": big }), within());
    expect(said).toMatch(/1 least recently used entry dropped\)$/);
    expect([cache.has(scope, "k1"), cache.has(scope, "k2"), cache.has(scope, "k3")]).toEqual([true, false, true]);
    expect(cache.bytes).toBeLessThanOrEqual(2 * 1024 * 1024);
    // A sparse file counts at its apparent size.
    const sparse = await work("bound-sparse", {});
    execFileSync("truncate", ["-s", "3M", join(sparse, "node_modules", "sparse.bin")]);
    expect(await cache.save(scope, "k4", "node_modules", sparse, within())).toMatch(/^dependencies: not cached \(3\.0 MiB, more than this node's cache of 2\.0 MiB\)$/);
    const reopened = await DependencyCache.open(dir, 2 * 1024 * 1024);
    expect([reopened.has(scope, "k1"), reopened.has(scope, "k2"), reopened.has(scope, "k3")]).toEqual([true, false, true]);
  });
});
