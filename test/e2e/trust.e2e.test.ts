import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { cp, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { type Socket, connect } from "node:net";
import { tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from "vitest";
import { LOG_RATE } from "../../builder/src/processes/app-log.js";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startOwnStack, svc, tempHome } from "../cli/svc.js";
import { expectExit, siteRequest } from "./sites.js";

const run = promisify(execFile);
const only = process.getuid?.() === 0 ? describe : describe.skip;

/** App processes on this stack's host may have this much memory in all (its nodes share a ledger of their own). */
const HOST_APP_MEMORY_MB = 4_000;

type Account = { key: string; id: string; env: Record<string, string> };
type NodeView = { id: string; name: string; address: string; state: string };
type Run = { jobName: string; status: string };

/**
 * Issue 28's acceptance on `npm start -- --nodes 2`'s stack, with two (and
 * more) accounts: a join token cannot take a node, two accounts on one host
 * get two uids, memory is not promised twice over, one app's log spam and one
 * account's flood leave another's requests alone, and the proxy passes only
 * what it should. Each case failed before its fix.
 */
only("trust between accounts on a fleet", () => {
  let stack: LocalStack & { stateDir: string };
  let home: Awaited<ReturnType<typeof tempHome>>;
  let victim: Account;
  let attacker: Account;
  const dirs: string[] = [];
  let ledger: string;

  beforeAll(async () => {
    ledger = await mkdtemp(join(tmpdir(), "svc-trust-ledger-"));
    stack = await startOwnStack({
      nodes: 2,
      workerLogs: true,
      builderEnv: {
        // One host of HOST_APP_MEMORY_MB for app processes; its own ledger, so other test stacks on this machine do not count.
        BUILDER_HOST_MEMORY_RESERVE_MB: String(Math.floor(totalmem() / 2 ** 20) - HOST_APP_MEMORY_MB),
        BUILDER_MEMORY_LEDGER_DIR: ledger,
      },
    });
    home = await tempHome();
    victim = await account("victim");
    attacker = await account("attacker");
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    await Promise.all([...dirs, ledger].filter(Boolean).map((dir) => rm(dir, { recursive: true, force: true })));
  });

  const showLog = async () => {
    const log = await readFile(join(stack.stateDir, "wrangler.log"), "utf8").catch(() => "");
    console.log(`wrangler.log (last lines):\n${log.split("\n").slice(-60).join("\n")}`);
  };

  async function api<T>(key: string, method: string, path: string, body?: unknown): Promise<{ status: number; data: T }> {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${key}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    const parsed = text ? (JSON.parse(text) as { data?: T }) : {};
    return { status: res.status, data: (parsed.data ?? parsed) as T };
  }
  async function ok<T>(key: string, method: string, path: string, body?: unknown): Promise<T> {
    const res = await api<T>(key, method, path, body);
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.data)}`);
    return res.data;
  }
  const operator = () => stack.secrets.OPERATOR_TOKEN;
  const nodes = () => ok<NodeView[]>(operator(), "GET", "/v1/operator/nodes");

  async function account(name: string): Promise<Account> {
    const created = await ok<{ account: { id: string }; apiKey: { key: string } }>(operator(), "POST", "/v1/accounts", { name, plan: "pro" });
    return { key: created.apiKey.key, id: created.account.id, env: { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: created.apiKey.key } };
  }

  /** Only `node` takes new work while `work` runs (the others are cordoned meanwhile). */
  async function on<T>(node: NodeView, work: () => Promise<T>): Promise<T> {
    const others = (await nodes()).filter((n) => n.id !== node.id);
    for (const other of others) await ok(operator(), "POST", `/v1/operator/nodes/${other.id}/cordon`, {});
    try {
      return await work();
    } finally {
      for (const other of others) await ok(operator(), "POST", `/v1/operator/nodes/${other.id}/uncordon`, {});
    }
  }

  /**
   * A steady app of `victim` and a noisy one of `attacker` on one node, deployed once for the log-spam
   * and flood tests (each deploy costs seconds): [steady, noisy].
   */
  let neighbourApps: Promise<[string, string]> | undefined;
  const neighbours = () =>
    (neighbourApps ??= (async () => {
      const [node] = await nodes();
      return on(node!, async (): Promise<[string, string]> => [await deployApp(victim, "node-features"), await deployApp(attacker, "node-features")]);
    })());

  /** Deploys a copy of `fixture` as a new app of `owner` with `memoryMb`; returns its name. */
  async function deployApp(owner: Account, fixture: string, memoryMb = 256, files: Record<string, string> = {}): Promise<string> {
    const name = `t-${randomBytes(4).toString("hex")}`;
    expectExit(await svc(["apps", "create", "--name", name, "--runtime", "node", "--memory", String(memoryMb)], owner.env), 0, "apps create");
    const source = await mkdtemp(join(tmpdir(), "svc-trust-app-"));
    dirs.push(source);
    await cp(join(ROOT, "test", "fixtures", "apps", fixture), source, { recursive: true });
    for (const [path, content] of Object.entries(files)) await writeFile(join(source, path), content);
    expectExit(await svc(["deploy", "--source", source, "--app", name], owner.env), 0, `deploy ${name}`);
    return name;
  }

  /**
   * Starts `command` as a cron run of a new app of `owner` (no disk: placed on the least loaded node):
   * its log so far, and its whole log once it ended.
   */
  async function runAs(owner: Account, command: string): Promise<{ logSoFar(): Promise<string>; done: Promise<string> }> {
    const app = await ok<{ id: string }>(owner.key, "POST", "/v1/apps", { name: `r-${randomBytes(4).toString("hex")}`, runtime: "node", memoryMb: 256 });
    const cron = await ok<{ id: string }>(owner.key, "POST", "/v1/crons", { appId: app.id, name: "probe", schedule: "0 0 1 1 *", command, timeoutSeconds: 120 });
    const started = await ok<Run>(owner.key, "POST", `/v1/crons/${cron.id}/run`);
    const logSoFar = async () => (await ok<{ logs: string }>(owner.key, "GET", `/v1/crons/${cron.id}/runs/${started.jobName}/logs`)).logs;
    const done = (async () => {
      for (let i = 0; i < 600; i++) {
        const runs = await ok<Run[]>(owner.key, "GET", `/v1/crons/${cron.id}/runs`);
        if (runs.some((r) => r.jobName === started.jobName && r.status !== "running")) break;
        await sleep(200);
      }
      return logSoFar();
    })();
    return { logSoFar, done };
  }

  it("a join with a token and an existing node's id is refused, and the node keeps its traffic", async () => {
    onTestFailed(showLog);
    const app = await deployApp(victim, "node-features");
    const before = await nodes();
    let stolen = 0;
    const imposter: Server = createServer((_req, res) => {
      stolen++;
      res.end("the attacker's page\n");
    });
    await new Promise<void>((resolve) => imposter.listen(0, "127.0.0.1", resolve));
    const address = `http://127.0.0.1:${(imposter.address() as { port: number }).port}`;
    const token = (await ok<{ token: string }>(operator(), "POST", "/v1/operator/join-tokens", { note: "leaked" })).token;
    const capacity = { cores: 2, memoryMb: 4096, diskTotalBytes: 2 ** 50, diskFreeBytes: 2 ** 50, runningJobs: 0, processes: 0, memoryFreeMb: 4096 };
    for (const node of before) {
      const res = await fetch(`${stack.apiUrl}/v1/nodes/join`, {
        method: "POST",
        headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
        body: JSON.stringify({ nodeId: node.id, name: node.name, address, capacity, disks: [] }),
      });
      expect(res.status).toBe(403);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("FORBIDDEN");
    }
    // The nodes keep their addresses, and every request of the app reaches the app.
    expect((await nodes()).map((n) => n.address).sort()).toEqual(before.map((n) => n.address).sort());
    await sleep(2_500);
    for (let i = 0; i < 20; i++) {
      const res = await siteRequest(stack, app, "/");
      expect(res.status).toBe(200);
      expect(res.body).toMatch(/^hello nobody from v1/);
    }
    expect(stolen).toBe(0);
    imposter.close();
  }, 180_000);

  it("two accounts on two nodes of one host run as two uids, and one's inotify flood leaves the other able to watch files", async () => {
    onTestFailed(showLog);
    const [first, second] = await nodes();
    // The attacker takes every inotify instance its uid may have, and holds them.
    const hold = `python3 -c "
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = [fd for fd in iter(lambda: libc.inotify_init(), -1)]
print('uid', __import__('os').getuid(), 'held', len(fds), 'errno', ctypes.get_errno(), flush=True)
time.sleep(12)
"`;
    // Started on the first node (the other cordoned until it runs), and holding before the victim starts.
    const held = await on(first!, async () => {
      const started = await runAs(attacker, hold);
      for (let i = 0; i < 150 && !(await started.logSoFar()).includes(" held "); i++) await sleep(200);
      return started;
    });
    expect(await held.logSoFar()).toContain(" held ");
    const watch = `python3 -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print('uid', os.getuid(), 'inotify', fd, 'errno', ctypes.get_errno(), flush=True)
"`;
    const victimLog = await on(second!, async () => (await runAs(victim, watch)).done);
    const attackerLog = await held.done;
    console.log(`uids: ${attackerLog.match(/uid \d+ held \d+/)?.[0]}; ${victimLog.match(/uid \d+ inotify -?\d+/)?.[0]}`);
    const attackerUid = /uid (\d+) held (\d+) errno (\d+)/.exec(attackerLog);
    const victimUid = /uid (\d+) inotify (-?\d+) errno (\d+)/.exec(victimLog);
    expect(attackerUid, attackerLog).not.toBeNull();
    expect(victimUid, victimLog).not.toBeNull();
    // The attacker reached its uid's limit (EMFILE: 24), the victim, with a uid of its own, did not.
    expect(Number(attackerUid![2])).toBeGreaterThan(0);
    expect(attackerUid![3]).toBe("24");
    expect(attackerUid![1]).not.toBe(victimUid![1]);
    expect(Number(victimUid![2])).toBeGreaterThanOrEqual(0);
  }, 180_000);

  it("memory is not promised twice over: the plan bounds an account's apps, and a host refuses what it cannot hold (507, every node tried)", async () => {
    onTestFailed(showLog);
    // The API: a pro account's apps reserve at most 16,384 MB; four apps of 8,192 MB are two too many.
    const planner = await account("planner");
    const big = (name: string) => api(planner.key, "POST", "/v1/apps", { name, runtime: "node", memoryMb: 8_192 });
    const names = [0, 1, 2, 3].map((i) => `big-${i}-${randomBytes(3).toString("hex")}`);
    expect((await big(names[0]!)).status).toBe(201);
    expect((await big(names[1]!)).status).toBe(201);
    for (const name of names.slice(2)) {
      const refused = await big(name);
      expect(refused.status).toBe(403);
      expect(JSON.stringify(refused.data)).toMatch(/PLAN_LIMIT_EXCEEDED.*may reserve 16384 MB of memory in all; 16384 MB are reserved and this app asks for 8192 MB/);
    }

    // The nodes: the host holds HOST_APP_MEMORY_MB for app processes; 2,048 MB fit once, not twice.
    const fits = await deployApp(victim, "node-features", 2_048);
    expect((await siteRequest(stack, fits, "/")).status).toBe(200);
    const name = `t-${randomBytes(4).toString("hex")}`;
    expectExit(await svc(["apps", "create", "--name", name, "--runtime", "node", "--memory", "2048"], attacker.env), 0, "apps create");
    const source = await mkdtemp(join(tmpdir(), "svc-trust-app-"));
    dirs.push(source);
    await cp(join(ROOT, "test", "fixtures", "apps", "node-features"), source, { recursive: true });
    const refused = await svc(["deploy", "--source", source, "--app", name], attacker.env);
    expect(refused.code).not.toBe(0);
    const deployments = JSON.parse(expectExit(await svc(["deployments", "list", name, "--json"], attacker.env), 0, "deployments").stdout) as {
      status: string;
      error: string | null;
    }[];
    expect(deployments[0]?.status).toBe("failed");
    // Both nodes were asked (they share the host), and said why with the numbers.
    expect(deployments[0]?.error).toMatch(/could not be placed: node node_\w+: the builder's host cannot hold a process with a memory limit of 2048 MiB: .* already is; 2\.0 GiB more does not fit; node node_\w+: /);
    await ok(victim.key, "DELETE", `/v1/apps/${fits}`);
  }, 300_000);

  it("one app's log spam leaves another account's requests on the same node within 1.5x of their p99", async () => {
    onTestFailed(showLog);
    const [steady, spammer] = await neighbours();
    const rounds: { quiet: number[]; spammed: number[] }[] = [];
    let failed = 0;
    const measure = async (into: number[], seconds: number) => {
      const until = Date.now() + seconds * 1000;
      await Promise.all(
        Array.from({ length: 4 }, async () => {
          while (Date.now() < until) {
            const at = performance.now();
            const res = await siteRequest(stack, steady, "/").catch(() => null);
            if (res?.status === 200) into.push(performance.now() - at);
            else failed++;
          }
        }),
      );
    };
    await measure([], 1);
    // Quiet and spammed windows in turn, and the median of the spammed windows' p99s against the median of the
    // quiet ones': whatever else loads the machine (the file running beside this one in a full run) lands in a
    // window or two of either kind, and moves neither median. One pooled p99 per kind read 0.91-2.2x; the median
    // of five pairs' ratios failed a full run at 1.55x (single pairs read 0.5-4.8x, one in six above 1.5x). The
    // medians of seven windows of each kind read 1.23x alone but 1.60x and 1.61x in full runs, and of nine 1.77x:
    // there the file beside this one (sick nodes, then apps under load) loaded the last half of the rounds, both
    // kinds alike, and the medians fell among them. A quiet window and the spammed one right after it share what
    // else loads the machine, so each pair's ratio cancels it; their median over nine pairs is the figure
    // (1.05x and 1.20x for those two runs).
    for (let round = 0; round < 9; round++) {
      const pair = { quiet: [] as number[], spammed: [] as number[] };
      await measure(pair.quiet, 2);
      expect((await siteRequest(stack, spammer, "/spam?ms=2500")).status).toBe(200);
      await measure(pair.spammed, 2);
      rounds.push(pair);
      await sleep(600);
    }
    const p = (times: number[], q: number) => [...times].sort((a, b) => a - b)[Math.floor(times.length * q)]!;
    const median = (values: number[]) => p(values, 0.5);
    const p99s = { quiet: rounds.map((pair) => p(pair.quiet, 0.99)), spammed: rounds.map((pair) => p(pair.spammed, 0.99)) };
    const ratio = median(rounds.map((_, i) => p99s.spammed[i]! / p99s.quiet[i]!));
    const all = { quiet: rounds.flatMap((pair) => pair.quiet), spammed: rounds.flatMap((pair) => pair.spammed) };
    console.log(
      `log spam: steady app p50 ${p(all.quiet, 0.5).toFixed(1)} → ${p(all.spammed, 0.5).toFixed(1)} ms, p99 ${p(all.quiet, 0.99).toFixed(1)} → ${p(all.spammed, 0.99).toFixed(1)} ms; window p99s quiet ${p99s.quiet.map((t) => t.toFixed(0)).join(", ")} ms, spammed ${p99s.spammed.map((t) => t.toFixed(0)).join(", ")} ms (median of the pairs' ratios ${ratio.toFixed(2)}x); ${all.quiet.length} → ${all.spammed.length} requests`,
    );
    const log = await (await fetch(`${stack.apiUrl}/v1/apps/${spammer}/runtime-logs?tail=10485760`, { headers: { Authorization: `Bearer ${attacker.key}` } })).text();
    const notices = log.match(/ svc \S+\/prc_\w+ log rate limit: dropped \d+ lines/g) ?? [];
    const kept = log.match(/ out \S+ spam spam/g)?.length ?? 0;
    console.log(`log spam: ${kept} spam lines kept, ${notices.length} drop notices`);
    // Spam it was: past the burst (the rate limit's drops then say so), unless a loaded node read the pipe
    // no faster than the limit (the app then waits on its own writes, and nothing needs dropping).
    expect(kept).toBeGreaterThan(LOG_RATE.burstLines);
    expect(failed).toBe(0);
    expect(ratio).toBeLessThanOrEqual(1.5);
  }, 240_000);

  it("a flood of connections and WebSockets to one account's app leaves another account's requests at 0 errors", async () => {
    onTestFailed(showLog);
    const [bystander, target] = await neighbours();
    const port = Number(new URL(stack.apiUrl).port);
    /** The bystander's 100 requests, one after another: how many failed, how many were sent again, their median time. */
    const bystanderRequests = async () => {
      let failed = 0;
      let resent = 0;
      const times: number[] = [];
      for (let i = 0; i < 100; i++) {
        const ask = () => siteRequest(stack, bystander, "/").catch((error: unknown) => ({ status: 0, body: String(error) }));
        const at = performance.now();
        let res = await ask();
        // A connection the local workerd reset under a flood of this size (no answer at all, never one of ours)
        // is sent again (up to four times, 250 ms apart), as a client would, and counted.
        for (let again = 0; again < 4 && res.status === 0; again++) {
          resent++;
          console.log(`bystander request ${i}: reset under the flood (${res.status} ${res.body.slice(0, 120)}); sent again`);
          await sleep(250);
          res = await ask();
        }
        times.push(performance.now() - at);
        if (res.status !== 200) {
          failed++;
          console.log(`bystander request ${i}: ${res.status} ${res.body.slice(0, 200)}`);
        }
      }
      return { failed, resent, p50: times.sort((a, b) => a - b)[50]! };
    };
    const quiet = await bystanderRequests();
    const sockets: Socket[] = [];
    const flood = { answered: new Map<number, number>(), retryAfter: 0, settled: 0 };
    // 500 requests that hold their connection (the app answers after 20 s), and 2,000 WebSockets.
    for (let i = 0; i < 2_500; i++) {
      const socket = connect(port, "127.0.0.1");
      let settled = false;
      const settle = () => {
        if (!settled) flood.settled++;
        settled = true;
      };
      socket.once("connect", settle);
      socket.on("error", settle);
      socket.on("data", (data: Buffer) => {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(data.toString("latin1"))?.[1] ?? 0);
        if (status) flood.answered.set(status, (flood.answered.get(status) ?? 0) + 1);
        if (/\r\nretry-after: 1\r\n/i.test(data.toString("latin1"))) flood.retryAfter++;
      });
      socket.write(
        i % 5 === 0
          ? `GET /slow?ms=20000 HTTP/1.1\r\nHost: ${target}.localhost:${port}\r\n\r\n`
          : `GET /ws HTTP/1.1\r\nHost: ${target}.localhost:${port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${randomBytes(16).toString("base64")}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
      sockets.push(socket);
    }
    // The flood in place: its connections accepted (2,500 at once overflow the local dev server's listen backlog,
    // which resets whatever connects in that instant, the bystander's too; Cloudflare's edge has no such queue).
    for (let i = 0; i < 100 && flood.settled < sockets.length; i++) await sleep(100);
    const flooded = await bystanderRequests();
    console.log(
      `flood: bystander p50 ${quiet.p50.toFixed(1)} ms quiet, ${flooded.p50.toFixed(1)} ms under the flood; ${flooded.failed} failed, ${flooded.resent} sent again; the flood's answers so far: ${JSON.stringify(Object.fromEntries(flood.answered))}, ${flood.retryAfter} with Retry-After`,
    );
    for (const socket of sockets) socket.destroy();
    expect(flooded.failed).toBe(0);
    expect(flooded.resent).toBeLessThanOrEqual(8);
    // Not held up behind the flood either (unbounded, the bystander's median went from ~20 ms to ~150 ms here).
    expect(flooded.p50).toBeLessThanOrEqual(Math.max(3 * quiet.p50, 50));
    // Past its share, the flood was told to come back later, at once.
    expect(flood.answered.get(503) ?? 0).toBeGreaterThan(0);
    expect(flood.retryAfter).toBeGreaterThan(0);
  }, 240_000);

  it("passes Expect: 100-continue bodies of 10 B and 5 MB to the app, never a client's address headers, and drops cookies for the apps domain", async () => {
    onTestFailed(showLog);
    const app = await deployApp(victim, "node-features");
    const port = new URL(stack.apiUrl).port;
    const scratch = await mkdtemp(join(tmpdir(), "svc-trust-body-"));
    dirs.push(scratch);
    const body = join(scratch, "body.bin");
    for (const size of [10, 5 * 1024 * 1024]) {
      const bytes = randomBytes(size);
      await writeFile(body, bytes);
      const { stdout } = await run("curl", [
        "-sS",
        "-H", `Host: ${app}.localhost:${port}`,
        "-H", "Expect: 100-continue",
        "--data-binary", `@${body}`,
        "-w", "\n%{http_code}",
        `http://127.0.0.1:${port}/echo`,
      ]);
      const sha = createHash("sha256").update(bytes).digest("hex");
      expect(stdout).toBe(`POST ${size} ${sha}\n\n200`);
    }
    const claims = {
      Forwarded: "for=6.6.6.6;proto=https",
      "X-Real-IP": "6.6.6.6",
      "True-Client-IP": "6.6.6.6",
      "X-Client-IP": "6.6.6.6",
      "X-Cluster-Client-IP": "6.6.6.6",
      "CF-Connecting-IP": "6.6.6.6",
      "X-Forwarded-For": "6.6.6.6",
      "X-Original-URL": "/admin",
      Via: "1.1 evil",
    };
    const echoed = JSON.parse((await siteRequest(stack, app, "/headers", { headers: claims })).body) as { headers: Record<string, string> };
    for (const name of Object.keys(claims)) expect(echoed.headers[name.toLowerCase()], name).toBeUndefined();
    expect(JSON.stringify(echoed.headers)).not.toContain("6.6.6.6");
    expect(echoed.headers.host).toBe(`${app}.localhost:${port}`);
    expect(echoed.headers["x-forwarded-proto"]).toBe("http");

    for (const domain of ["localhost", ".LOCALHOST", `other.localhost`]) {
      const res = await siteRequest(stack, app, `/cookie?domain=${encodeURIComponent(domain)}`);
      expect(res.status).toBe(200);
      expect(res.headers["set-cookie"], domain).toEqual(["own=1; Path=/; HttpOnly"]);
    }
    const own = await siteRequest(stack, app, `/cookie?domain=${app}.localhost`);
    expect(own.headers["set-cookie"]).toEqual([`wide=1; Path=/; Domain=${app}.localhost`, "own=1; Path=/; HttpOnly"]);
    const runtime = expectExit(await svc(["logs", app, "--runtime"], victim.env), 0, "logs").stdout;
    expect(runtime).toMatch(/ svc \S+\/prc_\w+ dropped the app's cookie "wide": its Domain=localhost is a top-level name/);
    expect(runtime).toMatch(/its Domain=other\.localhost is another app's host/);
  }, 240_000);
});
