import { randomBytes } from "node:crypto";
import { cp, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { chromium } from "playwright-core";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "../cli/svc.js";
import { fleetApi } from "./fleet-api.js";
import { expectExit, type SiteResponse, siteRequest } from "./sites.js";

const APPS = join(ROOT, "test", "fixtures", "apps");
/** A deploy of an app without dependencies, on a shared 2-core machine. */
const DEPLOY_MS = 120_000;

type App = { status: string; type: string | null; url: string | null; activeDeploymentId: string | null; pendingChanges: string[] };
type Deployment = {
  id: string;
  status: string;
  cause: string | null;
  error: string | null;
  logExcerpt: string[] | null;
  finishedAt: string | null;
  fileCount: number | null;
  [field: string]: unknown;
};
/** What the app's `release.json` says: how this release starts (test/fixtures/apps/node-life). */
type Release = { mark: string; warmupMs?: number; host?: string; port?: number; silent?: boolean; dieAfterMs?: number };

/**
 * Issue 29's acceptance through the stack `npm start` runs: the real `svc`
 * deploys and changes apps, the node runs them, and what each change did is
 * read back through the app itself (its answers, its runtime log) and through
 * what the CLI, the API and the dashboard say.
 */
describe("an app's life: every change reaches it, every status is true, every failure says why", () => {
  let stack: LocalStack & { stateDir: string };
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  const dirs: string[] = [];
  const suffix = randomBytes(3).toString("hex");
  const web = `life-${suffix}`;
  const port = () => new URL(stack.apiUrl).port;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "e2e-life", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
  }, STACK_START_TIMEOUT_MS);
  // The stack is shared with other files: what its Worker said (a restart under load, an error) explains a failure here.
  beforeEach(({ onTestFailed }) => onTestFailed(() => fleetApi(stack).showLog()));
  afterAll(async () => {
    await home?.remove();
    await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  });

  /** A copy of the node-life fixture whose release.json (and svc.json) say how this release starts. */
  const source = async (release: Release, svcJson: Record<string, unknown> = { runtime: "node" }) => {
    const dir = await mkdtemp(join(tmpdir(), "svc-life-"));
    dirs.push(dir);
    await cp(join(APPS, "node-life"), dir, { recursive: true });
    await writeFile(join(dir, "release.json"), JSON.stringify(release));
    await writeFile(join(dir, "svc.json"), JSON.stringify(svcJson));
    return dir;
  };
  const run = (args: string[]) => svc(args, env);
  const ok = async (args: string[]) => expectExit(await run(args), 0, args.join(" "));
  const appInfo = async (app: string) => JSON.parse((await ok(["apps", "info", app, "--json"])).stdout) as App;
  const deployments = async (app: string) => JSON.parse((await ok(["deployments", "list", app, "--json"])).stdout) as Deployment[];
  const create = (app: string) => ok(["apps", "create", "--name", app, "--runtime", "node", "--memory", "256"]);
  const deploy = (app: string, dir: string) => run(["deploy", "--source", dir, "--app", app]);
  const get = (app: string, path = "/") => siteRequest(stack, app, path).catch((err: Error): SiteResponse => ({ status: 0, headers: {}, body: err.message }));
  const runtimeLog = async (app: string, ...extra: string[]) => (await ok(["logs", app, "--runtime", ...extra])).stdout;
  /** `n` requests one after another; the bodies that were not `expected`. */
  const straightAfter = async (app: string, expected: string, n = 50) => {
    const wrong: string[] = [];
    for (let i = 0; i < n; i++) {
      const res = await get(app);
      if (res.status !== 200 || res.body !== `${expected}\n`) wrong.push(`${res.status} ${res.body.trim()}`);
    }
    return wrong;
  };
  /** Reads `read()` every `everyMs` until stopped: every value seen, in order, once each (a repeat is not kept). */
  const sample = <T>(read: () => Promise<T>, everyMs: number) => {
    const seen: T[] = [];
    let on = true;
    const done = (async () => {
      while (on) {
        const value = await read();
        if (seen.at(-1) !== value) seen.push(value);
        await sleep(everyMs);
      }
    })();
    return async () => {
      on = false;
      await done;
      return seen;
    };
  };
  /**
   * Requests the app every 50 ms until stopped, so the edge always holds a
   * fresh copy of the app as it is (before a first deploy: nothing to route
   * to): the statuses seen.
   */
  const knock = (app: string) => sample(async () => (await get(app)).status, 50);
  /** Milliseconds from the newest deployment's "switching traffic" (or last "instances on the new release") to its "serving". */
  const settleMs = async (app: string) => {
    const response = await fetch(`${stack.apiUrl}/v1/apps/${app}/deployments`, { headers: { Authorization: `Bearer ${env.SVC_API_KEY}` } });
    const [newest] = ((await response.json()) as { data: { progress: { at: string; text: string }[] }[] }).data;
    const steps = newest?.progress ?? [];
    const switched = steps.findLast((step) => /switching traffic to it$|instances on the new release$/.test(step.text));
    const serving = steps.find((step) => step.text.startsWith("serving:"));
    if (!switched || !serving) throw new Error(`no switch and serving in ${JSON.stringify(steps)}`);
    return Date.parse(serving.at) - Date.parse(switched.at);
  };
  /** The app as the API has it (polled: cheaper than starting the CLI each time). */
  const apiApp = async (app: string) =>
    ((await (await fetch(`${stack.apiUrl}/v1/apps/${app}`, { headers: { Authorization: `Bearer ${env.SVC_API_KEY}` } })).json()) as { data: App }).data;
  /** The last `lines` lines of the app's runtime log, through the API. */
  const apiLog = async (app: string, lines: number) =>
    (await fetch(`${stack.apiUrl}/v1/apps/${app}/runtime-logs?lines=${lines}`, { headers: { Authorization: `Bearer ${env.SVC_API_KEY}` } })).text();
  /** Samples the app's status through the API every 250 ms until stopped. */
  const watchStatus = (app: string) => sample(async () => (await apiApp(app)).status, 250);

  describe("a web app without a disk", () => {
    let redeployMs = 0;

    it(
      "created, it is not_deployed; its first deploy is deploying, narrates the start, and serves the new release the moment Deployed prints",
      async () => {
        const created = await create(web);
        expect(created.stdout).toMatch(/^status\s+not_deployed$/m);
        // How to reach it from code, where <app>.localhost does not resolve.
        expect(created.stdout).toContain(`(curl -H 'Host: ${web}.localhost:${port()}' http://127.0.0.1:${port()}/)`);
        const stopWatching = watchStatus(web);
        // The edge is asked for the app all through its first deploy: the copy it holds says nothing runs, to the last moment.
        const stopKnocking = knock(web);
        const first = await deploy(web, await source({ mark: "v1", warmupMs: 2_000 }));
        const knocked = await stopKnocking();
        const wrong = await straightAfter(web, "hello nobody from v1");
        const seen = await stopWatching();
        expectExit(first, 0, "first deploy");
        // The new process's own output and each phase, after the build and before "Deployed".
        const lines = first.stdout.trimEnd().split("\n");
        const at = (pattern: RegExp) => lines.findIndex((line) => pattern.test(line));
        const processNote = at(/svc starting process prc_\w+ of the release on node/);
        const starting = at(/ out v1 starting$/);
        const waiting = at(/ svc waiting for port 8080 \(\d+ s\)$/);
        const warming = at(/ out v1 warming up 1500 ms$/);
        const listening = at(/ out v1 listening on all interfaces:8080/);
        const rest = [
          at(/ svc healthy after \d+(\.\d+)? s; switching traffic to it$/),
          at(/ svc serving: every request goes to the new release$/),
          at(new RegExp(`^Deployed: http://${web}\\.localhost:${port()}$`)),
        ];
        // The app's own lines in their order and the node's notes in theirs; the first note on waiting comes
        // 1 s after the start, before or after the app's first line (node itself may take longer to start).
        for (const chain of [
          [processNote, starting, warming, listening, ...rest],
          [processNote, waiting, listening, ...rest],
        ]) {
          expect(chain.every((index) => index >= 0), `${chain}\n${first.stdout}`).toBe(true);
          expect([...chain].sort((a, b) => a - b), first.stdout).toEqual(chain);
        }
        expect(lines.at(-1)).toBe(`Deployed: http://${web}.localhost:${port()}`);
        // Not one of the 50 requests straight after "Deployed" got a 404 or anything else, though the deploy
        // was done sooner than the edge trusts a copy of an app with a process (AppRuntime's settleAt).
        expect(knocked[0], `statuses while deploying: ${knocked}`).not.toBe(200);
        expect(wrong).toEqual([]);
        expect(seen).toEqual(["not_deployed", "deploying", "running"]);
        // A first deploy replaced nothing: it is done once the edges' copies saying "nothing runs" (100 ms) expire,
        // not the second a copy naming a process is trusted.
        const firstSettle = await settleMs(web);
        expect(firstSettle).toBeLessThan(1_000);

        const started = Date.now();
        const second = await deploy(web, await source({ mark: "v2" }));
        redeployMs = Date.now() - started;
        const stale = await straightAfter(web, "hello nobody from v2");
        expectExit(second, 0, "redeploy");
        expect(second.stdout).toMatch(/ svc the previous release hands its new requests to the new release and stops once those in flight end \(at most 5 s\)$/m);
        expect(stale).toEqual([]);
        // The new process is on the old one's node, which sends the old one's requests to it from the switch on: no
        // edge's copy can reach the previous release, so the redeploy does not wait for the copies to expire either.
        const secondSettle = await settleMs(web);
        expect(secondSettle).toBeLessThan(1_000);
        console.log(`redeploy of the app (same app, a new release): ${redeployMs} ms; switch to serving: first deploy ${firstSettle} ms, redeploy ${secondSettle} ms`);
      },
      DEPLOY_MS * 2,
    );

    it(
      "env set under 16 clients of constant load: rolled out with 0 failed requests, the new value served within 1.5x a redeploy; unset too",
      async () => {
        const failures: string[] = [];
        let firstNew = 0;
        let total = 0;
        let on = true;
        const clients = Array.from({ length: 16 }, async () => {
          while (on) {
            const res = await get(web);
            total++;
            if (res.status !== 200 || !/^hello (nobody|bonjour) from v2\n$/.test(res.body)) failures.push(`${res.status} ${res.body.trim().slice(0, 200)}`);
            if (firstNew === 0 && res.body.startsWith("hello bonjour")) firstNew = Date.now();
          }
        });
        await sleep(1_000);
        const started = Date.now();
        const set = await run(["env", "set", "GREETING=bonjour", "--app", web]);
        const returned = Date.now();
        await sleep(1_000);
        on = false;
        await Promise.all(clients);
        expectExit(set, 0, "env set");
        const ms = firstNew - started;
        console.log(
          `env set under 16 clients: ${total} requests, ${failures.length} failed; the new value served after ${ms} ms (redeploy ${redeployMs} ms: ${(ms / redeployMs).toFixed(2)}x); svc returned after ${returned - started} ms`,
        );
        expect(set.stdout).toMatch(new RegExp(`^GREETING set; rolling out to ${web} \\(deployment dep_\\w+\\)$`, "m"));
        expect(set.stdout).toMatch(/ svc healthy after .*; switching traffic to it$/m);
        expect(set.stdout.trimEnd().split("\n").at(-1)).toBe(`Rolled out to ${web}: the new configuration serves at http://${web}.localhost:${port()}`);
        expect(failures).toEqual([]);
        expect(firstNew).toBeGreaterThan(0);
        expect(ms).toBeLessThanOrEqual(redeployMs * 1.5);
        expect(await straightAfter(web, "hello bonjour from v2", 20)).toEqual([]);
        const [latest] = await deployments(web);
        expect(latest).toMatchObject({ status: "ready", cause: "config: GREETING set" });

        const unset = await ok(["env", "unset", "GREETING", "--app", web]);
        expect(unset.stdout).toMatch(new RegExp(`^GREETING unset; rolling out to ${web}`, "m"));
        expect(await straightAfter(web, "hello nobody from v2", 20)).toEqual([]);
      },
      DEPLOY_MS,
    );

    it(
      "--no-apply batches changes: the app shows them pending and runs without them until apply rolls them out as one deployment",
      async () => {
        const held = await ok(["env", "set", "GREETING=batched", "--app", web, "--no-apply"]);
        expect(held.stdout).toContain(`GREETING set; not applied yet: \`svc apps apply ${web}\` rolls it out`);
        await ok(["apps", "update", web, "--memory", "320", "--no-apply"]);
        const info = await ok(["apps", "info", web]);
        expect(info.stdout).toMatch(new RegExp(`^not applied\\s+GREETING set, memory 320 MB \\(svc apps apply ${web}\\)$`, "m"));
        expect((await appInfo(web)).pendingChanges).toEqual(["GREETING set", "memory 320 MB"]);
        expect(await straightAfter(web, "hello nobody from v2", 5)).toEqual([]);
        const before = (await deployments(web)).length;

        const applied = await ok(["apps", "apply", web]);
        expect(applied.stdout).toMatch(new RegExp(`^GREETING set, memory 320 MB; rolling out to ${web}`, "m"));
        expect(await straightAfter(web, "hello batched from v2", 10)).toEqual([]);
        const after = await deployments(web);
        expect(after.length).toBe(Math.min(before + 1, 10));
        expect(after[0]).toMatchObject({ status: "ready", cause: "config: GREETING set, memory 320 MB" });
        expect((await appInfo(web)).pendingChanges).toEqual([]);
      },
      DEPLOY_MS,
    );

    it(
      "a release listening on loopback only fails within 5 s, in one line, with its lines, and the previous release keeps serving",
      async () => {
        const failed = await deploy(web, await source({ mark: "v3", host: "127.0.0.1" }));
        expectExit(failed, 1, "deploy of a loopback listener");
        const [latest] = await deployments(web);
        expect(latest!.status).toBe("failed");
        expect(latest!.error).toBe('listens on 127.0.0.1:8080 only; listen on 0.0.0.0 (all interfaces), e.g. listen(PORT, "0.0.0.0"), or nothing outside the app can reach it');
        expect(latest!.logExcerpt!.some((line) => / out v3 listening on 127\.0\.0\.1:8080/.test(line))).toBe(true);
        const listenedAt = Number(/v3 listening on 127\.0\.0\.1:8080 at (\d+)/.exec(latest!.logExcerpt!.join("\n"))![1]);
        const refusedMs = Date.parse(latest!.finishedAt!) - listenedAt;
        console.log(`loopback listener refused ${refusedMs} ms after it listened`);
        expect(refusedMs).toBeLessThan(5_000);
        // The CLI: the cause in one line, the lines, and a hint naming the runtime log and what still serves.
        expect(failed.stderr).toContain(`deployment ${latest!.id} failed`);
        expect(failed.stderr).toMatch(/^last log lines of the new release:\n( {2}.*\n)* {2}\S+ out v3 listening on 127\.0\.0\.1:8080 /m);
        expect(failed.stderr).toContain("listens on 127.0.0.1:8080 only; listen on 0.0.0.0 (all interfaces)");
        const active = (await appInfo(web)).activeDeploymentId!;
        expect(failed.stderr).toContain(`the new release did not start, and the previous release (${active}) still serves the app. Its output: svc logs --runtime --app ${web}`);
        expect(await straightAfter(web, "hello batched from v2", 10)).toEqual([]);
        expect((await appInfo(web)).status).toBe("running");
      },
      DEPLOY_MS,
    );

    it(
      "a crash loop shows as crash_loop, a fix brings it back to running, stop to stopped (status through a life)",
      async () => {
        const stopWatching = watchStatus(web);
        // Every instance of the new configuration exits 1.5 s after it starts: deployed (it passed its check), then a crash loop.
        await ok(["env", "set", "CRASH_AFTER_MS=1500", "--app", web]);
        let status = "";
        for (let i = 0; i < 240 && status !== "crash_loop"; i++) {
          await sleep(250);
          status = (await apiApp(web)).status;
        }
        expect(status).toBe("crash_loop");
        const list = await ok(["apps", "list"]);
        expect(list.stdout).toMatch(new RegExp(`^${web}\\s+app_\\w+\\s+node\\s+crash_loop\\s`, "m"));
        await ok(["env", "unset", "CRASH_AFTER_MS", "--app", web]);
        expect((await appInfo(web)).status).toBe("running");
        await ok(["apps", "stop", web]);
        expect((await appInfo(web)).status).toBe("stopped");
        await ok(["apps", "restart", web]);
        const seen = await stopWatching();
        console.log(`statuses seen: ${seen.join(" → ")}`);
        expect(seen).toEqual(expect.arrayContaining(["running", "deploying", "crash_loop", "stopped"]));
        expect(seen.indexOf("crash_loop")).toBeLessThan(seen.lastIndexOf("stopped"));
        expect(await straightAfter(web, "hello batched from v2", 5)).toEqual([]);
      },
      DEPLOY_MS * 2,
    );

    it(
      "the runtime log: each line names its release and process; --tail N and --since pick where it starts",
      async () => {
        await get(web, "/print?n=40");
        const all = (await runtimeLog(web, "--tail", "100000")).trimEnd().split("\n");
        expect(all.length).toBeGreaterThan(40);
        for (const line of all) expect(line).toMatch(/^\S+ (out|err|svc) (dep_\w+|-)\/prc_\w+ /);
        expect(all.filter((line) => / out dep_\w+\/prc_\w+ line \d+ of 40$/.test(line))).toHaveLength(40);
        const tail = (await runtimeLog(web, "--tail", "3")).trimEnd().split("\n");
        expect(tail).toEqual(all.slice(-3));
        await sleep(100);
        const mark = new Date().toISOString();
        await get(web, "/print?n=2");
        const recent = (await runtimeLog(web, "--since", mark)).trimEnd().split("\n");
        expect(recent.map((line) => line.replace(/^\S+ out \S+ /, ""))).toEqual(["line 1 of 2", "line 2 of 2"]);
        expect((await runtimeLog(web, "--since", "10m")).trimEnd().split("\n").length).toBeGreaterThan(all.length);
        const bad = await run(["logs", web, "--runtime", "--since", "yesterday"]);
        expect(bad.code).not.toBe(0);
        expect(bad.stderr).toContain("--since");
      },
      DEPLOY_MS,
    );

    it(
      "a disk attached reaches the running app; a disk app's restarts answer 503 with Retry-After through the gap, never 404",
      async () => {
        expect((await get(web, "/disk")).body).toBe("no disk\n");
        await ok(["disk", "create", "--name", `life-data-${suffix}`, "--size", "1", "--mount-path", "/data"]);
        const answers = new Map<string, number>();
        let missingRetryAfter = 0;
        let on = true;
        const poller = (async () => {
          while (on) {
            const res = await get(web);
            const key = res.status === 200 ? "200" : `${res.status} ${res.body.trim().slice(0, 120)}`;
            answers.set(key, (answers.get(key) ?? 0) + 1);
            if (res.status === 503 && !res.headers["retry-after"]) missingRetryAfter++;
            await sleep(20);
          }
        })();
        const attached = await ok(["disk", "attach", `life-data-${suffix}`, "--app", web]);
        expect(attached.stdout).toMatch(new RegExp(`^disk life-data-${suffix} attached at /data; rolling out to ${web}`, "m"));
        expect(attached.stdout).toMatch(/ svc stopped the running release first: one process writes a disk at a time$/m);
        expect((await get(web, "/disk")).body).toBe("disk at /data: 1 visits\n");
        await ok(["apps", "restart", web]);
        await sleep(500);
        for (let i = 0; i < 100 && (await get(web)).status !== 200; i++) await sleep(100);
        on = false;
        await poller;
        console.log(`answers through the disk attach and a restart: ${JSON.stringify(Object.fromEntries(answers))}`);
        expect((await get(web, "/disk")).body).toBe("disk at /data: 2 visits\n");
        expect([...answers.keys()].filter((key) => key !== "200" && !key.startsWith("503 "))).toEqual([]);
        expect(missingRetryAfter).toBe(0);
        const [latest] = await deployments(web);
        expect(latest!.cause).toBe(`config: disk life-data-${suffix} attached at /data`);
      },
      DEPLOY_MS,
    );
  });

  describe("releases that do not listen where they should", () => {
    it(
      "one listening on port 3000 on all interfaces is adopted within 5 s of listening, and the deploy says so",
      async () => {
        const app = `life3000-${suffix}`;
        await create(app);
        const r = await deploy(app, await source({ mark: "p3000", port: 3000 }));
        expectExit(r, 0, "deploy of a port-3000 listener");
        expect(r.stdout).toMatch(/ svc PORT is 8080 but the app listens on 3000: sending traffic to 3000 \(set "port": 3000 in svc\.json to say so\)$/m);
        expect(await straightAfter(app, "hello nobody from p3000", 10)).toEqual([]);
        const log = await runtimeLog(app);
        const listened = Number(/p3000 listening on all interfaces:3000 at (\d+)/.exec(log)![1]);
        const adopted = Date.parse(/^(\S+) svc \S+ PORT is 8080 but the app listens on 3000/m.exec(log)![1]!);
        console.log(`port 3000 adopted ${adopted - listened} ms after the app listened`);
        expect(adopted - listened).toBeLessThan(5_000);
      },
      DEPLOY_MS,
    );

    it(
      "one that never listens nor prints fails at its start timeout saying nothing listens, and the hint says nothing serves",
      async () => {
        const app = `lifesilent-${suffix}`;
        await create(app);
        const r = await deploy(app, await source({ mark: "silent", silent: true }, { runtime: "node", startTimeoutSeconds: 5 }));
        expectExit(r, 1, "deploy of a silent release");
        const [latest] = await deployments(app);
        expect(latest!.error).toBe("not ready within 5 s: nothing listens on port 8080 (nor on any other port)");
        expect(r.stderr).toContain("nothing listens on port 8080 (nor on any other port)");
        expect(r.stderr).toMatch(/the new release did not start, and nothing serves the app now\. Its output: svc logs --runtime --app lifesilent-/);
        expect(r.stdout).toMatch(/ svc waiting for port 8080 \(\d+ s\)$/m);
        expect((await appInfo(app)).status).toBe("failed");
      },
      DEPLOY_MS,
    );
  });

  describe("a worker", () => {
    const worker = `lifeworker-${suffix}`;
    const workerJson = (extra: Record<string, unknown> = {}) => ({ runtime: "node", type: "worker", startCommand: "node worker.js", ...extra });

    it(
      "has no URL and takes no traffic; a redeploy stops the old worker before the new one starts",
      async () => {
        await create(worker);
        const first = await deploy(worker, await source({ mark: "w1" }, workerJson({ minReadySeconds: 2 })));
        expectExit(first, 0, "worker deploy");
        expect(first.stdout).toMatch(/ svc ready after .*; it counts as deployed once up 2 s$/m);
        expect(first.stdout.trimEnd().split("\n").at(-1)).toBe(`Deployed: worker running (a worker takes no HTTP traffic; its output: svc logs --runtime --app ${worker})`);
        expect(await appInfo(worker)).toMatchObject({ type: "worker", url: null, status: "running" });
        const info = await ok(["apps", "info", worker]);
        expect(info.stdout).toMatch(/^url\s+- \(a worker takes no HTTP traffic\)$/m);
        const asked = await get(worker);
        expect(asked.status).toBe(404);
        expect(asked.body).toContain("This app is a worker: it takes no HTTP traffic");

        const second = await deploy(worker, await source({ mark: "w2" }, workerJson({ minReadySeconds: 1 })));
        expectExit(second, 0, "worker redeploy");
        expect(second.stdout).toMatch(/ svc stopped the running worker first \(set "overlap": true in svc\.json to run both during a deploy\)$/m);
        const log = (await runtimeLog(worker, "--tail", "100000")).trimEnd().split("\n");
        const lastOld = log.findLastIndex((line) => / out \S+ w1 tick \d+$/.test(line));
        const firstNew = log.findIndex((line) => / out \S+ w2 worker started$/.test(line));
        expect(lastOld).toBeGreaterThan(0);
        expect(firstNew).toBeGreaterThan(lastOld);
        expect(Date.parse(log[firstNew]!.split(" ")[0]!)).toBeGreaterThanOrEqual(Date.parse(log[lastOld]!.split(" ")[0]!));
      },
      DEPLOY_MS * 2,
    );

    it(
      "a release that dies 2 s after starting fails within its minReadySeconds, and the previous release runs again",
      async () => {
        const previous = (await appInfo(worker)).activeDeploymentId;
        const r = await deploy(worker, await source({ mark: "w3", dieAfterMs: 2_000 }, workerJson()));
        expectExit(r, 1, "deploy of a dying worker");
        const [latest] = await deployments(worker);
        expect(latest!.error).toBe("process exited with code 3 within its first 10 s");
        expect(latest!.logExcerpt!.some((line) => line.endsWith("w3 dying on purpose"))).toBe(true);
        expect(r.stderr).toContain(`the previous release (${previous}) still serves the app`);
        expect((await appInfo(worker)).activeDeploymentId).toBe(previous);
        // The previous release ticks again.
        let log = "";
        for (let i = 0; i < 40 && !/ w2 tick \d+\n?$/.test(log); i++) {
          await sleep(250);
          log = await apiLog(worker, 5);
        }
        expect(log).toMatch(/ w2 tick \d+\n?$/);
        const all = (await runtimeLog(worker, "--tail", "100000")).trimEnd().split("\n");
        expect(all.findLastIndex((line) => line.endsWith(" w3 dying on purpose"))).toBeLessThan(all.findLastIndex((line) => line.endsWith(" w2 worker started")));
        expect((await appInfo(worker)).status).toBe("running");
      },
      DEPLOY_MS,
    );
  });

  it(
    "a lean release: devDependencies pruned after the build, .venv and __pycache__ left out, file counts agree, no static fields",
    async () => {
      const app = `lifelean-${suffix}`;
      await create(app);
      const dir = await mkdtemp(join(tmpdir(), "svc-lean-"));
      dirs.push(dir);
      await cp(join(APPS, "node-lean"), dir, { recursive: true });
      await mkdir(join(dir, ".venv", "bin"), { recursive: true });
      await writeFile(join(dir, ".venv", "bin", "python"), "#!/bin/sh\n");
      await mkdir(join(dir, "__pycache__"));
      await writeFile(join(dir, "__pycache__", "x.cpython-311.pyc"), "junk");
      const r = await deploy(app, dir);
      expectExit(r, 0, "lean deploy");
      expect(r.stdout).toMatch(/^Packed \d+ files .*; never uploaded \(the build installs dependencies; caches are not source\): .*\.venv.*$/m);
      expect(r.stdout).toMatch(/never uploaded .*__pycache__/);
      expect(r.stdout).not.toMatch(/\.gitignore/);
      expect(r.stdout).toContain("built with a devDependency");
      const held = JSON.parse((await get(app)).body) as Record<string, boolean>;
      expect(held).toEqual({ devDependency: false, venv: false, pycache: false });
      const built = Number(/ svc release: (\d+) files/.exec(r.stdout)?.[1]);
      const ready = Number(/is ready: (\d+) files/.exec(r.stdout)?.[1]);
      const [latest] = await deployments(app);
      expect(built).toBeGreaterThan(0);
      expect([ready, latest!.fileCount]).toEqual([built, built]);
      for (const field of ["framework", "outputDir", "uploadedBlobs", "spa"]) expect(latest, field).not.toHaveProperty(field);
      // The install and build's own peak, measured (not a 0 from a field that belongs to static sites).
      expect(latest!.peakMemoryBytes).toBeGreaterThan(1024 * 1024);
    },
    DEPLOY_MS,
  );

  it(
    "the dashboard's runtime log opens scrolled to its newest line and stays there while following (Chromium)",
    async () => {
      await get(web, "/print?n=300");
      const browser = await chromium.launch({
        executablePath: "/usr/bin/chromium",
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
      });
      try {
        const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
        await page.goto(stack.apiUrl);
        await page.getByLabel("API key").fill(env.SVC_API_KEY!);
        await page.getByRole("button", { name: "Sign in" }).click();
        await page.getByRole("heading", { name: "Apps", level: 1 }).waitFor();
        await page.goto(`${stack.apiUrl}/apps/${web}/runtime`);
        const log = page.getByRole("log", { name: `Runtime log of ${web}` });
        await log.getByText("line 300 of 300").waitFor();
        const at = () => log.evaluate((el) => ({ top: el.scrollTop, height: el.scrollHeight, client: el.clientHeight }));
        const opened = await at();
        expect(opened.height).toBeGreaterThan(opened.client * 3);
        expect(opened.top + opened.client).toBeGreaterThanOrEqual(opened.height - 4);
        // New lines while following: still at the bottom.
        await get(web, "/print?n=30");
        await log.getByText("line 30 of 30").waitFor();
        const followed = await at();
        expect(followed.height).toBeGreaterThan(opened.height);
        expect(followed.top + followed.client).toBeGreaterThanOrEqual(followed.height - 4);
        // Scrolled up by the reader: new lines leave it where it is.
        await log.evaluate((el) => {
          el.scrollTop = 0;
          el.dispatchEvent(new Event("scroll"));
        });
        await get(web, "/print?n=5");
        await log.getByText("line 5 of 5").waitFor();
        expect((await at()).top).toBe(0);
      } finally {
        await browser.close();
      }
    },
    DEPLOY_MS,
  );
});
