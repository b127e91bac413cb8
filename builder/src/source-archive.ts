/**
 * Puts a job's source (a `.tar.gz` behind a presigned URL) into its working
 * directory. The archive is listed before it is extracted, and refused whole if
 * any member is absolute or climbs out with `..`; GNU tar then extracts with
 * `--no-same-owner` (and, when configured, as the unprivileged job user), and by
 * default defers symlinks that point outside the tree until extraction is done,
 * so no member can be written through them.
 */
import { spawn } from "node:child_process";
import { createReadStream, createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeWebReadableStream } from "node:stream/web";
import { DEFAULT_PATH, type JobLog, type JobUser, formatBytes } from "./sandbox.js";

/** Largest source archive the builder downloads. */
const MAX_SOURCE_BYTES = 1024 * 1024 * 1024;

/** Inputs of {@link fetchSourceArchive}. */
export interface SourceArchiveOptions {
  url: string;
  jobDir: string;
  workDir: string;
  user: JobUser | null;
  log: JobLog;
  /** Aborts the download and extraction (cancel or timeout). */
  signal: AbortSignal;
}

/** Downloads and unpacks the archive; expected failures come back as a message. */
export async function fetchSourceArchive(options: SourceArchiveOptions): Promise<{ ok: true } | { ok: false; error: string }> {
  const archive = join(options.jobDir, "source.tar.gz");
  try {
    const response = await fetch(options.url, { signal: options.signal });
    if (!response.ok || !response.body) return { ok: false, error: `source download failed: HTTP ${response.status}` };
    let received = 0;
    const limit = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        received += chunk.length;
        if (received > MAX_SOURCE_BYTES) done(new Error(`archive larger than ${formatBytes(MAX_SOURCE_BYTES)}`));
        else done(null, chunk);
      },
    });
    await pipeline(
      Readable.fromWeb(response.body as NodeWebReadableStream<Uint8Array>),
      limit,
      createWriteStream(archive, { mode: 0o600 }),
      { signal: options.signal },
    );
    options.log.note(`downloaded source archive (${formatBytes(received)})`);

    const listing = await runTar(["-tzf", "-"], archive, options);
    if (listing.code !== 0) return { ok: false, error: `source archive is not a valid .tar.gz (${listing.stderr.trim()})` };
    const unsafe = listing.stdout.split("\n").find((name) => name.startsWith("/") || name.split("/").includes(".."));
    if (unsafe !== undefined) return { ok: false, error: `source archive member escapes the working directory: ${unsafe}` };

    const extraction = await runTar(["-xzf", "-", "-C", options.workDir, "--no-same-owner"], archive, options);
    if (extraction.code !== 0) return { ok: false, error: `source extraction failed (${extraction.stderr.trim()})` };
    return { ok: true };
  } catch (error) {
    if (options.signal.aborted) return { ok: false, error: "source download interrupted" };
    return { ok: false, error: `source download failed: ${error instanceof Error ? error.message : String(error)}` };
  } finally {
    await rm(archive, { force: true });
  }
}

/** Runs GNU tar on the archive (fed through stdin, so the job user needs no access to it). */
function runTar(
  args: string[],
  archive: string,
  options: Pick<SourceArchiveOptions, "user" | "signal">,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const tar = spawn("tar", args, {
      env: { PATH: DEFAULT_PATH, LC_ALL: "C" },
      stdio: ["pipe", "pipe", "pipe"],
      signal: options.signal,
      ...(options.user ? { uid: options.user.uid, gid: options.user.gid } : {}),
    });
    let stdout = "";
    let stderr = "";
    tar.stdout.setEncoding("utf8").on("data", (text: string) => {
      stdout += text;
    });
    tar.stderr.setEncoding("utf8").on("data", (text: string) => {
      stderr += text;
    });
    tar.stdin.on("error", () => undefined); // tar may stop reading early on a bad archive
    createReadStream(archive).on("error", reject).pipe(tar.stdin);
    tar.once("error", reject);
    tar.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}
