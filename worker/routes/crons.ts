import { createRoute, z } from "@hono/zod-openapi";
import { eq } from "drizzle-orm";
import { requireScope } from "../auth/middleware";
import { CONCURRENCY_POLICIES, CRON_RUN_STATUSES, disks } from "../db/schema";
import { checkSchedule, isTimeZone, nextRuns } from "../lib/cron";
import { ApiError } from "../lib/errors";
import { iso } from "../lib/time";
import { authErrors, codedIssue, errorResponse, jsonBody, newRouter, planLimited } from "../lib/router";
import { DnsLabel, Deleted, dataOf, MetricsQuery, Ref } from "../lib/schemas";
import { cronMetrics } from "../services/metrics";
import { resolveApp } from "../services/apps";
import { diskNode } from "../services/placement";
import {
  accountPlan,
  createCron,
  cronDetail,
  cronStub,
  cronView,
  deleteCron,
  listCrons,
  resolveCron,
  runView,
  updateCron,
} from "../services/crons";

const Schedule = z
  .string()
  .superRefine((value, ctx) => {
    const check = checkSchedule(value);
    if (!check.ok) ctx.addIssue(codedIssue("INVALID_CRON_EXPRESSION", "invalid cron expression", check.message));
  })
  .openapi({ description: "Five fields: minute hour day-of-month month day-of-week", example: "*/15 * * * *" });

const Command = z.string().min(1).max(10_000).refine((c) => !c.includes("\0"), "must not contain NUL");
const TimeZone = z.string().max(64).refine(isTimeZone, "must be an IANA time zone, e.g. Europe/Berlin");
const Timeout = z.number().int().min(1).max(43_200);
const DisableAfter = z
  .number()
  .int()
  .min(1)
  .max(1000)
  .nullable()
  .openapi({ description: "Disable the job by itself after this many failed runs in a row (its `disabledReason` says so and a `cron.disabled` event goes out); null: never" });

const NotifyAfter = z
  .number()
  .int()
  .min(1)
  .max(1000)
  .openapi({ description: "Send `cron.failed` from this many failed runs in a row on (1, the default: every failed run); the event carries the count" });

const CreateCronBody = z
  .strictObject({
    appId: Ref.openapi({ description: "App id (or name)" }),
    name: DnsLabel,
    schedule: Schedule,
    command: Command,
    timezone: TimeZone.default("UTC"),
    concurrencyPolicy: z.enum(CONCURRENCY_POLICIES).default("forbid"),
    timeoutSeconds: Timeout.default(3600),
    enabled: z.boolean().default(true),
    disableAfterFailures: DisableAfter.optional(),
    notifyAfterFailures: NotifyAfter.optional(),
  })
  .openapi("CreateCron", {
    example: { appId: "app_0aB1cD2eF3gH4iJ5kL6mN7oP", name: "nightly-report", schedule: "0 3 * * *", command: "npm run report" },
  });

const UpdateCronBody = z
  .strictObject({
    schedule: Schedule.optional(),
    command: Command.optional(),
    timezone: TimeZone.optional(),
    concurrencyPolicy: z.enum(CONCURRENCY_POLICIES).optional(),
    timeoutSeconds: Timeout.optional(),
    enabled: z.boolean().optional(),
    disableAfterFailures: DisableAfter.optional(),
    notifyAfterFailures: NotifyAfter.optional(),
  })
  .refine((b) => Object.keys(b).length > 0, "supply at least one field to change")
  .openapi("UpdateCron", { example: { schedule: "*/30 * * * *" } });

const CronSchema = z
  .object({
    id: z.string(),
    appId: z.string(),
    name: z.string(),
    schedule: z.string(),
    command: z.string(),
    enabled: z.boolean(),
    timezone: z.string(),
    concurrencyPolicy: z.enum(CONCURRENCY_POLICIES),
    timeoutSeconds: z.number().int(),
    disableAfterFailures: z.number().int().nullable(),
    notifyAfterFailures: z.number().int(),
    disabledReason: z.string().nullable().openapi({ example: "disabled after 3 failed runs in a row (the last: exit code 1)" }),
    createdAt: z.string(),
    updatedAt: z.string(),
  })
  .openapi("Cron");

const CronDetailSchema = CronSchema.extend({
  lastRun: z.string().nullable(),
  nextRun: z.string().nullable(),
  nextRuns: z.array(z.string()).openapi({ description: "The next five run times" }),
  late: z.boolean().openapi({
    description: "The next run is overdue and its alarm did not fire; a watchdog re-arms such jobs within minutes",
  }),
}).openapi("CronDetail");

const RunPhase = z.enum(["queued", "running"]).nullable().openapi({
  description:
    "While status is `running`: `queued` until the builder starts the command (the account runs as many jobs as its plan allows, or the builder is full), then `running`; null once the run has ended",
});

const RunSchema = z
  .object({
    jobName: z.string().openapi({ example: "nightly-report-1795237200" }),
    status: z.enum(CRON_RUN_STATUSES),
    phase: RunPhase,
    waiting: z.string().nullable().openapi({
      description: "Why a queued run waits, e.g. `waiting for a slot: 2 of 2 concurrent jobs of the account's plan running`; null otherwise",
    }),
    trigger: z.enum(["schedule", "manual"]),
    queuedAt: z.string().openapi({ description: "When the run was handed to the builder" }),
    startedAt: z.string().openapi({
      description: "When the command started on the builder; while the run is queued (and for a run that ended before it started), when it was queued",
    }),
    finishedAt: z.string().nullable(),
    exitCode: z.number().int().nullable(),
    error: z.string().nullable(),
  })
  .openapi("CronRun");

const PreviewQuery = z.object({
  schedule: Schedule,
  timezone: TimeZone.default("UTC").openapi({ description: "IANA time zone the schedule is read in", example: "Europe/Berlin" }),
});

const PreviewSchema = z
  .object({
    schedule: z.string(),
    timezone: z.string(),
    nextRuns: z.array(z.string()).openapi({ description: "The next five run times (UTC)", example: ["2026-11-22T03:00:00.000Z"] }),
  })
  .openapi("CronSchedulePreview");

const IdParam = z.object({
  id: Ref.openapi({ description: "The cron job's id (cron_…) or its name (unique in the account)", example: "nightly-report" }),
});
const RunParam = IdParam.extend({ jobName: z.string().min(1).max(128) });
const security = [{ bearerAuth: [] }];
const json = <T extends z.ZodType>(description: string, schema: T) => ({
  description,
  content: { "application/json": { schema } },
});
const cronNotFound = { 404: errorResponse("No such cron job in this account (CRON_NOT_FOUND)") };

export const cronRoutes = newRouter();
cronRoutes.use("*", requireScope("deploy"));

cronRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Create a cron job",
    tags: ["Cron jobs"],
    security,
    request: { body: jsonBody(CreateCronBody) },
    responses: {
      201: json("Created", dataOf(CronSchema)),
      ...authErrors,
      ...planLimited,
      404: errorResponse("app not found"),
      409: errorResponse("Name taken (NAME_TAKEN)"),
    },
  }),
  async (c) => {
    const { appId, ...input } = c.req.valid("json");
    const accountId = c.get("principal").accountId;
    const app = await resolveApp(c.get("db"), accountId, appId);
    const row = await createCron(c.get("db"), c.env, accountId, { ...input, appId: app.id });
    return c.json({ data: cronView(row) }, 201);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List cron jobs",
    tags: ["Cron jobs"],
    security,
    responses: { 200: json("Cron jobs, newest first", dataOf(z.array(CronSchema))), ...authErrors },
  }),
  async (c) => c.json({ data: (await listCrons(c.get("db"), c.get("principal").accountId)).map(cronView) }, 200),
);

// Registered before /{id}, which would otherwise take the path.
cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/schedule-preview",
    summary: "Check a schedule and list its next five runs, without creating a job",
    description: "The same grammar and time-zone rules as create and update; the dashboard previews a schedule as it is typed.",
    tags: ["Cron jobs"],
    security,
    request: { query: PreviewQuery },
    responses: {
      200: json("The next runs", dataOf(PreviewSchema)),
      ...authErrors,
      400: errorResponse("Not five valid fields (INVALID_CRON_EXPRESSION) or an unknown time zone (VALIDATION_ERROR)"),
    },
  }),
  (c) => {
    const { schedule, timezone } = c.req.valid("query");
    return c.json({ data: { schedule, timezone, nextRuns: nextRuns(schedule, timezone, Date.now(), 5).map(iso) } }, 200);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{id}",
    summary: "Get a cron job, with its last and next runs",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam },
    responses: { 200: json("The job", dataOf(CronDetailSchema)), ...authErrors, ...cronNotFound },
  }),
  async (c) => {
    const row = await resolveCron(c.get("db"), c.get("principal").accountId, c.req.valid("param").id);
    return c.json({ data: await cronDetail(c.env, row) }, 200);
  },
);

const RunPointSchema = z.object({
  runs: z.number().int().openapi({ description: "Runs that finished in the step" }),
  succeeded: z.number().int(),
  failed: z.number().int().openapi({ description: "Failed, timed out or lost" }),
  meanDurationMs: z.number().int().nullable().openapi({ description: "null: no run finished" }),
  maxDurationMs: z.number().int().nullable(),
});

cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{id}/metrics",
    summary: "A cron job's runs over time",
    description: "Finished runs by outcome and their durations, kept per minute for 7 days and per hour for 30 (docs/metrics.md).",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam, query: MetricsQuery },
    responses: {
      200: json(
        "Every step of the range, oldest first (empty ones as zero), and the range's totals",
        dataOf(z.object({ since: z.string(), stepSeconds: z.number().int(), points: z.array(RunPointSchema.extend({ at: z.string() })), totals: RunPointSchema })),
      ),
      ...authErrors,
      ...cronNotFound,
    },
  }),
  async (c) => {
    const cron = await resolveCron(c.get("db"), c.get("principal").accountId, c.req.valid("param").id);
    const since = c.req.valid("query").since;
    return c.json({ data: { since, ...(await cronMetrics(c.env, cron.id, since)) } }, 200);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{id}",
    summary: "Update a cron job",
    description: "Only the supplied fields change; the schedule is re-armed.",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam, body: jsonBody(UpdateCronBody) },
    responses: { 200: json("The whole job after the change", dataOf(CronDetailSchema)), ...authErrors, ...cronNotFound },
  }),
  async (c) => {
    const db = c.get("db");
    const cron = await resolveCron(db, c.get("principal").accountId, c.req.valid("param").id);
    return c.json({ data: await cronDetail(c.env, await updateCron(db, c.env, cron, c.req.valid("json"))) }, 200);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{id}",
    summary: "Delete a cron job, its alarm and its run history",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam },
    responses: { 200: json("Deleted", dataOf(Deleted)), ...authErrors, ...cronNotFound },
  }),
  async (c) => {
    const cron = await resolveCron(c.get("db"), c.get("principal").accountId, c.req.valid("param").id);
    await deleteCron(c.get("db"), c.env, cron);
    return c.json({ data: { id: cron.id, deleted: true as const } }, 200);
  },
);

/**
 * When to ask again for a run no node took: a node held unreachable is probed every 2 s and takes work
 * again once it answers (durable-objects/fleet.ts), sooner than a sick disk's node is worth asking again.
 */
const NO_NODE_RETRY_AFTER_SECONDS = 5;

cronRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{id}/run",
    summary: "Run a cron job once, now",
    description:
      "Starts regardless of the schedule, within the job's concurrency policy: `forbid` refuses while a run of the job is queued or running (RUN_IN_PROGRESS), `replace` cancels that run, `allow` adds another. The run counts against the account's concurrent jobs (it may wait `queued`), and is refused while the plan's limit of jobs already wait (TOO_MANY_JOBS).",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam },
    responses: {
      202: json("Started (or queued for a slot)", dataOf(z.object({ jobName: z.string(), status: z.enum(CRON_RUN_STATUSES), phase: RunPhase }))),
      ...authErrors,
      ...cronNotFound,
      409: errorResponse("The app is stopped (APP_STOPPED), or the policy is forbid and a run is queued or running (RUN_IN_PROGRESS)"),
      429: errorResponse("The account has its plan's limit of jobs waiting for a slot (TOO_MANY_JOBS), or too many requests (RATE_LIMITED)"),
      502: errorResponse("No node has joined or is ready to take work (BUILDER_UNAVAILABLE); the run did not start"),
      503: errorResponse(
        "The node holding the app's disk is not answering, or (without a disk) no node is (NODE_UNREACHABLE); the run did not start, and Retry-After says when to ask again",
      ),
    },
  }),
  async (c) => {
    const db = c.get("db");
    const accountId = c.get("principal").accountId;
    const cron = await resolveCron(db, accountId, c.req.valid("param").id);
    const app = await resolveApp(db, accountId, cron.appId);
    if (app.status === "stopped") {
      throw new ApiError("APP_STOPPED", `app ${app.name} is stopped; restart it (svc apps restart ${app.name}) to run its cron jobs`);
    }
    // A run of an app with a disk goes to the disk's node: a sick one answers 503 NODE_UNREACHABLE now, saying what comes next.
    const disk = await db.select({ id: disks.id, nodeId: disks.nodeId }).from(disks).where(eq(disks.appId, app.id)).get();
    if (disk?.nodeId) await diskNode(c.env, disk);
    const started = await cronStub(c.env, cron.id).runNow(await accountPlan(db, accountId));
    if (!started) throw new ApiError("CRON_NOT_FOUND", `cron job ${cron.id} not found`);
    if (!started.ok) {
      const retry: Record<string, string> = started.code === "NODE_UNREACHABLE" ? { "Retry-After": String(NO_NODE_RETRY_AFTER_SECONDS) } : {};
      throw new ApiError(started.code, started.message, undefined, undefined, retry);
    }
    return c.json({ data: { jobName: started.jobName, status: started.status, phase: started.phase } }, 202);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{id}/runs",
    summary: "List a cron job's runs (newest first, last 100 kept)",
    tags: ["Cron jobs"],
    security,
    request: { params: IdParam },
    responses: { 200: json("Runs", dataOf(z.array(RunSchema))), ...authErrors, ...cronNotFound },
  }),
  async (c) => {
    const cron = await resolveCron(c.get("db"), c.get("principal").accountId, c.req.valid("param").id);
    return c.json({ data: (await cronStub(c.env, cron.id).runs()).map(runView) }, 200);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "get",
    path: "/{id}/runs/{jobName}/logs",
    summary: "A run's log, while it runs and after",
    tags: ["Cron jobs"],
    security,
    request: { params: RunParam },
    responses: {
      200: json("Log lines: `<time> <out|err|svc> <text>`", dataOf(z.object({ logs: z.string() }))),
      ...authErrors,
      404: errorResponse("No such cron job (CRON_NOT_FOUND) or run (RUN_NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { id, jobName } = c.req.valid("param");
    const cron = await resolveCron(c.get("db"), c.get("principal").accountId, id);
    const logs = await cronStub(c.env, cron.id).logs(jobName);
    if (logs === null) throw new ApiError("RUN_NOT_FOUND", `run ${jobName} not found`);
    return c.json({ data: { logs } }, 200);
  },
);

cronRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{id}/runs/{jobName}/cancel",
    summary: "Cancel a running run",
    description: "Kills the run's process group. Cancelling a finished run changes nothing.",
    tags: ["Cron jobs"],
    security,
    request: { params: RunParam },
    responses: {
      200: json("The run after the request", dataOf(RunSchema)),
      ...authErrors,
      404: errorResponse("No such cron job (CRON_NOT_FOUND) or run (RUN_NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { id, jobName } = c.req.valid("param");
    const cron = await resolveCron(c.get("db"), c.get("principal").accountId, id);
    const run = await cronStub(c.env, cron.id).cancel(jobName);
    if (!run) throw new ApiError("RUN_NOT_FOUND", `run ${jobName} not found`);
    return c.json({ data: runView(run) }, 200);
  },
);
