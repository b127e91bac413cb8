/**
 * Serving a job log over HTTP: a byte range of the file, or (follow) everything
 * from an offset onwards as it is written, ending when the job ends. Readers
 * only ever read bytes the writer has flushed, so they never see half a line.
 */
import { open } from "node:fs/promises";
import type { ServerResponse } from "node:http";

/** What the log route needs to know about one job's log. */
export interface LogSource {
  path: string;
  /** Bytes that may be read now. */
  available(): number;
  /** True once the job is over and no byte will be added. */
  ended(): boolean;
  /** Resolves when bytes were added or the job ended. */
  changed(): Promise<void>;
}

const CHUNK_BYTES = 64 * 1024;

/** Writes the log from `offset` to `response` and ends it (when following, only once the job ended). */
export async function streamLog(source: LogSource, offset: number, follow: boolean, response: ServerResponse): Promise<void> {
  let gone = false;
  const disconnected = new Promise<void>((resolve) =>
    response.once("close", () => {
      gone = true;
      resolve();
    }),
  );
  let position = offset;
  for (;;) {
    // Decide "ended" before measuring, so bytes written just before the end are still sent.
    const ended = !follow || source.ended();
    const changed = follow && !ended ? source.changed() : null;
    const available = source.available();
    if (position < available) position = await copyRange(source.path, position, available, response, () => gone);
    if (ended || gone || !changed) break;
    await Promise.race([changed, disconnected]);
  }
  if (!gone) response.end();
}

async function copyRange(
  path: string,
  start: number,
  end: number,
  response: ServerResponse,
  gone: () => boolean,
): Promise<number> {
  let position = start;
  let file: Awaited<ReturnType<typeof open>>;
  try {
    file = await open(path, "r");
  } catch {
    return position; // a job cancelled while queued has no log file
  }
  try {
    while (position < end && !gone()) {
      const buffer = Buffer.allocUnsafe(Math.min(CHUNK_BYTES, end - position));
      const { bytesRead } = await file.read(buffer, 0, buffer.length, position);
      if (bytesRead === 0) break;
      position += bytesRead;
      if (!response.write(buffer.subarray(0, bytesRead))) await drained(response);
    }
  } finally {
    await file.close();
  }
  return position;
}

/** Resolves once a response whose buffer is full can take more (or the client went away). */
export function drained(response: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      response.off("drain", done);
      response.off("close", done);
      resolve();
    };
    response.on("drain", done);
    response.on("close", done);
  });
}
