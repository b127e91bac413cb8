import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { packSource, type SourceFile, SourceTooLarge, selectSource } from "../../dashboard/src/pack.js";

const run = promisify(execFile);

/** A file as the folder picker would hand it over. */
const file = (path: string, content: string | Uint8Array): SourceFile => ({
  path,
  blob: new Blob([content]),
  lastModified: Date.parse("2026-11-20T10:00:00Z"),
});

const project = [
  file(".gitignore", "dist/\n*.log\n!keep.log\n.env\n"),
  file("package.json", '{"name":"site"}'),
  file("index.html", "<h1>hi</h1>"),
  file("src/main.js", "console.log(1)"),
  file("src/debug.log", "noise"),
  file("src/keep.log", "kept on purpose"),
  file("src/nested/.gitignore", "secret.txt\n"),
  file("src/nested/secret.txt", "do not ship"),
  file("src/nested/page.html", "<p>page</p>"),
  file("dist/bundle.js", "built"),
  file("dist/inner/more.js", "built"),
  file("node_modules/left-pad/index.js", "module.exports = 1"),
  file(".git/HEAD", "ref: refs/heads/main"),
  file(".env", "TOKEN=1"),
];

const dirs: string[] = [];
afterAll(async () => {
  await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true })));
});

describe("packing a folder in the page", () => {
  it("leaves out what .gitignore files exclude at every level, and node_modules and .git always", async () => {
    const selection = await selectSource(project);
    expect(selection.files.map((f) => f.path)).toEqual([
      ".gitignore",
      "index.html",
      "package.json",
      "src/keep.log",
      "src/main.js",
      "src/nested/.gitignore",
      "src/nested/page.html",
    ]);
    expect(selection.ignored).toEqual([".env", ".git/", "dist/", "node_modules/", "src/debug.log", "src/nested/secret.txt"]);
    expect(selection.totalBytes).toBe(selection.files.reduce((sum, f) => sum + f.blob.size, 0));
  });

  it("writes a .tar.gz that tar lists and extracts: folders before their files, contents intact", async () => {
    const packed = await packSource(await selectSource(project));
    expect(packed.fileCount).toBe(7);
    expect(packed.sizeBytes).toBe(packed.archive.size);
    const dir = await mkdtemp(join(tmpdir(), "svc-dashboard-pack-"));
    dirs.push(dir);
    const archive = join(dir, "source.tar.gz");
    await writeFile(archive, new Uint8Array(await packed.archive.arrayBuffer()));
    const { stdout } = await run("tar", ["-tzf", archive]);
    expect(stdout.trim().split("\n")).toEqual([
      "src/",
      "src/nested/",
      ".gitignore",
      "index.html",
      "package.json",
      "src/keep.log",
      "src/main.js",
      "src/nested/.gitignore",
      "src/nested/page.html",
    ]);
    await run("tar", ["-xzf", archive, "-C", dir]);
    expect(await readFile(join(dir, "src/nested/page.html"), "utf8")).toBe("<p>page</p>");
    expect(await readFile(join(dir, "src/keep.log"), "utf8")).toBe("kept on purpose");
  });

  it("refuses a source whose archive passes the limit before anything could be uploaded", async () => {
    // Random bytes do not compress: 300 KB of them cannot fit a 100 KB limit.
    const big = await selectSource([file("index.html", "<h1>big</h1>"), file("media/video.bin", randomBytes(300_000))]);
    const packing = packSource(big, { maxBytes: 100_000 });
    await expect(packing).rejects.toBeInstanceOf(SourceTooLarge);
    await expect(packing).rejects.toThrow(/over the build upload limit of 0.1 MB; nothing was uploaded/);
  });
});
