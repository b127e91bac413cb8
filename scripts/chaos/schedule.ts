import type { Cut } from "../partition.js";
import { prng } from "../prng.js";

/** What the chaos run does to one node (or to the Worker), and for how long. */
export type Fault =
  | { kind: "kill" | "stop"; node: number; forMs: number }
  | { kind: "partition"; node: number; cut: Cut; forMs: number }
  | { kind: "restart-api" };

/** A fault and when it starts, counted from the start of the chaos. */
export type Planned = { atMs: number; fault: Fault };

/** Each round of the schedule: every kind once (partitions twice, three ways to cut), in an order the seed draws. */
const ROUND = ["kill", "stop", "partition", "partition", "restart-api"] as const;

/**
 * The faults of a chaos run of `durationMs` over `nodes` nodes, one at a time:
 * a `kill -9` of a node's agent (revived after), a stop and continue
 * (SIGSTOP, SIGCONT: a hung host), a partition one way or both (healed after)
 * or a restart of the Worker, drawn in rounds that hold every kind, so even a
 * short run meets each. Lengths run from shorter than a lease to longer than
 * the lost threshold plus the failover grace (`longestMs`), so some faults
 * pass unnoticed, some fence the node, and some move its disks.
 */
export function faultSchedule(seed: number, durationMs: number, nodes: number, longestMs: number): Planned[] {
  const next = prng(seed);
  const between = (low: number, high: number) => Math.round(low + next() * (high - low));
  const planned: Planned[] = [];
  const cuts: Cut[] = ["both", "to-node", "from-node"];
  let round: (typeof ROUND)[number][] = [];
  for (let at = between(3_000, 8_000); at < durationMs; ) {
    if (round.length === 0) round = [...ROUND].sort(() => next() - 0.5);
    const kind = round.pop()!;
    const node = Math.floor(next() * nodes);
    const forMs = between(2_000, longestMs);
    const fault: Fault =
      kind === "restart-api"
        ? { kind }
        : kind === "partition"
          ? { kind, node, cut: cuts[Math.floor(next() * cuts.length)]!, forMs }
          : { kind, node, forMs };
    planned.push({ atMs: at, fault });
    at += ("forMs" in fault ? fault.forMs : 0) + between(3_000, 10_000);
  }
  return planned;
}

/** One line naming a fault, for the run's log and its table. */
export function describeFault(fault: Fault, names: string[]): string {
  switch (fault.kind) {
    case "kill":
      return `kill -9 ${names[fault.node]}, revived after ${(fault.forMs / 1000).toFixed(1)} s`;
    case "stop":
      return `SIGSTOP ${names[fault.node]}, SIGCONT after ${(fault.forMs / 1000).toFixed(1)} s`;
    case "partition":
      return `partition ${names[fault.node]} (${fault.cut}), healed after ${(fault.forMs / 1000).toFixed(1)} s`;
    case "restart-api":
      return "restart the Worker";
  }
}
