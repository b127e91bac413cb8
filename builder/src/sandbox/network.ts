/**
 * Outbound network for run jobs, "like an app would have it", and nothing
 * host-local. Every run executes in a network namespace of its own, wired to a
 * bridge of this builder by a veth pair and NATed to the outside; nftables
 * rules on the host then drop whatever a job sends to the host itself (the
 * builder's control port, wrangler, sshd, … on any address) and to private,
 * loopback and link-local ranges (cloud metadata, the host's LAN), and to every
 * subnet the host is directly connected to (its LAN or a provider's network on
 * a public-looking range) and its own addresses, read from its interfaces and
 * read again every {@link HOST_NETWORKS_REFRESH_MS} (an interface added later
 * is blocked as soon), except DNS to the host's resolvers. Loopback inside the
 * namespace is the job's own. The
 * host itself may open connections into a namespace (an app's health check and
 * its proxied traffic, processes/): only replies to those come back in, every
 * connection a namespace opens towards the host is still refused.
 *
 * Runs never reach each other: frames between two ports of the bridge are
 * switched, not routed, so the host's inet rules see them only when
 * br_netfilter is loaded with bridge-nf-call-iptables=1, a host setting nobody
 * guarantees. Every port is therefore an isolated bridge port (the kernel
 * forwards its frames only to the bridge itself), and a `bridge` family table
 * drops whatever the bridge would still forward between ports; both hold
 * whatever br_netfilter says.
 *
 * Namespaces are created ahead of need (as many as jobs may run at once) and
 * reused (a job's processes are all dead when its namespace returns to the
 * pool, and a job has no privilege over the namespace's addresses or routes),
 * so a run costs no `ip` call. Each builder
 * claims its own /24 (10.213.N.0/24, a bridge `svcbrN`, an nftables table
 * `svc_N`), recorded in /run/svc-builder so several builders can share a host.
 *
 * This needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and nftables.
 * Without them runs get no network at all (a namespace with only loopback), and
 * the builder says so at startup.
 */
import { execFile } from "node:child_process";
import { mkdir, open, readFile, readdir, rm } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { pidAlive } from "./cgroups.js";

const run = promisify(execFile);
const STATE_DIR = "/run/svc-builder";
const NETNS_DIR = "/run/netns";
const SUBNETS = 256;
/** Hosts .2 to .254 of the /24. */
const MAX_SLOTS = 253;

/** Destinations a job may never reach (besides the host's own addresses). */
const BLOCKED_RANGES = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.168.0.0/16",
  "198.18.0.0/15",
  "224.0.0.0/3",
];

/** How often the host's own networks are read again (an interface that came up since is blocked from then on). */
const HOST_NETWORKS_REFRESH_MS = 30_000;

/** `a.b.c.d/n` of each IPv4 network the host is directly connected to (its interfaces' subnets, loopback aside), and its addresses. */
export function hostNetworks(interfaces = networkInterfaces()): string[] {
  const networks = new Set<string>();
  for (const addresses of Object.values(interfaces)) {
    for (const address of addresses ?? []) {
      if (address.family !== "IPv4" || address.internal || !address.cidr) continue;
      const [ip, bits] = address.cidr.split("/");
      const prefix = Number(bits);
      const value = ip!.split(".").reduce((sum, part) => sum * 256 + Number(part), 0);
      const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
      const network = (value & mask) >>> 0;
      networks.add(`${[24, 16, 8, 0].map((shift) => (network >>> shift) & 255).join(".")}/${prefix}`);
      networks.add(`${ip}/32`);
    }
  }
  return [...networks].sort();
}

/** A namespace lent to one job; `release` returns it to the pool. */
export interface NetworkSlot {
  /** Path nsenter joins (`/run/netns/svc3-7`). */
  path: string;
  /**
   * The namespace's address on the bridge (`10.213.3.8`): where the host
   * reaches a server it runs (an app's health check and proxied traffic).
   */
  address: string;
  release(): void;
}

/** Runs `ip` commands (one per line) in one process; `netns` runs them inside that namespace. */
async function ip(script: string, netns?: string): Promise<void> {
  const child = run("ip", [...(netns ? ["-n", netns] : []), "-batch", "-"], { timeout: 30_000 });
  child.child.stdin?.end(script);
  await child;
}

async function nft(script: string): Promise<void> {
  const child = run("nft", ["-f", "-"], { timeout: 30_000 });
  child.child.stdin?.end(script);
  await child;
}

/** Nameservers of the host's resolv.conf, which jobs may query (DNS is the one private destination allowed). */
export async function hostResolvers(path = "/etc/resolv.conf"): Promise<string[]> {
  const text = await readFile(path, "utf8").catch(() => "");
  return [...text.matchAll(/^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/gm)].map((m) => m[1]!);
}

export class RunNetwork {
  readonly #index: number;
  readonly #free: string[] = [];
  #created = 0;
  #closed = false;
  #filling: Promise<void> = Promise.resolve();
  /** The host's networks as last written into the blocked set. */
  #hostNetworks = "";
  #refresh: NodeJS.Timeout | undefined;

  private constructor(index: number) {
    this.#index = index;
  }

  /** Sets up this builder's bridge and rules, or answers why runs must go without network. */
  static async open(): Promise<RunNetwork | { reason: string }> {
    if (process.getuid?.() !== 0) return { reason: "runs have no network: the builder is not root (needs CAP_NET_ADMIN)" };
    try {
      await run("nft", ["--version"]);
      await run("ip", ["-V"]);
    } catch {
      return { reason: "runs have no network: install iproute2 and nftables" };
    }
    const resolvers = (await hostResolvers()).filter((address) => !address.startsWith("127."));
    try {
      await mkdir(STATE_DIR, { recursive: true, mode: 0o711 });
      await removeAbandoned();
      const index = await claimSubnet();
      const network = new RunNetwork(index);
      await network.#removeLeftovers();
      await network.#createBridge(resolvers);
      await network.#blockHostNetworks();
      const refresh = () =>
        network.#blockHostNetworks().catch((error: unknown) => console.error(`builder: could not update the blocked host networks: ${String(error)}`));
      network.#refresh = setInterval(() => void refresh(), HOST_NETWORKS_REFRESH_MS);
      network.#refresh.unref();
      return network;
    } catch (error) {
      return { reason: `runs have no network: ${error instanceof Error ? error.message.split("\n")[0] : String(error)}` };
    }
  }

  get description(): string {
    return `own network namespace per run, NAT through bridge ${this.#bridge} (10.213.${this.#index}.0/24, isolated ports); host, its own networks (${this.#hostNetworks || "none"}), private addresses and other runs blocked`;
  }

  get #bridge(): string {
    return `svcbr${this.#index}`;
  }

  /**
   * Creates namespaces ahead of need, up to `count` in all, so the first burst
   * of runs (a minute's crons) finds them ready instead of each paying for two
   * `ip` processes. Runs in the background; `close` waits for it.
   */
  fill(count: number): void {
    const target = Math.min(count, MAX_SLOTS);
    this.#filling = (async () => {
      while (!this.#closed && this.#created < target) this.#free.push(await this.#create());
    })().catch((error: unknown) => console.error(`builder: could not prepare run network namespaces: ${String(error)}`));
  }

  /** Namespaces that could still be lent now: those free, and those the /24 still has room to make. */
  get available(): number {
    return this.#free.length + MAX_SLOTS - this.#created;
  }

  /** A namespace for one run: a free one, or a new one while the /24 has room. */
  async acquire(): Promise<NetworkSlot> {
    const taken = this.#free.pop() ?? (await this.#create());
    let released = false;
    return {
      path: join(NETNS_DIR, taken),
      address: `10.213.${this.#index}.${Number(taken.slice(taken.lastIndexOf("-") + 1)) + 1}`,
      release: () => {
        if (released || this.#closed) return;
        released = true;
        this.#free.push(taken);
      },
    };
  }

  async #create(): Promise<string> {
    if (this.#created >= MAX_SLOTS) throw new Error(`all ${MAX_SLOTS} run network namespaces are in use`);
    const slot = ++this.#created;
    const name = `svc${this.#index}-${slot}`;
    const host = `svc${this.#index}v${slot}`;
    const net = `10.213.${this.#index}`;
    await ip(
      [
        `netns add ${name}`,
        `link add ${host} type veth peer name eth0 netns ${name}`,
        // An isolated bridge port forwards only to the bridge itself (the host's rules), never to another run.
        `link set ${host} master ${this.#bridge}`,
        `link set dev ${host} type bridge_slave isolated on`,
        `link set ${host} up`,
      ].join("\n"),
    );
    await ip([`addr add ${net}.${slot + 1}/24 dev eth0`, "link set lo up", "link set eth0 up", `route add default via ${net}.1`].join("\n"), name);
    return name;
  }

  /** Removes the namespaces, bridge, rules and the claim. */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#refresh);
    await this.#filling;
    await this.#removeLeftovers();
    await rm(join(STATE_DIR, `net-${this.#index}.pid`), { force: true });
  }

  /** Writes the host's networks into the blocked set when they changed (auto-merge folds them into overlapping ranges). */
  async #blockHostNetworks(): Promise<void> {
    const networks = hostNetworks().join(", ");
    if (networks === this.#hostNetworks || this.#closed) return;
    const table = `inet svc_${this.#index}`;
    await nft(`flush set ${table} host\n${networks ? `add element ${table} host { ${networks} }\n` : ""}`);
    this.#hostNetworks = networks;
  }

  async #createBridge(resolvers: string[]): Promise<void> {
    const bridge = this.#bridge;
    const net = `10.213.${this.#index}`;
    await ip([`link add ${bridge} type bridge`, `addr add ${net}.1/24 dev ${bridge}`, `link set ${bridge} up`].join("\n"));
    await run("sysctl", ["-qw", "net.ipv4.ip_forward=1"]);
    const dns = resolvers.length > 0 ? `iifname "${bridge}" ip daddr { ${resolvers.join(", ")} } meta l4proto { tcp, udp } th dport 53 accept` : "";
    await nft(`
table inet svc_${this.#index} {
  set blocked {
    type ipv4_addr; flags interval; auto-merge;
    elements = { ${BLOCKED_RANGES.join(", ")} }
  }
  set host {
    type ipv4_addr; flags interval; auto-merge;
  }
  chain input {
    type filter hook input priority -10; policy accept;
    iifname "${bridge}" ct state established,related accept
    iifname "${bridge}" meta l4proto tcp reject with tcp reset
    iifname "${bridge}" reject
  }
  chain forward {
    type filter hook forward priority -10; policy accept;
    oifname "${bridge}" ct state established,related accept
    oifname "${bridge}" drop
    ${dns}
    iifname "${bridge}" ip daddr @blocked meta l4proto tcp reject with tcp reset
    iifname "${bridge}" ip daddr @blocked reject
    iifname "${bridge}" ip daddr @host meta l4proto tcp reject with tcp reset
    iifname "${bridge}" ip daddr @host reject
    iifname "${bridge}" meta nfproto ipv6 drop
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    ip saddr ${net}.0/24 oifname != "${bridge}" masquerade
  }
}
table bridge svc_${this.#index} {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "svc${this.#index}v*" oifname "svc${this.#index}v*" drop
  }
}`);
  }

  /** What an earlier builder with this subnet (or this one, closing) left behind. */
  async #removeLeftovers(): Promise<void> {
    await removeSubnet(this.#index);
  }
}

/** Deletes one subnet's namespaces, bridge and rules (whatever of them exists). */
async function removeSubnet(index: number): Promise<void> {
  const prefix = `svc${index}-`;
  const names = await readdir(NETNS_DIR).catch(() => [] as string[]);
  const stale = names.filter((name) => name.startsWith(prefix));
  const commands = [...stale.map((name) => `netns del ${name}`), `link del svcbr${index}`];
  // -force: keep going past what is already gone.
  const child = run("ip", ["-force", "-batch", "-"], { timeout: 30_000 });
  child.child.stdin?.end(commands.join("\n"));
  await child.catch(() => undefined);
  await run("nft", ["delete", "table", "inet", `svc_${index}`]).catch(() => undefined);
  await run("nft", ["delete", "table", "bridge", `svc_${index}`]).catch(() => undefined);
}

/** Subnets claimed by builders that died without closing (SIGKILL, a crash): freed for good. */
async function removeAbandoned(): Promise<void> {
  for (const name of await readdir(STATE_DIR).catch(() => [] as string[])) {
    const index = Number(/^net-(\d+)\.pid$/.exec(name)?.[1] ?? Number.NaN);
    if (!Number.isInteger(index)) continue;
    const owner = Number(await readFile(join(STATE_DIR, name), "utf8").catch(() => "0"));
    if (owner > 0 && pidAlive(owner)) continue;
    await removeSubnet(index);
    await rm(join(STATE_DIR, name), { force: true });
  }
}

/** Claims a free subnet index with an O_EXCL pid file; a claim whose process is gone is taken over. */
async function claimSubnet(): Promise<number> {
  const first = process.pid % SUBNETS;
  for (let i = 0; i < SUBNETS; i++) {
    const index = (first + i) % SUBNETS;
    const file = join(STATE_DIR, `net-${index}.pid`);
    const owner = Number(await readFile(file, "utf8").catch(() => "0"));
    if (owner > 0 && owner !== process.pid && pidAlive(owner)) continue;
    if (owner > 0) await rm(file, { force: true });
    try {
      const handle = await open(file, "wx", 0o644);
      await handle.writeFile(String(process.pid));
      await handle.close();
      return index;
    } catch {
      // another builder took it meanwhile
    }
  }
  throw new Error(`all ${SUBNETS} builder subnets are claimed`);
}
