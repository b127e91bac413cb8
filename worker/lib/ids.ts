const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** Uniform random base62 string (rejection sampling, so no modulo bias). */
export function randomBase62(length: number): string {
  let out = "";
  while (out.length < length) {
    const bytes = crypto.getRandomValues(new Uint8Array(length * 2));
    for (const b of bytes) {
      if (b < 248 && out.length < length) out += BASE62[b % 62];
    }
  }
  return out;
}

/** Encodes a non-negative integer in base62, left-padded with "0" to `width`. */
export function toBase62(value: number, width: number): string {
  let out = "";
  let n = value;
  do {
    out = BASE62[n % 62] + out;
    n = Math.floor(n / 62);
  } while (n > 0);
  return out.padStart(width, "0");
}

export const ID_PREFIXES = {
  account: "acct",
  key: "key",
  app: "app",
  disk: "disk",
  backup: "bak",
  cron: "cron",
  upload: "upl",
  restore: "rst",
  deployment: "dep",
  node: "node",
  joinToken: "njt",
  domain: "dom",
  webhook: "whk",
  message: "msg",
} as const;

export type IdKind = keyof typeof ID_PREFIXES;

/** Every resource id comes from here: `<prefix>_` + 24 random base62 characters (DESIGN §3). */
export function newId(kind: IdKind): string {
  return `${ID_PREFIXES[kind]}_${randomBase62(24)}`;
}

/** Whether `value` has the shape of an id of `kind` (used to tell ids from names in paths). */
export function isId(kind: IdKind, value: string): boolean {
  return new RegExp(`^${ID_PREFIXES[kind]}_[0-9A-Za-z]{24}$`).test(value);
}
