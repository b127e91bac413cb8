/**
 * The unix user each tenant (an account of the platform) runs as. A root
 * builder gives every tenant its own unprivileged uid and gid, one per account
 * per host: every node (and every stack) on the host allocates from one
 * host-wide registry, so two nodes on one host never give two accounts the
 * same uid, and an account's uid is the same on all of them. The kernel
 * counts per uid what it limits per user (inotify instances and watches,
 * processes under RLIMIT_NPROC): one account exhausting its share leaves every
 * other account's whole. Inside the sandbox that id is all a job is: the user
 * namespace maps it to itself and nothing else (no root, no other user).
 *
 * The registry is a directory only root can enter (`/var/lib/svc-builder/tenants`
 * by default): `by-uid/<uid>` names the tenant holding a uid, created with
 * O_EXCL so two allocations never take the same uid, and `by-tenant/<tenant>`
 * names the uid of a tenant, made by link(2), which fails when another process
 * allocated for the same tenant first (the loser gives its uid back). No lock
 * is held, so a builder killed mid-allocation leaves at most an unused uid.
 *
 * A node's data directory may still hold `tenants.json` from before the
 * registry (uids given per data directory): a tenant found there keeps its
 * old uid when the host has not given it to another account; otherwise it gets
 * a new one and its disks are re-owned ({@link TenantUsers.moved}).
 *
 * A builder that is not root cannot switch users: every job then runs as the
 * builder's own uid, still inside its own namespaces, which is what separates
 * tenants in that mode (see README "Sandbox").
 */
import { randomUUID } from "node:crypto";
import { link, mkdir, readFile, readdir, rm, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { TENANT_PATTERN } from "../protocol/shared.js";

/** Unix user and group a job's processes run as. */
export interface JobUser {
  uid: number;
  gid: number;
}

/** Uids handed out per host; above this, allocation fails rather than wraps. */
const MAX_TENANTS = 1_000_000;

/** Where a root builder's host-wide registry lives unless BUILDER_TENANT_REGISTRY says otherwise. */
export const DEFAULT_TENANT_REGISTRY = "/var/lib/svc-builder/tenants";

export class TenantUsers {
  readonly #registry: string | null;
  readonly #base: number | null;
  readonly #ids = new Map<string, number>();
  /** Uids a data directory's old `tenants.json` gave (tried first for their tenants). */
  readonly #legacy: Map<string, number>;
  readonly #allocating = new Map<string, Promise<number>>();
  /** Tenants whose uid changed from the data directory's old table: tenant → its old uid. */
  readonly moved = new Map<string, number>();

  private constructor(registry: string | null, base: number | null, legacy: Map<string, number>) {
    this.#registry = registry;
    this.#base = base;
    this.#legacy = legacy;
  }

  /**
   * Opens the host's registry; `base` null means "not root": every tenant is
   * the builder's own user. `dataDir`'s old `tenants.json`, if any, says which
   * uid each tenant had there.
   */
  static async open(dataDir: string, base: number | null, registry: string = DEFAULT_TENANT_REGISTRY): Promise<TenantUsers> {
    if (base === null) return new TenantUsers(null, null, new Map());
    await mkdir(join(registry, "by-uid"), { recursive: true, mode: 0o700 });
    await mkdir(join(registry, "by-tenant"), { recursive: true, mode: 0o700 });
    const legacy = new Map<string, number>();
    const text = await readFile(join(dataDir, "tenants.json"), "utf8").catch(() => null);
    if (text !== null) {
      for (const [tenant, uid] of Object.entries(JSON.parse(text) as Record<string, unknown>)) {
        if (TENANT_PATTERN.test(tenant) && typeof uid === "number" && Number.isInteger(uid)) legacy.set(tenant, uid);
      }
    }
    const users = new TenantUsers(registry, base, legacy);
    // Settled now, so the disks opened next know whose files must be re-owned.
    for (const tenant of legacy.keys()) await users.userOf(tenant);
    return users;
  }

  /** Whether tenants get users of their own (a root builder). */
  get separateUsers(): boolean {
    return this.#base !== null;
  }

  /** The tenant's user (allocating one on first use on this host) and gid equal to it. */
  async userOf(tenant: string): Promise<JobUser> {
    if (this.#base === null || this.#registry === null) return { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
    if (!TENANT_PATTERN.test(tenant)) throw new Error(`invalid tenant ${JSON.stringify(tenant)}`);
    let uid = this.#ids.get(tenant);
    if (uid === undefined) {
      let pending = this.#allocating.get(tenant);
      if (!pending) {
        pending = this.#claim(this.#registry, this.#base, tenant).finally(() => this.#allocating.delete(tenant));
        this.#allocating.set(tenant, pending);
      }
      uid = await pending;
      this.#ids.set(tenant, uid);
    }
    return { uid, gid: uid };
  }

  /** The tenant's uid in the registry, allocating the lowest free one (its old one first) when it has none. */
  async #claim(registry: string, base: number, tenant: string): Promise<number> {
    const known = await readUid(join(registry, "by-tenant", tenant));
    if (known !== null) return known;
    const old = this.#legacy.get(tenant);
    let uid = old !== undefined && (await this.#take(registry, old, tenant)) ? old : await this.#takeFree(registry, base, tenant);
    // Name the uid under the tenant; link(2) fails when another allocation named one first: theirs wins,
    // and ours goes back unless it is the same uid (both found the tenant's own half-made allocation).
    const temporary = join(registry, "by-tenant", `.${tenant}.${randomUUID()}`);
    await writeFile(temporary, String(uid), { mode: 0o600 });
    try {
      await link(temporary, join(registry, "by-tenant", tenant));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      const theirs = await readUid(join(registry, "by-tenant", tenant));
      if (theirs === null) throw new Error(`the registry names no uid for ${tenant} after another allocation did`);
      if (theirs !== uid) await unlink(join(registry, "by-uid", String(uid))).catch(() => undefined);
      uid = theirs;
    } finally {
      await rm(temporary, { force: true });
    }
    if (old !== undefined && old !== uid) this.moved.set(tenant, old);
    return uid;
  }

  /** The lowest uid from `base` no tenant holds on this host, taken for `tenant`. */
  async #takeFree(registry: string, base: number, tenant: string): Promise<number> {
    const held = new Set((await readdir(join(registry, "by-uid"))).map(Number).filter(Number.isInteger));
    for (let uid = base; uid < base + MAX_TENANTS; uid++) {
      if (!held.has(uid) && (await this.#take(registry, uid, tenant))) return uid;
    }
    throw new Error("no tenant uid left on this host");
  }

  /** Takes `uid` for `tenant` unless another tenant holds it (O_EXCL: two builders never both succeed). */
  async #take(registry: string, uid: number, tenant: string): Promise<boolean> {
    const file = join(registry, "by-uid", String(uid));
    try {
      await writeFile(file, tenant, { flag: "wx", mode: 0o600 });
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      // Ours already: an allocation for this tenant that stopped before naming it.
      return (await readFile(file, "utf8").catch(() => "")) === tenant;
    }
  }
}

async function readUid(path: string): Promise<number | null> {
  const text = await readFile(path, "utf8").catch(() => null);
  const uid = text === null ? Number.NaN : Number(text.trim());
  return Number.isInteger(uid) && uid > 0 ? uid : null;
}
