/**
 * Who uses which disk right now, shared by the builder's rooms: jobs (runs and
 * snapshots use a disk alongside others, a restore alone) and app processes
 * (which hold their disk from start to stop). Neither room looks into the
 * other; both take and return leases here, so a restore is refused while an
 * app runs on the disk, and an app cannot start on a disk being restored.
 */

/** Who holds a lease: named in refusals. */
export interface DiskHolder {
  kind: "job" | "process";
  id: string;
}

/** A granted lease, or why the disk cannot be had now. */
export type DiskLease = { ok: true; release: () => void } | { ok: false; message: string };

export class DiskLeases {
  /** Disk id → its holders (exclusive or not). */
  readonly #holders = new Map<string, Map<string, DiskHolder>>();
  /** Disk id → the id of its exclusive holder (a restore). */
  readonly #exclusive = new Map<string, string>();

  /**
   * Takes a lease on the disk: shared (alongside every other shared holder) or
   * exclusive (alone). Decided synchronously, so two requests can never both
   * pass; `release` is idempotent.
   */
  acquire(diskId: string, holder: DiskHolder, exclusive: boolean): DiskLease {
    if (this.#exclusive.has(diskId)) return { ok: false, message: `disk ${diskId} is being restored; retry once the restore has ended` };
    if (exclusive) {
      const busy = this.busy(diskId);
      if (busy !== null) return { ok: false, message: busy };
      this.#exclusive.set(diskId, holder.id);
    }
    let holders = this.#holders.get(diskId);
    if (!holders) {
      holders = new Map();
      this.#holders.set(diskId, holders);
    }
    holders.set(holder.id, holder);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        const current = this.#holders.get(diskId);
        current?.delete(holder.id);
        if (current?.size === 0) this.#holders.delete(diskId);
        if (this.#exclusive.get(diskId) === holder.id) this.#exclusive.delete(diskId);
      },
    };
  }

  /** Why the disk may not be deleted or restored now (someone holds it), or null when nobody does. */
  busy(diskId: string): string | null {
    if (this.#exclusive.has(diskId)) return `disk ${diskId} is being restored; retry once the restore has ended`;
    const holders = [...(this.#holders.get(diskId)?.values() ?? [])];
    if (holders.some((holder) => holder.kind === "job")) return `disk ${diskId} is used by a queued or running job`;
    const process = holders.find((holder) => holder.kind === "process");
    if (process) return `disk ${diskId} is used by app process ${process.id}; stop the app's process first`;
    return null;
  }
}
