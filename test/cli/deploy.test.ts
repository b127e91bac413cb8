import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { cp, mkdir, mkdtemp, open, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dnsLabel } from "../../cli/src/commands/init.js";
import { isIgnored, parseIgnoreFile } from "../../builder/src/static/ignore.js";
import { listSource, packSource, SourceTooLarge } from "../../cli/src/pack.js";
import { freePort, ROOT } from "../../scripts/local-stack.js";
import { svc, tempHome } from "./svc.js";

/**
 * `svc deploy`'s packing and `svc init` on folders of their own, without a
 * running stack: .gitignore rules, the archive's members (as GNU tar lists
 * them), the 100 MB refusal before any request, and svc.json from detection.
 */

let scratch: string;
let home: Awaited<ReturnType<typeof tempHome>>;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "svc-deploy-test-"));
  home = await tempHome();
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
  await home?.remove();
});

/** Writes a tree of files (path → content) under a fresh folder. */
async function tree(files: Record<string, string>): Promise<string> {
  const root = await mkdtemp(join(scratch, "tree-"));
  for (const [path, content] of Object.entries(files)) {
    await mkdir(dirname(join(root, path)), { recursive: true });
    await writeFile(join(root, path), content);
  }
  return root;
}

describe(".gitignore rules", () => {
  // [pattern, path, is a directory, ignored]
  const cases: [string, string, boolean, boolean][] = [
    ["dist", "dist", true, true],
    ["dist", "packages/web/dist", true, true],
    ["dist", "dist", false, true],
    ["dist/", "dist", true, true],
    ["dist/", "dist", false, false],
    ["/dist", "dist", true, true],
    ["/dist", "src/dist", true, false],
    ["src/gen", "src/gen", true, true],
    ["src/gen", "lib/src/gen", true, false],
    ["*.log", "debug.log", false, true],
    ["*.log", "logs/deep/app.log", false, true],
    ["*.log", "log.txt", false, false],
    ["doc/*.txt", "doc/notes.txt", false, true],
    ["doc/*.txt", "doc/server/arch.txt", false, false],
    ["**/foo", "foo", true, true],
    ["**/foo", "a/b/foo", false, true],
    ["**/foo/bar", "x/foo/bar", false, true],
    ["abc/**", "abc/x/y.js", false, true],
    ["abc/**", "abc", true, false],
    ["a/**/b", "a/b", false, true],
    ["a/**/b", "a/x/y/b", false, true],
    ["a/**/b", "a/x/c", false, false],
    ["foo**bar", "fooXbar", false, true],
    ["foo**bar", "foo/bar", false, false],
    ["?.md", "a.md", false, true],
    ["?.md", "ab.md", false, false],
    ["[abc].js", "b.js", false, true],
    ["[abc].js", "d.js", false, false],
    ["[!abc].js", "d.js", false, true],
    ["[a-c]x", "bx", false, true],
    ["\\#notcomment", "#notcomment", false, true],
    ["\\!bang", "!bang", false, true],
    ["# comment", "# comment", false, false],
    ["trailing   ", "trailing", false, true],
    [".env*", ".env.local", false, true],
    ["*.min.js", "vendor.min.js", false, true],
    ["*.min.js", "vendor-min.js", false, false],
  ];
  it.each(cases)("%j on %j (dir: %j) → ignored: %j", (pattern, path, isDir, expected) => {
    expect(isIgnored(path, isDir, [{ base: "", rules: parseIgnoreFile(pattern) }])).toBe(expected);
  });

  it("blank lines and comments ignore nothing, and names match case-sensitively as git does on Linux", () => {
    const sets = [{ base: "", rules: parseIgnoreFile("\n   \n# a comment\nBuild/\n") }];
    expect(isIgnored("a", false, sets)).toBe(false);
    expect(isIgnored("# a comment", false, sets)).toBe(false);
    expect(isIgnored("Build", true, sets)).toBe(true);
    expect(isIgnored("build", true, sets)).toBe(false);
  });

  it("negation re-includes, and the last matching line wins", () => {
    const rules = [{ base: "", rules: parseIgnoreFile("*.log\n!keep.log\n") }];
    expect(isIgnored("a.log", false, rules)).toBe(true);
    expect(isIgnored("keep.log", false, rules)).toBe(false);
    expect(isIgnored("keep.log", false, [{ base: "", rules: parseIgnoreFile("!keep.log\n*.log\n") }])).toBe(true);
  });

  it("a nested .gitignore applies below its folder and wins over the root's", () => {
    const sets = [
      { base: "", rules: parseIgnoreFile("*.secret\n") },
      { base: "app", rules: parseIgnoreFile("!public.secret\n/local\n") },
    ];
    expect(isIgnored("app/public.secret", false, sets)).toBe(false);
    expect(isIgnored("app/other.secret", false, sets)).toBe(true);
    expect(isIgnored("public.secret", false, sets)).toBe(true);
    expect(isIgnored("app/local", true, sets)).toBe(true);
    expect(isIgnored("app/sub/local", true, sets)).toBe(false);
  });

  it("node_modules and .git are left out whatever .gitignore says", () => {
    const sets = [{ base: "", rules: parseIgnoreFile("!node_modules\n!.git\n") }];
    expect(isIgnored("node_modules", true, sets)).toBe(true);
    expect(isIgnored("packages/a/node_modules", true, sets)).toBe(true);
    expect(isIgnored(".git", true, sets)).toBe(true);
  });
});

describe("packing the source", () => {
  it("archives what git would commit, as GNU tar lists it", async () => {
    const root = await tree({
      ".gitignore": "dist/\n*.log\n!keep.log\n/only-at-root.txt\n",
      "index.html": "<h1>hi</h1>",
      "src/main.js": "console.log(1)",
      "dist/bundle.js": "built",
      "logs/a.log": "x",
      "logs/keep.log": "kept",
      "only-at-root.txt": "x",
      "nested/only-at-root.txt": "kept: the anchor is the root",
      "nested/.gitignore": ".env\n",
      "nested/.env": "SECRET=1",
      "nested/dist/x.js": "dist/ matches at any depth",
      "node_modules/react/index.js": "x",
      ".git/HEAD": "ref: refs/heads/main",
      "empty-dir/.keep": "",
    });
    await symlink("src/main.js", join(root, "link.js"));
    const packed = await packSource(root);
    try {
      const members = execFileSync("tar", ["tzf", packed.file], { encoding: "utf8" }).trimEnd().split("\n");
      expect(members).toEqual([
        ".gitignore",
        "empty-dir/",
        "empty-dir/.keep",
        "index.html",
        "link.js",
        "logs/",
        "logs/keep.log",
        "nested/",
        "nested/.gitignore",
        "nested/only-at-root.txt",
        "src/",
        "src/main.js",
      ]);
      const verbose = execFileSync("tar", ["tzvf", packed.file], { encoding: "utf8" });
      expect(verbose).toMatch(/^l\S+ 0\/0 .* link\.js -> src\/main\.js$/m);
      expect(execFileSync("tar", ["xzOf", packed.file, "src/main.js"], { encoding: "utf8" })).toBe("console.log(1)");
      expect(packed.fileCount).toBe(7); // link.js is a link, not a file
      // What .gitignore left out, apart from what is never uploaded (dependencies, VCS data, caches).
      expect(packed.ignored.sort()).toEqual(["dist/", "logs/a.log", "nested/.env", "nested/dist/", "only-at-root.txt"]);
      expect(packed.excluded.sort()).toEqual([".git/", "node_modules/"]);
    } finally {
      await packed.remove();
    }
    expect(existsSync(packed.file)).toBe(false);
  });

  it("refuses a source whose archive passes the limit, naming the biggest entries, and leaves no file behind", async () => {
    const root = await tree({ "index.html": "<h1>hi</h1>", "small.txt": "x" });
    await mkdir(join(root, "media"));
    await writeFile(join(root, "media", "video.bin"), randomBytes(300_000));
    await writeFile(join(root, "blob.bin"), randomBytes(200_000));
    const before = (await listSource(root)).entries.length;
    const error = await packSource(root, { maxBytes: 100_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(SourceTooLarge);
    const detail = (error as SourceTooLarge).detail.join("\n");
    expect(detail).toContain("over the build upload limit of 0.1 MB (100000 bytes); nothing was uploaded");
    expect((error as SourceTooLarge).detail).toContain("biggest entries: media/ (293 KiB), blob.bin (195 KiB)");
    expect((error as SourceTooLarge).detail).toContain("biggest files: media/video.bin (293 KiB), blob.bin (195 KiB)");
    expect(before).toBe(5);
  });

  it("refuses a large file cut off in the middle of its member, every time, without leaving an error behind", async () => {
    const root = await tree({ "index.html": "<h1>hi</h1>" });
    await writeFile(join(root, "video.bin"), randomBytes(3_000_000));
    for (let attempt = 0; attempt < 5; attempt++) {
      await expect(packSource(root, { maxBytes: 1_000_000 })).rejects.toBeInstanceOf(SourceTooLarge);
    }
    // A torn-down member must not surface later as an "error" event nobody listens to (that crashes the CLI).
    await new Promise((resolve) => setTimeout(resolve, 100));
  });

  it("svc deploy refuses a source over 100 MB before it sends any request", async () => {
    const root = await tree({ "svc.json": JSON.stringify({ name: "big-site", runtime: "static", outputDir: "static" }), "static/index.html": "hi" });
    // 101 MB that gzip cannot shrink, written in pieces.
    const file = await open(join(root, "static", "huge.bin"), "w");
    for (let i = 0; i < 101; i++) await file.write(randomBytes(1_000_000));
    await file.close();
    // Nothing listens on this port: any request would fail with a network error instead.
    const api = `http://127.0.0.1:${await freePort()}`;
    const r = await svc(["deploy", "--source", root], { ...home.env, SVC_API_URL: api, SVC_API_KEY: "svc_unused" });
    expect(r.code).toBe(1);
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe("Error: the source is too large to deploy");
    expect(r.stderr).toContain("over the build upload limit of 100 MB (100000000 bytes); nothing was uploaded");
    expect(r.stderr).toContain("biggest files: static/huge.bin (96 MiB)");
    expect(r.stderr).toContain("Hint: leave build output, media and archives out of the source with .gitignore");
    expect(r.stderr).not.toContain("is the API running");
    expect(r.stdout).toBe("");
  }, 60_000);

  it("svc deploy without an app name says how to give one", async () => {
    const root = await tree({ "static/index.html": "hi" });
    const r = await svc(["deploy", "--source", root], { ...home.env, SVC_API_KEY: "svc_unused" });
    expect(r.code).toBe(1);
    expect(r.stderr.trimEnd().split("\n")).toEqual([
      "Error: no app to deploy to",
      `  ${root} has no svc.json`,
      "  Hint: pass --app <app>, or run `svc init` to write svc.json",
    ]);
  });
});

describe("svc deploy's checks before the upload (no request is made: nothing listens at the API URL)", () => {
  const deployOffline = async (root: string) =>
    svc(["deploy", "--source", root, "--app", "my-site"], { ...home.env, SVC_API_URL: `http://127.0.0.1:${await freePort()}`, SVC_API_KEY: "svc_unused" });
  const vite = { "package.json": JSON.stringify({ scripts: { build: "vite build" }, devDependencies: { vite: "8.3.8" } }), "index.html": "<div id=root></div>" };

  it("refuses dependencies without a lockfile, and a lockfile .gitignore keeps from being uploaded", async () => {
    const missing = await deployOffline(await tree(vite));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^Error: cannot deploy \S+\n {2}package\.json lists dependencies but no lockfile was found: commit one of package-lock\.json, yarn\.lock, pnpm-lock\.yaml/);
    expect(missing.stderr).toContain("Hint: run npm install (or yarn / pnpm install) in the project and commit the lockfile it writes");
    const ignored = await deployOffline(await tree({ ...vite, "package-lock.json": "{}", ".gitignore": "package-lock.json\n" }));
    expect(ignored.code).toBe(1);
    expect(ignored.stderr).toContain("package-lock.json is left out by .gitignore, so the build would install without it");
    for (const r of [missing, ignored]) expect(r.stderr).not.toContain("is the API running");
  });

  it("refuses an output folder that is missing or ignored when nothing builds it, and an svc.json the build would refuse", async () => {
    const config = (fields: Record<string, unknown>) => JSON.stringify({ name: "my-site", runtime: "static", ...fields });
    const absent = await deployOffline(await tree({ "svc.json": config({ outputDir: "public" }), "index.html": "x" }));
    expect(absent.stderr).toContain('outputDir "public" does not exist and nothing builds it');
    const ignored = await deployOffline(await tree({ "svc.json": config({ outputDir: "site" }), "site/index.html": "x", ".gitignore": "site/\n" }));
    expect(ignored.stderr).toContain('outputDir "site" is left out by .gitignore and nothing builds it');
    const invalid = await deployOffline(await tree({ "svc.json": config({ outputdir: "dist" }), "static/index.html": "x" }));
    expect(invalid.stderr).toMatch(/^Error: \S+svc\.json is not valid\n {2}svc\.json: unknown field "outputdir"/);
    const root = await deployOffline(await tree({ "svc.json": config({ outputDir: "." }), ...vite, "package-lock.json": "{}" }));
    expect(root.stderr).toContain('outputDir "." (the project root) is served only for a plain folder');
    expect(root.stderr).toContain('Hint: set "outputDir" in svc.json to the folder the build writes');
    for (const r of [absent, ignored, invalid, root]) {
      expect(r.code).toBe(1);
      expect(r.stderr).not.toContain("is the API running");
    }
  });
});

describe("svc init", () => {
  const fixtures = join(ROOT, "test", "fixtures", "sites");
  const copy = async (name: string) => {
    const dir = join(await mkdtemp(join(scratch, "init-")), name);
    await cp(join(fixtures, name), dir, { recursive: true });
    return dir;
  };
  const written = async (dir: string) => JSON.parse(await readFile(join(dir, "svc.json"), "utf8")) as unknown;

  it("a plain static/index.html folder: no build command, output static, not a SPA", async () => {
    const dir = await copy("plain");
    const r = await svc(["init", "--dir", dir], home.env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Detected: plain static site \(static\/index\.html\)$/m);
    expect(await written(dir)).toEqual({ name: "plain", runtime: "static", outputDir: "static", spa: false });
  });

  it("the Vite + React app: npm run build into dist, a SPA, the lockfile named", async () => {
    const dir = await copy("vite-react");
    const r = await svc(["init", "--dir", dir, "--name", "my-spa", "--yes"], home.env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Detected: Vite, dependencies from package-lock\.json \(npm\)$/m);
    expect(r.stdout).toContain("Next: svc apps create --name my-spa --runtime static, then svc deploy");
    expect(await written(dir)).toEqual({ name: "my-spa", runtime: "static", buildCommand: "npm run build", outputDir: "dist", spa: true });
  });

  it("the outdir site: keeps its svc.json unless --force, which keeps the fields nothing else knows", async () => {
    const dir = await copy("outdir");
    const original = await readFile(join(dir, "svc.json"), "utf8");
    const refused = await svc(["init", "--dir", dir], home.env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(`Error: ${join(dir, "svc.json")} already exists`);
    expect(await readFile(join(dir, "svc.json"), "utf8")).toBe(original);

    const forced = await svc(["init", "--dir", dir, "--force", "--json"], home.env);
    expect(forced.code).toBe(0);
    const expected = { name: "outdir-site", runtime: "static", buildCommand: "node build.js", outputDir: "build", spa: false };
    expect(JSON.parse(forced.stdout)).toEqual(expected);
    expect(await written(dir)).toEqual(expected);
  });

  it("a project nothing recognises needs --output-dir, and then gets exactly what was asked", async () => {
    const dir = await copy("outdir");
    await rm(join(dir, "svc.json"));
    // A package.json with no framework is a node app, which needs something to start.
    const unknown = await svc(["init", "--dir", dir], home.env);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain(`Error: cannot set up ${dir} as a node app`);
    expect(unknown.stderr).toContain("no start command: add a start script to package.json, or startCommand to svc.json");
    expect(unknown.stderr).toContain(
      'Hint: pass --start-command <command> (e.g. "node server.js") for an app that runs, or for a static site say where the build writes it: svc init --output-dir <folder> --build-command <command>',
    );

    const r = await svc(["init", "--dir", dir, "--build-command", "node build.js", "--output-dir", "build", "--spa", "false"], home.env);
    expect(r.code).toBe(0);
    expect(await written(dir)).toEqual({ name: "outdir", runtime: "static", buildCommand: "node build.js", outputDir: "build", spa: false });
  });

  it("a plain folder with index.html at its root: served from the root, and --output-dir . refused where there is a build", async () => {
    const dir = await tree({ "index.html": "<h1>hi</h1>", "about.html": "<h1>about</h1>" });
    const r = await svc(["init", "--dir", dir, "--name", "hand-written"], home.env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Detected: plain folder \(index\.html at the root, served as it is\)$/m);
    // Not logged in: the next step is the generic one.
    expect(r.stdout.trimEnd().split("\n").at(-1)).toBe("Next: svc apps create --name hand-written --runtime static, then svc deploy");
    expect(await written(dir)).toEqual({ name: "hand-written", runtime: "static", outputDir: ".", spa: false });

    const withBuild = await copy("outdir");
    const refused = await svc(["init", "--dir", withBuild, "--force", "--output-dir", "./"], home.env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(`Error: cannot serve ${withBuild} as it is`);
    expect(refused.stderr).toContain('this project has a package.json and has a build command ("node build.js")');
    expect(refused.stderr).toContain("Hint: pass --output-dir <folder> with the folder the build writes");
  });

  it("rejects a name that is not a DNS label, and derives one from the folder", async () => {
    const r = await svc(["init", "--dir", scratch, "--name", "Not_A_Label"], home.env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--name must be a DNS label");
    expect(dnsLabel("My Site_2")).toBe("my-site-2");
    expect(dnsLabel("--Café--")).toBe("cafe");
    expect(dnsLabel("___")).toBe("site");
    expect(dnsLabel("x".repeat(80))).toHaveLength(52);
  });
});
