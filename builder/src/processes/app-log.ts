/**
 * The runtime log of each app on this node: its processes' stdout and stderr
 * and the supervisor's `svc` lines, in the app log's line format (protocol/processes.ts,
 * `<time> <stream> <deployment>/<process> <text>`: every line says which
 * release and which process wrote it), kept across the app's restarts and
 * deploys (every process of the app writes to the same log) and across
 * builder restarts (it is a file).
 *
 * Bounded: the log is two files, `app-logs/<appId>/log` (being written) and
 * `log.1` (the one before). When `log` would pass half of LOG_LIMIT_BYTES it
 * becomes `log.1` (the older one is dropped), so between 5 and 10 MiB of the
 * latest output are kept, never more, and nothing is ever rewritten in place.
 *
 * Readers address the log by a logical offset that only grows (bytes written
 * since the log was opened by this builder), so a follower keeps its place
 * across rotations; one that falls behind a whole file skips what was dropped.
 *
 * An app that writes faster than the file takes it is slowed down, not cut:
 * its pipes are paused while more than {@link QUEUE_HIGH_BYTES} wait, so it
 * blocks on its writes like on a slow terminal.
 *
 * Bounded in rate too ({@link LOG_RATE}): the node's agent also proxies other
 * accounts' traffic, so what one app prints costs it a bounded amount of
 * work, whatever the app prints. Past the rate (per app and node: its
 * processes share it) output is dropped, not processed: its newlines are
 * counted and the app's pipes are read at most every {@link DROP_PAUSE_MS}
 * (so a spamming app blocks on its writes, paying for its own output), and a
 * `svc` line says how much was dropped once lines are kept again.
 */
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import type { ServerResponse } from "node:http";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { LOG_LIMIT_BYTES, LOG_MAX_LINE_BYTES } from "../protocol/jobs.js";
import { PROCESS_LAST_LINES } from "../protocol/processes.js";
import { type OutputLog, withoutAnsi } from "../sandbox/sandbox.js";
import { Changes } from "../changes.js";
import { drained } from "../logs.js";

/**
 * What one app's output may cost the node: lines and bytes a second,
 * sustained, with a burst (a stack trace, a start-up banner) let through whole.
 */
export const LOG_RATE = { linesPerSecond: 500, burstLines: 2_000, bytesPerSecond: 1024 * 1024, burstBytes: 4 * 1024 * 1024 } as const;
/** While an app is over its rate, its pipes are read (and the output dropped) at most this often. */
const DROP_PAUSE_MS = 100;

/**
 * Token buckets of one app's output (lines and bytes). A chunk is taken whole
 * while both have tokens, which may leave them in debt; the debt is paid back
 * at the sustained rate before the next chunk is taken, so over any second the
 * app gets its rate and no more.
 */
export class LogBudget {
  #lines: number = LOG_RATE.burstLines;
  #bytes: number = LOG_RATE.burstBytes;
  #at: number;
  /** Output dropped since the last kept lines. */
  droppedLines = 0;
  droppedBytes = 0;

  constructor(now = Date.now()) {
    this.#at = now;
  }

  /** Whether the next chunk may be kept (both buckets hold tokens). */
  open(now = Date.now()): boolean {
    const seconds = (now - this.#at) / 1000;
    this.#at = now;
    this.#lines = Math.min(LOG_RATE.burstLines, this.#lines + seconds * LOG_RATE.linesPerSecond);
    this.#bytes = Math.min(LOG_RATE.burstBytes, this.#bytes + seconds * LOG_RATE.bytesPerSecond);
    return this.#lines > 0 && this.#bytes > 0;
  }

  /** Charges kept output. */
  take(lines: number, bytes: number): void {
    this.#lines -= lines;
    this.#bytes -= bytes;
  }

  /** Counts dropped output. */
  drop(chunk: Buffer): void {
    let lines = 0;
    for (let at = chunk.indexOf(0x0a); at !== -1; at = chunk.indexOf(0x0a, at + 1)) lines++;
    this.droppedLines += lines;
    this.droppedBytes += chunk.length;
  }

  /** The notice of what was dropped since lines were last kept (and forgets it), or null. */
  takeNotice(): string | null {
    if (this.droppedBytes === 0) return null;
    const notice = `log rate limit: dropped ${this.droppedLines} lines (${this.droppedBytes} bytes) of output written faster than ${LOG_RATE.linesPerSecond} lines or ${LOG_RATE.bytesPerSecond / 1024} KiB a second`;
    this.droppedLines = 0;
    this.droppedBytes = 0;
    return notice;
  }
}

/** Size at which the current file becomes the previous one. */
export const APP_LOG_FILE_BYTES = LOG_LIMIT_BYTES / 2;
/** Output waiting for the file beyond which the writers' pipes are paused. */
const QUEUE_HIGH_BYTES = 1024 * 1024;
const CHUNK_BYTES = 64 * 1024;
const NEWLINE = Buffer.from("\n");
const CURRENT = "log";
const PREVIOUS = "log.1";

/** Which part of an app's log a read wants. */
export type LogWindow = {
  /** The last bytes (from the first whole line in them). */
  tailBytes?: number;
  /** The last lines. */
  tailLines?: number;
  /** Lines written at or after this time (epoch ms). */
  since?: number;
  /** Only the lines of this process (`prc_…`). */
  process?: string;
};

/** Keeps the whole lines of `chunk` whose writer is `processId` (app log format: `<time> <stream> <dep>/<prc> …`). */
function lineFilter(processId: string): (chunk: Buffer) => Buffer {
  const tag = Buffer.from(`/${processId} `);
  return (chunk) => {
    const kept: Buffer[] = [];
    for (let at = 0; at < chunk.length; ) {
      const newline = chunk.indexOf(0x0a, at);
      const end = newline === -1 ? chunk.length : newline + 1;
      const line = chunk.subarray(at, end);
      // The tag comes right after `<time> <stream> <deployment>`: within the line's first 120 bytes.
      const found = line.subarray(0, 120).indexOf(tag);
      if (found !== -1) kept.push(line);
      at = end;
    }
    return Buffer.concat(kept);
  };
}

/** One app's log: appends in order through one queue, rotation, and reads by logical offset. */
export class AppLog {
  /** What the app's output may cost the node, shared by all its processes here. */
  readonly budget = new LogBudget();
  readonly #dir: string;
  readonly #changes = new Changes();
  #queue: Buffer[] = [];
  #queuedBytes = 0;
  #draining: Promise<void> | null = null;
  /** Logical offset of the first byte of `log.1` (of `log` when there is no `log.1`). */
  #base = 0;
  #previousBytes = 0;
  #currentBytes = 0;
  /** Rotation and reads take turns, so a read never maps an offset to a file being renamed. */
  #lock: Promise<unknown> = Promise.resolve();
  #closed = false;
  #writeFailed = false;
  /** Pipes paused while the queue is over its bound; resumed once it drains. */
  readonly #paused = new Set<Readable>();
  /** Sees every record appended from now on (the log shipper). */
  #tap: ((records: Buffer) => void) | null = null;

  private constructor(dir: string) {
    this.#dir = dir;
  }

  /** Opens the log of one app (creating its folder), continuing what an earlier builder left; `tap` sees what is appended from then on. */
  static async open(dir: string, tap?: (records: Buffer) => void): Promise<AppLog> {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const log = new AppLog(dir);
    log.#previousBytes = await sizeOf(join(dir, PREVIOUS));
    log.#currentBytes = await sizeOf(join(dir, CURRENT));
    // A builder that died mid-write may have left half a line: end it, so the next record starts its own.
    if (log.#currentBytes > 0 && (await lastByte(join(dir, CURRENT))) !== 0x0a) log.append(NEWLINE);
    log.#tap = tap ?? null;
    return log;
  }

  /** Logical offset one past the last byte on disk. */
  get end(): number {
    return this.#base + this.#previousBytes + this.#currentBytes;
  }

  /** Logical offset of the oldest byte still kept. */
  get start(): number {
    return this.#base;
  }

  /** Queues whole records (lines with their newline) for the file. */
  append(records: Buffer): void {
    if (this.#writeFailed || this.#closed) return;
    this.#tap?.(records);
    this.#queue.push(records);
    this.#queuedBytes += records.length;
    this.#draining ??= this.#drain();
  }

  /** Pauses `source` while the queue is over its bound (an app writing faster than the disk). */
  throttle(source: Readable): void {
    if (this.#queuedBytes <= QUEUE_HIGH_BYTES || this.#paused.has(source)) return;
    this.#paused.add(source);
    source.pause();
  }

  /** Resolves once everything appended so far is in the file. */
  async settled(): Promise<void> {
    while (this.#draining) await this.#draining;
  }

  /** Ends followers; appends after this are dropped. */
  async close(): Promise<void> {
    await this.settled();
    this.#closed = true;
    this.#changes.notify();
  }

  /**
   * Writes the log to `response`: from where `from` says (the last bytes or
   * lines, or the first line written at or after a time; everything kept
   * when it says nothing), only the lines of `from.process` when it names one,
   * then, with `follow`, new lines as they are written, until the client goes
   * away or the log closes.
   */
  async stream(from: LogWindow, follow: boolean, response: ServerResponse): Promise<void> {
    let gone = false;
    const disconnected = new Promise<void>((resolve) =>
      response.once("close", () => {
        gone = true;
        resolve();
      }),
    );
    let position = await this.#startOf(from);
    const keep = from.process ? lineFilter(from.process) : null;
    for (;;) {
      const changed = follow && !this.#closed ? this.#changes.wait() : null;
      while (!gone && position < this.end) {
        position = Math.max(position, this.start); // fell behind a rotation: what it missed is gone
        let chunk = await this.#read(position, Math.min(CHUNK_BYTES, this.end - position));
        if (chunk.length === 0) break;
        if (keep) {
          // Whole lines only (the rest is read again with the next chunk), those of the process asked for.
          const last = chunk.lastIndexOf(0x0a);
          if (last === -1 && chunk.length < CHUNK_BYTES) break;
          chunk = last === -1 ? chunk : chunk.subarray(0, last + 1);
          position += chunk.length;
          const kept = keep(chunk);
          if (kept.length > 0 && !response.write(kept)) await drained(response);
          continue;
        }
        position += chunk.length;
        if (!response.write(chunk)) await drained(response);
      }
      if (gone || !changed) break;
      await Promise.race([changed, disconnected]);
    }
    if (!gone) response.end();
  }

  /** Where a read of `from` starts. */
  async #startOf(from: LogWindow): Promise<number> {
    if (from.since !== undefined) return this.#firstAt(from.since);
    if (from.tailLines !== undefined) return this.#lastLines(from.tailLines);
    if (from.tailBytes !== undefined) return this.#lineStart(Math.max(this.start, this.end - from.tailBytes));
    return this.start;
  }

  /** The offset of the last `count` lines (0: the end). */
  async #lastLines(count: number): Promise<number> {
    if (count === 0) return this.end;
    let position = this.end;
    let seen = 0;
    while (position > this.start) {
      const from = Math.max(this.start, position - CHUNK_BYTES);
      const chunk = await this.#read(from, position - from);
      if (chunk.length === 0) break;
      // Each newline but the log's very last ends a line before the ones counted so far.
      for (let at = chunk.length - 1; at >= 0; at--) {
        if (chunk[at] !== 0x0a || from + at === this.end - 1) continue;
        if (++seen === count) return from + at + 1;
      }
      position = from;
    }
    return this.start;
  }

  /** The offset of the first line whose time is at or after `since` (epoch ms): lines are in time order, so a search. */
  async #firstAt(since: number): Promise<number> {
    let low = this.start;
    let high = this.end;
    while (high - low > CHUNK_BYTES) {
      const middle = await this.#lineStart(Math.floor((low + high) / 2));
      const time = await this.#timeAt(middle);
      if (time === null || middle >= high) break;
      if (time < since) low = middle;
      else high = middle;
    }
    for (let position = await this.#lineStart(low); position < this.end; ) {
      const chunk = await this.#read(position, Math.min(CHUNK_BYTES, this.end - position));
      if (chunk.length === 0) break;
      let at = 0;
      while (at < chunk.length) {
        const newline = chunk.indexOf(0x0a, at);
        if (newline === -1) break;
        const time = Date.parse(chunk.toString("latin1", at, at + 24));
        if (!Number.isNaN(time) && time >= since) return position + at;
        at = newline + 1;
      }
      if (at === 0) break;
      position += at;
    }
    return this.end;
  }

  /** The time of the line starting at `offset`, or null. */
  async #timeAt(offset: number): Promise<number | null> {
    const head = await this.#read(offset, Math.min(24, this.end - offset));
    const time = Date.parse(head.toString("latin1"));
    return Number.isNaN(time) ? null : time;
  }

  /** The offset of the first line starting at or after `offset`. */
  async #lineStart(offset: number): Promise<number> {
    if (offset <= this.start) return this.start;
    let position = offset - 1;
    // A record is at most LOG_MAX_LINE_BYTES plus its prefix: two chunks always find its end.
    for (let scanned = 0; scanned < 2 * CHUNK_BYTES && position < this.end; ) {
      const chunk = await this.#read(position, Math.min(CHUNK_BYTES, this.end - position));
      if (chunk.length === 0) break;
      const newline = chunk.indexOf(0x0a);
      if (newline !== -1) return position + newline + 1;
      position += chunk.length;
      scanned += chunk.length;
    }
    return position;
  }

  /** Up to `length` bytes from logical `offset` (within one file: callers loop). */
  #read(offset: number, length: number): Promise<Buffer> {
    return this.#exclusive(async () => {
      if (offset < this.#base) return Buffer.alloc(0);
      const inPrevious = offset < this.#base + this.#previousBytes;
      const path = join(this.#dir, inPrevious ? PREVIOUS : CURRENT);
      const at = inPrevious ? offset - this.#base : offset - this.#base - this.#previousBytes;
      const available = (inPrevious ? this.#previousBytes : this.#currentBytes) - at;
      const buffer = Buffer.allocUnsafe(Math.max(0, Math.min(length, available)));
      if (buffer.length === 0) return buffer;
      const file = await open(path, "r");
      try {
        const { bytesRead } = await file.read(buffer, 0, buffer.length, at);
        return buffer.subarray(0, bytesRead);
      } finally {
        await file.close();
      }
    });
  }

  #exclusive<T>(work: () => Promise<T>): Promise<T> {
    const result = this.#lock.then(work, work);
    this.#lock = result.catch(() => undefined);
    return result;
  }

  async #drain(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        // Take what fits in the current file (at least one record, so a huge one cannot stall).
        let take = 0;
        let bytes = 0;
        while (take < this.#queue.length) {
          const next = this.#queue[take]!.length;
          if (this.#currentBytes + bytes + next > APP_LOG_FILE_BYTES && (take > 0 || this.#currentBytes > 0)) break;
          bytes += next;
          take++;
        }
        if (take === 0) {
          await this.#rotate();
          continue;
        }
        const batch = Buffer.concat(this.#queue.splice(0, take), bytes);
        const file = await open(join(this.#dir, CURRENT), "a", 0o600);
        try {
          await file.appendFile(batch);
        } finally {
          await file.close();
        }
        this.#currentBytes += batch.length;
        this.#queuedBytes -= batch.length;
        this.#changes.notify();
        if (this.#queuedBytes <= QUEUE_HIGH_BYTES / 2) this.#resume();
      }
    } catch (error) {
      this.#writeFailed = true;
      this.#queue = [];
      this.#queuedBytes = 0;
      this.#resume();
      console.error(`builder: app log write failed (${this.#dir}): ${String(error)}`);
    } finally {
      this.#draining = null;
    }
  }

  #resume(): void {
    for (const source of this.#paused) source.resume();
    this.#paused.clear();
  }

  /** `log` becomes `log.1` (the older one is dropped); the next write starts a fresh `log`. */
  #rotate(): Promise<void> {
    return this.#exclusive(async () => {
      await rename(join(this.#dir, CURRENT), join(this.#dir, PREVIOUS));
      this.#base += this.#previousBytes;
      this.#previousBytes = this.#currentBytes;
      this.#currentBytes = 0;
    });
  }
}

/**
 * What one process writes into its app's log ({@link OutputLog}, so the sandbox
 * captures into it as into a job log), remembering its own last lines for
 * `lastLines` (the app's log may interleave another process's during a deploy).
 */
export class ProcessOutput implements OutputLog {
  readonly #log: AppLog;
  /** `<deployment>/<process>`: which release and which process wrote a line. */
  readonly #writer: string;
  readonly #partial = new Map<"out" | "err", Buffer>();
  /** The last records (without newline), oldest first. */
  #last: Buffer[] = [];

  constructor(log: AppLog, processId: string, deploymentId: string | null) {
    this.#log = log;
    this.#writer = `${deploymentId ?? "-"}/${processId}`;
  }

  note(text: string): void {
    this.#write("svc", text.split("\n").map((line) => Buffer.from(line)));
  }

  capture(stream: "out" | "err", source: Readable): void {
    const budget = this.#log.budget;
    source.on("data", (chunk: Buffer) => {
      if (!budget.open()) {
        // Over the app's rate: counted, not processed, and the pipe read again only after a pause.
        this.#flushPartial(stream);
        budget.drop(chunk);
        source.pause();
        setTimeout(() => source.resume(), DROP_PAUSE_MS).unref();
        return;
      }
      const notice = budget.takeNotice();
      if (notice) this.note(notice);
      budget.take(this.#ingest(stream, chunk), chunk.length);
      this.#log.throttle(source);
    });
    source.on("end", () => {
      this.#flushPartial(stream);
      const notice = budget.takeNotice();
      if (notice) this.note(notice);
    });
  }

  /** The process's last lines in the log (at most PROCESS_LAST_LINES), oldest first. */
  lastLines(): string[] {
    return this.#last.map((line) => line.toString("utf8"));
  }

  /** Resolves once everything written so far is in the file. */
  settled(): Promise<void> {
    return this.#log.settled();
  }

  /** Splits the chunk into records and writes them; how many lines it wrote. */
  #ingest(stream: "out" | "err", chunk: Buffer): number {
    const pending = this.#partial.get(stream);
    const data = pending ? Buffer.concat([pending, chunk]) : chunk;
    const lines: Buffer[] = [];
    let start = 0;
    for (;;) {
      const newline = data.indexOf(0x0a, start);
      if (newline !== -1 && newline - start <= LOG_MAX_LINE_BYTES) {
        lines.push(withoutAnsi(data.subarray(start, newline)));
        start = newline + 1;
      } else if (data.length - start >= LOG_MAX_LINE_BYTES) {
        lines.push(withoutAnsi(data.subarray(start, start + LOG_MAX_LINE_BYTES)));
        start += LOG_MAX_LINE_BYTES;
      } else {
        break;
      }
    }
    this.#partial.set(stream, Buffer.from(data.subarray(start)));
    this.#write(stream, lines);
    return lines.length;
  }

  #flushPartial(stream: "out" | "err"): void {
    const pending = this.#partial.get(stream);
    this.#partial.delete(stream);
    if (pending && pending.length > 0) this.#write(stream, [withoutAnsi(pending)]);
  }

  /**
   * Appends the lines as records (one time stamp for all: they arrived
   * together) and remembers the last ones, as `<time> <stream> <text>` (all
   * are this process's: the writer's tag would say nothing there).
   */
  #write(stream: "out" | "err" | "svc", lines: Buffer[]): void {
    if (lines.length === 0) return;
    const head = `${new Date().toISOString()} ${stream} `;
    const prefix = Buffer.from(`${head}${this.#writer} `);
    const parts: Buffer[] = [];
    for (const line of lines) parts.push(prefix, line, NEWLINE);
    this.#log.append(Buffer.concat(parts));
    const short = Buffer.from(head);
    const kept = lines.slice(-PROCESS_LAST_LINES).map((line) => Buffer.concat([short, line]));
    this.#last = [...this.#last, ...kept].slice(-PROCESS_LAST_LINES);
  }
}

/** Sees the records appended to an app's log. */
export type LogTap = (appId: string, records: Buffer) => void;

/** Every app's log on this node, opened on first use. */
export class AppLogs {
  readonly #root: string;
  readonly #logs = new Map<string, Promise<AppLog>>();
  readonly #tap: LogTap | undefined;

  /** `tap` sees every record appended to any app's log (the log shipper). */
  constructor(root: string, tap?: LogTap) {
    this.#root = root;
    this.#tap = tap;
  }

  /** The app's log (appId already validated: it becomes a directory name). */
  get(appId: string): Promise<AppLog> {
    let log = this.#logs.get(appId);
    if (!log) {
      const tap = this.#tap;
      log = AppLog.open(join(this.#root, appId), tap && ((records) => tap(appId, records)));
      this.#logs.set(appId, log);
      log.catch(() => this.#logs.delete(appId));
    }
    return log;
  }

  /**
   * Deletes the logs of apps that run nothing here (`active` says which do)
   * and were last written more than `maxAgeMs` ago.
   */
  async prune(active: (appId: string) => boolean, maxAgeMs: number): Promise<void> {
    const cutoff = Date.now() - maxAgeMs;
    for (const appId of await readdir(this.#root).catch(() => [] as string[])) {
      if (active(appId)) continue;
      const written = await stat(join(this.#root, appId, CURRENT)).then(
        (stats) => stats.mtimeMs,
        () => 0,
      );
      if (written >= cutoff) continue;
      const open = this.#logs.get(appId);
      this.#logs.delete(appId);
      await open?.then((log) => log.close()).catch(() => undefined);
      await rm(join(this.#root, appId), { recursive: true, force: true });
    }
  }

  /** Ends every follower (builder shutdown), after the last lines reached the files. */
  async close(): Promise<void> {
    await Promise.all([...this.#logs.values()].map((log) => log.then((opened) => opened.close()).catch(() => undefined)));
  }
}

async function sizeOf(path: string): Promise<number> {
  return stat(path).then(
    (stats) => stats.size,
    () => 0,
  );
}

async function lastByte(path: string): Promise<number | null> {
  const file = await open(path, "r");
  try {
    const { size } = await file.stat();
    if (size === 0) return null;
    const buffer = Buffer.alloc(1);
    await file.read(buffer, 0, 1, size - 1);
    return buffer[0]!;
  } finally {
    await file.close();
  }
}
