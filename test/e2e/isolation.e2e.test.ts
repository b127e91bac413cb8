import { randomBytes } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { networkInterfaces } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { siteRequest } from "./sites.js";

/**
 * Issue 9's acceptance: two accounts on the stack `npm start` runs. The
 * victim's cron run holds secrets in its environment and data on its disk
 * while the attacker's cron run, started meanwhile, tries with ordinary tools
 * everything that used to work: other processes' environ and cwd, other disks,
 * sources and logs, the repository's secrets and admin key, the builder's
 * environment, killing others, a fork bomb, filling /tmp, and connecting to
 * the builder and the API. Each is refused; the victim's run completes and
 * still reads its own variables and disk at its mountPath.
 */
const only = process.getuid?.() === 0 ? describe : describe.skip;

type Account = { key: string; accountId: string };
type Run = { jobName: string; status: string; error: string | null };

only("two accounts on one builder", () => {
  let stack: LocalStack;
  let victim: Account;
  let attacker: Account;
  const secret = `victim-secret-${randomBytes(8).toString("hex")}`;
  const diskContent = `victim-disk-${randomBytes(8).toString("hex")}`;

  async function api<T>(account: Account | null, method: string, path: string, body?: unknown): Promise<T> {
    const res = await fetch(`${stack.apiUrl}${path}`, {
      method,
      headers: {
        Authorization: `Bearer ${account ? account.key : stack.secrets.OPERATOR_TOKEN}`,
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return JSON.parse(text) as T;
  }

  async function newAccount(name: string): Promise<Account> {
    const created = await api<{ account: { id: string }; apiKey: { key: string } }>(null, "POST", "/v1/accounts", { name, plan: "pro" });
    return { key: created.apiKey.key, accountId: created.account.id };
  }

  /** Creates a cron job (never due on its own) and starts a run of it; resolves to the job id and run name. */
  async function startRun(account: Account, app: string, name: string, command: string): Promise<{ id: string; jobName: string }> {
    const cron = await api<{ data: { id: string } }>(account, "POST", "/v1/crons", {
      appId: app,
      name,
      schedule: "0 0 1 1 *",
      command,
      timeoutSeconds: 120,
    });
    const run = await api<{ data: { jobName: string } }>(account, "POST", `/v1/crons/${cron.data.id}/run`);
    return { id: cron.data.id, jobName: run.data.jobName };
  }

  async function logsOf(account: Account, id: string, jobName: string): Promise<string> {
    return (await api<{ data: { logs: string } }>(account, "GET", `/v1/crons/${id}/runs/${jobName}/logs`)).data.logs;
  }

  async function finished(account: Account, id: string, jobName: string): Promise<Run> {
    const deadline = Date.now() + 120_000;
    for (;;) {
      const runs = await api<{ data: Run[] }>(account, "GET", `/v1/crons/${id}/runs`);
      const run = runs.data.find((r) => r.jobName === jobName);
      if (run && run.status !== "running") return run;
      if (Date.now() > deadline) throw new Error(`run ${jobName} did not finish`);
      await sleep(500);
    }
  }

  /** `check=value` lines the attack printed on stdout. */
  function results(log: string): Record<string, string> {
    const found: Record<string, string> = {};
    for (const match of log.matchAll(/ out (\w[\w-]*)=(.*)$/gm)) found[match[1]!] = match[2]!;
    return found;
  }

  beforeAll(async () => {
    stack = await startStack();
    [victim, attacker] = await Promise.all([newAccount("victim"), newAccount("attacker")]);
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
  });

  it("the attacker's job reaches nothing of the victim, the builder or the host, and the victim's job completes", async () => {
    const victimApp = `victim-${randomBytes(3).toString("hex")}`;
    const attackerApp = `attacker-${randomBytes(3).toString("hex")}`;
    await api(victim, "POST", "/v1/apps", { name: victimApp, runtime: "node", memoryMb: 256 });
    await api(attacker, "POST", "/v1/apps", { name: attackerApp, runtime: "node", memoryMb: 256 });
    await api(victim, "PATCH", `/v1/apps/${victimApp}/env`, { vars: { VICTIM_SECRET: secret } });
    await api(victim, "POST", "/v1/disks", { name: "private", sizeGb: 1, mountPath: "/var/lib/victim" });
    await api(victim, "POST", "/v1/disks/private/attach", { app: victimApp });
    const seed = await startRun(victim, victimApp, "seed", `echo ${diskContent} > /var/lib/victim/private.txt`);
    const seeded = await finished(victim, seed.id, seed.jobName);
    expect(seeded.status, await logsOf(victim, seed.id, seed.jobName)).toBe("success");

    // The victim holds its secret and disk while the attacker runs.
    const held = await startRun(
      victim,
      victimApp,
      "hold",
      'echo ready; sleep 25; echo "disk=$(cat /var/lib/victim/private.txt)"; echo "env=$VICTIM_SECRET"',
    );
    const deadline = Date.now() + 60_000;
    while (!(await logsOf(victim, held.id, held.jobName)).includes("ready")) {
      if (Date.now() > deadline) throw new Error("the victim's run never started");
      await sleep(200);
    }

    const hostAddress = Object.values(networkInterfaces())
      .flat()
      .find((address) => address && address.family === "IPv4" && !address.internal)?.address;
    const builderPort = new URL(stack.builderUrl).port;
    const apiPort = new URL(stack.apiUrl).port;
    const probe = (host: string, port: string) =>
      `node -e "require('net').connect(${port},'${host}').on('connect',()=>{console.log('open');process.exit()}).on('error',(e)=>{console.log(e.code);process.exit()});setTimeout(()=>{console.log('timeout');process.exit()},3000)"`;
    const attack = [
      'echo "processes=$(ls /proc | grep -c "^[0-9]")"',
      `echo "environ=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c -e VICTIM_SECRET -e BUILDER_SECRET -e OPERATOR_TOKEN)"`,
      'echo "cwds=$(ls -l /proc/[0-9]*/cwd 2>/dev/null | grep -v -c " -> /work$")"',
      `echo "found=$(find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name private.txt -o -name .dev.vars -o -name secrets.env -o -name local-admin-key -o -name status.json -o -name source.tar.gz -o -name builder.log -o -name disk.img -o -name tenants.json \\) -print 2>/dev/null | wc -l)"`,
      `echo "grep=$(grep -rs -l -e ${diskContent} -e ${secret} /etc /tmp /work /run /dev/shm /home 2>/dev/null | wc -l)"`,
      'echo "mountpath=$(ls /var/lib/victim 2>&1 | head -1)"',
      `echo "builder-port=$(${probe("127.0.0.1", builderPort)})"`,
      `echo "api-port=$(${probe("127.0.0.1", apiPort)})"`,
      hostAddress ? `echo "host-builder-port=$(${probe(hostAddress, builderPort)})"` : "echo host-builder-port=ECONNREFUSED",
      'kill -9 -1; echo "kill-all=survived"',
      'echo "tmp-fill=$(head -c 1000000000 /dev/zero > /tmp/fill 2>&1; echo $?)"; rm -f /tmp/fill',
      'echo "uid=$(id -u)"',
      // Last: a fork bomb, contained by the job's process limit; the run ends (and the kernel ends the rest) after it.
      // Its wait is forked before it: while the bomb holds every process the limit allows, the shell can fork
      // nothing (dash exits on a failed fork), and `wait` and `echo` are builtins. (The line still went missing
      // once in a full run since: the assertion prints the run and its log.)
      "sleep 3 & pause=$!; ( bomb() { bomb | bomb & }; bomb ) 2>/dev/null; wait $pause; echo bomb=contained",
    ].join("\n");
    const attacked = await startRun(attacker, attackerApp, "attack", attack);
    const attackRun = await finished(attacker, attacked.id, attacked.jobName);
    const attackLog = await logsOf(attacker, attacked.id, attacked.jobName);
    const seen = results(attackLog);

    expect(Number(seen.processes), attackLog).toBeLessThan(20);
    expect(seen.environ).toBe("0");
    expect(seen.cwds).toBe("0");
    expect(seen.found).toBe("0");
    expect(seen.grep).toBe("0");
    expect(seen.mountpath).toMatch(/No such file or directory/);
    expect(seen["builder-port"]).toBe("ECONNREFUSED");
    expect(seen["api-port"]).toBe("ECONNREFUSED");
    expect(seen["host-builder-port"]).toMatch(/^(ECONNREFUSED|EHOSTUNREACH|ENETUNREACH)$/);
    expect(seen["kill-all"]).toBe("survived");
    expect(seen["tmp-fill"]).toBe("1");
    // Its log says how the run ended when the line is missing (the cause of a rare miss is not known yet).
    expect(seen.bomb, `${JSON.stringify(attackRun)}\n${attackLog.slice(-3000)}`).toBe("contained");
    expect(attackRun.status).toBe("success");
    for (const value of [...Object.values(stack.secrets), stack.adminKey, secret, diskContent]) {
      expect(attackLog).not.toContain(value);
    }

    const victimRun = await finished(victim, held.id, held.jobName);
    const victimLog = await logsOf(victim, held.id, held.jobName);
    expect(victimRun, victimLog).toMatchObject({ status: "success" });
    expect(results(victimLog)).toMatchObject({ disk: diskContent, env: secret });
    // Different accounts, different users (the victim's uid is not the attacker's).
    const whoami = await startRun(victim, victimApp, "whoami", "id -u");
    await finished(victim, whoami.id, whoami.jobName);
    expect(await logsOf(victim, whoami.id, whoami.jobName)).not.toMatch(new RegExp(` out ${seen.uid}$`, "m"));
  }, 300_000);

  it("a run cannot connect to a server in another account's run, with the host's bridge netfilter off", async () => {
    await withBridgeNetfilterOff(async () => {
      const victimApp = `server-${randomBytes(3).toString("hex")}`;
      const attackerApp = `client-${randomBytes(3).toString("hex")}`;
      await api(victim, "POST", "/v1/apps", { name: victimApp, runtime: "node", memoryMb: 256 });
      await api(attacker, "POST", "/v1/apps", { name: attackerApp, runtime: "node", memoryMb: 256 });
      const connect = (host: string) =>
        `require('net').connect(8765,${host}).on('data',(d)=>{console.log(String(d));process.exit()}).on('error',(e)=>{console.log(e.code);process.exit()});setTimeout(()=>{console.log('timeout');process.exit()},3000)`;
      const server = await startRun(
        victim,
        victimApp,
        "server",
        `node -e "const ip=require('os').networkInterfaces().eth0.find((a)=>a.family==='IPv4').address;require('net').createServer((c)=>c.end('open')).listen(8765,'0.0.0.0',()=>console.log('ip='+ip));setTimeout(()=>process.exit(),40000)" &
sleep 1; echo "self=$(node -e "${connect("require('os').networkInterfaces().eth0[0].address")}")"; wait`,
      );
      const deadline = Date.now() + 60_000;
      let address: string | undefined;
      while (!address) {
        address = / out ip=(\d+\.\d+\.\d+\.\d+)$/m.exec(await logsOf(victim, server.id, server.jobName))?.[1];
        if (Date.now() > deadline) throw new Error("the victim's server never started");
        if (!address) await sleep(200);
      }
      const probe = await startRun(attacker, attackerApp, "probe", `echo "peer=$(node -e "${connect(`'${address}'`)}")"`);
      const probeRun = await finished(attacker, probe.id, probe.jobName);
      const probeLog = await logsOf(attacker, probe.id, probe.jobName);
      expect(probeRun.status, probeLog).toBe("success");
      expect(results(probeLog).peer, probeLog).toMatch(/^(timeout|ECONNREFUSED|EHOSTUNREACH|ENETUNREACH)$/);
      // The server was there all along: its own run reached it.
      expect(results(await logsOf(victim, server.id, server.jobName)).self).toBe("open");
    });
  }, 180_000);

  it("another account's run cannot reach an app's port: only the edge's path leads there", async () => {
    const home = await tempHome();
    try {
      const victimApp = `web-${randomBytes(3).toString("hex")}`;
      const attackerApp = `scan-${randomBytes(3).toString("hex")}`;
      await api(victim, "POST", "/v1/apps", { name: victimApp, runtime: "node", memoryMb: 256 });
      await api(attacker, "POST", "/v1/apps", { name: attackerApp, runtime: "node", memoryMb: 256 });
      const env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: victim.key };
      const deployed = await svc(["deploy", "--source", join(ROOT, "test", "fixtures", "apps", "node-features"), "--app", victimApp], env);
      expect(deployed.code, deployed.stderr).toBe(0);
      expect((await siteRequest(stack, victimApp, "/")).status).toBe(200);
      await withBridgeNetfilterOff(async () => {
        // Every address of the attacker's own subnet (where app processes and runs live), the app's port.
        const scan = `node -e "
const net = require('net');
const own = require('os').networkInterfaces().eth0.find((a) => a.family === 'IPv4').address;
const prefix = own.split('.').slice(0, 3).join('.');
const open = [];
let pending = 254;
for (let i = 1; i < 255; i++) {
  const s = net.connect(8080, prefix + '.' + i);
  const done = (ok) => { if (ok) open.push(prefix + '.' + i); s.destroy(); if (--pending === 0) { console.log('open=' + open.join(',')); console.log('scanned=' + prefix + '.0/24'); } };
  s.setTimeout(2000, () => done(false));
  s.on('connect', () => done(true)).on('error', () => done(false));
}"`;
        const probe = await startRun(attacker, attackerApp, "scan", scan);
        const run = await finished(attacker, probe.id, probe.jobName);
        const log = await logsOf(attacker, probe.id, probe.jobName);
        expect(run.status, log).toBe("success");
        expect(results(log).scanned, log).toMatch(/^10\.213\.\d+\.0\/24$/);
        expect(results(log).open, log).toBe("");
      });
    } finally {
      await home.remove();
    }
  }, 240_000);
});

/**
 * Runs share a bridge; with br_netfilter off (a fresh VM without Docker) the host's inet rules never see
 * bridged traffic, so isolation must hold at the bridge itself: the setting is off while `check` runs.
 */
async function withBridgeNetfilterOff(check: () => Promise<void>): Promise<void> {
  const sysctl = "/proc/sys/net/bridge/bridge-nf-call-iptables";
  const before = await readFile(sysctl, "utf8").catch(() => null);
  if (before !== null) await writeFile(sysctl, "0");
  try {
    await check();
  } finally {
    if (before !== null) await writeFile(sysctl, before);
  }
}
