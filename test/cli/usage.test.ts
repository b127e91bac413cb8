import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { cp, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ago } from "../../cli/src/output.js";
import { ROOT } from "../../scripts/local-stack.js";
import { svc, tempHome } from "./svc.js";

const run = promisify(execFile);

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
    for (const cmd of ["login", "logout", "keys create", "keys list", "keys delete", "keys roll", "apps create", "apps delete", "env set", "env unset", "env list", "domains add", "domains verify", "domains remove", "disk attach", "disk detach"]) {
      expect(r.stdout).toContain(cmd);
    }
  });

  it("runs an edit of its sources at the next command, even one that keeps the bundle's length", async () => {
    // A copy of what the bundle is made from, so the edit reaches no other test; its bundle gets a folder of its own.
    const copy = await mkdtemp(join(tmpdir(), "svc-cli-copy-"));
    const cache = join(ROOT, "node_modules", ".cache", "svc-cli", createHash("sha256").update(`${copy}/`).digest("hex").slice(0, 12));
    try {
      await cp(join(ROOT, "cli"), join(copy, "cli"), { recursive: true });
      await cp(join(ROOT, "builder", "src"), join(copy, "builder", "src"), { recursive: true });
      await cp(join(ROOT, "package.json"), join(copy, "package.json"));
      await symlink(join(ROOT, "node_modules"), join(copy, "node_modules"));
      const help = async () => (await run(process.execPath, [join(copy, "cli", "bin", "svc.js"), "--help"], { env: { PATH: process.env.PATH ?? "", ...env } })).stdout.split("\n")[0];
      // Bundled, then run again with the code V8 compiled the first time.
      expect(await help()).toBe("svc: the command-line tool of the svc platform");
      expect(await help()).toBe("svc: the command-line tool of the svc platform");
      // The same number of characters: V8 checks a code cache against its source's length alone.
      const main = join(copy, "cli", "src", "main.ts");
      await writeFile(main, (await readFile(main, "utf8")).replace("the command-line tool of the svc platform", "THE COMMAND-LINE TOOL OF THE SVC PLATFORM"));
      expect(await help()).toBe("svc: THE COMMAND-LINE TOOL OF THE SVC PLATFORM");
      expect(await help()).toBe("svc: THE COMMAND-LINE TOOL OF THE SVC PLATFORM");
    } finally {
      await rm(copy, { recursive: true, force: true });
      await rm(cache, { recursive: true, force: true });
    }
  });

  it("prints the help with exit 0 for svc alone, and the same screens through svc help [command]", async () => {
    const bare = await svc([], env);
    expect(bare.code).toBe(0);
    expect(bare.stderr).toBe("");
    expect(bare.stdout).toMatch(/^svc: the command-line tool of the svc platform\n/);
    expect(bare.stdout).toContain("completion");
    expect((await svc(["help"], env)).stdout).toBe(bare.stdout);
    expect((await svc(["--help"], env)).stdout).toBe(bare.stdout);
    const verb = await svc(["help", "keys", "create"], env);
    expect(verb.code).toBe(0);
    expect(verb.stdout).toBe((await svc(["keys", "create", "--help"], env)).stdout);
    expect((await svc(["help", "deploy"], env)).stdout).toContain("Usage: svc deploy [--app <app>] [options]");
    expect((await svc(["help", "cron"], env)).stdout).toContain("Usage: svc cron <command> [options]");
    const typo = await svc(["help", "kyes"], env);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("Hint: did you mean `svc keys`? (`svc help` lists the commands)");
  });

  it("explains option mistakes in its own words, suggesting the option meant", async () => {
    const typo = await svc(["deploy", "--sorce", "site"], env);
    expect(typo.code).toBe(2);
    expect(typo.stderr.trimEnd().split("\n")).toEqual([
      "Error: unknown option --sorce for svc deploy",
      "  usage: svc deploy [--app <app>] [options]",
      "  Hint: did you mean --source? (`svc deploy --help` lists the options)",
    ]);
    const noValue = await svc(["keys", "create", "--name", "--scopes", "deploy"], env);
    expect(noValue.stderr).toMatch(/^Error: --name needs a value: --name <name> \(got "--scopes"; for a value starting with -, write --name=--scopes\)$/m);
    const boolValue = await svc(["apps", "delete", "x", "--yes=no"], env);
    expect(boolValue.stderr).toMatch(/^Error: --yes takes no value \(got "--yes=no"\)$/m);
    const global = await svc(["--jsno", "keys", "list"], env);
    expect(global.stderr).toContain("Hint: did you mean --json? Only --json, --help and --version go before the command");
    for (const r of [typo, noValue, boolValue, global]) {
      expect(r.code).toBe(2);
      expect(r.stderr).not.toMatch(/ERR_PARSE_ARGS|To specify a positional argument/);
    }
  });

  it("tells to quote a schedule the shell split into words", async () => {
    // What the shell passes for --schedule 0 3 * * * in a folder holding a.txt and b.txt.
    const r = await svc(["cron", "create", "--app", "my-site", "--name", "n", "--schedule", "0", "3", "a.txt", "b.txt", "--command", "true"], env);
    expect(r.code).toBe(2);
    expect(r.stderr.trimEnd().split("\n")).toEqual([
      'Error: unexpected argument "3"',
      "  usage: svc cron create --app <app> --name <name> --schedule <expr> --command <cmd> [options]",
      '  Hint: quote the schedule, it is one argument: --schedule "0 3 * * *" (unquoted, the shell splits it into words and turns each * into file names)',
    ]);
    const update = await svc(["cron", "update", "nightly", "--schedule", "30", "2", "a.txt"], env);
    expect(update.stderr).toContain('Hint: quote the schedule, it is one argument: --schedule "0 3 * * *"');
  });

  it("takes the app as --app, -a or the first argument, alike for every command", async () => {
    const forms = [
      [["logs", "my-site"], ["logs", "--app", "my-site"], ["logs", "-a", "my-site"]],
      [["env", "list", "my-site"], ["env", "list", "--app", "my-site"]],
      [["env", "set", "my-site", "A=1"], ["env", "set", "A=1", "--app", "my-site"], ["env", "set", "-a", "my-site", "A=1"]],
      [["cron", "create", "my-site", "--name", "n", "--schedule", "* * * * *", "--command", "true"], ["cron", "create", "--app", "my-site", "--name", "n", "--schedule", "* * * * *", "--command", "true"]],
      [["apps", "info", "my-site"], ["apps", "info", "--app", "my-site"]],
      [["deployments", "list", "my-site"], ["deployments", "list", "--app", "my-site"]],
      [["disk", "attach", "uploads", "--app", "my-site"], ["disk", "attach", "uploads", "my-site"]],
      [["domains", "list", "my-site"], ["domains", "list", "--app", "my-site"]],
      [["domains", "info", "my-site", "www.example.com"], ["domains", "info", "www.example.com", "--app", "my-site"], ["domains", "info", "-a", "my-site", "www.example.com"]],
    ];
    for (const variants of forms) {
      const results = await Promise.all(variants.map((args) => svc(args, env)));
      // Each reaches the API (not running here) with the same request: the same "could not …" about my-site.
      const firstLines = results.map((r) => r.stderr.split("\n")[0]);
      expect(firstLines[0], variants[0]!.join(" ")).toMatch(/^Error: could not .*my-site/);
      expect(new Set(firstLines).size, variants[0]!.join(" ")).toBe(1);
    }
    const twice = await svc(["logs", "my-site", "--app", "other"], env);
    expect(twice.code).toBe(2);
    expect(twice.stderr).toContain('unexpected argument "my-site"');
  });

  it("reads times to come as in 5 minutes, never just now", () => {
    const now = Date.parse("2026-11-23T12:00:00.000Z");
    const at = (seconds: number) => new Date(now + seconds * 1000).toISOString();
    expect(ago(at(300), "never", now)).toBe("in 5 minutes");
    expect(ago(at(10), "never", now)).toBe("in 10 seconds");
    expect(ago(at(0.3), "never", now)).toBe("in 1 second");
    expect(ago(at(-10), "never", now)).toBe("just now");
    expect(ago(at(-300), "never", now)).toBe("5 minutes ago");
    expect(ago(at(3 * 3600), "never", now)).toBe("in 3 hours");
    expect(ago(at(-2 * 86_400), "never", now)).toBe("2 days ago");
    expect(ago(at(90 * 86_400), "never", now)).toBe("2027-02-21");
    expect(ago(null, "never", now)).toBe("never");
  });

  describe("shell completion", () => {
    const script = async (shell: string) => {
      const r = await svc(["completion", shell], env);
      expect(r.code).toBe(0);
      const file = join(home.dir, `svc.${shell}`);
      await writeFile(file, r.stdout);
      return file;
    };

    it("bash: nouns, verbs, a command's options, and file names after an option taking a path", async () => {
      const file = await script("bash");
      const complete = async (...words: string[]) => {
        const line = `source ${file}; COMP_WORDS=(svc ${words.map((w) => `'${w}'`).join(" ")}); COMP_CWORD=${words.length}; _svc; echo "\${COMPREPLY[*]}"`;
        return (await run("bash", ["-c", line])).stdout.trim();
      };
      expect(await complete("ke")).toBe("keys");
      expect(await complete("")).toContain("deploy");
      expect(await complete("keys", "")).toBe("create list delete roll");
      expect(await complete("keys", "create", "--s")).toBe("--scopes");
      expect(await complete("deploy", "--")).toContain("--source");
      expect(await complete("completion", "")).toBe("bash zsh fish");
      expect(await complete("help", "de")).toBe("deploy deployments");
      expect(await complete("deploy", "--source", "")).toBe(""); // bash falls back to file names
    });

    it("zsh: the script loads and registers _svc for svc", async () => {
      const file = await script("zsh");
      const { stdout } = await run("zsh", ["-fc", `autoload -U compinit && compinit -u -D && source ${file} && print -r -- \${_comps[svc]}`]);
      expect(stdout.trim()).toBe("_svc");
    });

    it("fish: nouns, verbs and options with their descriptions", async () => {
      const file = await script("fish");
      const complete = async (line: string) =>
        (await run("fish", ["--no-config", "-c", `source ${file}; complete -C '${line}'`])).stdout.trimEnd().split("\n");
      expect(await complete("svc ke")).toEqual(["keys\tManage API keys"]);
      expect(await complete("svc keys ")).toEqual(expect.arrayContaining([expect.stringMatching(/^create\tCreate an API key/), expect.stringMatching(/^roll\t/)]));
      expect(await complete("svc keys create --sc")).toEqual([expect.stringMatching(/^--scopes\tcomma-separated scopes/)]);
      expect(await complete("svc completion ")).toEqual(["bash", "fish", "zsh"]);
    });

    it("refuses a shell it does not know, suggesting the closest", async () => {
      const r = await svc(["completion", "bsh"], env);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain('Error: unknown shell "bsh"');
      expect(r.stderr).toContain("Hint: did you mean bash or zsh?");
    });
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

  it("rejects an unknown command with a usage error and exit code 2, suggesting the closest ones", async () => {
    const r = await svc(["frobnicate"], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^Error: unknown command "frobnicate"$/m);
    expect(r.stderr).toContain("usage: svc <command> [options]");
    expect(r.stderr).toContain("Hint: `svc help` lists the commands");
    const typo = await svc(["depoly"], env);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("Hint: did you mean `svc deploy`? (`svc help` lists the commands)");
    const verb = await svc(["create"], env);
    expect(verb.stderr).toContain('Hint: "create" goes after a noun: `svc keys create`, `svc apps create`, `svc disk create`, `svc backups create` or `svc cron create`');
  });

  it("rejects an unknown verb with suggestions, and shows a noun's verbs when none is given", async () => {
    const unknown = await svc(["keys", "rotate"], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^Error: unknown command "keys rotate"$/m);
    expect(unknown.stderr).toContain("Hint: `svc help keys` lists the commands");
    const typo = await svc(["keys", "creat"], env);
    expect(typo.stderr).toContain("Hint: did you mean `svc keys create`? (`svc help keys` lists the commands)");
    const noun = await svc(["apps"], env);
    expect(noun.code).toBe(0);
    expect(noun.stdout).toContain("Usage: svc apps <command> [options]");
    expect(noun.stdout).toMatch(/^\s+delete\s+Delete an app/m);
  });

  it("rejects unknown options, missing flags and missing arguments before calling the API", async () => {
    const unknown = await svc(["keys", "list", "--colour"], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr.trimEnd().split("\n")).toEqual([
      "Error: unknown option --colour for svc keys list",
      "  usage: svc keys list [options]",
      "  Hint: `svc keys list --help` lists the options",
    ]);
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

  it("refuses every destructive command without --yes when stdin is not a terminal, before calling the API", async () => {
    const cases: [string[], string, string][] = [
      [["apps", "delete", "my-app"], "delete app my-app", "svc apps delete --app my-app --yes"],
      [["apps", "delete", "--app", "my-app"], "delete app my-app", "svc apps delete --app my-app --yes"],
      [["disk", "delete", "uploads"], "delete disk uploads", "svc disk delete uploads --yes"],
      [["keys", "delete", "key_x"], "delete API key key_x", "svc keys delete key_x --yes"],
      [["backups", "restore", "uploads", "--backup", "bak_x"], "restore disk uploads", "svc backups restore uploads --backup bak_x --yes"],
      [["backups", "delete", "uploads", "bak_x"], "delete backup bak_x of disk uploads", "svc backups delete uploads bak_x --yes"],
      [["cron", "delete", "nightly"], "delete cron job nightly", "svc cron delete nightly --yes"],
      [["domains", "remove", "www.example.com", "--app", "my-app"], "remove domain www.example.com from app my-app", "svc domains remove www.example.com --app my-app --yes"],
    ];
    for (const [args, action, retry] of cases) {
      const r = await svc(args, env);
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.stderr.trimEnd().split("\n")).toEqual([
        `Error: refusing to ${action} without confirmation`,
        "  stdin is not a terminal, so svc cannot ask",
        `  Hint: pass --yes: ${retry}`,
      ]);
    }
    // With --yes the command goes ahead: here it reaches for the API, which is not running.
    const yes = await svc(["disk", "delete", "uploads", "--yes"], env);
    expect(yes.stderr).toContain("Error: could not delete disk uploads");
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

  it("takes no URL or key besides --local, which reads both from the local stack", async () => {
    const r = await svc(["login", "--local", "--api-key", "svc_x"], home.env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("Error: --local takes the URL and the key from the local stack: leave out --api-url and --api-key");
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
