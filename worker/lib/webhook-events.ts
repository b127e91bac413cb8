/** What webhooks can be told of (docs/webhooks.md has each payload); the API, the schema and the CLI's check share it. */
export const WEBHOOK_EVENTS = [
  "deploy.succeeded",
  "deploy.failed",
  "app.crash_loop",
  "app.recovered",
  "cron.failed",
  "cron.disabled",
  "backup.failed",
  "restore.failed",
] as const;
export type WebhookEvent = (typeof WEBHOOK_EVENTS)[number];
