import { cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from "vitest";
import { fleetClocks, type LocalNode, type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { STACK_START_TIMEOUT_MS, startOwnStack, svc, tempHome } from "../cli/svc.js";
import { fleetApi, until } from "./fleet-api.js";
import { expectExit, siteRequest } from "./sites.js";

/** Short enough for a test, the same code paths as the defaults. */
const LOST_AFTER_S = 4;
const CLIENTS = 16;

type Instance = { id: string; node: string; nodeName: string; state: string; ready: boolean; deploymentId: string | null; startedAt: string | null; restarts: number };
type AppInfo = { id: string; name: string; instanceCount: number; activeDeploymentId: string | null; instances: Instance[] };

/**
 * GET load on an app through the edge: `clients` loops, each a request after
 * the other, every answer counted; a failure is anything but a 200 (or a
 * request that got no answer), kept with its body.
 */
function load(stack: LocalStack, app: string, clients: number, path = "/") {
  let running = true;
  const seen = { ok: 0, failed: 0, samples: [] as string[], bodies: new Map<string, number>() };
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      const answer = await siteRequest(stack, app, path).catch((error: Error) => ({ status: 0, body: error.message }));
      if (answer.status === 200) {
        seen.ok++;
        seen.bodies.set(answer.body.trim(), (seen.bodies.get(answer.body.trim()) ?? 0) + 1);
      } else {
        seen.failed++;
        if (seen.samples.length < 10) seen.samples.push(`${answer.status} ${answer.body.trim().slice(0, 200)}`);
      }
    }
  });
  return {
    seen,
    stop: async () => {
      running = false;
      await Promise.all(loops);
      return seen;
    },
  };
}

/**
 * Issue 31's instances on `npm start -- --nodes 3`'s stack: an app scaled to
 * three processes runs one on each node; under 16 clients of GET load a node
 * killed with kill -9 costs no request (the edge tries another instance) and
 * its instance is started again on a remaining node; a rolling deploy and a
 * rolling configuration change cost none either, one instance at a time;
 * scaling down drains the extra ones, also without a failed request.
 */
describe("an app's instances across three nodes", () => {
  let stack: LocalStack & { stateDir: string };
  let home: Awaited<ReturnType<typeof tempHome>>;
  let api: ReturnType<typeof fleetApi>;
  let source: string;
  let dead: LocalNode | null = null;
  const app = "multi";

  const info = async () => (await api.ok<AppInfo>("GET", `/v1/apps/${app}`)) as AppInfo;
  const cli = (args: string[]) => svc(args, { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey });

  beforeAll(async () => {
    stack = await startOwnStack({
      workerLogs: true,
      nodes: 3,
      workerVars: { ...fleetClocks({ lostAfterSeconds: LOST_AFTER_S, graceSeconds: 5, leaseSeconds: 4 }), AUTOSCALE_UP_SECONDS: "2", AUTOSCALE_DOWN_SECONDS: "4" },
    });
    home = await tempHome();
    api = fleetApi(stack);
    source = await mkdtemp(join(tmpdir(), "svc-instances-"));
    await cp(join(ROOT, "test", "fixtures", "apps", "node-features"), source, { recursive: true });
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await dead?.revive();
    await stack?.stop();
    await home?.remove();
    if (source) await rm(source, { recursive: true, force: true });
  });

  it("spreads three instances over the three nodes; svc apps info lists each", async () => {
    onTestFailed(() => api.showLog());
    await api.newApp(app, "node");
    expectExit(await cli(["deploy", "--source", source, "--app", app]), 0, "deploy");
    const scaled = expectExit(await cli(["apps", "scale", app, "3"]), 0, "scale to 3");
    expect(scaled.stdout).toMatch(/^scaling multi to 3 instances\n(\d\/3 instances ready\n)+multi runs 3 instances on local-\d, local-\d, local-\d\n$/);
    const now = await info();
    expect(now.instanceCount).toBe(3);
    expect(now.instances).toHaveLength(3);
    expect(new Set(now.instances.map((i) => i.node)).size).toBe(3);
    for (const instance of now.instances) {
      expect(instance).toMatchObject({ state: "running", ready: true, deploymentId: now.activeDeploymentId, restarts: 0 });
      expect(instance.startedAt).not.toBeNull();
    }
    const shown = expectExit(await cli(["apps", "info", app]), 0, "apps info");
    expect(shown.stdout).toMatch(/instances\s+3 wanted, 3 running/);
    for (const instance of now.instances) expect(shown.stdout).toContain(`${instance.id} on ${instance.nodeName}: running, ready`);
    // The runtime log has every instance's lines, merged by time, and no node "move" among them.
    const res = await fetch(`${stack.apiUrl}/v1/apps/${app}/runtime-logs?lines=300`, { headers: { Authorization: `Bearer ${stack.adminKey}` } });
    const log = await res.text();
    const writers = new Set([...log.matchAll(/^\S+ (?:out|err|svc) \S+\/(prc_\w+) /gm)].map((m) => m[1]));
    for (const instance of now.instances) expect(writers, log).toContain(instance.id);
    expect(log).not.toMatch(/the app moved from node/);
    const times = log.split("\n").filter(Boolean).map((line) => line.slice(0, 24));
    expect(times).toEqual([...times].sort());
    const json = JSON.parse(expectExit(await cli(["apps", "info", app, "--json"]), 0, "apps info --json").stdout) as AppInfo;
    expect(json.instances.map((i) => i.id).sort()).toEqual(now.instances.map((i) => i.id).sort());
    // An app with several instances takes no disk (one writer per disk), and one with a disk does not scale.
    const disk = await api.ok<{ id: string }>("POST", "/v1/disks", { name: "one-writer", sizeGb: 1 });
    const attach = await api.call("POST", `/v1/disks/${disk.id}/attach`, { app });
    expect(attach.status).toBe(409);
    expect(JSON.stringify(attach.data)).toContain("APP_HAS_INSTANCES");
  }, 240_000);

  it("a node killed with kill -9 under 16 clients of GET load: no request fails, and its instance starts again on a remaining node", async () => {
    onTestFailed(() => api.showLog());
    const before = await info();
    const victimId = before.instances[1]!.node;
    const victim = stack.nodes.find((node) => node.id === victimId)!;
    const traffic = load(stack, app, CLIENTS);
    await until("some traffic", async () => traffic.seen.ok > 50);
    victim.kill();
    dead = victim;
    await until("the node to be lost", async () => (await api.nodesNow()).find((n) => n.id === victimId)?.state === "lost", 30_000);
    const after = await until(
      "three ready instances again, none on the lost node",
      async () => {
        const now = await info();
        const ready = now.instances.filter((i) => i.ready && i.state === "running");
        return ready.length === 3 && now.instances.length === 3 && !now.instances.some((i) => i.node === victimId) ? now : null;
      },
      90_000,
    );
    const seen = await traffic.stop();
    console.log(`instances e2e: kill -9 of ${victim.name}: ${seen.ok} answered, ${seen.failed} failed`);
    expect(seen.failed, seen.samples.join("\n")).toBe(0);
    expect(seen.ok).toBeGreaterThan(100);
    // The two instances that were not on it kept running throughout; the third is new, on one of the two nodes left.
    const kept = before.instances.filter((i) => i.node !== victimId).map((i) => i.id);
    expect(after.instances.map((i) => i.id)).toEqual(expect.arrayContaining(kept));
    expect(new Set(after.instances.map((i) => i.node)).size).toBe(2);
    await victim.revive();
    dead = null;
    await until("the node to return", async () => (await api.nodesNow()).find((n) => n.id === victimId)?.state === "ready", 60_000);
  }, 240_000);

  it("a rolling deploy and a rolling configuration change under 16 clients: one instance at a time, no request fails", async () => {
    onTestFailed(() => api.showLog());
    const before = await info();
    const traffic = load(stack, app, CLIENTS);
    await until("some traffic", async () => traffic.seen.ok > 50);
    const deployed = expectExit(await cli(["deploy", "--source", source, "--app", app]), 0, "rolling deploy");
    expect(deployed.stdout + deployed.stderr).toMatch(/1\/3 instances on the new release[\s\S]*2\/3 instances on the new release[\s\S]*3\/3 instances on the new release/);
    const rolled = await info();
    expect(rolled.activeDeploymentId).not.toBe(before.activeDeploymentId);
    expect(rolled.instances.map((i) => i.deploymentId)).toEqual([rolled.activeDeploymentId, rolled.activeDeploymentId, rolled.activeDeploymentId]);
    expect(rolled.instances.some((i) => before.instances.some((b) => b.id === i.id))).toBe(false);
    // A configuration change rolls the same way: the answers change from v1 to v2 with none failing.
    expectExit(await cli(["env", "set", "RELEASE_MARK=v2", "--app", app]), 0, "env set");
    await until("every instance on the new configuration", async () => {
      const now = await info();
      return now.instances.length === 3 && now.instances.every((i) => i.deploymentId === now.activeDeploymentId && i.ready) && now.activeDeploymentId !== rolled.activeDeploymentId;
    });
    const answered = await siteRequest(stack, app, "/");
    expect(answered.body).toContain("from v2");
    const seen = await traffic.stop();
    console.log(`instances e2e: rolling deploy and config change: ${seen.ok} answered, ${seen.failed} failed; ${JSON.stringify(Object.fromEntries(seen.bodies))}`);
    expect(seen.failed, seen.samples.join("\n")).toBe(0);
    expect([...seen.bodies.keys()].sort()).toEqual(["hello nobody from v1", "hello nobody from v2"]);
  }, 300_000);

  it("scaling down drains the extra instances without a failed request", async () => {
    onTestFailed(() => api.showLog());
    const traffic = load(stack, app, CLIENTS);
    await until("some traffic", async () => traffic.seen.ok > 50);
    expectExit(await cli(["apps", "scale", app, "1"]), 0, "scale to 1");
    const one = await until("one instance", async () => {
      const now = await info();
      return now.instances.length === 1 ? now : null;
    });
    // Past the drain (5 s): the stopped ones are gone from their nodes, and traffic went on.
    await new Promise((resolve) => setTimeout(resolve, 6_000));
    const seen = await traffic.stop();
    expect(seen.failed, seen.samples.join("\n")).toBe(0);
    expect(one.instanceCount).toBe(1);
    expect((await siteRequest(stack, app, "/")).status).toBe(200);
  }, 120_000);

  it("svc.json's instances is the app's from its deploy (within the plan); a release failing its check fails the deploy and the instances keep the previous one", async () => {
    onTestFailed(() => api.showLog());
    const svcJson = (extra: Record<string, unknown>) =>
      writeFile(join(source, "svc.json"), JSON.stringify({ name: "node-features", runtime: "node", healthCheckPath: "/healthz", ...extra }));
    await svcJson({ instances: 2 });
    const two = expectExit(await cli(["deploy", "--source", source, "--app", app]), 0, "deploy with instances 2");
    expect(two.stdout).toContain("svc.json asks for 2 instances: the app runs 2 (it ran 1)");
    const scaled = await info();
    expect(scaled.instanceCount).toBe(2);
    expect(scaled.instances.map((i) => i.deploymentId)).toEqual([scaled.activeDeploymentId, scaled.activeDeploymentId]);
    expect(new Set(scaled.instances.map((i) => i.node)).size).toBe(2);
    // No plan runs 25: the deploy says so and the app keeps 2; the release exits at once and fails.
    await svcJson({ instances: 25, startCommand: "exit 3" });
    const traffic = load(stack, app, 4);
    const broken = await cli(["deploy", "--source", source, "--app", app]);
    const seen = await traffic.stop();
    expect(broken.code).not.toBe(0);
    expect(broken.stdout + broken.stderr).toMatch(/svc\.json asks for 25 instances, but an app may run at most \d+ instances \(asked for 25\) on the \w+ plan; ask for fewer, or upgrade the plan: the app keeps 2/);
    // A count that does apply goes back with the release when the deploy fails.
    await svcJson({ instances: 3, startCommand: "exit 3" });
    const brokenAgain = await cli(["deploy", "--source", source, "--app", app]);
    expect(brokenAgain.code).not.toBe(0);
    expect(brokenAgain.stdout).toContain("svc.json asks for 3 instances: the app runs 3 (it ran 2)");
    expect(broken.stdout + broken.stderr).toMatch(/process exited with code 3 during start/);
    const after = await info();
    expect(after.instanceCount).toBe(2);
    expect(after.activeDeploymentId).toBe(scaled.activeDeploymentId);
    expect(after.instances.map((i) => i.id).sort()).toEqual(scaled.instances.map((i) => i.id).sort());
    expect(seen.failed, seen.samples.join("\n")).toBe(0);
    await svcJson({});
  }, 180_000);

  it("scales on load: a load that needs three instances reaches three within 60 s, and one again after it stops, no request failing", async () => {
    onTestFailed(() => api.showLog());
    const turnedOn = expectExit(await cli(["apps", "scale", app, "--min", "1", "--max", "3", "--target", "4", "--no-follow"]), 0, "autoscaling on");
    expect(turnedOn.stdout).toMatch(/multi scales on load between 1 and 3 instances, at 4 requests in flight each; it runs 2 instances now/);
    // 16 clients each waiting 300 ms for an answer: about 16 requests in flight, 4 instances' worth at a target of 4 (at most 3).
    const heavy = load(stack, app, CLIENTS, "/slow?ms=300");
    const started = Date.now();
    await until("three ready instances", async () => {
      const now = await info();
      return now.instanceCount === 3 && now.instances.length === 3 && now.instances.every((i) => i.ready) ? now : null;
    }, 60_000);
    const upIn = Date.now() - started;
    const busy = await heavy.stop();
    // A light load goes on while it scales down: one client, one request at a time.
    const light = load(stack, app, 1);
    const stopped = Date.now();
    const one = await until(
      "one instance again",
      async () => {
        const now = await info();
        return now.instanceCount === 1 && now.instances.length === 1 ? now : null;
      },
      300_000,
    );
    const downIn = Date.now() - stopped;
    const calm = await light.stop();
    console.log(`instances e2e: autoscaling: three in ${(upIn / 1000).toFixed(1)} s under load (${busy.ok} answered, ${busy.failed} failed), one ${(downIn / 1000).toFixed(1)} s after it stopped (${calm.ok} answered, ${calm.failed} failed)`);
    expect(busy.failed, busy.samples.join("\n")).toBe(0);
    expect(calm.failed, calm.samples.join("\n")).toBe(0);
    expect(upIn).toBeLessThanOrEqual(60_000);
    expect(downIn).toBeLessThanOrEqual(300_000);
    // Every decision is on the app with its reason, newest first: the last ones drained one at a time.
    const events = (one as AppInfo & { scaleEvents: { from: number; to: number; reason: string }[] }).scaleEvents;
    expect(events[0]).toMatchObject({ from: 2, to: 1 });
    expect(events[0]!.reason).toMatch(/requests in flight \(.* per instance, target 4\) for 4 s: 1 would do; draining one/);
    const up = events.find((e) => e.to === 3)!;
    expect(up.reason).toMatch(/requests in flight \(.* per instance, target 4\) for 2 s: 3 needed/);
    const shown = expectExit(await cli(["apps", "info", app]), 0, "apps info");
    expect(shown.stdout).toMatch(/autoscaling\s+1–3 instances, 4 requests in flight each/);
    expect(shown.stdout).toContain("2 → 1: ");
    expectExit(await cli(["apps", "scale", app, "--no-autoscaling", "--no-follow"]), 0, "autoscaling off");
    expect((await api.ok<{ autoscaling: unknown }>("GET", `/v1/apps/${app}`)).autoscaling).toBeNull();
  }, 420_000);
});
