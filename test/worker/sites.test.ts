import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { newId } from "../../worker/lib/ids";
import { blobKey, blobPrefix, type Manifest, manifestKey } from "../../worker/sites/serve";
import { call } from "./helpers";
import { get, HTML, newSite, publish, sha256 } from "./sites-helpers";

const files = (): Record<string, [string, string]> => ({
  "/index.html": [HTML, "<h1>home</h1>"],
  "/404.html": [HTML, "<h1>custom not found</h1>"],
  "/about/index.html": [HTML, "<h1>about</h1>"],
  "/assets/app-4f3a9c1b.js": ["text/javascript; charset=utf-8", "console.log('app')"],
  "/style.css": ["text/css; charset=utf-8", "body{color:red}"],
});

describe("edge serving on <app>.<APPS_DOMAIN>", () => {
  it("serves files with content types, dir/ → index.html, ETag → 304, HEAD and Range", async () => {
    const { name } = await newSite(false, files());
    const home = await get(name, "/");
    expect(home.status).toBe(200);
    expect(home.headers.get("Content-Type")).toBe(HTML);
    expect(home.headers.get("Cache-Control")).toBe("no-cache");
    expect(await home.text()).toBe("<h1>home</h1>");
    const js = await get(name, "/assets/app-4f3a9c1b.js");
    expect(js.headers.get("Content-Type")).toBe("text/javascript; charset=utf-8");
    expect(js.headers.get("Cache-Control")).toBe("public, max-age=31536000, immutable");
    expect((await get(name, "/style.css")).headers.get("Content-Type")).toBe("text/css; charset=utf-8");
    expect(await (await get(name, "/about/")).text()).toBe("<h1>about</h1>");

    const etag = home.headers.get("ETag")!;
    const cached = await get(name, "/", { headers: { "If-None-Match": etag } });
    expect(cached.status).toBe(304);
    expect(await cached.text()).toBe("");

    const head = await get(name, "/style.css", { method: "HEAD" });
    expect([head.status, head.headers.get("Content-Length"), await head.text()]).toEqual([200, "15", ""]);
    const range = await get(name, "/style.css", { headers: { Range: "bytes=0-3" } });
    expect([range.status, range.headers.get("Content-Range"), await range.text()]).toEqual([206, "bytes 0-3/15", "body"]);
  });

  it("without spa: a miss is 404.html with 404", async () => {
    const { name } = await newSite(false, files());
    const miss = await get(name, "/about-us");
    expect(miss.status).toBe(404);
    expect(await miss.text()).toBe("<h1>custom not found</h1>");
    expect(miss.headers.get("Cache-Control")).toBe("no-cache");
  });

  it("with spa: a miss is index.html with 200, and 404.html is ignored", async () => {
    const { name } = await newSite(true, files());
    const deep = await get(name, "/deep/route");
    expect(deep.status).toBe(200);
    expect(await deep.text()).toBe("<h1>home</h1>");
    expect(deep.headers.get("Cache-Control")).toBe("no-cache");
  });

  it("refuses other methods (405), answers unknown apps 404 and stopped apps 503", async () => {
    const { name, key } = await newSite(false, files());
    const post = await get(name, "/", { method: "POST", body: "x" });
    expect(post.status).toBe(405);
    expect(post.headers.get("Allow")).toBe("GET, HEAD");
    expect((await get("no-such-app-here", "/")).status).toBe(404);
    await call(`/v1/apps/${name}/stop`, { method: "POST", key });
    await new Promise((r) => setTimeout(r, 2100));
    expect((await get(name, "/")).status).toBe(503);
  });

  it("switching the active deployment takes effect within seconds (rollback serves the old content)", async () => {
    const { name, appId, accountId, key, deploymentId: first } = await newSite(false, files());
    expect(await (await get(name, "/")).text()).toBe("<h1>home</h1>");
    await publish(appId, accountId, { ...files(), "/index.html": [HTML, "<h1>home v2</h1>"] }, false);
    await new Promise((r) => setTimeout(r, 2100));
    expect(await (await get(name, "/")).text()).toBe("<h1>home v2</h1>");
    const rollback = await call(`/v1/apps/${name}/deployments/${first}/activate`, { method: "POST", key });
    expect(rollback.status).toBe(200);
    await new Promise((r) => setTimeout(r, 2100));
    expect(await (await get(name, "/")).text()).toBe("<h1>home</h1>");
  }, 20_000); // two 2.1 s waits for the app cache: the 5 s default left no room when two test files share the cores

  it("logs each request off the serving path, readable through GET /v1/apps/:app/logs", async () => {
    const { name, key } = await newSite(false, files());
    await get(name, "/");
    await get(name, "/missing");
    let logs: { method: string; path: string; status: number; bytes: number; durationMs: number; id: number }[] = [];
    for (let i = 0; i < 30 && logs.length < 2; i++) {
      await new Promise((r) => setTimeout(r, 200));
      logs = ((await (await call(`/v1/apps/${name}/logs`, { key })).json()) as { data: typeof logs }).data;
    }
    expect(logs.map((l) => [l.method, l.path, l.status])).toEqual([
      ["GET", "/", 200],
      ["GET", "/missing", 404],
    ]);
    expect(logs[0]!.bytes).toBe(13);
    const after = ((await (await call(`/v1/apps/${name}/logs?after=${logs[0]!.id}`, { key })).json()) as { data: typeof logs }).data;
    expect(after.map((l) => l.path)).toEqual(["/missing"]);
  });

  it("serves small files from isolate memory once read, checked against their hash", async () => {
    const { name, appId, accountId } = await newSite(false, files());
    const css = await get(name, "/style.css");
    expect(await css.text()).toBe("body{color:red}");
    // R2 loses the blob: the edge still has it, keyed by its hash, and serves it whole, every time.
    await env.BUCKET.delete(blobKey(blobPrefix(accountId), await sha256("body{color:red}")));
    for (let i = 0; i < 2; i++) {
      const again = await get(name, "/style.css");
      expect([again.status, again.headers.get("Content-Length"), await again.text()]).toEqual([200, "15", "body{color:red}"]);
    }
    // Bytes whose hash is not their key are served but never kept.
    const forged = await sha256("what the manifest promised");
    await env.BUCKET.put(blobKey(blobPrefix(accountId), forged), "something else!");
    const id = newId("deployment");
    const manifest: Manifest = {
      spa: false,
      blobs: blobPrefix(accountId),
      files: { "/forged.txt": { sha256: forged, size: 15, contentType: "text/plain; charset=utf-8" } },
    };
    await env.BUCKET.put(manifestKey(id), JSON.stringify(manifest));
    await env.DB.batch([
      env.DB.prepare(
        "INSERT INTO deployments (id, account_id, app_id, status, source_key, source_size_bytes, upload_expires_at, manifest_key, created_at) VALUES (?, ?, ?, 'ready', ?, 1, ?, ?, ?)",
      ).bind(id, accountId, appId, `sources/${appId}/${id}.tar.gz`, Date.now(), manifestKey(id), Date.now()),
      env.DB.prepare("UPDATE apps SET active_deployment_id = ? WHERE id = ?").bind(id, appId),
    ]);
    await new Promise((r) => setTimeout(r, 2100));
    expect(await (await get(name, "/forged.txt")).text()).toBe("something else!");
    await env.BUCKET.delete(blobKey(blobPrefix(accountId), forged));
    expect((await get(name, "/forged.txt")).status).toBe(500);
  });

  it("serves mid-size files through the Cache API once cached, and ranges of them from R2", async () => {
    const big = "x".repeat(300 * 1024);
    const { name, accountId } = await newSite(false, { ...files(), "/big.txt": ["text/plain; charset=utf-8", big] });
    const first = await get(name, "/big.txt");
    expect([first.status, first.headers.get("Content-Length"), (await first.text()).length]).toEqual([200, String(big.length), big.length]);
    const key = new Request(`http://${name}.${env.APPS_DOMAIN}/.svc-blobs/${await sha256(big)}`);
    await expect.poll(async () => (await caches.default.match(key))?.status ?? 0).toBe(200);
    const range = await get(name, "/big.txt", { headers: { Range: "bytes=10-19" } });
    expect([range.status, await range.text()]).toEqual([206, "xxxxxxxxxx"]);
    await env.BUCKET.delete(blobKey(blobPrefix(accountId), await sha256(big)));
    const cached = await get(name, "/big.txt");
    expect([cached.status, await cached.text()]).toEqual([200, big]);
  });

  it("adds the headers of the site's _headers rules, on files and on 404s", async () => {
    const { name } = await newSite(false, files(), [
      { pattern: "/*", headers: [["X-Frame-Options", "DENY"]] },
      { pattern: "/assets/*", headers: [["Access-Control-Allow-Origin", "*"]] },
    ]);
    const asset = await get(name, "/assets/app-4f3a9c1b.js");
    expect([asset.headers.get("X-Frame-Options"), asset.headers.get("Access-Control-Allow-Origin")]).toEqual(["DENY", "*"]);
    const home = await get(name, "/");
    expect([home.headers.get("X-Frame-Options"), home.headers.get("Access-Control-Allow-Origin")]).toEqual(["DENY", null]);
    expect((await get(name, "/missing")).headers.get("X-Frame-Options")).toBe("DENY");
  });
});
