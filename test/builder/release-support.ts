/**
 * What the release suites share: wheels built by hand (no PyPI here), a
 * local python package index serving them, running a release build to its
 * end against the fake Worker and storage, extracting the uploaded archive
 * with the platform's own extractor, and running a start command the way a
 * node would (cheaply: `sh -c` in the extracted tree, not the supervisor).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { chmod, cp, mkdtemp, readFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { createGunzip } from "node:zlib";
import type { JobStatus } from "../../builder/src/protocol/job-status.js";
import type { ReleaseResult, ServerRuntime } from "../../builder/src/protocol/processes.js";
import type { BuildSpec } from "../../builder/src/protocol/static.js";
import { extractTar } from "../../builder/src/tar/extract.js";
import { freePort } from "../../scripts/local-stack.js";
import { type FakeWorker, packProject, submitBuild } from "./build-support.js";
import { type BuilderTarget, TEST_TENANT, followLog, jobStatus } from "./builder-process.js";
import type { FakeStorage } from "./snapshot-storage.js";

/** `test/fixtures/apps`. */
export const appsDir = fileURLToPath(new URL("../fixtures/apps", import.meta.url));

/** A throwaway copy of an app fixture, to change before packing. */
export async function copyApp(name: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), `svc-app-${name}-`));
  await cp(join(appsDir, name), dir, { recursive: true });
  return dir;
}

const WHEEL_SCRIPT = `
import base64, hashlib, os, sys, zipfile
out, name, version, source = sys.argv[1:5]
dist = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": source,
    f"{dist}/METADATA": f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n",
    f"{dist}/WHEEL": "Wheel-Version: 1.0\\nGenerator: svc-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}
record = []
for path, text in files.items():
    data = text.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append(f"{dist}/RECORD,,")
files[f"{dist}/RECORD"] = "\\n".join(record) + "\\n"
path = os.path.join(out, f"{name}-{version}-py3-none-any.whl")
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
    for member, text in files.items():
        wheel.writestr(member, text)
print(path)
`;

/**
 * Writes a minimal pure-python wheel (METADATA, WHEEL, RECORD and one
 * module whose `greeting()` returns `greeting`) into `dir`; its path.
 */
export async function writeWheel(dir: string, name: string, version: string, greeting: string): Promise<string> {
  const source = `def greeting():\n    return ${JSON.stringify(greeting)}\n`;
  const path = execFileSync("python3", ["-c", WHEEL_SCRIPT, dir, name, version, source], { encoding: "utf8" }).trim();
  await chmod(path, 0o644);
  return path;
}

/** A folder of wheels every user can read, as the builder's BUILDER_PIP_FIND_LINKS must be (sandboxed users read it). */
export async function wheelFolder(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "svc-wheels-"));
  await chmod(dir, 0o755);
  return dir;
}

/** A PEP 503 "simple" index on 127.0.0.1 serving the given wheels; `requests` lists the paths asked for. */
export async function startPackageIndex(wheels: string[]): Promise<{ url: string; requests: string[]; close(): Promise<void> }> {
  const files = new Map<string, Buffer>();
  for (const path of wheels) files.set(basename(path), await readFile(path));
  const requests: string[] = [];
  const server = createServer((request, response) => {
    const path = request.url ?? "/";
    requests.push(path);
    const project = /^\/simple\/([^/]+)\/$/.exec(path)?.[1];
    if (project) {
      const links = [...files]
        .filter(([file]) => file.startsWith(`${project.replaceAll("-", "_")}-`))
        .map(([file, bytes]) => `<a href="/files/${file}#sha256=${createHash("sha256").update(bytes).digest("hex")}">${file}</a>`);
      if (links.length === 0) return response.writeHead(404).end();
      return response.writeHead(200, { "Content-Type": "text/html" }).end(`<!doctype html><html><body>${links.join("\n")}</body></html>`);
    }
    const file = files.get(path.replace(/^\/files\//, ""));
    if (path.startsWith("/files/") && file) return response.writeHead(200, { "Content-Type": "application/octet-stream" }).end(file);
    response.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/simple/`,
    requests,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** A release build of the project in `dir` for an app of `runtime`, uploaded to `storage`. */
export function releaseSpec(
  worker: FakeWorker,
  storage: FakeStorage,
  tag: string,
  dir: string,
  runtime: ServerRuntime,
  extra: Partial<BuildSpec> = {},
): BuildSpec {
  return {
    sourceUrl: worker.serveSource(tag, packProject(dir)),
    tenant: TEST_TENANT,
    env: {},
    memoryMb: 1024,
    timeoutSeconds: 180,
    blobsEndpoint: worker.blobsEndpoint(tag),
    release: { runtime, partUrlEndpoint: storage.partUrlEndpoint, partSizeBytes: 5 * 1024 * 1024 },
    ...extra,
  };
}

/** Runs a release build to its end: final status, the release (when it succeeded), the whole log and the uploaded archive. */
export async function releaseToEnd(
  target: BuilderTarget,
  storage: FakeStorage,
  spec: BuildSpec,
): Promise<{ status: JobStatus; result: ReleaseResult | null; log: string; archive: Buffer; ms: number }> {
  storage.parts.clear();
  const started = Date.now();
  const submitted = await submitBuild(target, spec);
  const log = await followLog(target, submitted.id);
  const status = await jobStatus(target, submitted.id);
  const result = status.result?.kind === "release" ? status.result : null;
  return { status, result, log, archive: storage.archive(), ms: Date.now() - started };
}

/** Extracts a release with the extractor nodes restore it with, limited to exactly what the release announced. */
export async function extractRelease(archive: Buffer, result: ReleaseResult): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), "svc-release-"));
  await extractTar({
    source: Readable.from([archive]).pipe(createGunzip()),
    root,
    maxEntries: result.entries,
    maxExpandedBytes: result.expandedBytes,
    quotaBytes: 4 * 1024 ** 3,
    owner: null,
  });
  return root;
}

/** A start command running in an extracted release. */
export interface RunningApp {
  port: number;
  output(): string;
  stop(): Promise<void>;
}

/**
 * Runs `command` with `/bin/sh -c` in `dir` and PORT set, with the PATH a
 * node gives an app (its virtualenv and node_modules/.bin first), in a
 * process group of its own so stop() ends everything it started.
 */
export async function startApp(dir: string, command: string): Promise<RunningApp> {
  const port = await freePort();
  const path = `${join(dir, ".venv/bin")}:${join(dir, "node_modules/.bin")}:/usr/local/bin:/usr/bin:/bin`;
  const child: ChildProcess = spawn("/bin/sh", ["-c", command], {
    cwd: dir,
    env: { PATH: path, PORT: String(port), HOME: dir },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout?.on("data", (chunk: Buffer) => {
    output += chunk.toString();
  });
  child.stderr?.on("data", (chunk: Buffer) => {
    output += chunk.toString();
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    port,
    output: () => output,
    async stop() {
      if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) process.kill(-child.pid, "SIGKILL");
      await exited;
    },
  };
}

/** GETs `path` from a started app, retrying while it starts (up to `ms`). */
export async function getFromApp(app: RunningApp, path: string, ms = 15_000): Promise<{ status: number; body: string }> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      const response = await fetch(`http://127.0.0.1:${app.port}${path}`);
      return { status: response.status, body: await response.text() };
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`the app did not answer on port ${app.port}: ${String(error)}\n${app.output()}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** Waits until the app's output matches `pattern` (up to `ms`). */
export async function outputOf(app: RunningApp, pattern: RegExp, ms = 10_000): Promise<string> {
  const deadline = Date.now() + ms;
  while (!pattern.test(app.output())) {
    if (Date.now() > deadline) throw new Error(`no output matching ${pattern}: ${app.output()}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return app.output();
}

export function sha256(bytes: Buffer): string {
  return createHash("sha256").update(bytes).digest("hex");
}
