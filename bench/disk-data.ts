/**
 * The deterministic disk contents the disk benchmarks share (bench/backup.ts,
 * bench/disk-roundtrip.ts): seeded, so every run and every tool sees the same
 * bytes.
 *
 * {@link generate} writes 40 % compressible JSON lines in 8 MiB files, 40 %
 * incompressible bytes in 16 MiB files, and 20 % small files (1-16 KiB, half
 * JSON, half random) spread over nested directories.
 */
import { createCipheriv, createHash } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { prng } from "../scripts/prng.js";

export const MiB = 1024 * 1024;

/** Deterministic bytes: AES-256-CTR keystream under a key derived from the seed (fast, and incompressible). */
export function randomStream(seed: string): (bytes: number) => Buffer {
  const key = createHash("sha256").update(seed).digest();
  const cipher = createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
  return (bytes) => cipher.update(Buffer.alloc(bytes));
}

export const WORDS = "alpha beta gamma delta order user invoice paid pending shipped berlin paris tokyo retry cache ok error".split(" ");

/** `bytes` bytes of JSON lines (an application's log or export), cut at exactly that length. */
export function jsonLines(random: () => number, bytes: number): Buffer {
  const lines: string[] = [];
  let size = 0;
  for (let id = 0; size < bytes; id++) {
    const pick = () => WORDS[Math.floor(random() * WORDS.length)];
    const line = JSON.stringify({
      id,
      at: new Date(1_700_000_000_000 + id * 1000).toISOString(),
      kind: pick(),
      city: pick(),
      amount: Math.round(random() * 100_000) / 100,
      tags: [pick(), pick()],
      note: `${pick()} ${pick()} ${pick()}`,
    });
    lines.push(line);
    size += line.length + 1;
  }
  return Buffer.from(`${lines.join("\n")}\n`).subarray(0, bytes);
}

/** Fills `root` with `total` bytes of the mix above; answers the number of files. */
export async function generate(root: string, total: number): Promise<number> {
  const random = prng(42);
  const bytes = randomStream("svc-bench-backup");
  let files = 0;
  const write = async (path: string, content: Buffer) => {
    await mkdir(join(path, ".."), { recursive: true });
    await writeFile(path, content);
    files++;
  };
  for (let written = 0, i = 0; written < total * 0.4; written += 8 * MiB, i++) await write(join(root, `logs/app-${i}.jsonl`), jsonLines(random, 8 * MiB));
  for (let written = 0, i = 0; written < total * 0.4; written += 16 * MiB, i++) await write(join(root, `blobs/blob-${i}.bin`), bytes(16 * MiB));
  for (let written = 0, i = 0; written < total * 0.2; i++) {
    const size = 1024 + Math.floor(random() * 15 * 1024);
    const path = join(root, `small/d${i % 16}/e${Math.floor(i / 16) % 32}/f${i}.${i % 2 ? "bin" : "json"}`);
    await write(path, i % 2 ? bytes(size) : jsonLines(random, size));
    written += size;
  }
  return files;
}
