import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalStack } from "../../scripts/local-stack.js";
import { createKey, STACK_START_TIMEOUT_MS, startStack, svc, tempHome } from "./svc.js";

type Backup = { id: string; status: string; sizeBytes: number; sha256?: string; description: string };

/**
 * `svc backups` through the real binary against the real Worker and builder
 * (issue 5): files written on an attached disk by a cron run, backed up,
 * downloaded, restored from the file and from the backup, read back by
 * another cron run.
 */
describe("svc backups against wrangler dev", () => {
  let stack: LocalStack;
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: Record<string, string>;
  let work: string;
  let cronId: string;
  let backupId: string;
  let archive: string;
  const suffix = randomBytes(3).toString("hex");
  const app = `bak-${suffix}`;
  const disk = `vol-${suffix}`;

  const json = <T>(stdout: string) => JSON.parse(stdout) as T;
  /** Runs a shell command on the app (so on its disk, at $SVC_DISK_PATH) and returns its log. */
  const onDisk = async (command: string): Promise<string> => {
    const changed = await svc(["cron", "update", cronId, "--command", command], env);
    if (changed.code !== 0) throw new Error(`cron update: ${changed.stderr}`);
    const r = await svc(["cron", "run", cronId, "--wait"], env);
    if (r.code !== 0) throw new Error(`cron run of ${command}: ${r.stdout}${r.stderr}`);
    return r.stdout;
  };

  beforeAll(async () => {
    stack = await startStack();
    home = await tempHome();
    work = await mkdtemp(join(tmpdir(), "svc-cli-backups-"));
    const key = await createKey(stack, "cli-backups", ["deploy"]);
    env = { ...home.env, SVC_API_URL: stack.apiUrl, SVC_API_KEY: key.key };
    const steps = [
      ["apps", "create", "--name", app, "--runtime", "static"],
      ["disk", "create", "--name", disk, "--size", "1", "--mount-path", "/data"],
      ["disk", "attach", disk, "--app", app],
      ["cron", "create", app, "--name", `shell-${suffix}`, "--schedule", "0 0 1 1 *", "--command", "true", "--json"],
    ];
    for (const step of steps) {
      const r = await svc(step, env);
      if (r.code !== 0) throw new Error(`svc ${step.join(" ")}: ${r.stderr}`);
      if (step[0] === "cron") cronId = json<{ id: string }>(r.stdout).id;
    }
    await onDisk('mkdir -p "$SVC_DISK_PATH/nested/dir" && printf "hello backup" > "$SVC_DISK_PATH/nested/dir/greeting.txt" && echo one > "$SVC_DISK_PATH/top.txt"');
  }, STACK_START_TIMEOUT_MS);
  afterAll(async () => {
    await stack?.stop();
    await home?.remove();
    if (work) await rm(work, { recursive: true, force: true });
  });

  it("create --wait waits until the backup is ready", async () => {
    const r = await svc(["backups", "create", disk, "--description", "cli test", "--wait"], env);
    expect(r.code).toBe(0);
    backupId = /^Backup (bak_\w+) of disk \S+ is ready$/m.exec(r.stdout)![1]!;
    expect(r.stdout).toMatch(/^status\s+ready$/m);
    expect(r.stdout).toMatch(/^description\s+cli test$/m);
    expect(r.stdout).toMatch(/^sha256\s+[0-9a-f]{64}$/m);
  });

  it("list shows the backup in a table and as JSON", async () => {
    const r = await svc(["backups", "list", disk], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^ID\s+STATUS\s+KIND\s+SIZE\s+CREATED\s+EXPIRES\s+DESCRIPTION$/m);
    expect(r.stdout).toMatch(new RegExp(`^${backupId}\\s+ready\\s+manual\\s+\\d+(\\.\\d)? (B|KiB|MiB)\\s+.+\\s+cli test$`, "m"));
    const list = json<Backup[]>((await svc(["backups", "list", disk, "--json"], env)).stdout);
    expect(list[0]).toMatchObject({ id: backupId, status: "ready", description: "cli test", automatic: false });
  });

  it("download -o streams the archive to a file that tar lists, with the SHA-256 checked", async () => {
    archive = join(work, "backup.tar.gz");
    const r = await svc(["backups", "download", disk, backupId, "-o", archive], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^Downloaded backup ${backupId} to .*backup\\.tar\\.gz \\(.+, SHA-256 verified\\)$`, "m"));
    const { stdout } = await promisify(execFile)("tar", ["tzf", archive]);
    const entries = stdout.split("\n").map((e) => e.replace(/^\.\//, ""));
    expect(entries).toContain("nested/dir/greeting.txt");
    expect(entries).toContain("top.txt");
    expect(await readdir(work)).toEqual(["backup.tar.gz"]);
    const list = json<Backup[]>((await svc(["backups", "list", disk, "--json"], env)).stdout);
    expect((await stat(archive)).size).toBe(list.find((b) => b.id === backupId)!.sizeBytes);
  });

  it("download of an unknown backup gets BACKUP_NOT_FOUND with a pointer to the disk's list", async () => {
    const missing = await svc(["backups", "download", disk, "bak_nope"], env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^ {2}BACKUP_NOT_FOUND: /m);
    expect(missing.stderr).toContain(`Hint: \`svc backups list ${disk}\` shows the disk's backups`);
  });

  it("restore --file while the app runs gets the three-part DISK_IN_USE error, and uploads nothing", async () => {
    await onDisk('rm -r "$SVC_DISK_PATH/nested" && echo two > "$SVC_DISK_PATH/top.txt" && echo new > "$SVC_DISK_PATH/later.txt"');
    const r = await svc(["backups", "restore", disk, "--file", archive, "--yes"], env);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not restore disk ${disk}`);
    expect(lines[1]).toMatch(/^ {2}DISK_IN_USE: /);
    expect(lines.at(-1)).toBe(
      `  Hint: stop the app first (svc apps stop --app ${app}; the restore starts it again), or detach the disk (svc disk detach ${disk}), restore, then svc disk attach ${disk} --app ${app}`,
    );
  });

  it("restore --file after apps stop restores the files and starts the app again", async () => {
    expect((await svc(["apps", "stop", app], env)).code).toBe(0);
    const r = await svc(["backups", "restore", disk, "--file", archive, "--yes"], env);
    expect(r.stderr).not.toContain("Error");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Uploaded .*backup\.tar\.gz \(.+\)$/m);
    expect(r.stdout).toContain(`Restored disk ${disk} from ${archive}; app ${app} restarts with the restored data`);
    const info = json<{ status: string }>((await svc(["apps", "info", app, "--json"], env)).stdout);
    // Started again (a static site with nothing deployed: not_deployed, not stopped).
    expect(info.status).toBe("not_deployed");
    const log = await onDisk('cat "$SVC_DISK_PATH/nested/dir/greeting.txt"; echo; cat "$SVC_DISK_PATH/top.txt"; ls "$SVC_DISK_PATH"');
    expect(log).toMatch(/ out hello backup$/m);
    expect(log).toMatch(/ out one$/m);
    expect(log).not.toMatch(/ out later\.txt$/m);
  });

  it("restore --backup restores a ready backup without an upload; the API refuses it while the app runs", async () => {
    await onDisk('echo three > "$SVC_DISK_PATH/top.txt"');
    const refused = await svc(["backups", "restore", disk, "--backup", backupId, "--yes"], env);
    expect(refused.code).toBe(1);
    const lines = refused.stderr.trimEnd().split("\n");
    expect(lines[0]).toBe(`Error: could not restore disk ${disk}`);
    expect(lines[1]).toMatch(/^ {2}DISK_IN_USE: /);
    expect(lines.at(-1)).toContain(`Hint: stop the app first (svc apps stop --app ${app}; the restore starts it again)`);
    expect((await svc(["apps", "stop", app], env)).code).toBe(0);
    const r = await svc(["backups", "restore", disk, "--backup", backupId, "--json", "--yes"], env);
    expect(r.code).toBe(0);
    expect(json(r.stdout)).toMatchObject({ status: "succeeded", error: null });
    expect(await onDisk('cat "$SVC_DISK_PATH/top.txt"')).toMatch(/ out one$/m);
  });

  it("restore takes one of --file and --backup (neither: the newest ready backup), and reads the file before asking the API", async () => {
    // Neither: the newest ready backup, named before the question a script must answer with --yes.
    const neither = await svc(["backups", "restore", disk], env);
    expect(neither.code).toBe(1);
    expect(neither.stderr).toMatch(/^Newest ready backup of disk \S+: bak_\w+ \(/m);
    expect(neither.stderr).toContain("--yes");
    const both = await svc(["backups", "restore", disk, "--file", archive, "--backup", backupId], env);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain("pass --file <archive> or --backup <id>, not both");
    const absent = await svc(["backups", "restore", disk, "--file", join(work, "absent.tar.gz")], env);
    expect(absent.code).toBe(1);
    expect(absent.stderr).toMatch(/^Error: could not read .*absent\.tar\.gz$/m);
    expect(absent.stderr).toContain("ENOENT");
  });

  it("delete removes the backup; afterwards it is not found", async () => {
    const r = await svc(["backups", "delete", disk, backupId, "--yes"], env);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(`Deleted backup ${backupId} of disk ${disk}`);
    const list = json<Backup[]>((await svc(["backups", "list", disk, "--json"], env)).stdout);
    expect(list.map((b) => b.id)).not.toContain(backupId);
    const gone = await svc(["backups", "download", disk, backupId, "-o", join(work, "gone.tar.gz")], env);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toMatch(/^ {2}BACKUP_NOT_FOUND: /m);
  });

  it("an unknown disk gets DISK_NOT_FOUND with a pointer to disk list", async () => {
    const r = await svc(["backups", "list", "no-such-disk"], env);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^ {2}DISK_NOT_FOUND: /m);
    expect(r.stderr).toContain('Hint: no disk "no-such-disk" in this account: `svc disk list` shows the names and ids');
  });
});
