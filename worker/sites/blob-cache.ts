/**
 * The hot files of static sites, kept in the isolate's memory in front of R2.
 * Blobs are content-addressed (keyed by their SHA-256, which the edge checks
 * before admitting them), so an entry can never be stale: a new deployment
 * that changes a file changes its key. Only small blobs are kept, and the
 * total is capped; the least recently used go first. Pure bookkeeping, no
 * I/O, so it is unit-tested on its own (STYLE 10).
 */

/** Limits of one cache. */
export interface BlobCacheLimits {
  /** Bytes all entries may hold together. */
  maxBytes: number;
  /** Largest blob admitted; bigger ones are left to R2 (and the Cache API). */
  maxEntryBytes: number;
}

/** A least-recently-used map of SHA-256 → bytes, bounded in total bytes. */
export class BlobCache {
  readonly #limits: BlobCacheLimits;
  /** Insertion order is recency order: a hit moves its entry to the end. */
  readonly #entries = new Map<string, Uint8Array>();
  #bytes = 0;

  constructor(limits: BlobCacheLimits) {
    this.#limits = limits;
  }

  /** Bytes held. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Whether a blob of this size may be admitted. */
  admits(size: number): boolean {
    return size <= this.#limits.maxEntryBytes && size <= this.#limits.maxBytes;
  }

  get(sha256: string): Uint8Array | undefined {
    const bytes = this.#entries.get(sha256);
    if (bytes === undefined) return undefined;
    this.#entries.delete(sha256);
    this.#entries.set(sha256, bytes);
    return bytes;
  }

  /** Keeps `bytes` under its hash, evicting the least recently used until the total fits; too large a blob is not kept. */
  set(sha256: string, bytes: Uint8Array): void {
    if (!this.admits(bytes.byteLength)) return;
    const previous = this.#entries.get(sha256);
    if (previous !== undefined) {
      this.#entries.delete(sha256);
      this.#bytes -= previous.byteLength;
    }
    for (const [key, old] of this.#entries) {
      if (this.#bytes + bytes.byteLength <= this.#limits.maxBytes) break;
      this.#entries.delete(key);
      this.#bytes -= old.byteLength;
    }
    this.#entries.set(sha256, bytes);
    this.#bytes += bytes.byteLength;
  }
}
