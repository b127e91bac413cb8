import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "./svc.js";

/** `svc apps`, `svc env` and `svc disk` through the real binary against the real Worker and builder (issue 3). */
describe("svc apps, env and disk against wrangler dev", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let deploy: Record<string, string>;
  const app = `cli-${randomBytes(3).toString("hex")}`;
  const diskName = `data-${randomBytes(3).toString("hex")}`;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    const key = await createKey(stack, "cli-apps", ["deploy"]);
    deploy = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
  });

  const json = <T>(stdout: string) => JSON.parse(stdout) as T;

  describe("apps", () => {
    let appId: string;

    it("create prints the new app's details", async () => {
      const r = await svc(["apps", "create", "--name", app, "--runtime", "static", "--memory", "256"], deploy);
      expect(r.stderr).toBe("");
      expect(r.code).toBe(0);
      expect(r.stdout).toContain(`Created app ${app}`);
      // Nothing deployed yet: the status says so.
      expect(r.stdout).toMatch(/^status\s+not_deployed$/m);
      expect(r.stdout).toMatch(/^memory\s+256 MB$/m);
      appId = /\bapp_[0-9A-Za-z]+/.exec(r.stdout)![0];
    });

    it("list shows the app in a table and as JSON", async () => {
      const human = await svc(["apps", "list"], deploy);
      expect(human.code).toBe(0);
      const [header, ...rows] = human.stdout.trimEnd().split("\n");
      expect(header).toMatch(/^NAME\s+ID\s+RUNTIME\s+STATUS\s+MEMORY\s+INSTANCES\s+URL\s+CREATED$/);
      expect(rows.find((row) => row.startsWith(`${app} `))).toMatch(new RegExp(`${appId}\\s+static\\s+not_deployed\\s+256 MB`));

      const list = await svc(["apps", "list", "--json"], deploy);
      expect(list.code).toBe(0);
      expect(json<{ id: string; name: string }[]>(list.stdout)).toContainEqual(expect.objectContaining({ id: appId, name: app }));
    });

    it("info finds the app by name and by id", async () => {
      const byName = await svc(["apps", "info", app], deploy);
      expect(byName.code).toBe(0);
      expect(byName.stdout).toMatch(new RegExp(`^id\\s+${appId}$`, "m"));
      expect(byName.stdout).toMatch(/^disks\s+none$/m);
      const byId = await svc(["apps", "info", appId, "--json"], deploy);
      expect(byId.code).toBe(0);
      expect(json<{ name: string; runtime: string }>(byId.stdout)).toMatchObject({ name: app, runtime: "static" });
    });

    it("stop and restart change the status", async () => {
      const stop = await svc(["apps", "stop", app], deploy);
      expect(stop.code).toBe(0);
      expect(stop.stdout.trim()).toBe(`Stopped app ${app} (status: stopped)`);
      const restart = await svc(["apps", "restart", app, "--json"], deploy);
      expect(restart.code).toBe(0);
      expect(json<{ status: string }>(restart.stdout).status).toBe("not_deployed");
    });

    it("a duplicate name gets the three-part NAME_TAKEN error", async () => {
      const r = await svc(["apps", "create", "--name", app, "--runtime", "node"], deploy);
      expect(r.code).toBe(1);
      const lines = r.stderr.trimEnd().split("\n");
      expect(lines[0]).toBe(`Error: could not create app ${app}`);
      expect(lines[1]).toMatch(/^ {2}NAME_TAKEN: /);
      expect(lines.at(-1)).toContain("Hint: app names are subdomains");
    });

    it("an invalid name gets VALIDATION_ERROR naming the flag", async () => {
      const r = await svc(["apps", "create", "--name", "Not_A_Label", "--runtime", "static"], deploy);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/^ {2}VALIDATION_ERROR: /m);
      expect(r.stderr).toMatch(/^ {4}name: /m);
      expect(r.stderr).toContain("Hint: fix --name");
    });

    it("an unknown app gets APP_NOT_FOUND with `app not found` and a pointer to apps list", async () => {
      const r = await svc(["apps", "info", "no-such-app"], deploy);
      expect(r.code).toBe(1);
      expect(r.stderr.trimEnd().split("\n")).toEqual([
        "Error: could not show app no-such-app",
        "  APP_NOT_FOUND: app not found",
        '  Hint: no app "no-such-app" in this account: `svc apps list` shows the names and ids',
      ]);
    });

    it("a key without the deploy scope gets INSUFFICIENT_SCOPE", async () => {
      const db = await createKey(stack, "cli-db-only", ["db"]);
      const r = await svc(["apps", "list"], { ...deploy, SVC_API_KEY: db.key });
      expect(r.code).toBe(1);
      expect(r.stderr).toContain('INSUFFICIENT_SCOPE: this operation requires an API key with the "deploy" scope');
      expect(r.stderr).toContain("--scopes deploy");
    });
  });

  describe("env", () => {
    it("set merges variables; a value may contain '='", async () => {
      const first = await svc(["env", "set", "A=1", "URL=postgres://h/db?x=y", "--app", app], deploy);
      expect(first.code).toBe(0);
      // What became of the change: this site has nothing deployed, so it waits for the first deploy.
      expect(first.stdout.trim()).toBe(`A, URL set; ${app} has nothing deployed yet: its first deploy runs with it`);
      const second = await svc(["env", "set", "EMPTY=", "--app", app, "--json"], deploy);
      expect(second.code).toBe(0);
      expect(json<{ name: string }[]>(second.stdout).map((v) => v.name).sort()).toEqual(["A", "EMPTY", "URL"]);
    });

    it("list shows names only, and values with --reveal", async () => {
      const names = await svc(["env", "list", "--app", app], deploy);
      expect(names.code).toBe(0);
      expect(names.stdout).toMatch(/^NAME\s+UPDATED$/m);
      expect(names.stdout).not.toContain("postgres://");
      const revealed = await svc(["env", "list", "--app", app, "--reveal"], deploy);
      expect(revealed.code).toBe(0);
      expect(revealed.stdout).toMatch(/^NAME\s+UPDATED\s+VALUE$/m);
      expect(revealed.stdout).toMatch(/^URL\s+.*postgres:\/\/h\/db\?x=y$/m);
      const asJson = await svc(["env", "list", "--app", app, "--reveal", "--json"], deploy);
      expect(json<{ name: string; value: string }[]>(asJson.stdout)).toContainEqual(expect.objectContaining({ name: "A", value: "1" }));
    });

    it("unset removes variables, and an unknown one gets ENV_VAR_NOT_FOUND", async () => {
      const r = await svc(["env", "unset", "A", "EMPTY", "--app", app], deploy);
      expect(r.code).toBe(0);
      // Both names in one change of the app.
      expect(r.stdout.trim()).toBe(`A unset, EMPTY unset; ${app} has nothing deployed yet: its first deploy runs with it`);
      const left = await svc(["env", "list", "--app", app, "--json"], deploy);
      expect(json<{ name: string }[]>(left.stdout).map((v) => v.name)).toEqual(["URL"]);

      const missing = await svc(["env", "unset", "A", "--app", app], deploy);
      expect(missing.code).toBe(1);
      expect(missing.stderr).toContain(`Error: could not unset A on app ${app}`);
      expect(missing.stderr).toMatch(/^ {2}ENV_VAR_NOT_FOUND: /m);
      expect(missing.stderr).toContain(`svc env list --app ${app}`);
    });

    it("env commands on an unknown app get APP_NOT_FOUND", async () => {
      const r = await svc(["env", "list", "--app", "no-such-app"], deploy);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("APP_NOT_FOUND: app not found");
    });
  });

  describe("disk", () => {
    it("create, list and info show the disk", async () => {
      const created = await svc(["disk", "create", "--name", diskName, "--size", "1", "--mount-path", "/data"], deploy);
      expect(created.stderr).toBe("");
      expect(created.code).toBe(0);
      expect(created.stdout).toContain(`Created disk ${diskName}`);
      expect(created.stdout).toMatch(/^app\s+not attached$/m);

      const list = await svc(["disk", "list"], deploy);
      expect(list.code).toBe(0);
      expect(list.stdout).toMatch(/^NAME\s+ID\s+SIZE\s+USED\s+MOUNT PATH\s+APP\s+IN USE\s+SNAPSHOTS\s+CREATED$/m);
      expect(list.stdout).toMatch(new RegExp(`^${diskName}\\s+disk_\\w+\\s+1 GB\\s+[\\d.]+ (?:B|KiB|MiB) \\((?:<1|\\d+)%\\)\\s+/data\\s+-\\s+no\\s+daily \\(keep 7\\)\\s`, "m"));

      const info = await svc(["disk", "info", diskName, "--json"], deploy);
      expect(info.code).toBe(0);
      expect(json(info.stdout)).toMatchObject({ name: diskName, sizeGb: 1, mountPath: "/data", appId: null, inUse: false });
    });

    it("update changes the automatic snapshots; info shows them", async () => {
      const created = await svc(["disk", "info", diskName], deploy);
      expect(created.stdout).toMatch(/^snapshots\s+daily, keeping 7$/m);
      expect(created.stdout).toMatch(/^next snapshot\s+\d{4}-\d\d-\d\dT\S+Z \(.+\)$/m);
      const updated = await svc(["disk", "update", diskName, "--snapshot-every", "6h", "--snapshot-keep", "3"], deploy);
      expect(updated.stderr).toBe("");
      expect(updated.stdout).toMatch(/^snapshots\s+every 6 hours, keeping 3$/m);
      const off = await svc(["disk", "update", diskName, "--snapshot-every", "off", "--json"], deploy);
      expect(json(off.stdout)).toMatchObject({ snapshotIntervalHours: 0, snapshotKeep: 3, nextSnapshotAt: null });
      const bad = await svc(["disk", "update", diskName, "--snapshot-keep", "0"], deploy);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain("--snapshot-keep must be a whole number of at least 1");
      const back = await svc(["disk", "update", diskName, "--snapshot-every", "1d", "--snapshot-keep", "7"], deploy);
      expect(back.stdout).toMatch(/^snapshots\s+daily, keeping 7$/m);
    });

    it("attach puts the disk on the app, and delete is refused while attached", async () => {
      const attached = await svc(["disk", "attach", diskName, "--app", app], deploy);
      expect(attached.code).toBe(0);
      expect(attached.stdout.trim().split("\n")).toEqual([
        `Attached disk ${diskName} to app ${app} at /data`,
        `disk ${diskName} attached at /data; ${app}'s cron runs see it from their next run`,
      ]);
      const info = await svc(["disk", "info", diskName, "--json"], deploy);
      expect(json(info.stdout)).toMatchObject({ appName: app, inUse: true });
      const appInfo = await svc(["apps", "info", app], deploy);
      expect(appInfo.stdout).toMatch(new RegExp(`^disks\\s+${diskName} \\(disk_\\w+\\) 1 GB at /data$`, "m"));

      const refused = await svc(["disk", "delete", diskName, "--yes"], deploy);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain(`Error: could not delete disk ${diskName}`);
      expect(refused.stderr).toMatch(/^ {2}DISK_ATTACHED: /m);
      expect(refused.stderr).toContain(`Hint: detach it first: svc disk detach ${diskName}`);
    });

    it("detach and delete remove the disk", async () => {
      const detached = await svc(["disk", "detach", diskName, "--json"], deploy);
      expect(detached.code).toBe(0);
      expect(json(detached.stdout)).toMatchObject({ appId: null, inUse: false });
      const deleted = await svc(["disk", "delete", diskName, "--yes"], deploy);
      expect(deleted.code).toBe(0);
      expect(deleted.stdout).toMatch(new RegExp(`^Deleted disk ${diskName} \\(disk_\\w+\\)$`, "m"));
      const gone = await svc(["disk", "info", diskName], deploy);
      expect(gone.code).toBe(1);
      expect(gone.stderr).toMatch(/^ {2}DISK_NOT_FOUND: /m);
      expect(gone.stderr).toContain("svc disk list");
    });
  });

  describe("apps delete", () => {
    it("deletes with --yes, after which the app is not found", async () => {
      const r = await svc(["apps", "delete", app, "--yes"], deploy);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`^Deleted app ${app} \\(app_\\w+\\)$`, "m"));
      const gone = await svc(["apps", "info", app], deploy);
      expect(gone.code).toBe(1);
      expect(gone.stderr).toContain("APP_NOT_FOUND: app not found");
    });
  });
});
