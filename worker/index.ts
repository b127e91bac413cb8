import { createApp } from "./app";
import type { Env, WebhookMessage } from "./env";
import { sweep } from "./services/retention";
import { snapshotDueDisks } from "./services/snapshots";
import { watchCrons } from "./services/watchdog";
import { deliver } from "./services/webhooks";

export { AppMetrics } from "../durable-objects/app-metrics";
export { AppRuntime } from "../durable-objects/app-runtime";
export { BackupJob } from "../durable-objects/backup-job";
export { CronJob } from "../durable-objects/cron-job";
export { Deployment } from "../durable-objects/deployment";
export { Fleet } from "../durable-objects/fleet";
export { RestoreJob } from "../durable-objects/restore-job";

const app = createApp();

/**
 * wrangler.toml [triggers]: the hourly retention sweep; the other trigger
 * (every 5 minutes) is the watchdog pass: cron jobs whose alarm died, and
 * disks whose automatic snapshot is due.
 */
const RETENTION_SCHEDULE = "17 * * * *";

export default {
  fetch: app.fetch,
  scheduled(controller, env, ctx) {
    if (controller.cron === RETENTION_SCHEDULE) ctx.waitUntil(sweep(env, controller.scheduledTime));
    else {
      ctx.waitUntil(watchCrons(env, controller.scheduledTime));
      ctx.waitUntil(snapshotDueDisks(env, controller.scheduledTime));
    }
  },
  /** Webhook deliveries (wrangler.toml [[queues.consumers]]): each sent once more, or brought back after its backoff. */
  async queue(batch, env) {
    await Promise.all(
      batch.messages.map(async (message) => {
        const wait = await deliver(env, message.body.deliveryId).catch((err: unknown) => {
          console.error(JSON.stringify({ event: "webhook.deliver_failed", deliveryId: message.body.deliveryId, error: err instanceof Error ? err.message : String(err) }));
          return 30;
        });
        if (wait === null) message.ack();
        else message.retry({ delaySeconds: wait });
      }),
    );
  },
} satisfies ExportedHandler<Env, WebhookMessage>;
