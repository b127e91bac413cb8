import { cp, mkdir, mkdtemp, rm } from "node:fs/promises";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type LocalStack, ROOT } from "../../scripts/local-stack.js";
import { type SvcResult, svc } from "../cli/svc.js";

/** The sample projects of the static-site tests. */
export const FIXTURES = join(ROOT, "test", "fixtures", "sites");

/** Temporary copies of fixtures, so a test can change them without touching the repository. */
export class FixtureCopies {
  private readonly dirs: string[] = [];

  /** Copies `test/fixtures/sites/<name>` into a fresh temporary folder and returns the copy's path. */
  async copy(name: string): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), `svc-site-${name}-`));
    this.dirs.push(dir);
    const target = join(dir, name);
    await cp(join(FIXTURES, name), target, { recursive: true });
    return target;
  }

  /** A new empty folder named `name` (its name is what `svc init` derives the app name from). */
  async folder(name: string): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), "svc-site-"));
    this.dirs.push(dir);
    const target = join(dir, name);
    await mkdir(target);
    return target;
  }

  async removeAll(): Promise<void> {
    await Promise.all(this.dirs.map((dir) => rm(dir, { recursive: true, force: true })));
  }
}

/** One answer of the edge server. */
export type SiteResponse = { status: number; headers: Record<string, string | string[] | undefined>; body: string };

/**
 * A request to an app's site the way a browser on this machine makes it:
 * to 127.0.0.1 with `Host: <app>.localhost:<port>`, or `host` (a custom domain) (fetch cannot set Host, so node:http).
 */
export function siteRequest(
  stack: Pick<LocalStack, "apiUrl">,
  app: string,
  path: string,
  options: { method?: string; headers?: Record<string, string>; host?: string } = {},
): Promise<SiteResponse> {
  const api = new URL(stack.apiUrl);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: "127.0.0.1",
        port: api.port,
        path,
        // A connection of its own: a kept-alive one the server is closing as the request goes out ends as "socket hang up".
        agent: false,
        method: options.method ?? "GET",
        headers: { ...options.headers, Host: options.host ?? `${app}.localhost:${api.port}` },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end();
  });
}

/** Throws with both output streams when an `svc` call did not exit as expected, so a failed setup step says why. */
export function expectExit(result: SvcResult, code: number, what: string): SvcResult {
  if (result.code !== code) {
    throw new Error(`${what}: exit ${result.code}, expected ${code}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`);
  }
  return result;
}

/**
 * Creates a static app and deploys the Vite + React fixture to it (with a
 * VITE_ variable and a secret that must stay out of the bundle), through the
 * real CLI. Resolves to the `svc deploy --json` deployment.
 */
export async function deployViteReact(
  env: Record<string, string>,
  app: string,
  fixtures: FixtureCopies,
): Promise<{ deployment: { id: string; status: string; url: string; uploadedBlobs: number }; source: string; deploy: SvcResult }> {
  expectExit(await svc(["apps", "create", "--name", app, "--runtime", "static"], env), 0, "apps create");
  expectExit(await svc(["env", "set", "VITE_GREETING=hello-from-env", "SECRET_TOKEN=do-not-leak", "--app", app], env), 0, "env set");
  const source = await fixtures.copy("vite-react");
  const deploy = expectExit(await svc(["deploy", "--source", source, "--app", app, "--json"], env), 0, "deploy vite-react");
  return { deployment: JSON.parse(deploy.stdout), source, deploy };
}
