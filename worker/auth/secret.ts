import { randomBase62, toBase62 } from "../lib/ids";

/**
 * API key secrets: `svc_` + 40 random base62 characters (≈238 bits) + a 6-char
 * base62 CRC32 of the body. The fixed prefix and checksum let secret scanners
 * (and our own auth) tell a real key from a typo without touching the database.
 * Only the SHA-256 of a secret is ever stored. Web Crypto only, so the Worker
 * and the Node scripts share this module.
 */
export const SECRET_PREFIX = "svc_";
const BODY_LENGTH = 40;
const CHECKSUM_LENGTH = 6;
/** Characters shown in listings so users can tell keys apart. */
export const DISPLAY_PREFIX_LENGTH = 10;

const SECRET_PATTERN = new RegExp(`^${SECRET_PREFIX}[0-9A-Za-z]{${BODY_LENGTH + CHECKSUM_LENGTH}}$`);

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(text: string): number {
  let crc = 0xffffffff;
  for (const byte of new TextEncoder().encode(text)) {
    crc = CRC_TABLE[(crc ^ byte) & 0xff]! ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function checksum(body: string): string {
  return toBase62(crc32(body), CHECKSUM_LENGTH);
}

export function generateSecret(): string {
  const body = randomBase62(BODY_LENGTH);
  return `${SECRET_PREFIX}${body}${checksum(body)}`;
}

/** Cheap structural check (prefix, alphabet, length, checksum) done before any lookup. */
export function isWellFormedSecret(value: string): boolean {
  if (!SECRET_PATTERN.test(value)) return false;
  const body = value.slice(SECRET_PREFIX.length, SECRET_PREFIX.length + BODY_LENGTH);
  return value.slice(-CHECKSUM_LENGTH) === checksum(body);
}

export async function hashSecret(secret: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(secret));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export function displayPrefix(secret: string): string {
  return secret.slice(0, DISPLAY_PREFIX_LENGTH);
}
