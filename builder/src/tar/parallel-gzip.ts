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
 *
 * Blocks that cannot shrink (already compressed data: images, archives,
 * encrypted files) are stored rather than searched for matches: a fast trial
 * on samples spread over the block decides, so such data costs a copy and a
 * CRC instead of a full level-6 search that would gain nothing. The output is
 * still standard gzip (deflate's stored blocks).
 */
import { promisify } from "node:util";
import { deflateRawSync, gzip } from "node:zlib";

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

/** The trial: this many samples of this size, spread evenly over a block, compressed together at level 1. */
const TRIAL_SAMPLES = 16;
const TRIAL_SAMPLE_BYTES = 1024;
const TRIAL_BYTES = TRIAL_SAMPLES * TRIAL_SAMPLE_BYTES;
/** A block whose samples do not shrink below this fraction is stored. */
const STORE_ABOVE_RATIO = 0.98;

/**
 * How well a block compresses, judged from samples spread over it and
 * compressed together at level 1 (about 2 % of what level 6 on the whole
 * block costs): compressed size over size, or null for a block too small to
 * sample. Spread samples mean a block that mixes compressible and
 * incompressible data is judged compressible.
 */
export function trialRatio(block: Buffer): number | null {
  if (block.length < 2 * TRIAL_BYTES) return null;
  const stride = Math.floor(block.length / TRIAL_SAMPLES);
  const samples = Buffer.allocUnsafe(TRIAL_BYTES);
  for (let i = 0; i < TRIAL_SAMPLES; i++) block.copy(samples, i * TRIAL_SAMPLE_BYTES, i * stride, i * stride + TRIAL_SAMPLE_BYTES);
  return deflateRawSync(samples, { level: 1 }).length / TRIAL_BYTES;
}

/**
 * Output room that takes a whole member in one threadpool round trip: deflate
 * can expand incompressible data by a few bytes per 16 KiB stored block, plus
 * the gzip header and trailer. A block the trial says compresses gets room for
 * a little more than the trial's ratio (level 6 does better than level 1), so
 * the buffer allocated is close to what is used; should it not suffice, zlib
 * simply continues into another.
 */
function outputRoom(bytes: number, ratio: number | null): number {
  const worst = bytes + (bytes >> 8) + 1024;
  return ratio === null ? worst : Math.min(worst, Math.ceil(bytes * ratio * 1.1) + 4096);
}

/** Compresses `source` into concatenated gzip members, in order. */
export async function* parallelGzip(source: AsyncIterable<Buffer>, options: ParallelGzipOptions): AsyncGenerator<Buffer> {
  const { blockBytes } = options;
  const inFlight: Promise<Buffer>[] = [];
  /** Blocks whose compression is done, to fill again: at most `concurrency` + 1 blocks ever exist. */
  const free: Buffer[] = [];
  let block: Buffer = Buffer.allocUnsafe(blockBytes);
  let filled = 0;
  let dispatched = 0;
  const dispatch = (whole: Buffer, length: number) => {
    const data = whole.subarray(0, length);
    const ratio = trialRatio(data);
    const store = ratio !== null && ratio > STORE_ABOVE_RATIO;
    const member = gzipAsync(data, { level: store ? 0 : options.level, chunkSize: outputRoom(length, ratio) });
    // Awaited in order below; until then a rejection must not count as unhandled.
    member.then(
      () => free.push(whole),
      () => undefined,
    );
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
        dispatch(block, filled);
        while (inFlight.length >= options.concurrency) yield await inFlight.shift()!;
        block = free.pop() ?? Buffer.allocUnsafe(blockBytes);
        filled = 0;
      }
    }
    // An empty input still makes one (empty) member, so the output is a valid gzip file.
    if (filled > 0 || dispatched === 0) dispatch(block, filled);
    while (inFlight.length > 0) yield await inFlight.shift()!;
  } finally {
    // Stopped early (a failure downstream, a cancel): let the threadpool finish what it holds.
    await Promise.allSettled(inFlight);
  }
}
