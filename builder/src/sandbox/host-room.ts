/**
 * What this node's host has promised, and the one check everything that
 * takes room or memory goes through, so the host never promises more than it
 * has (issue 28):
 *
 * - **Disk room** of the data directory's filesystem: every sparse image
 *   (disks, restore stagings, processes' working trees) may come to fill its
 *   whole size, so what each has not allocated yet is promised. Something new
 *   is made only when it fits beside every promise and the reserve, one check
 *   at a time with its creation, so two requests cannot share the same room.
 * - **Memory**: every app process's memory limit is promised for as long as
 *   the process lives. A new one is admitted only when the host's memory,
 *   less a reserve, holds it beside every promise of every node on this host
 *   (a ledger of one file per builder process in /run/svc-builder/memory, so
 *   two nodes on one host do not promise the same memory twice).
 *
 * Refusals say the numbers, and the node answers them 507: the control plane
 * then tries another node.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { totalmem } from "node:os";
import { join } from "node:path";
import { pidAlive } from "./cgroups.js";
import { formatBytes } from "../units.js";

/** Share of the data dir's filesystem kept free of promises when no reserve is configured. */
const DEFAULT_DISK_RESERVE_SHARE = 0.1;
/** Memory kept for the host itself (the builder, jobs' sandboxes, the kernel) when none is configured: 10 %, at least 1 GiB. */
const DEFAULT_MEMORY_RESERVE_SHARE = 0.1;
const MIN_MEMORY_RESERVE_BYTES = 1024 ** 3;
const LEDGER_DIR = "/run/svc-builder/memory";

/** The host cannot hold what was asked (disk room). */
export class InsufficientStorage extends Error {}
/** The host cannot hold what was asked (memory). */
export class InsufficientMemory extends Error {}

export interface HostRoomOptions {
  dataDir: string;
  /** Bytes of the data dir's filesystem never promised; null: 10 % of its size. */
  diskReserveBytes: number | null;
  /** Bytes of memory never promised to app processes; null: 10 % of the host's, at least 1 GiB. */
  memoryReserveBytes: number | null;
  /** Where builders on this host record their memory promises (tests give their own). */
  ledgerDir?: string;
}

/** One holder of promised disk room: what its images may still take. */
export type DiskPromises = () => Promise<number>;

export class HostRoom {
  readonly #options: HostRoomOptions;
  readonly #ledgerDir: string;
  readonly #sources: DiskPromises[] = [];
  #checking: Promise<unknown> = Promise.resolve();
  /** Memory promised by this builder, per holder (a process id). */
  readonly #memory = new Map<string, number>();

  constructor(options: HostRoomOptions) {
    this.#options = options;
    this.#ledgerDir = options.ledgerDir ?? ledgerDir(options.dataDir);
    mkdirSync(this.#ledgerDir, { recursive: true, mode: 0o700 });
    this.#record();
  }

  /** Adds a holder of sparse images whose unallocated part counts as promised. */
  addDiskPromises(source: DiskPromises): void {
    this.#sources.push(source);
  }

  /**
   * Runs `create` (which makes something that may take `extraBytes` of the
   * filesystem) only if it fits beside every promise and the reserve;
   * otherwise throws {@link InsufficientStorage} with the numbers.
   */
  withDiskRoom<T>(extraBytes: number, what: string, create: () => Promise<T>): Promise<T> {
    const work = async () => {
      const room = await this.diskRoom();
      if (room.promisedBytes + extraBytes > room.freeBytes - room.reserveBytes) {
        throw new InsufficientStorage(
          `the builder's host cannot hold ${what}: ${formatBytes(room.freeBytes)} free, of which ${formatBytes(room.reserveBytes)} is kept in reserve ` +
            `and ${formatBytes(room.promisedBytes)} is promised to existing disks and working trees (room they do not use yet); ` +
            `${formatBytes(extraBytes)} more does not fit`,
        );
      }
      return create();
    };
    const result = this.#checking.then(work, work);
    this.#checking = result.catch(() => undefined);
    return result;
  }

  /** The filesystem's free bytes, its reserve, and what is promised of it. */
  async diskRoom(): Promise<{ freeBytes: number; reserveBytes: number; promisedBytes: number }> {
    const fs = await statfs(this.#options.dataDir);
    let promisedBytes = 0;
    for (const source of this.#sources) promisedBytes += await source();
    return {
      freeBytes: fs.bavail * fs.bsize,
      reserveBytes: this.#options.diskReserveBytes ?? Math.round(fs.blocks * fs.bsize * DEFAULT_DISK_RESERVE_SHARE),
      promisedBytes,
    };
  }

  /** Memory the host may promise to app processes in all. */
  get memoryCapacityBytes(): number {
    const total = totalmem();
    const reserve = this.#options.memoryReserveBytes ?? Math.max(MIN_MEMORY_RESERVE_BYTES, Math.round(total * DEFAULT_MEMORY_RESERVE_SHARE));
    return Math.max(0, total - reserve);
  }

  /** Memory this builder has promised. */
  get memoryPromisedBytes(): number {
    let sum = 0;
    for (const bytes of this.#memory.values()) sum += bytes;
    return sum;
  }

  /** Memory the host may still promise to app processes (less every node's promises on it). */
  get memoryFreeBytes(): number {
    return Math.max(0, this.memoryCapacityBytes - this.#othersPromised() - this.memoryPromisedBytes);
  }

  /**
   * Promises `bytes` of memory to `holder` if the host holds it beside every
   * node's promises; otherwise throws {@link InsufficientMemory} with the numbers.
   * Synchronous, so two admissions in this builder never share the same memory.
   */
  promiseMemory(holder: string, bytes: number, what: string): void {
    const others = this.#othersPromised();
    const mine = this.memoryPromisedBytes;
    const capacity = this.memoryCapacityBytes;
    if (others + mine + bytes > capacity) {
      throw new InsufficientMemory(
        `the builder's host cannot hold ${what}: ${formatBytes(capacity)} of its memory may be promised to apps ` +
          `and ${formatBytes(others + mine)} already is; ${formatBytes(bytes)} more does not fit`,
      );
    }
    this.#memory.set(holder, bytes);
    this.#record();
  }

  /** Gives back what `holder` was promised (idempotent). */
  releaseMemory(holder: string): void {
    if (this.#memory.delete(holder)) this.#record();
  }

  /** Removes this builder's line of the ledger (at shutdown). */
  close(): void {
    rmSync(join(this.#ledgerDir, String(process.pid)), { force: true });
  }

  /** What the other builders of this host promised (their ledger lines; lines of dead processes are dropped). */
  #othersPromised(): number {
    let sum = 0;
    for (const name of readdirSync(this.#ledgerDir)) {
      const pid = Number(name);
      if (!Number.isInteger(pid) || pid === process.pid) continue;
      if (!pidAlive(pid)) {
        rmSync(join(this.#ledgerDir, name), { force: true });
        continue;
      }
      try {
        sum += Number(JSON.parse(readFileSync(join(this.#ledgerDir, name), "utf8")).bytes) || 0;
      } catch {
        // being written: its last value is a moment away
      }
    }
    return sum;
  }

  #record(): void {
    const file = join(this.#ledgerDir, String(process.pid));
    writeFileSync(`${file}.tmp`, JSON.stringify({ bytes: this.memoryPromisedBytes, dataDir: this.#options.dataDir }), { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }
}

/** The host's ledger, or (a builder that may not write /run) one of its own beside its data. */
function ledgerDir(dataDir: string): string {
  try {
    mkdirSync(LEDGER_DIR, { recursive: true, mode: 0o700 });
    return LEDGER_DIR;
  } catch {
    const own = join(dataDir, "memory-ledger");
    mkdirSync(own, { recursive: true, mode: 0o700 });
    return own;
  }
}
