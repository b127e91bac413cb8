/**
 * gzip on every core, the pigz way: the input is cut into fixed-size blocks,
 * each block is compressed on its own into a complete gzip member, and the
 * members come out in input order. A gzip file may hold several members
 * (RFC 1952 §2.2); `gzip -d`, GNU tar, bsdtar, Python's tarfile and Node's
 * gunzip all read them back as one stream.
 *
 * The compression runs on libuv's threadpool (Node's asynchronous zlib does),
 * so the event loop keeps packing the next block, hashing and uploading while
 * up to `concurrency` blocks compress at once. Memory is bounded by the
 * blocks in flight plus the one being filled, whatever the input's size.
 */
import { promisify } from "node:util";
import { gzip } from "node:zlib";

const gzipAsync = promisify(gzip);

/** How blocks are cut and compressed. */
export interface ParallelGzipOptions {
  /** zlib level, 1–9 (6 is what `gzip` and `tar czf` use). */
  level: number;
  /** Uncompressed bytes per member: larger loses less ratio at block edges, smaller keeps more threads busy. */
  blockBytes: number;
  /** Blocks compressing at once. More than the cores keeps them busy while the event loop fills the next block. */
  concurrency: number;
}

/**
 * Output room for one block in one go: deflate can expand incompressible data
 * by a few bytes per 16 KiB stored block plus the gzip header and trailer, so
 * a block never needs a second threadpool round trip.
 */
const outputRoomFor = (bytes: number) => bytes + (bytes >> 8) + 1024;

/** Compresses `source` into concatenated gzip members, in order. */
export async function* parallelGzip(source: AsyncIterable<Buffer>, options: ParallelGzipOptions): AsyncGenerator<Buffer> {
  const { blockBytes } = options;
  const zlibOptions = { level: options.level, chunkSize: outputRoomFor(blockBytes) };
  const inFlight: Promise<Buffer>[] = [];
  let block = Buffer.allocUnsafe(blockBytes);
  let filled = 0;
  let dispatched = 0;
  const dispatch = (data: Buffer) => {
    const member = gzipAsync(data, zlibOptions);
    // Awaited in order below; until then a rejection must not count as unhandled.
    member.catch(() => undefined);
    inFlight.push(member);
    dispatched++;
  };
  try {
    for await (const chunk of source) {
      let offset = 0;
      while (offset < chunk.length) {
        const take = Math.min(blockBytes - filled, chunk.length - offset);
        chunk.copy(block, filled, offset, offset + take);
        filled += take;
        offset += take;
        if (filled < blockBytes) continue;
        dispatch(block);
        block = Buffer.allocUnsafe(blockBytes);
        filled = 0;
        while (inFlight.length >= options.concurrency) yield await inFlight.shift()!;
      }
    }
    // An empty input still makes one (empty) member, so the output is a valid gzip file.
    if (filled > 0 || dispatched === 0) dispatch(block.subarray(0, filled));
    while (inFlight.length > 0) yield await inFlight.shift()!;
  } finally {
    // Stopped early (a failure downstream, a cancel): let the threadpool finish what it holds.
    await Promise.allSettled(inFlight);
  }
}
