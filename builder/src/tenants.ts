/**
 * The unix user each tenant (an account of the platform) runs as. A root
 * builder gives every tenant its own unprivileged uid and gid, allocated in
 * order from a base far above ordinary users and recorded in `tenants.json`, so
 * that a restart keeps the owner of the files on the tenant's disks. Inside the
 * sandbox that id is all a job is: the user namespace maps it to itself and
 * nothing else (no root, no other user).
 *
 * A builder that is not root cannot switch users: every job then runs as the
 * builder's own uid, still inside its own namespaces, which is what separates
 * tenants in that mode (see README "Sandbox").
 */
import { readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { TENANT_PATTERN } from "./protocol.js";
import type { JobUser } from "./sandbox.js";

/** Ids handed out per builder data directory; above this, allocation fails rather than wraps. */
const MAX_TENANTS = 1_000_000;

export class TenantUsers {
  readonly #file: string;
  readonly #base: number | null;
  readonly #ids: Map<string, number>;
  #saving: Promise<void> = Promise.resolve();

  private constructor(file: string, base: number | null, ids: Map<string, number>) {
    this.#file = file;
    this.#base = base;
    this.#ids = ids;
  }

  /**
   * Loads the allocations; `base` null means "not root": every tenant is the
   * builder's own user.
   */
  static async open(dataDir: string, base: number | null): Promise<TenantUsers> {
    const file = join(dataDir, "tenants.json");
    const ids = new Map<string, number>();
    const text = await readFile(file, "utf8").catch(() => null);
    if (text !== null) {
      for (const [tenant, uid] of Object.entries(JSON.parse(text) as Record<string, unknown>)) {
        if (TENANT_PATTERN.test(tenant) && typeof uid === "number" && Number.isInteger(uid)) ids.set(tenant, uid);
      }
    }
    return new TenantUsers(file, base, ids);
  }

  /** Whether tenants get users of their own (a root builder). */
  get separateUsers(): boolean {
    return this.#base !== null;
  }

  /** The tenant's user (allocating one on first use) and gid equal to it. */
  async userOf(tenant: string): Promise<JobUser> {
    if (this.#base === null) return { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
    if (!TENANT_PATTERN.test(tenant)) throw new Error(`invalid tenant ${JSON.stringify(tenant)}`);
    let uid = this.#ids.get(tenant);
    if (uid === undefined) {
      if (this.#ids.size >= MAX_TENANTS) throw new Error("no tenant uid left");
      uid = this.#base + this.#ids.size;
      this.#ids.set(tenant, uid);
      await this.#save();
    }
    return { uid, gid: uid };
  }

  /** Writes the table atomically; writes queue so two allocations never lose one another. */
  #save(): Promise<void> {
    const next = this.#saving.then(async () => {
      const temporary = `${this.#file}.tmp`;
      await writeFile(temporary, JSON.stringify(Object.fromEntries(this.#ids)), { mode: 0o600 });
      await rename(temporary, this.#file);
    });
    this.#saving = next.catch(() => undefined);
    return next;
  }
}
