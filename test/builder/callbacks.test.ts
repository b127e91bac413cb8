import { type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JobStatus } from "../../builder/src/protocol/job-status.js";
import { verifyRequest } from "../../builder/src/protocol/signing.js";
import { type BuilderProcess, startBuilder, submitJob } from "./builder-process.js";

interface Delivery {
  at: number;
  verified: boolean;
  body: unknown;
}

let builder: BuilderProcess;
let receiver: Server;
let receiverUrl: string;
const deliveries: Delivery[] = [];
/** Status codes the receiver answers with, in order; 200 once exhausted. */
const answers: number[] = [];

beforeAll(async () => {
  builder = await startBuilder();
  receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", async () => {
      const body = Buffer.concat(chunks);
      const verdict = await verifyRequest({
        secret: builder.secret,
        method: request.method ?? "",
        path: request.url ?? "",
        body,
        headers: { get: (name) => (request.headers[name.toLowerCase()] as string | undefined) ?? null },
      });
      deliveries.push({ at: Date.now(), verified: verdict.ok, body: JSON.parse(body.toString("utf8")) });
      response.writeHead(answers.shift() ?? 200).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/internal/builder/callback?run=r1`;
});
afterAll(async () => {
  await builder?.stop();
  receiver?.close();
});

async function waitFor(count: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (deliveries.length < count && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 25));
}

describe("completion callback", () => {
  it("POSTs the final status, signed over the callback's path and query, and retries after a 500", async () => {
    answers.push(500);
    const job = await submitJob(builder, { command: "exit 4", callbackUrl: receiverUrl, labels: { runName: "nightly-1" } });
    await waitFor(2, 10_000);
    expect(deliveries).toHaveLength(2);
    expect(deliveries.every((delivery) => delivery.verified)).toBe(true);
    const [first, second] = deliveries as [Delivery, Delivery];
    expect(second.at - first.at).toBeGreaterThanOrEqual(400);
    const status = JobStatus.parse(second.body);
    expect(status).toMatchObject({ id: job.id, status: "failed", exitCode: 4, labels: { runName: "nightly-1" } });
    expect(status.finishedAt).not.toBeNull();
    await new Promise((resolve) => setTimeout(resolve, 1200));
    expect(deliveries).toHaveLength(2); // no further attempts after a 2xx
  });
});
