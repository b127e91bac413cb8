import { createHash } from "node:crypto";
import { readFile, rm, writeFile } from "node:fs/promises";
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import { request } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BuildSpec } from "../../builder/src/protocol/static.js";
import { type FakeWorker, buildToEnd, copyFixture, packProject, startFakeWorker, svcLines } from "./build-support.js";
import { type BuilderProcess, TEST_TENANT, startBuilder } from "./builder-process.js";

/** The platform package the mirror has not published (rolldown's, in the vite-react fixture's lockfile). */
const UNPUBLISHED = "@rolldown/binding-android-arm-eabi";

/**
 * A registry mirror that has not caught up: it relays everything to the public
 * registry but answers 404 for {@link UNPUBLISHED}, as a mirror does for a
 * platform package of the newest release that it has not copied yet.
 */
async function startLaggingMirror(): Promise<{ url: string; asked: string[]; close(): Promise<void> }> {
  const asked: string[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = decodeURIComponent(req.url ?? "/");
    if (path === `/${UNPUBLISHED}` || path.startsWith(`/${UNPUBLISHED}/`)) {
      asked.push(path);
      res.writeHead(404, { "Content-Type": "application/json" }).end('{"error":"Not found"}');
      return;
    }
    const upstream = request({ host: "registry.npmjs.org", path: req.url, method: req.method, headers: { ...req.headers, host: "registry.npmjs.org" } }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    upstream.on("error", (error) => res.writeHead(502).end(String(error)));
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    asked,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * Run before the build: every installed package against its lockfile entry
 * (platform packages for elsewhere are not installed), and the lockfile
 * against the SHA-256 of what was deployed.
 */
const checkPins = (lockfileSha256: string) => `const fs = require("node:fs");
const text = fs.readFileSync("package-lock.json");
const lock = JSON.parse(text.toString("utf8"));
let checked = 0;
const differ = [];
for (const [key, entry] of Object.entries(lock.packages)) {
  if (!key.startsWith("node_modules/")) continue;
  let installed;
  try { installed = JSON.parse(fs.readFileSync(key + "/package.json", "utf8")).version; } catch { continue; }
  checked++;
  if (installed !== entry.version) differ.push(key + "@" + installed + " (locked " + entry.version + ")");
}
console.log("pins: " + checked + " installed packages checked, " + differ.length + " differ from package-lock.json" + (differ.length ? ": " + differ.join(", ") : ""));
console.log("lockfile unchanged: " + (require("node:crypto").createHash("sha256").update(text).digest("hex") === "${lockfileSha256}"));
`;

let mirror: Awaited<ReturnType<typeof startLaggingMirror>>;
let builder: BuilderProcess;
let worker: FakeWorker;
const scratch: string[] = [];
beforeAll(async () => {
  mirror = await startLaggingMirror();
  builder = await startBuilder({ env: { NPM_CONFIG_REGISTRY: mirror.url } });
  worker = await startFakeWorker(builder.secret);
});
afterAll(async () => {
  await worker?.close();
  await builder?.stop();
  await mirror?.close();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

function specFor(tag: string, dir: string): BuildSpec {
  return {
    sourceUrl: worker.serveSource(tag, packProject(dir)),
    tenant: TEST_TENANT,
    env: {},
    memoryMb: 1024,
    timeoutSeconds: 170,
    blobsEndpoint: worker.blobsEndpoint(tag),
  };
}

describe("a lockfile naming an optional platform package it has no entry for", () => {
  let outcome: Awaited<ReturnType<typeof buildToEnd>>;
  beforeAll(async () => {
    // What npm install writes while the mirror lacks the package: rolldown's entry lists it, but it has no entry of its own.
    const dir = await copyFixture("vite-react");
    scratch.push(dir);
    const lockfile = JSON.parse(await readFile(join(dir, "package-lock.json"), "utf8"));
    expect(lockfile.packages["node_modules/rolldown"].optionalDependencies).toHaveProperty(UNPUBLISHED);
    delete lockfile.packages[`node_modules/${UNPUBLISHED}`];
    const lockfileText = `${JSON.stringify(lockfile, null, 2)}\n`;
    await writeFile(join(dir, "package-lock.json"), lockfileText);
    // Before building, the project compares what was installed with what the lockfile pins (scripts are not in the lockfile).
    const pkg = JSON.parse(await readFile(join(dir, "package.json"), "utf8"));
    pkg.scripts.build = `node check-pins.cjs && ${pkg.scripts.build}`;
    await writeFile(join(dir, "package.json"), JSON.stringify(pkg, null, 2));
    await writeFile(join(dir, "check-pins.cjs"), checkPins(createHash("sha256").update(lockfileText).digest("hex")));
    outcome = await buildToEnd(builder, specFor("lagging-mirror", dir));
  }, 180_000);

  it("deploys: npm ci refuses it, then npm install --no-save installs what it pins", () => {
    const { status, result, log } = outcome;
    expect(status, log).toMatchObject({ status: "succeeded", reason: null, exitCode: 0 });
    expect(result?.manifest.map((entry) => entry.path)).toContain("/index.html");
    expect(mirror.asked).toContain(`/${UNPUBLISHED}`); // the mirror really lacked it
    // npm's own words stay in the log.
    expect(log).toMatch(new RegExp(` err npm error Missing: ${UNPUBLISHED}@ from lock file$`, "m"));
    const lines = svcLines(log);
    const ci = lines.indexOf("$ npm ci --no-audit --no-fund");
    const note = lines.findIndex((line) => line.startsWith("npm ci refused package-lock.json"));
    expect(ci).toBeGreaterThanOrEqual(0);
    expect(note).toBeGreaterThan(ci);
    expect(lines[note]).toBe(
      `npm ci refused package-lock.json: it names ${UNPUBLISHED} (an optional dependency of rolldown@1.2.19) but has no entry for it ` +
        "(the registry did not have it when the lockfile was written, and still does not); installing with `npm install --no-audit --no-fund --no-save` instead, " +
        "which keeps every version the lockfile pins and leaves out optional packages the registry lacks or this platform does not use",
    );
    expect(lines[note + 1]).toBe("$ npm install --no-audit --no-fund --no-save");
    expect(lines).toContainEqual(expect.stringMatching(/^install finished in [\d.]+ s$/));
    expect(log).toMatch(/ out .*built in/);
  });

  it("installs exactly the versions the lockfile pins, and leaves the lockfile as it was", () => {
    const checked = / out pins: (\d+) installed packages checked, (\d+) differ from package-lock\.json(.*)$/m.exec(outcome.log);
    expect(checked, outcome.log).not.toBeNull();
    expect(Number(checked![1])).toBeGreaterThan(15); // 21 for the fixture on linux-x64: its platform packages for elsewhere are not installed
    expect(checked![2], checked![3]).toBe("0");
    expect(outcome.log).toMatch(/ out lockfile unchanged: true$/m);
  });
});
