import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/local-stack.js";
import { svc, tempHome } from "./svc.js";

/**
 * Command-line handling that is decided before any request: help, usage
 * errors, local validation, refusals. No API runs here; where a command would
 * reach the network, SVC_API_URL points at a port nothing listens on.
 */
describe("svc command line", () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;

  beforeAll(async () => {
    home = await tempHome();
    env = { ...home.env, SVC_API_URL: "http://127.0.0.1:9", SVC_API_KEY: "svc_unused" };
  });
  afterAll(async () => {
    await home.remove();
  });

  it("prints every command with --help and exits 0", async () => {
    const r = await svc(["--help"], env);
    expect(r.code).toBe(0);
    for (const cmd of ["login", "logout", "keys create", "keys list", "keys delete", "keys roll", "apps create", "apps delete", "env set", "env unset", "env list", "disk attach", "disk detach"]) {
      expect(r.stdout).toContain(cmd);
    }
  });

  it("prints a noun's verbs and a verb's options with --help at each level", async () => {
    const noun = await svc(["keys", "--help"], env);
    expect(noun.code).toBe(0);
    expect(noun.stdout).toMatch(/Usage: svc keys <command>/);
    expect(noun.stdout).toMatch(/^\s+roll\s/m);
    const verb = await svc(["keys", "create", "-h"], env);
    expect(verb.code).toBe(0);
    expect(verb.stdout).toContain("Usage: svc keys create --name <name> --scopes <list> [options]");
    expect(verb.stdout).toContain("--expires-in <duration>");
    const leading = await svc(["--help", "apps", "delete"], env);
    expect(leading.stdout).toContain("--yes");
  });

  it("prints the package version with --version", async () => {
    const pkg = JSON.parse(await readFile(join(ROOT, "package.json"), "utf8")) as { version: string };
    const r = await svc(["--version"], env);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(pkg.version);
  });

  it("rejects an unknown command with a usage error and exit code 2", async () => {
    const r = await svc(["frobnicate"], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^Error: unknown command "frobnicate"$/m);
    expect(r.stderr).toContain("usage: svc <command> [options]");
    expect(r.stderr).toContain("svc --help");
  });

  it("rejects an unknown verb and a missing verb with usage errors", async () => {
    const unknown = await svc(["keys", "rotate"], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown command "svc keys rotate"');
    const missing = await svc(["apps"], env);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("usage: svc apps <command> [options]");
  });

  it("rejects unknown options, missing flags and missing arguments before calling the API", async () => {
    const unknown = await svc(["keys", "list", "--colour"], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain("--colour");
    const flag = await svc(["keys", "create", "--name", "ci"], env);
    expect(flag.code).toBe(2);
    expect(flag.stderr).toMatch(/^Error: missing --scopes <list>$/m);
    const arg = await svc(["keys", "delete"], env);
    expect(arg.code).toBe(2);
    expect(arg.stderr).toMatch(/^Error: missing <id>$/m);
    const extra = await svc(["apps", "list", "surplus"], env);
    expect(extra.code).toBe(2);
    expect(extra.stderr).toContain('unexpected argument "surplus"');
  });

  it("checks flag values locally", async () => {
    const both = await svc(["keys", "create", "--name", "x", "--scopes", "deploy", "--expires-at", "2030-01-01", "--expires-in", "1d"], env);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain("either --expires-at or --expires-in");
    const duration = await svc(["keys", "create", "--name", "x", "--scopes", "deploy", "--expires-in", "soon"], env);
    expect(duration.code).toBe(2);
    expect(duration.stderr).toContain("--expires-in must be a duration");
    const memory = await svc(["apps", "create", "--name", "a", "--runtime", "node", "--memory", "lots"], env);
    expect(memory.code).toBe(2);
    expect(memory.stderr).toContain("--memory must be a whole number");
    const size = await svc(["disk", "create", "--name", "d", "--size", "0"], env);
    expect(size.code).toBe(2);
    expect(size.stderr).toContain("--size must be a whole number");
  });

  it("checks KEY=VALUE syntax of env set and names of env unset", async () => {
    const noEquals = await svc(["env", "set", "FOO", "--app", "a"], env);
    expect(noEquals.code).toBe(2);
    expect(noEquals.stderr).toContain('"FOO" is not KEY=VALUE');
    const badName = await svc(["env", "set", "1X=y", "--app", "a"], env);
    expect(badName.code).toBe(2);
    expect(badName.stderr).toContain('"1X" is not a valid variable name');
    const noApp = await svc(["env", "set", "A=1"], env);
    expect(noApp.code).toBe(2);
    expect(noApp.stderr).toContain("missing --app <app>");
    const unsetPair = await svc(["env", "unset", "A=1", "--app", "a"], env);
    expect(unsetPair.code).toBe(2);
    expect(unsetPair.stderr).toContain("unset takes names only");
  });

  it("refuses to delete an app without --yes when stdin is not a terminal", async () => {
    const r = await svc(["apps", "delete", "my-app"], env);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^Error: refusing to delete app my-app without confirmation$/m);
    expect(r.stderr).toContain("Hint: pass --yes: svc apps delete my-app --yes");
  });

  it("reports an unreachable API in three parts with the URL to check", async () => {
    const r = await svc(["keys", "list"], env);
    expect(r.code).toBe(1);
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe("Error: could not list API keys");
    expect(lines[1]).toMatch(/^ {2}\S/);
    expect(lines.at(-1)).toContain("Hint: is the API running at http://127.0.0.1:9? start it with `npm start`");
  });

  it("says how to log in when no key is configured", async () => {
    const r = await svc(["apps", "list"], home.env);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("Error: not logged in");
    expect(r.stderr).toContain("Hint: run `svc login` or set SVC_API_KEY");
  });

  it("requires --api-key for login when stdin is not a terminal", async () => {
    const r = await svc(["login", "--api-url", "http://127.0.0.1:9"], home.env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("missing --api-key <key> (stdin is not a terminal");
  });

  it("rejects a login URL that is not http(s)", async () => {
    const r = await svc(["login", "--api-url", "ftp://example.com", "--api-key", "svc_x"], home.env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--api-url must be an http(s) URL");
  });

  it("logs out cleanly when not logged in", async () => {
    const r = await svc(["logout"], home.env);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("Not logged in");
  });
});
