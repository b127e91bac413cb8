/**
 * The tar header format, both directions: POSIX ustar headers, preceded by a
 * pax extended header (`x`) when a value does not fit ustar (a name or link
 * target over 100 bytes or not ASCII, a size or mtime beyond 11 octal digits,
 * large ids). Reading also understands GNU archives (`L`/`K` long names,
 * base-256 numbers), which is what GNU tar writes by default.
 *
 * Written by hand rather than taken from a package because the builder may not
 * add dependencies, and because restore must control every byte it accepts.
 */

/** Tar works in 512-byte blocks. */
export const BLOCK_SIZE = 512;
/** Two zero blocks end an archive. */
export const END_OF_ARCHIVE = Buffer.alloc(2 * BLOCK_SIZE);
/** Largest value an 11-digit octal field holds (8 GiB − 1 for sizes). */
const MAX_OCTAL_11 = 0o77777777777;
/** Largest value a 7-digit octal field holds (uid, gid). */
const MAX_OCTAL_7 = 0o7777777;
/** Longest name or link target a ustar field holds without a pax record. */
const USTAR_NAME_BYTES = 100;

/** The member types a snapshot writes. */
export type WritableType = "file" | "directory" | "symlink" | "hardlink";

/** One member as a snapshot writes it. */
export interface HeaderInput {
  /** Archive path: `./a/b`, directories with a trailing slash like GNU tar. */
  path: string;
  type: WritableType;
  /** Permission bits (setuid/setgid/sticky are not written). */
  mode: number;
  /** Unix seconds. */
  mtime: number;
  /** Content bytes following the header (0 for everything but files). */
  size: number;
  /** Symlink target, or the archive path a hardlink refers to. */
  linkpath: string;
  uid: number;
  gid: number;
}

const TYPEFLAG: Record<WritableType, string> = { file: "0", directory: "5", symlink: "2", hardlink: "1" };

const isAscii = (text: string) => /^[\x20-\x7e]*$/.test(text);

/** Bytes of zero padding that follow `size` content bytes. */
export function paddingAfter(size: number): number {
  return (BLOCK_SIZE - (size % BLOCK_SIZE)) % BLOCK_SIZE;
}

function writeString(block: Buffer, offset: number, length: number, value: string): void {
  block.write(value, offset, length, "utf8");
}

/** Octal, zero-padded to `length − 1` digits and NUL-terminated, as ustar wants. */
function writeOctal(block: Buffer, offset: number, length: number, value: number): void {
  block.write(`${value.toString(8).padStart(length - 1, "0")}\0`, offset, length, "latin1");
}

/** One pax record: `<length> <key>=<value>\n`, where length counts itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bodyBytes = Buffer.byteLength(body);
  const digits = String(bodyBytes).length;
  // Adding the digits can add a digit (95 + 2 = 97, but 99 + 2 = 101 needs 3).
  const length = String(bodyBytes + digits).length > digits ? bodyBytes + digits + 1 : bodyBytes + digits;
  return `${length}${body}`;
}

/** A ustar-safe stand-in name for tools that ignore pax: ASCII, at most 100 bytes. */
function fallbackName(path: string): string {
  return path.replace(/[^\x20-\x7e]/g, "_").slice(-USTAR_NAME_BYTES);
}

function ustarBlock(input: HeaderInput, typeflag: string, name: string, linkname: string): Buffer {
  const block = Buffer.alloc(BLOCK_SIZE);
  writeString(block, 0, 100, name);
  writeOctal(block, 100, 8, input.mode & 0o777);
  writeOctal(block, 108, 8, input.uid <= MAX_OCTAL_7 ? input.uid : 0);
  writeOctal(block, 116, 8, input.gid <= MAX_OCTAL_7 ? input.gid : 0);
  writeOctal(block, 124, 12, input.size <= MAX_OCTAL_11 ? input.size : 0);
  writeOctal(block, 136, 12, input.mtime >= 0 && input.mtime <= MAX_OCTAL_11 ? input.mtime : 0);
  block.write(typeflag, 156, 1, "latin1");
  writeString(block, 157, 100, linkname);
  block.write("ustar\x0000", 257, 8, "latin1");
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "latin1");
  return block;
}

/**
 * The header block(s) of one member: a pax extended header first when some
 * value does not fit ustar, then the ustar header. Content and padding follow.
 */
export function encodeHeader(input: HeaderInput): Buffer {
  const records: string[] = [];
  const pathFits = isAscii(input.path) && Buffer.byteLength(input.path) <= USTAR_NAME_BYTES;
  const linkFits = isAscii(input.linkpath) && Buffer.byteLength(input.linkpath) <= USTAR_NAME_BYTES;
  if (!pathFits) records.push(paxRecord("path", input.path));
  if (!linkFits) records.push(paxRecord("linkpath", input.linkpath));
  if (input.size > MAX_OCTAL_11) records.push(paxRecord("size", String(input.size)));
  if (input.mtime < 0 || input.mtime > MAX_OCTAL_11) records.push(paxRecord("mtime", String(input.mtime)));
  if (input.uid > MAX_OCTAL_7) records.push(paxRecord("uid", String(input.uid)));
  if (input.gid > MAX_OCTAL_7) records.push(paxRecord("gid", String(input.gid)));
  const header = ustarBlock(
    input,
    TYPEFLAG[input.type],
    pathFits ? input.path : fallbackName(input.path),
    linkFits ? input.linkpath : fallbackName(input.linkpath),
  );
  if (records.length === 0) return header;
  const data = Buffer.from(records.join(""), "utf8");
  const paxHeader = ustarBlock(
    { ...input, mode: 0o644, size: data.length, linkpath: "", uid: 0, gid: 0 },
    "x",
    fallbackName(`PaxHeaders/${input.path.replace(/\/$/, "").split("/").pop() ?? ""}`),
    "",
  );
  return Buffer.concat([paxHeader, data, Buffer.alloc(paddingAfter(data.length)), header]);
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/** A header block as stored, before pax or GNU long-name records apply. */
export interface RawHeader {
  name: string;
  mode: number;
  size: number;
  mtime: number;
  typeflag: string;
  linkname: string;
}

/** A header that cannot be parsed: the archive is corrupt (or not a tar at all). */
export class TarFormatError extends Error {}

/** Whether a block is all zeros (the end-of-archive marker). */
export function isZeroBlock(block: Buffer): boolean {
  for (const byte of block) if (byte !== 0) return false;
  return true;
}

function readString(block: Buffer, offset: number, length: number): string {
  const field = block.subarray(offset, offset + length);
  const end = field.indexOf(0);
  return field.subarray(0, end === -1 ? length : end).toString("utf8");
}

/** Octal (space or NUL terminated), or GNU base-256 when the high bit is set. */
function readNumber(block: Buffer, offset: number, length: number, field: string): number {
  const first = block[offset] ?? 0;
  if (first & 0x80) {
    if (first !== 0x80) throw new TarFormatError(`negative or oversized base-256 ${field}`);
    let value = 0;
    for (let i = offset + 1; i < offset + length; i++) value = value * 256 + (block[i] ?? 0);
    if (!Number.isSafeInteger(value)) throw new TarFormatError(`${field} too large`);
    return value;
  }
  const text = block.toString("latin1", offset, offset + length).replace(/[\0 ]+$/, "").trim();
  if (text === "") return 0;
  if (!/^[0-7]+$/.test(text)) throw new TarFormatError(`malformed ${field} field ${JSON.stringify(text)}`);
  return Number.parseInt(text, 8);
}

/** Parses one non-zero header block, verifying its checksum. */
export function decodeHeader(block: Buffer): RawHeader {
  const stored = readNumber(block, 148, 8, "checksum");
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK_SIZE; i++) {
    const byte = i >= 148 && i < 156 ? 0x20 : (block[i] ?? 0);
    unsigned += byte;
    signed += byte > 127 ? byte - 256 : byte;
  }
  if (stored !== unsigned && stored !== signed) throw new TarFormatError("header checksum mismatch");
  let name = readString(block, 0, 100);
  // POSIX ustar splits long names into prefix + name; GNU's "ustar  " magic uses that area for other fields.
  if (block.toString("latin1", 257, 265) === "ustar\x0000") {
    const prefix = readString(block, 345, 155);
    if (prefix !== "") name = `${prefix}/${name}`;
  }
  return {
    name,
    mode: readNumber(block, 100, 8, "mode"),
    size: readNumber(block, 124, 12, "size"),
    mtime: readNumber(block, 136, 12, "mtime"),
    typeflag: String.fromCharCode(block[156] ?? 0),
    linkname: readString(block, 157, 100),
  };
}

/** Parses pax records into key → value (later keys win, as the standard says). */
export function parsePaxRecords(data: Buffer): Map<string, string> {
  const records = new Map<string, string>();
  let offset = 0;
  while (offset < data.length) {
    if (data[offset] === 0) break; // some writers pad with NULs
    const space = data.indexOf(0x20, offset);
    const length = space === -1 ? Number.NaN : Number(data.toString("latin1", offset, space));
    if (!Number.isSafeInteger(length) || length <= 0 || offset + length > data.length || data[offset + length - 1] !== 0x0a) {
      throw new TarFormatError("malformed pax extended header");
    }
    const record = data.toString("utf8", space + 1, offset + length - 1);
    const equals = record.indexOf("=");
    if (equals <= 0) throw new TarFormatError("malformed pax record");
    records.set(record.slice(0, equals), record.slice(equals + 1));
    offset += length;
  }
  return records;
}
