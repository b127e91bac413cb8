import { randomBytes } from "node:crypto";
import { readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { deployViteReact, expectExit, FixtureCopies, siteRequest } from "./sites.js";

type Deployment = { id: string; status: string; active: boolean; error: string | null; url: string; uploadedBlobs: number; spa: boolean };

/** How long a deploy through the real builder may take (the Vite one installs from the registry). */
const DEPLOY_MS = 120_000;

/**
 * The acceptance points of issue 6 that go through the whole system: the real
 * `svc` binary packs and uploads, the Worker drives the real builder, and the
 * Worker's edge serves the result on `Host: <app>.localhost:<port>`.
 */
describe("static sites: svc deploy, the builder and the edge", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const fixtures = new FixtureCopies();
  const suffix = randomBytes(3).toString("hex");
  const plain = `plain-${suffix}`;
  const outdir = `outdir-${suffix}`;
  const vite = `vite-${suffix}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "e2e-sites", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    await fixtures.removeAll();
  });

  const createApp = async (name: string, ...extra: string[]) =>
    expectExit(await svc(["apps", "create", "--name", name, "--runtime", "static", ...extra], env), 0, `apps create ${name}`);
  /**
   * The body of `path` once it contains `text`, or the last body after ~3 s: the
   * edge trusts an app's active deployment for 2 s per isolate, so a switch
   * (a new deployment, a rollback) shows within that.
   */
  const servedWithin = async (app: string, path: string, text: string) => {
    const deadline = Date.now() + 3500;
    let body = "";
    while (Date.now() < deadline) {
      body = (await siteRequest(stack, app, path)).body;
      if (body.includes(text)) break;
      await sleep(200);
    }
    return body;
  };
  const deployments = async (app: string) => JSON.parse(expectExit(await svc(["deployments", "list", app, "--json"], env), 0, "deployments list").stdout) as Deployment[];

  describe("a plain static/index.html site", () => {
    let source: string;
    let firstId: string;

    it(
      "deploys: the build log streams and the command ends with the URL",
      async () => {
        const missing = await svc(["deploy", "--source", await fixtures.copy("plain"), "--app", plain], env);
        expect(missing.code).toBe(1);
        expect(missing.stderr).toContain(`svc apps create --name ${plain} --runtime static`);

        await createApp(plain);
        source = await fixtures.copy("plain");
        // A Pages-style _headers file: applied by the edge, never served.
        await writeFile(join(source, "static", "_headers"), "/*\n  X-Frame-Options: DENY\n");
        const r = await svc(["deploy", "--source", source, "--app", plain], env);
        expect(r.stderr).toBe("");
        expect(r.code).toBe(0);
        expect(r.stdout).toMatch(/^Packed 4 files /m); // .gitignore, static/index.html, static/style.css, static/_headers
        expect(r.stdout).toMatch(/ svc static site: output static /);
        expect(r.stdout.trimEnd().split("\n").at(-1)).toBe(`Deployed: http://${plain}.localhost:${new URL(stack.apiUrl).port}`);
        firstId = (await deployments(plain))[0]!.id;
      },
      DEPLOY_MS,
    );

    it("serves the page, the stylesheet with its content type, and 304 for a matching ETag", async () => {
      const page = await siteRequest(stack, plain, "/");
      expect(page.status).toBe(200);
      expect(page.headers["content-type"]).toBe("text/html; charset=utf-8");
      expect(page.headers["cache-control"]).toBe("no-cache");
      expect(page.body).toContain("<h1>Plain static site</h1>");
      expect(page.headers["x-frame-options"]).toBe("DENY");
      expect((await siteRequest(stack, plain, "/_headers")).status).toBe(404);

      const css = await siteRequest(stack, plain, "/style.css");
      expect(css.status).toBe(200);
      expect(css.headers["content-type"]).toBe("text/css; charset=utf-8");
      expect(css.body).toContain("font-family: Georgia");
      const etag = css.headers.etag as string;
      expect(etag).toMatch(/^"[0-9a-f]{64}"$/);

      const again = await siteRequest(stack, plain, "/style.css", { headers: { "If-None-Match": etag } });
      expect(again.status).toBe(304);
      expect(again.body).toBe("");
    });

    it("cron runs of the app execute in its environment: the active deployment's source", async () => {
      const created = await svc(
        ["cron", "create", plain, "--name", "inspect", "--schedule", "0 0 1 1 *", "--command", "grep -q 'Plain static site' static/index.html && echo source-present", "--json"],
        env,
      );
      expect(created.code).toBe(0);
      const { id } = JSON.parse(created.stdout) as { id: string };
      const run = await svc(["cron", "run", id, "--wait"], env);
      expect(run.stderr + run.stdout).toMatch(/ out source-present$/m);
      expect(run.code).toBe(0);
    }, 60_000);

    it(
      "a redeploy with one changed file uploads one blob; rollback serves the old page again",
      async () => {
        const index = join(source, "static", "index.html");
        await writeFile(index, (await readFile(index, "utf8")).replace("<h1>Plain static site</h1>", "<h1>Second version</h1>"));
        const r = await svc(["deploy", "--source", source, "--app", plain, "--json"], env);
        expect(r.code).toBe(0);
        const second = JSON.parse(r.stdout) as Deployment;
        expect(second).toMatchObject({ status: "ready", active: true, uploadedBlobs: 1 });
        expect(r.stderr).toMatch(/blobs: 3 distinct, 2 already stored, 1 uploaded/);
        expect(await servedWithin(plain, "/", "<h1>Second version</h1>")).toContain("<h1>Second version</h1>");

        const back = await svc(["deployments", "rollback", plain, firstId], env);
        expect(back.stderr).toBe("");
        expect(back.code).toBe(0);
        expect(back.stdout).toContain(`now serves deployment ${firstId}`);
        const list = await deployments(plain);
        expect(list.map((d) => [d.id, d.active])).toEqual([
          [second.id, false],
          [firstId, true],
        ]);
        expect(await servedWithin(plain, "/", "<h1>Plain static site</h1>")).toContain("<h1>Plain static site</h1>");
      },
      DEPLOY_MS,
    );
  });

  describe("a site with outputDir and a 404.html (spa false)", () => {
    it(
      "deploys, serves dir/ as dir/index.html and answers a miss with 404.html and 404",
      async () => {
        await createApp(outdir);
        const source = await fixtures.copy("outdir");
        const r = await svc(["deploy", "--source", source, "--app", outdir], env);
        expect(r.code).toBe(0);
        expect(r.stdout).toContain("wrote build/index.html, build/about/index.html, build/404.html");
        expect(r.stdout).toContain("Deployed: ");

        const about = await siteRequest(stack, outdir, "/about/");
        expect(about.status).toBe(200);
        expect(about.body).toContain("<h1>About this outdir site</h1>");
        const missing = await siteRequest(stack, outdir, "/nope");
        expect(missing.status).toBe(404);
        expect(missing.headers["content-type"]).toBe("text/html; charset=utf-8");
        expect(missing.body).toContain("<h1>Custom 404 page of the outdir site</h1>");
      },
      DEPLOY_MS,
    );
  });

  describe("a Vite + React app installed from the registry with its lockfile", () => {
    let js: string;

    it(
      "deploys with a VITE_ variable and a secret set beforehand",
      async () => {
        const { deployment, deploy } = await deployViteReact(env, vite, fixtures);
        expect(deployment).toMatchObject({ status: "ready", active: true, spa: true, framework: "vite", outputDir: "dist" });
        expect(deploy.stderr).toMatch(/installing dependencies from package-lock.json with npm/);
      },
      DEPLOY_MS,
    );

    it("serves /, the hashed JS as immutable JavaScript with the public variable only, /about as the SPA, and 304", async () => {
      const page = await siteRequest(stack, vite, "/");
      expect(page.status).toBe(200);
      expect(page.headers["content-type"]).toBe("text/html; charset=utf-8");
      const src = /<script type="module" crossorigin src="(\/assets\/[^"]+\.js)"/.exec(page.body)?.[1];
      expect(src, page.body).toBeDefined();

      const asset = await siteRequest(stack, vite, src!);
      expect(asset.status).toBe(200);
      expect(asset.headers["content-type"]).toBe("text/javascript; charset=utf-8");
      expect(asset.headers["cache-control"]).toBe("public, max-age=31536000, immutable");
      js = asset.body;
      expect(js).toContain("hello-from-env");
      expect(js).not.toContain("do-not-leak");

      const about = await siteRequest(stack, vite, "/about");
      expect(about.status).toBe(200);
      expect(about.headers["cache-control"]).toBe("no-cache");
      expect(about.body).toBe(page.body);

      const cached = await siteRequest(stack, vite, src!, { headers: { "If-None-Match": asset.headers.etag as string } });
      expect(cached.status).toBe(304);
    });
  });

  describe("failures are clear and early", () => {
    it(
      "a package.json with dependencies but no lockfile: names the three lockfiles, uploads and installs nothing",
      async () => {
        const app = `nolock-${suffix}`;
        await createApp(app);
        const source = await fixtures.copy("vite-react");
        await rm(join(source, "package-lock.json"));
        const r = await svc(["deploy", "--source", source, "--app", app], env);
        expect(r.code).toBe(1);
        const output = r.stdout + r.stderr;
        for (const lockfile of ["package-lock.json", "yarn.lock", "pnpm-lock.yaml"]) expect(output).toContain(lockfile);
        // svc deploy applies the build's own rule before the upload (the builder's refusal is test/builder/build.error.test.ts).
        expect(r.stderr).toMatch(/^Error: cannot deploy \S+$/m);
        expect(r.stderr).toContain("Hint: run npm install");
        expect(output).not.toMatch(/Packed|Uploaded|installing dependencies|npm ci|added \d+ packages/);
        expect(await deployments(app)).toEqual([]);
      },
      DEPLOY_MS,
    );

    it(
      "a wrong outputDir names the folder the build did write",
      async () => {
        const app = `wrongdir-${suffix}`;
        await createApp(app);
        const source = await fixtures.copy("outdir");
        // svc.json says build (as in the fixture), but this build writes dist/.
        const script = join(source, "build.js");
        await writeFile(script, (await readFile(script, "utf8")).replaceAll("build/", "dist/"));
        const r = await svc(["deploy", "--source", source, "--app", app], env);
        expect(r.code).toBe(1);
        expect(r.stderr).toMatch(/outputDir "build" does not exist after the build; found: dist\b/);
        expect(r.stderr).toContain("Hint: set outputDir in svc.json");
      },
      DEPLOY_MS,
    );

    it(
      "a build allocating past the app's memory limit fails with OOMKilled, the limit and the peak",
      async () => {
        const app = `oom-${suffix}`;
        await createApp(app, "--memory", "128");
        const source = await fixtures.copy("outdir");
        await writeFile(
          join(source, "build.js"),
          `// Holds 512 MiB, written so it is resident: four times the app's 128 MiB.
const held = [];
for (let i = 0; i < 32; i++) {
  held.push(Buffer.alloc(16 * 1024 * 1024, i));
  await new Promise((resolve) => setTimeout(resolve, 20));
}
console.log("allocated", held.length * 16, "MiB");
`,
        );
        const r = await svc(["deploy", "--source", source, "--app", app], env);
        expect(r.code).toBe(1);
        expect(r.stderr).toContain("OOMKilled");
        expect(r.stderr).toMatch(/memory limit 128 MiB exceeded \(peak \d+ MiB\)/);
        expect(r.stdout).not.toContain("allocated 512 MiB");
      },
      DEPLOY_MS,
    );
  });

  describe("logs", () => {
    it("svc apps logs shows the latest build log", async () => {
      const r = await svc(["apps", "logs", outdir], env);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/^\S+ out wrote build\/index.html/m);
      expect(r.stdout).toMatch(/^\S+ svc job succeeded/m);
    });

    it(
      "svc deploy --no-follow returns at once; svc apps logs --follow then streams the build to its end",
      async () => {
        const started = await svc(["deploy", "--source", await fixtures.copy("outdir"), "--app", outdir, "--no-follow", "--json"], env);
        expect(started.code).toBe(0);
        const deployment = JSON.parse(started.stdout) as Deployment;
        expect(started.stderr).toBe(""); // no build log: it did not follow
        expect(["queued", "building", "deploying", "ready"]).toContain(deployment.status);

        const followed = await svc(["apps", "logs", outdir, "--deployment", deployment.id, "--follow"], env);
        expect(followed.code).toBe(0);
        expect(followed.stdout).toMatch(/^\S+ out wrote build\/index.html/m);
        expect(followed.stdout.trimEnd().split("\n").at(-1)).toMatch(/^\S+ svc job succeeded/);
        expect(followed.stderr).toBe(`Deployment ${deployment.id} is ready\n`);
      },
      DEPLOY_MS,
    );

    it(
      "a followed build log arrives line by line to a client that accepts gzip (Node's fetch), as the build prints it",
      async () => {
        // A build printing a line a second: each must reach the client when printed, not all at the end.
        const app = `ticks-${suffix}`;
        await createApp(app);
        const source = await fixtures.copy("outdir");
        await writeFile(
          join(source, "build.js"),
          `import { mkdirSync, writeFileSync } from "node:fs";
for (let i = 1; i <= 5; i++) { console.log("tick " + i); await new Promise((r) => setTimeout(r, 1000)); }
mkdirSync("build", { recursive: true });
writeFileSync("build/index.html", "<h1>ticked</h1>");
`,
        );
        const started = expectExit(await svc(["deploy", "--source", source, "--app", app, "--no-follow", "--json"], env), 0, "deploy");
        const deployment = JSON.parse(started.stdout) as Deployment;
        const response = await fetch(`${stack.apiUrl}/v1/apps/${app}/deployments/${deployment.id}/logs?follow=true`, {
          headers: { Authorization: `Bearer ${env.SVC_API_KEY}`, "Accept-Encoding": "gzip, deflate, br" },
        });
        expect(response.status).toBe(200);
        const arrivals = new Map<number, number>();
        const decoder = new TextDecoder();
        let text = "";
        for await (const chunk of response.body!) {
          text += decoder.decode(chunk as Uint8Array, { stream: true });
          for (const match of text.matchAll(/ out tick (\d)\n/g)) if (!arrivals.has(Number(match[1]))) arrivals.set(Number(match[1]), Date.now());
        }
        expect([...arrivals.keys()].sort()).toEqual([1, 2, 3, 4, 5]);
        // Printed four seconds apart; a response held back by a compressor delivers them together at the end.
        expect(arrivals.get(5)! - arrivals.get(1)!).toBeGreaterThan(2500);
        expect(text.trimEnd().split("\n").at(-1)).toMatch(/^\S+ svc job succeeded/);
      },
      DEPLOY_MS,
    );

    it("svc logs shows the requests made above with their status codes", async () => {
      // Requests are logged after the response; give the last ones a moment.
      let lines: string[] = [];
      for (let i = 0; i < 20; i++) {
        const r = await svc(["logs", outdir], env);
        expect(r.code).toBe(0);
        lines = r.stdout.trimEnd().split("\n");
        if (lines.some((l) => / GET \/nope 404 /.test(l))) break;
        await sleep(250);
      }
      expect(lines).toContainEqual(expect.stringMatching(/^\d{4}-\d\d-\d\dT\S+Z GET \/about\/ 200 \d+ \d+ms$/));
      expect(lines).toContainEqual(expect.stringMatching(/^\S+ GET \/nope 404 \d+ \d+ms$/));

      const plainLog = await svc(["logs", plain, "--json"], env);
      const entries = JSON.parse(plainLog.stdout) as { method: string; path: string; status: number }[];
      expect(entries).toContainEqual(expect.objectContaining({ method: "GET", path: "/style.css", status: 304 }));
      expect(entries).toContainEqual(expect.objectContaining({ method: "GET", path: "/style.css", status: 200 }));
    });
  });
});
