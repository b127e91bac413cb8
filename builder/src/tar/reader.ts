/**
 * A streaming tar parser: members come out one at a time with their content as
 * an async iterable of the chunks that arrived, so memory stays bounded by the
 * chunk size whatever the archive holds. pax (`x`, `g`) and GNU long-name
 * (`L`, `K`) records are applied to the member that follows them and never
 * returned themselves.
 */
import {
  BLOCK_SIZE,
  TarFormatError,
  decodeHeader,
  isZeroBlock,
  paddingAfter,
  parsePaxRecords,
} from "./format.js";

/** Largest pax or GNU long-name record accepted (a path is at most a few KiB). */
const MAX_META_BYTES = 1024 * 1024;

/** Member types as restore judges them. */
export type EntryType = "file" | "directory" | "symlink" | "hardlink" | "char-device" | "block-device" | "fifo" | "unsupported";

/** One archive member. */
export interface TarEntry {
  /** As stored (after pax/GNU long names), not yet checked or normalised. */
  path: string;
  type: EntryType;
  /** The raw type flag, for messages about unsupported members. */
  typeflag: string;
  mode: number;
  /** Unix seconds (pax may give fractions). */
  mtime: number;
  /** Content bytes that follow (files; 0 for most other types). */
  size: number;
  linkpath: string;
  /** Offset of the content in the uncompressed stream: where the member ends is `dataOffset + size`. */
  dataOffset: number;
}

const TYPES: Record<string, EntryType> = {
  "0": "file",
  "\0": "file",
  "7": "file",
  "1": "hardlink",
  "2": "symlink",
  "3": "char-device",
  "4": "block-device",
  "5": "directory",
  "6": "fifo",
};

const truncated = () => new TarFormatError("tar stream ends in the middle of a member (truncated archive)");

/** Pulls exact byte counts out of a stream of arbitrary chunks. */
class ByteReader {
  readonly #iterator: AsyncIterator<Buffer>;
  #chunk: Buffer = Buffer.alloc(0);
  /** Bytes consumed so far. */
  position = 0;

  constructor(source: AsyncIterable<Buffer>) {
    this.#iterator = source[Symbol.asyncIterator]();
  }

  async #fill(): Promise<boolean> {
    while (this.#chunk.length === 0) {
      const next = await this.#iterator.next();
      if (next.done) return false;
      this.#chunk = next.value;
    }
    return true;
  }

  /** Exactly `count` bytes, or null when the stream ended cleanly before them. */
  async read(count: number): Promise<Buffer | null> {
    if (!(await this.#fill())) return null;
    if (this.#chunk.length >= count) {
      const out = this.#chunk.subarray(0, count);
      this.#chunk = this.#chunk.subarray(count);
      this.position += count;
      return out;
    }
    const out = Buffer.allocUnsafe(count);
    let filled = 0;
    while (filled < count) {
      if (!(await this.#fill())) throw truncated();
      const take = Math.min(count - filled, this.#chunk.length);
      this.#chunk.copy(out, filled, 0, take);
      this.#chunk = this.#chunk.subarray(take);
      filled += take;
    }
    this.position += count;
    return out;
  }

  /** The next `count` bytes as they arrive. */
  async *take(count: number): AsyncGenerator<Buffer> {
    let left = count;
    while (left > 0) {
      if (!(await this.#fill())) throw truncated();
      const piece = this.#chunk.subarray(0, Math.min(left, this.#chunk.length));
      this.#chunk = this.#chunk.subarray(piece.length);
      this.position += piece.length;
      left -= piece.length;
      yield piece;
    }
  }

  async skip(count: number): Promise<void> {
    for await (const _ of this.take(count));
  }

  /** Reads whatever follows to the end (so the caller's byte counting and checks see all of it). */
  async drain(): Promise<void> {
    this.position += this.#chunk.length;
    this.#chunk = Buffer.alloc(0);
    for (let next = await this.#iterator.next(); !next.done; next = await this.#iterator.next()) {
      this.position += next.value.length;
    }
  }
}

/**
 * Iterates an uncompressed tar stream. Call {@link next} for each member and
 * read its content with {@link body} before the following `next` (unread
 * content is skipped). `next` answers null at the end-of-archive marker; an
 * archive that stops without one is reported as truncated.
 */
export class TarReader {
  readonly #bytes: ByteReader;
  /** Unread content of the current member, and the padding after it. */
  #contentLeft = 0;
  #paddingLeft = 0;

  constructor(source: AsyncIterable<Buffer>) {
    this.#bytes = new ByteReader(source);
  }

  /** The next member, or null at the end-of-archive marker. */
  async next(): Promise<TarEntry | null> {
    await this.#bytes.skip(this.#contentLeft + this.#paddingLeft);
    this.#contentLeft = 0;
    this.#paddingLeft = 0;
    let pax = new Map<string, string>();
    let longName: string | null = null;
    let longLink: string | null = null;
    for (;;) {
      const block = await this.#bytes.read(BLOCK_SIZE);
      if (block === null) throw new TarFormatError("tar stream ends without the end-of-archive marker (truncated archive)");
      if (isZeroBlock(block)) return null;
      const header = decodeHeader(block);
      const { typeflag } = header;
      if (typeflag === "x" || typeflag === "g" || typeflag === "L" || typeflag === "K") {
        if (header.size > MAX_META_BYTES) throw new TarFormatError(`extended header of ${header.size} bytes is too large`);
        const data = (await this.#bytes.read(header.size + paddingAfter(header.size))) ?? Buffer.alloc(0);
        if (data.length < header.size) throw truncated();
        const content = data.subarray(0, header.size);
        // Global pax headers (`g`) carry archive-wide defaults such as comments; none of their keys matter here.
        if (typeflag === "x") pax = new Map([...pax, ...parsePaxRecords(content)]);
        const text = () => {
          const end = content.indexOf(0);
          return content.subarray(0, end === -1 ? content.length : end).toString("utf8");
        };
        if (typeflag === "L") longName = text();
        if (typeflag === "K") longLink = text();
        continue;
      }
      const path = pax.get("path") ?? longName ?? header.name;
      const sizeText = pax.get("size");
      const size = sizeText === undefined ? header.size : Number(sizeText);
      if (!Number.isSafeInteger(size) || size < 0) throw new TarFormatError(`invalid size in pax header of ${path}`);
      const mtimeText = pax.get("mtime");
      const mtime = mtimeText === undefined ? header.mtime : Number(mtimeText);
      let type = TYPES[typeflag] ?? "unsupported";
      // Pre-POSIX archives mark directories only by a trailing slash.
      if (type === "file" && typeflag !== "7" && path.endsWith("/")) type = "directory";
      this.#contentLeft = size;
      this.#paddingLeft = paddingAfter(size);
      return {
        path,
        type,
        typeflag,
        mode: header.mode,
        mtime: Number.isFinite(mtime) ? mtime : header.mtime,
        size,
        linkpath: pax.get("linkpath") ?? longLink ?? header.linkname,
        dataOffset: this.#bytes.position,
      };
    }
  }

  /** The current member's content, chunk by chunk. */
  async *body(): AsyncGenerator<Buffer> {
    for await (const piece of this.#bytes.take(this.#contentLeft)) {
      this.#contentLeft -= piece.length;
      yield piece;
    }
    await this.#bytes.skip(this.#paddingLeft);
    this.#paddingLeft = 0;
  }

  /** Consumes what follows the end-of-archive marker (padding), so the whole stream is read. */
  drain(): Promise<void> {
    return this.#bytes.drain();
  }
}
