import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { idleBounded } from "../../worker/lib/builder-client";

/** A body that sends `first`, stays silent `pauseMs`, then sends `second` and ends. */
function pausing(first: string, pauseMs: number, second: string): Response {
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      controller.enqueue(encoder.encode(first));
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
      controller.enqueue(encoder.encode(second));
      controller.close();
    },
  });
  return new Response(body);
}

describe("a followed stream from a node, under its idle bound", () => {
  // The real builder the Worker suites start: it answers the probe a silence triggers.
  const node = { id: "builder", address: String(env.BUILDER_URL) };

  it("goes on after a silence the node's health check excuses, with the read it was waiting on (never a second one)", async () => {
    const followed = idleBounded(node, pausing("before ", 450, "after"), true, "a followed log", 100);
    expect(await followed.text()).toBe("before after");
  });

  it("ends in an error after a silence when not followed", async () => {
    const complete = idleBounded(node, pausing("before ", 450, "after"), false, "a log", 100);
    await expect(complete.text()).rejects.toThrow("a log: silent for 0.1 s");
  });
});
