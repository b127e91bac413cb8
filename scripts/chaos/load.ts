import { spawn } from "node:child_process";
import { cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { LocalStack } from "../local-stack.js";
import { ROOT } from "../root.js";

/** One API call the load made: what it answered, how fast, and whether a 503 said when to come back. */
export type ApiCall = { method: string; path: string; status: number; ms: number; retryAfter: boolean };

/** An answer of the API: its status, its `data` (or the whole body) and its headers. */
export type Answer<T> = { status: number; data: T; headers: Headers };

/** The API as the chaos load calls it, every call timed and kept (status 0: no answer within 30 s). */
export class TimedApi {
  readonly calls: ApiCall[] = [];
  readonly #stack: Pick<LocalStack, "apiUrl" | "adminKey">;

  constructor(stack: Pick<LocalStack, "apiUrl" | "adminKey">) {
    this.#stack = stack;
  }

  async call<T>(method: string, path: string, body?: unknown, token = this.#stack.adminKey): Promise<Answer<T>> {
    const started = performance.now();
    let answer: Answer<T> = { status: 0, data: null as T, headers: new Headers() };
    try {
      const res = await fetch(`${this.#stack.apiUrl}${path}`, {
        method,
        headers: { Authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(30_000),
      });
      const text = await res.text();
      let parsed: { data?: T } = {};
      try {
        parsed = text ? (JSON.parse(text) as { data?: T }) : {};
      } catch {
        parsed = {};
      }
      answer = { status: res.status, data: (parsed.data ?? parsed) as T, headers: res.headers };
    } catch {
      // No answer within the deadline (or the Worker restarting): status 0.
    }
    this.calls.push({ method, path, status: answer.status, ms: performance.now() - started, retryAfter: answer.headers.has("Retry-After") });
    return answer;
  }

  /** A call that must succeed (the run's set-up), tried again while the platform says to wait. */
  async ok<T>(method: string, path: string, body?: unknown, token?: string): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const res = await this.call<T>(method, path, body, token);
      if (res.status < 300) return res.data;
      if ((res.status !== 503 && res.status !== 429 && res.status !== 0) || attempt === 10) {
        throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.data)}`);
      }
      await sleep(Number(res.headers.get("Retry-After") ?? 2) * 1000);
    }
  }
}

/** A write the app acknowledged: its sequence number, and when the answer came (ms since the epoch). */
export type Ack = { seq: number; at: number };

/** One app of the chaos run: a node app whose disk keeps every write it acknowledges (scripts/chaos/ledger-app). */
export type LedgerApp = { name: string; id: string; diskId: string; diskName: string; cronId: string; marker: string; source: string };

/** A request to an app through the local edge (`Host: <app>.localhost:<port>`), with a deadline. */
export function edgeRequest(apiUrl: string, app: string, method: string, path: string, timeoutMs: number): Promise<{ status: number; body: string }> {
  const port = new URL(apiUrl).port;
  return new Promise((resolve) => {
    const req = request(
      { host: "127.0.0.1", port, path, method, agent: false, timeout: timeoutMs, headers: { Host: `${app}.localhost:${port}` } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", () => resolve({ status: 0, body: "" }));
      },
    );
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve({ status: 0, body: "" }));
    req.end();
  });
}

/**
 * Writes numbered records to an app's disk through the edge, one after
 * another, keeping those it acknowledged (`ok <seq>`): what must still be
 * there at the end, unless a failover said it lost them.
 */
export async function writeLedger(apiUrl: string, app: LedgerApp, until: () => boolean, acks: Ack[]): Promise<{ tried: number }> {
  let seq = 0;
  while (!until()) {
    seq++;
    const res = await edgeRequest(apiUrl, app.name, "POST", `/write?seq=${seq}`, 3_000);
    if (res.status === 200 && res.body === `ok ${seq}\n`) acks.push({ seq, at: Date.now() });
    else await sleep(250);
    await sleep(50);
  }
  return { tried: seq };
}

/** What a disk's `placement` said during the run, and when the run first read each. */
export type Note = { text: string; seenAt: number };

/** Reads each disk's record every second while `until` is false, keeping every new placement note. */
export async function watchPlacement(api: TimedApi, disks: LedgerApp[], until: () => boolean, notes: Map<string, Note[]>): Promise<void> {
  while (!until()) {
    for (const app of disks) {
      const res = await api.call<{ placement: string | null }>("GET", `/v1/disks/${app.diskId}`);
      const text = res.status === 200 ? res.data.placement : null;
      const kept = notes.get(app.diskId) ?? [];
      if (text && kept.at(-1)?.text !== text) kept.push({ text, seenAt: Date.now() });
      notes.set(app.diskId, kept);
    }
    await sleep(1_000);
  }
}

/** How long the load lets one `svc deploy` follow its deployment: one still going then is left to the checker (not final). */
const DEPLOY_WAIT_MS = 300_000;

/** Runs `svc deploy` (cli/bin/svc.js, as users run it) of `source` to `app`; its exit code and last lines (code null: stopped waiting). */
export function deploy(stack: Pick<LocalStack, "apiUrl" | "adminKey">, app: string, source: string, home: string): Promise<{ code: number | null; tail: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(ROOT, "cli", "bin", "svc.js"), "deploy", "--source", source, "--app", app], {
      env: { PATH: process.env.PATH ?? "", HOME: home, XDG_CONFIG_HOME: join(home, "config"), SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out = (out + d).slice(-2_000);
    });
    child.stderr.on("data", (d: Buffer) => {
      out = (out + d).slice(-2_000);
    });
    const waited = setTimeout(() => child.kill("SIGTERM"), DEPLOY_WAIT_MS);
    child.on("close", (code) => {
      clearTimeout(waited);
      resolve({ code, tail: out.trim().split("\n").slice(-3).join(" | ") });
    });
  });
}

/**
 * Makes one ledger app: a node app with a 1 GB disk at /data on the node
 * `place` names, its source a
 * copy of scripts/chaos/ledger-app whose start command carries the disk's
 * marker (the writer watch finds its processes by it), and a cron job that
 * appends its job's id to the disk every minute.
 */
export async function makeLedgerApp(api: TimedApi, tag: string, place: { others: string[]; operator: string }): Promise<LedgerApp> {
  const name = `ledger-${tag}`;
  const marker = `chaos-writer-${tag}`;
  const source = await mkdtemp(join(tmpdir(), `svc-chaos-${tag}-`));
  await cp(join(ROOT, "scripts", "chaos", "ledger-app"), source, { recursive: true });
  await writeFile(join(source, "svc.json"), JSON.stringify({ name, runtime: "node", startCommand: `node server.js ${marker}`, healthCheckPath: "/healthz" }));
  const app = await api.ok<{ id: string }>("POST", "/v1/apps", { name, runtime: "node", memoryMb: 256 });
  // On the node the schedule names: the other nodes cordoned while the disk is placed.
  for (const other of place.others) await api.ok("POST", `/v1/operator/nodes/${other}/cordon`, {}, place.operator);
  const disk = await api.ok<{ id: string; name: string }>("POST", "/v1/disks", { name: `ledger-${tag}`, sizeGb: 1, mountPath: "/data" });
  for (const other of place.others) await api.ok("POST", `/v1/operator/nodes/${other}/uncordon`, {}, place.operator);
  await api.ok("POST", `/v1/disks/${disk.id}/attach`, { app: app.id });
  const cron = await api.ok<{ id: string }>("POST", "/v1/crons", {
    appId: app.id,
    name: `tick-${tag}`,
    schedule: "* * * * *",
    command: `echo "$SVC_JOB_ID $(date -u +%s)" >> "$SVC_DISK_PATH/cron-runs" # ${marker}`,
    concurrencyPolicy: "forbid",
    timeoutSeconds: 30,
  });
  return { name, id: app.id, diskId: disk.id, diskName: disk.name, cronId: cron.id, marker, source };
}

/** Removes a ledger app's source copy. */
export function removeSource(app: LedgerApp): Promise<void> {
  return rm(app.source, { recursive: true, force: true });
}
