import { env, exports } from "cloudflare:workers";
import { newId } from "../../worker/lib/ids";
import { blobKey, blobPrefix, type Manifest, manifestKey } from "../../worker/sites/serve";
import { call, newAccount } from "./helpers";

export async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Publishes files as a ready, active deployment the way the Deployment object does (`extra` adds manifest fields). */
export async function publish(
  appId: string,
  accountId: string,
  files: Record<string, [string, string]>,
  spa: boolean,
  headers?: Manifest["headers"],
  extra: Partial<Manifest> = {},
): Promise<string> {
  const manifest: Manifest = { spa, files: {}, blobs: blobPrefix(accountId), ...(headers ? { headers } : {}), ...extra };
  for (const [path, [contentType, body]] of Object.entries(files)) {
    const sha = await sha256(body);
    await env.BUCKET.put(blobKey(blobPrefix(accountId), sha), body);
    manifest.files[path] = { ...manifest.files[path], sha256: sha, size: new TextEncoder().encode(body).byteLength, contentType };
  }
  const id = newId("deployment");
  await env.BUCKET.put(manifestKey(id), JSON.stringify(manifest));
  const now = Date.now();
  await env.DB.batch([
    env.DB.prepare(
      "INSERT INTO deployments (id, account_id, app_id, status, source_key, source_size_bytes, upload_expires_at, manifest_key, created_at) VALUES (?, ?, ?, 'ready', ?, 1, ?, ?, ?)",
    ).bind(id, accountId, appId, `sources/${appId}/${id}.tar.gz`, now, manifestKey(id), now),
    env.DB.prepare("UPDATE apps SET active_deployment_id = ? WHERE id = ?").bind(id, appId),
  ]);
  return id;
}

/** A static app of a fresh account, serving `files` as its active deployment. */
export async function newSite(spa: boolean, files: Record<string, [string, string]>, headers?: Manifest["headers"], extra: Partial<Manifest> = {}) {
  const { accountId, adminKey } = await newAccount();
  const name = `site-${crypto.randomUUID().slice(0, 8)}`;
  const app = ((await (await call("/v1/apps", { method: "POST", key: adminKey, body: { name, runtime: "static" } })).json()) as { data: { id: string } }).data;
  const deploymentId = await publish(app.id, accountId, files, spa, headers, extra);
  return { name, appId: app.id, accountId, key: adminKey, deploymentId };
}

/** A request to `<name>.<APPS_DOMAIN>` through the real Worker entry. */
export const get = (name: string, path: string, init: RequestInit = {}) =>
  exports.default.fetch(new Request(`http://${name}.${env.APPS_DOMAIN}${path}`, init));

export const HTML = "text/html; charset=utf-8";
