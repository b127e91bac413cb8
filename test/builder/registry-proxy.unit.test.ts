import { mkdtemp, rm } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RegistryProxy } from "../../builder/src/sandbox/registry-proxy.js";

/** The build proxy with a python package index configured: the index's origin is reachable, nothing else is. */
let dir: string;
let proxy: RegistryProxy;
let index: Server;
let other: Server;
let indexOrigin: string;
let otherOrigin: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "svc-proxy-"));
  const serve = async (body: string) => {
    const server = createServer((_req, res) => res.end(body));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return { server, origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
  };
  ({ server: index, origin: indexOrigin } = await serve("index"));
  ({ server: other, origin: otherOrigin } = await serve("other"));
  proxy = await RegistryProxy.open(join(dir, "registry.sock"), null, `${indexOrigin}/simple/`);
});
afterAll(async () => {
  await proxy?.close();
  index?.close();
  other?.close();
  await rm(dir, { recursive: true, force: true });
});

/** Sends a request through the proxy's socket, as the sandbox's relay does. */
function viaProxy(method: string, target: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: proxy.socketPath, method, path: target, headers: { host: "proxy" } }, (res) => {
      let body = "";
      res.on("data", (chunk: Buffer) => {
        body += chunk.toString();
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("connect", (res, socket, head) => {
      let body = head.toString();
      socket.on("data", (chunk: Buffer) => {
        body += chunk.toString();
      });
      socket.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("the build proxy with BUILDER_PIP_INDEX_URL", () => {
  it("lists the npm registry and the index's origin, and names only the npm one for node installs", () => {
    expect(proxy.allowed).toBe(`https://registry.npmjs.org, https://registry.yarnpkg.com, ${indexOrigin}`);
    expect(proxy.npmAllowed).toBe("https://registry.npmjs.org, https://registry.yarnpkg.com");
  });

  it("forwards any path of the index's origin (its files live beside /simple/), and refuses other origins", async () => {
    expect(await viaProxy("GET", `${indexOrigin}/files/x-1.0-py3-none-any.whl`)).toEqual({ status: 200, body: "index" });
    const refused = await viaProxy("GET", `${otherOrigin}/simple/`);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("builds may only reach the package registries");
  });

  it("refuses a CONNECT to any other host", async () => {
    const refused = await viaProxy("CONNECT", "example.com:443");
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("not example.com:443");
  });

  it("adds files.pythonhosted.org for PyPI itself", async () => {
    const pypi = await RegistryProxy.open(join(dir, "pypi.sock"), "https://mirror.example/npm/", "https://pypi.org/simple/");
    try {
      expect(pypi.allowed).toBe("https://mirror.example, https://pypi.org, https://files.pythonhosted.org");
    } finally {
      await pypi.close();
    }
  });
});
