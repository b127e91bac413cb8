/**
 * A node's lease on its disks (docs/fleet.md, "Leases"). Every heartbeat's
 * answer grants the node its disks for `leaseSeconds` more, counted from
 * when the heartbeat was sent; a node that cannot renew it (partitioned,
 * its control plane down, or the node agent itself hung) must hold no disk
 * once it runs out, because after the lost threshold and the grace period
 * the control plane restores the disk elsewhere, and one disk has one
 * writer.
 *
 * What ends the writers must not depend on this agent being alive (it may
 * be what hangs), so it is a watchdog of its own: a small shell process the
 * agent starts (`svc-lease-watchdog`), which reads the lease's end from a
 * file once a second and, once it has passed, SIGKILLs every process of
 * every disk-holding sandbox (their cgroups are named `disk-…`, sandbox.ts)
 * and lazily unmounts every disk filesystem. The agent, while alive,
 * refuses disk work and restarts no disk writer until a heartbeat grants
 * the lease again; that answer first names the copies that are no longer its
 * own (fenced), then the rest are mounted again.
 *
 * Times are the host's boot clock (/proc/uptime), shared by the agent and the
 * watchdog and immune to wall-clock steps.
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { DISK_HOLDER_CGROUP_PREFIX } from "../sandbox/sandbox.js";

/** The name the watchdog runs under (its $0), by which a leftover one is recognised. */
const WATCHDOG_NAME = "svc-lease-watchdog";

/**
 * The watchdog: `$1` the lease file (an uptime second, or absent: nothing
 * to enforce), `$2` the disks' root, then the cgroup parents whose `disk-*`
 * children hold disks. Exits when the lease's folder is removed (the agent
 * stopped cleanly).
 */
const WATCHDOG = `
lease=$1; disks=$2; shift 2
fenced=
while sleep 1; do
  [ -d "\${lease%/*}" ] || exit 0
  if ! read -r until < "$lease" 2>/dev/null; then fenced=; continue; fi
  read -r up _ < /proc/uptime
  if [ "\${up%.*}" -lt "$until" ]; then fenced=; continue; fi
  for parent in "$@"; do
    for group in "$parent"/${DISK_HOLDER_CGROUP_PREFIX}*; do
      [ -d "$group" ] || continue
      [ -w "$group/cgroup.kill" ] && echo 1 > "$group/cgroup.kill"
      for round in 1 2 3; do
        while read -r pid; do kill -9 "$pid" 2>/dev/null; done < "$group/cgroup.procs"
      done
    done
  done
  [ -n "$fenced" ] && continue
  for mnt in "$disks"/*/mnt "$disks"/*/staging-*; do
    [ -d "$mnt" ] && mountpoint -q "$mnt" && umount -l "$mnt"
  done
  echo "${WATCHDOG_NAME}: the node's lease ran out (uptime $up s, lease until $until s): its disks' writers were killed and its disks unmounted" >&2
  fenced=1
done
`;

/** The host's boot clock, in seconds. */
export function uptime(): number {
  return Number(readFileSync("/proc/uptime", "utf8").split(" ")[0]);
}

export interface LeaseOptions {
  /** `<data dir>/lease`: the lease's end and the watchdog's pid. */
  dir: string;
  /** Where the disks live (`<data dir>/disks`): the watchdog unmounts `*\/mnt` and `*\/staging-*` there. */
  disksRoot: string;
  /** Cgroup directories whose `disk-*` children are disk-holding sandboxes (none: the watchdog can only unmount). */
  cgroupParents: readonly string[];
}

export class DiskLease {
  /** Whether leases apply: a node of a fleet; a lone builder (BUILDER_SECRET) holds its disks without one. */
  readonly enforced: boolean;
  readonly #file: string;
  readonly #dir: string;
  /** The lease's end (uptime seconds); null before the first grant. */
  #until: number | null = null;
  /** Why the last heartbeat granted nothing (the node was declared lost), or null. */
  #refused: string | null = null;
  readonly #regained = new Set<() => void>();

  private constructor(dir: string, enforced: boolean) {
    this.#dir = dir;
    this.#file = join(dir, "until");
    this.enforced = enforced;
  }

  /** A lease that always holds (a lone builder). */
  static none(dir: string): DiskLease {
    return new DiskLease(dir, false);
  }

  /**
   * Starts enforcing: forgets the lease a previous run of the agent left, ends
   * that run's watchdog, and starts a new one. Until the first heartbeat's
   * grant the node holds no lease (disk work waits for the control plane).
   */
  static async open(options: LeaseOptions): Promise<DiskLease> {
    const lease = new DiskLease(options.dir, true);
    await mkdir(options.dir, { recursive: true, mode: 0o700 });
    await rm(lease.#file, { force: true });
    await endWatchdog(join(options.dir, "watchdog.pid"));
    const child = spawn("/bin/sh", ["-c", WATCHDOG, WATCHDOG_NAME, lease.#file, options.disksRoot, ...options.cgroupParents], {
      detached: true,
      stdio: ["ignore", "ignore", "inherit"],
    });
    child.unref();
    if (child.pid !== undefined) await writeFile(join(options.dir, "watchdog.pid"), String(child.pid));
    return lease;
  }

  /** Whether the node may use its disks now. */
  valid(): boolean {
    return !this.enforced || (this.#until !== null && uptime() < this.#until);
  }

  /** Why disk work must wait now, or null when it may go ahead. */
  problem(): string | null {
    if (this.valid()) return null;
    if (this.#refused !== null) return `this node holds no lease on its disks: ${this.#refused}`;
    if (this.#until === null) return "this node has no lease on its disks yet: it waits for its first heartbeat's answer";
    return "this node's lease on its disks ran out: it could not reach the control plane; disk work waits until it does";
  }

  /**
   * A heartbeat sent at `sentAt` (uptime) was answered: the lease now ends
   * `seconds` after that (0: none granted, `why`). Written for the watchdog
   * before it counts here.
   */
  async grant(sentAt: number, seconds: number, why = "it was declared lost"): Promise<void> {
    if (!this.enforced) return;
    const wasValid = this.valid();
    const until = seconds > 0 ? Math.floor(sentAt + seconds) : 0;
    this.#refused = seconds > 0 ? null : why;
    await writeFile(`${this.#file}.tmp`, `${until}\n`);
    await rename(`${this.#file}.tmp`, this.#file);
    this.#until = until;
    if (!wasValid && this.valid()) for (const listener of this.#regained) listener();
  }

  /** Calls `listener` whenever the lease holds again after it did not. */
  onRegained(listener: () => void): void {
    this.#regained.add(listener);
  }

  /** A clean stop: the watchdog ends (its folder goes) and nothing is enforced any more. */
  async close(): Promise<void> {
    if (!this.enforced) return;
    await endWatchdog(join(this.#dir, "watchdog.pid"));
    await rm(this.#dir, { recursive: true, force: true });
  }
}

/** Ends the watchdog whose pid the file names, when that process is still one (not a reused pid). */
async function endWatchdog(pidFile: string): Promise<void> {
  const pid = Number(await readFile(pidFile, "utf8").catch(() => ""));
  if (!Number.isInteger(pid) || pid <= 0) return;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
  if (cmdline.split("\0").includes(WATCHDOG_NAME)) process.kill(pid, "SIGKILL");
  await rm(pidFile, { force: true });
}
