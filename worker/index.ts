import { createApp } from "./app";
import type { Env } from "./env";
import { sweep } from "./services/retention";

export { BackupJob } from "../durable-objects/backup-job";
export { CronJob } from "../durable-objects/cron-job";
export { Deployment } from "../durable-objects/deployment";
export { RestoreJob } from "../durable-objects/restore-job";

const app = createApp();

export default {
  fetch: app.fetch,
  scheduled(controller, env, ctx) {
    ctx.waitUntil(sweep(env, controller.scheduledTime));
  },
} satisfies ExportedHandler<Env>;
