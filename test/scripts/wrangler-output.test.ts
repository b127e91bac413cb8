import { describe, expect, it } from "vitest";
import { DISCONNECT_NOTE, quietDisconnects } from "../../scripts/wrangler-output.js";

/** Runs `chunks` through the filter, returning what it wrote. */
function filtered(chunks: string[]): string {
  let out = "";
  const feed = quietDisconnects((text) => {
    out += text;
  });
  for (const chunk of chunks) feed(chunk);
  return out;
}

// workerd's report as npm start printed it (issue 20), colours included, and with the stack lines after it.
const REPORT = [
  "\u001b[31m✘ \u001b[41;31m[\u001b[41;97mERROR\u001b[41;31m]\u001b[0m \u001b[1mkj::getCaughtExceptionAsKj() = kj/async-io-unix.c++:186:\u001b[0m",
  "          disconnected: ::write(fd, buffer.begin(), buffer.size()): Broken pipe",
  "          stack: /work/node_modules/@cloudflare/workerd-linux-64/bin/workerd@2a1b3c4 workerd@2a1c5d6",
  "",
].join("\n");

describe("npm start's wrangler output", () => {
  it("replaces workerd's report of a client that went away with one line, said once", () => {
    const out = filtered([`[wrangler:info] GET /v1/apps 200 OK (12ms)\n${REPORT}`, `\n${REPORT}\n[wrangler:info] GET /healthz 200 OK (1ms)\n`]);
    expect(out).toBe(`[wrangler:info] GET /v1/apps 200 OK (12ms)\n${DISCONNECT_NOTE}\n[wrangler:info] GET /healthz 200 OK (1ms)\n`);
  });

  it("knows the report on one line, as newer workerd prints it", () => {
    const oneLine =
      "\u001b[31m✘ \u001b[41;31m[\u001b[41;97mERROR\u001b[41;31m]\u001b[0m \u001b[1mkj::getCaughtExceptionAsKj() = kj/async-io-unix.c++:186: disconnected: ::write(fd, buffer.begin(), buffer.size()): Broken pipe\u001b[0m\n";
    expect(filtered([oneLine, oneLine, "[wrangler:info] GET / 200 OK (3ms)\n"])).toBe(`${DISCONNECT_NOTE}\n[wrangler:info] GET / 200 OK (3ms)\n`);
  });

  it("keeps every other error, kj ones included, and lines split across chunks", () => {
    const other = "✘ [ERROR] kj::getCaughtExceptionAsKj() = kj/compat/http.c++:1234:\n          failed: expected contentLength > 0\n";
    expect(filtered([other])).toBe(other);
    expect(filtered(["✘ [ERROR] Uncaught TypeError: x is not a func", "tion\n    at worker.js:1:1\n"])).toBe(
      "✘ [ERROR] Uncaught TypeError: x is not a function\n    at worker.js:1:1\n",
    );
  });
});
