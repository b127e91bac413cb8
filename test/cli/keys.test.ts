import { mkdir, readFile, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, type SvcResult, startStack, svc, tempHome } from "./svc.js";

/** Everything the key commands promise, run through the real binary against the real Worker (issue 2). */
describe("svc login and svc keys against wrangler dev", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let admin: Record<string, string>;

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    admin = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey };
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
  });

  const as = (key: string) => ({ ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key });
  const secretOf = (r: SvcResult) => /\bsvc_[0-9A-Za-z]+/.exec(r.stdout)?.[0];

  describe("login", () => {
    it("verifies the key, saves it with mode 0600 in a 0700 directory, and later commands use it", async () => {
      const login = await svc(["login", "--api-url", `${stack.apiUrl}/`, "--api-key", stack.adminKey], home.env);
      expect(login.stderr).toBe("");
      expect(login.code).toBe(0);
      expect(login.stdout).toContain("Logged in.");

      const file = join(home.env.XDG_CONFIG_HOME!, "svc", "config.json");
      expect((await stat(file)).mode & 0o777).toBe(0o600);
      expect((await stat(dirname(file))).mode & 0o777).toBe(0o700);
      expect(JSON.parse(await readFile(file, "utf8"))).toEqual({ apiUrl: stack.apiUrl, apiKey: stack.adminKey });

      const list = await svc(["keys", "list", "--json"], home.env);
      expect(list.code).toBe(0);
      expect(Array.isArray(JSON.parse(list.stdout))).toBe(true);

      // whoami: the key in use, where it comes from, and the API.
      const me = await svc(["whoami"], home.env);
      expect(me.code).toBe(0);
      expect(me.stdout).toMatch(new RegExp(`^key\\s+.+ \\(key_\\w+\\), from the saved login \\(${file.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\)$`, "m"));
      expect(me.stdout).toMatch(/^scopes\s+\S/m);
      expect(me.stdout).toMatch(new RegExp(`^api\\s+${stack.apiUrl}$`, "m"));
      expect(JSON.parse((await svc(["whoami", "--json"], { ...home.env, SVC_API_KEY: stack.adminKey })).stdout)).toMatchObject({ apiUrl: stack.apiUrl });
    });

    it("reads the key from stdin with --api-key -", async () => {
      const other = await tempHome();
      const login = await svc(["login", "--api-url", stack.apiUrl, "--api-key", "-"], other.env, `${stack.adminKey}\n`);
      expect(login.code).toBe(0);
      const saved = JSON.parse(await readFile(join(other.env.XDG_CONFIG_HOME!, "svc", "config.json"), "utf8"));
      expect(saved.apiKey).toBe(stack.adminKey);
      await other.remove();
    });

    it("does not save a key the API rejects", async () => {
      const other = await tempHome();
      const r = await svc(["login", "--api-url", stack.apiUrl, "--api-key", "svc_notarealkey"], other.env);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`Error: could not verify the API key with ${stack.apiUrl}`);
      expect(r.stderr).toMatch(/^ {2}UNAUTHORIZED: /m);
      expect(r.stderr).toContain("Hint: the API did not accept this key");
      await expect(stat(join(other.env.XDG_CONFIG_HOME!, "svc", "config.json"))).rejects.toThrow(/ENOENT/);
      await other.remove();
    });

    it("lets SVC_API_URL and SVC_API_KEY override the saved file", async () => {
      const other = await tempHome();
      const file = join(other.env.XDG_CONFIG_HOME!, "svc", "config.json");
      await mkdir(dirname(file), { recursive: true });
      await writeFile(file, JSON.stringify({ apiUrl: "http://127.0.0.1:9", apiKey: "svc_stale" }), { mode: 0o600 });

      const fromFile = await svc(["keys", "list"], other.env);
      expect(fromFile.code).toBe(1);
      expect(fromFile.stderr).toContain("is the API running at http://127.0.0.1:9?");

      const overridden = await svc(["keys", "list", "--json"], { ...other.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: stack.adminKey });
      expect(overridden.code).toBe(0);
      expect(JSON.parse(overridden.stdout).length).toBeGreaterThan(0);

      const badEnvKey = await svc(["keys", "list"], { ...other.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: "svc_wrong" });
      expect(badEnvKey.code).toBe(1);
      expect(badEnvKey.stderr).toContain("Hint: SVC_API_KEY is set and overrides the saved login");
      await other.remove();
    });

    it("logout removes the saved file", async () => {
      const other = await tempHome();
      expect((await svc(["login", "--api-url", stack.apiUrl, "--api-key", stack.adminKey], other.env)).code).toBe(0);
      const r = await svc(["logout"], other.env);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain("Logged out");
      const after = await svc(["keys", "list"], other.env);
      expect(after.code).toBe(1);
      expect(after.stderr).toContain("Error: not logged in");
      await other.remove();
    });
  });

  describe("keys", () => {
    let ci: { id: string; key: string };

    it("create prints a working key once, with a warning that it cannot be shown again", async () => {
      const r = await svc(["keys", "create", "--name", "ci", "--scopes", "deploy"], admin);
      expect(r.code).toBe(0);
      const key = secretOf(r);
      expect(key).toBeDefined();
      const id = /\bkey_[0-9A-Za-z]{24}\b/.exec(r.stdout)?.[0];
      expect(id).toBeDefined();
      expect(r.stdout).toMatch(/^scopes\s+deploy$/m);
      expect(r.stderr).toContain("cannot be shown again");
      ci = { id: id!, key: key! };

      const withNewKey = await svc(["keys", "list", "--json"], as(ci.key));
      expect(withNewKey.code).toBe(0);
      expect(JSON.parse(withNewKey.stdout).some((k: { id: string }) => k.id === ci.id)).toBe(true);
    });

    it("list shows the key in a table and as JSON without any secret", async () => {
      const human = await svc(["keys", "list"], admin);
      expect(human.code).toBe(0);
      const [header, ...rows] = human.stdout.trimEnd().split("\n");
      expect(header).toMatch(/^ID\s+NAME\s+PREFIX\s+SCOPES\s+CREATED\s+LAST USED\s+EXPIRES$/);
      const row = rows.find((line) => line.startsWith(ci.id));
      expect(row).toMatch(/\bci\b.*\bdeploy\b.*\bnever$/);
      expect(human.stdout).not.toContain(ci.key);

      const json = await svc(["keys", "list", "--json"], admin);
      expect(json.code).toBe(0);
      const keys = JSON.parse(json.stdout) as Record<string, unknown>[];
      const item = keys.find((k) => k.id === ci.id);
      expect(item).toMatchObject({ name: "ci", scopes: ["deploy"], expiresAt: null });
      for (const k of keys) expect(k).not.toHaveProperty("key");
    });

    it("a deploy-scoped key gets the three-part INSUFFICIENT_SCOPE error from keys create", async () => {
      const r = await svc(["keys", "create", "--name", "escalate", "--scopes", "admin"], as(ci.key));
      expect(r.code).toBe(1);
      expect(r.stdout).toBe("");
      const lines = r.stderr.trimEnd().split("\n");
      expect(lines).toEqual([
        "Error: could not create API key",
        '  INSUFFICIENT_SCOPE: this operation requires an API key with the "admin" scope',
        '  Hint: use a key with the "admin" scope (create one with an admin key: svc keys create --name <name> --scopes admin)',
      ]);
    });

    it("delete removes the key, and its next command gets the three-part 401 error", async () => {
      const r = await svc(["keys", "delete", ci.id, "--yes"], admin);
      expect(r.code).toBe(0);
      expect(r.stdout.trim()).toBe(`Deleted API key ${ci.id}`);

      const after = await svc(["keys", "list"], as(ci.key));
      expect(after.code).toBe(1);
      const lines = after.stderr.trimEnd().split("\n");
      expect(lines[0]).toBe("Error: could not list API keys");
      expect(lines[1]).toMatch(/^ {2}UNAUTHORIZED: \S/);
      expect(lines.at(-1)).toContain("Hint:");
      expect(lines.at(-1)).toContain("SVC_API_KEY");
    });

    it("delete of an unknown key says KEY_NOT_FOUND and points at keys list", async () => {
      const r = await svc(["keys", "delete", ci.id, "--yes"], admin);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`Error: could not delete API key ${ci.id}`);
      expect(r.stderr).toMatch(/^ {2}KEY_NOT_FOUND: /m);
      expect(r.stderr).toContain("svc keys list");
    });

    it("create reports validation errors field by field with the flag to fix", async () => {
      const r = await svc(["keys", "create", "--name", "bad", "--scopes", "deploy,superuser"], admin);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("Error: could not create API key");
      expect(r.stderr).toMatch(/^ {2}VALIDATION_ERROR: /m);
      expect(r.stderr).toMatch(/^ {4}scopes\.1: /m);
      expect(r.stderr).toContain("Hint: fix --scopes and try again");
    });

    it("create --json prints the created object with its key and expiry", async () => {
      const r = await svc(["keys", "create", "--name", "temp", "--scopes", "deploy,db", "--expires-in", "30d", "--json"], admin);
      expect(r.code).toBe(0);
      expect(r.stderr).toBe("");
      const created = JSON.parse(r.stdout) as { key: string; scopes: string[]; expiresAt: string };
      expect(created.key).toMatch(/^svc_/);
      expect(created.scopes).toEqual(["deploy", "db"]);
      const days = (Date.parse(created.expiresAt) - Date.now()) / 86_400_000;
      expect(days).toBeGreaterThan(29.9);
      expect(days).toBeLessThan(30.1);
    });

    it("roll issues a new working key and keeps the old one alive for the grace period", async () => {
      const old = await createKey(stack, "rolled", ["deploy"]);
      const r = await svc(["keys", "roll", old.id, "--grace", "1h"], admin);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain(`Rolled API key ${old.id}`);
      const fresh = secretOf(r);
      expect(fresh).toBeDefined();
      expect(fresh).not.toBe(old.key);
      expect((await svc(["keys", "list"], as(fresh!))).code).toBe(0);
      expect((await svc(["keys", "list"], as(old.key))).code).toBe(0);
    });
  });
});
