/** The local stack's route to a cron trigger (scripts/worker-dev-entry.ts answers it; scripts/local-crons.ts fires it). */
export const SCHEDULED_PATH = "/__scheduled";
