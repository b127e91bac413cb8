import { createApp } from "./app";
import type { Env } from "./env";

export { CronJob } from "../durable-objects/cron-job";

const app = createApp();

export default {
  fetch: app.fetch,
} satisfies ExportedHandler<Env>;
