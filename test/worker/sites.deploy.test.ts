import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { JobStatus } from "../../builder/src/protocol/job-status";
import { newId } from "../../worker/lib/ids";
import { deploymentStub } from "../../worker/services/deployments";
import { blobKey, blobPrefix, type Manifest, manifestKey } from "../../worker/sites/serve";
import { call, json, newAccount } from "./helpers";
import { sha256 } from "./sites-helpers";

type Row = { status: string; error: string | null };

/**
 * Runs the Deployment object's finish on a build that succeeded with `files`
 * (path → contents, already in storage), as the builder's callback would, and
 * returns the deployment's row and the manifest it published.
 */
async function finishBuild(
  files: Record<string, string>,
  framework: string | null = null,
): Promise<{ row: Row; manifest: Manifest | null }> {
  const { accountId, adminKey: key } = await newAccount();
  const name = `site-${crypto.randomUUID().slice(0, 8)}`;
  const app = (await json<{ data: { id: string } }>(await call("/v1/apps", { method: "POST", key, body: { name, runtime: "static" } }))).data;
  const id = newId("deployment");
  const now = Date.now();
  await env.DB.prepare(
    "INSERT INTO deployments (id, account_id, app_id, status, source_key, source_size_bytes, upload_expires_at, started_at, created_at) VALUES (?, ?, ?, 'building', ?, 1, ?, ?, ?)",
  )
    .bind(id, accountId, app.id, `sources/${id}`, now, now, now)
    .run();
  const manifest = [];
  for (const [path, text] of Object.entries(files)) {
    const sha = await sha256(text);
    await env.BUCKET.put(blobKey(blobPrefix(accountId), sha), text);
    manifest.push({ path, sha256: sha, size: new TextEncoder().encode(text).byteLength, contentType: "text/plain; charset=utf-8" });
  }
  const stub = deploymentStub(env, id);
  await runInDurableObject(stub, (_i, state) => {
    state.storage.kv.put("deploymentId", id);
    state.storage.kv.put("accountId", accountId);
    state.storage.kv.put("jobKey", id);
  });
  const at = new Date().toISOString();
  const status: JobStatus = {
    id: "job_0aB1cD2eF3gH4iJ5kL6mN7oP",
    key: id,
    status: "succeeded",
    reason: null,
    exitCode: 0,
    signal: null,
    error: null,
    peakMemoryBytes: 0,
    logBytes: 0,
    logTruncated: false,
    createdAt: at,
    startedAt: at,
    finishedAt: at,
    labels: { kind: "deployment", deploymentId: id },
    result: {
      kind: "build",
      framework,
      buildCommand: null,
      outputDir: "dist",
      spa: false,
      packageManager: null,
      manifest: manifest.sort((a, b) => (a.path < b.path ? -1 : 1)),
      artifacts: null,
      uploadedBlobs: 0,
      peakMemoryBytes: 0,
    },
  };
  await stub.jobFinished(status);
  const row = (await env.DB.prepare("SELECT status, error FROM deployments WHERE id = ?").bind(id).first<Row>())!;
  const stored = await env.BUCKET.get(manifestKey(id));
  return { row, manifest: stored ? ((await stored.json()) as Manifest) : null };
}

describe("deploying a site's _headers file", () => {
  it("publishes a good file's rules in the manifest, without serving the file", async () => {
    const { row, manifest } = await finishBuild({
      "/index.html": "<h1>home</h1>",
      "/_headers": "/*\n  X-Frame-Options: DENY\n  Set-Cookie: session=1; Path=/; Secure\n",
    });
    expect(row).toEqual({ status: "ready", error: null });
    expect(manifest?.headers).toEqual([
      {
        pattern: "/*",
        headers: [
          ["X-Frame-Options", "DENY"],
          ["Set-Cookie", "session=1; Path=/; Secure"],
        ],
      },
    ]);
    expect(Object.keys(manifest?.files ?? {})).toEqual(["/index.html"]);
  });

  it("fails the deployment when a Set-Cookie carries a Domain attribute, saying which line and why", async () => {
    const { row, manifest } = await finishBuild({
      "/index.html": "<h1>home</h1>",
      "/_headers": "# cookies\n/*\n  Set-Cookie: toss=1; Domain=apps.example\n",
    });
    expect(row.status).toBe("failed");
    expect(row.error).toMatch(/^_headers line 3: .*Set-Cookie.*Domain/);
    expect(manifest).toBeNull();
  });

  it("fails the deployment when the file is over a limit, saying which and where", async () => {
    const rules = Array.from({ length: 101 }, (_, i) => `/p${i}\n  X-A: ${i}`).join("\n");
    const { row } = await finishBuild({ "/index.html": "<h1>home</h1>", "/_headers": rules });
    expect(row.status).toBe("failed");
    expect(row.error).toMatch(/^_headers line 201: more than 100 rules/);
  });
});

describe("deploying a site: which files are immutable", () => {
  it("marks the files of the framework's immutable folder and names with a content hash, and no other", async () => {
    const { row, manifest } = await finishBuild(
      {
        "/index.html": "<h1>home</h1>",
        "/favicon.ico": "icon",
        "/_next/static/chunks/0cz1d0mv5g_q7.js": "chunk",
        "/_next/static/tLIE13poBlR2QdNcl3tTj/_buildManifest.js": "manifest",
        "/vendor/jquery-3.7.1.min.js": "jquery",
        "/fonts/font-awesome-webfont.woff2": "font",
        "/img/hero-C49xKYgQ.png": "hero",
      },
      "nextjs",
    );
    expect(row.status).toBe("ready");
    expect(manifest?.immutableMarked).toBe(true);
    const marked = Object.entries(manifest?.files ?? {})
      .filter(([, e]) => e.immutable)
      .map(([p]) => p);
    expect(marked.sort()).toEqual(["/_next/static/chunks/0cz1d0mv5g_q7.js", "/_next/static/tLIE13poBlR2QdNcl3tTj/_buildManifest.js", "/img/hero-C49xKYgQ.png"]);
  });
});
