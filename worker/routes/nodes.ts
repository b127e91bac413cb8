import { createRoute, z } from "@hono/zod-openapi";
import { desc, eq, isNotNull } from "drizzle-orm";
import { NodeCapacity, NodeJoin, NodeJoined, QuarantinedDisk } from "../../builder/src/protocol/node";
import { capsOf, type FleetNode, type FleetResult } from "../../durable-objects/fleet";
import { hashSecret } from "../auth/secret";
import type { Config } from "../env";
import { disks, NODE_STATES, nodeJoinTokens } from "../db/schema";
import { listQuarantine, nodeKey, removeQuarantined } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { newId, randomBase62 } from "../lib/ids";
import { errorResponse, jsonBody, newRouter } from "../lib/router";
import { iso, isoOrNull } from "../lib/time";
import { fleetStub, forgetFleet, nodeRef } from "../services/fleet";
import { requireOperator } from "./accounts";

/**
 * The fleet's doors (DESIGN §10): `POST /v1/nodes/join` for a new builder
 * node holding a join token, and `/v1/operator/nodes…` for the operator token
 * (which also mints the join tokens). Neither takes an API key: no account
 * may see or change the fleet. A node that joined before joins again through
 * `/internal/nodes/rejoin`, signed with its own key (internal.ts).
 */

/** Join tokens: `svcjoin_` + 40 base62 characters; only their SHA-256 is kept. */
const JOIN_TOKEN_PREFIX = "svcjoin_";
const JOIN_TOKEN_PATTERN = /^svcjoin_[0-9A-Za-z]{40}$/;
const GIB = 2 ** 30;

function unwrap<T>(result: FleetResult<T>): T {
  if (!result.ok) throw new ApiError(result.code, result.message);
  return result.value;
}

const Caps = z.object({
  cores: z.int(),
  memoryMb: z.int(),
  diskBytes: z.int(),
  /** True where the fleet's defaults (NODE_MAX_*) apply, false where the node's join token or the operator set them. */
  defaults: z.boolean(),
});

const NodeSchema = z
  .object({
    id: z.string(),
    name: z.string(),
    address: z.string(),
    state: z.enum(NODE_STATES),
    /** What placement believes: the node's report, held to its caps. */
    capacity: NodeCapacity,
    /** The most the node is believed to have, whatever it reports. */
    caps: Caps,
    /** What the node last reported when it claimed more than its caps; null when its report is within them. */
    claimed: NodeCapacity.nullable(),
    pid: z.number().int().nullable(),
    joinedAt: z.string(),
    lastHeartbeatAt: z.string(),
    lostAt: z.string().nullable(),
    unreachable: z
      .object({ since: z.string(), reason: z.string() })
      .nullable()
      .openapi({
        description:
          "Since when calls to the node go unanswered (it missed a call's deadline) and what it missed; null while it answers. An unreachable node takes no new work and is probed until it answers; after the lost threshold it is declared lost, heartbeats or not.",
      }),
    /** Ids of the disks whose copy of record is on the node. */
    disks: z.array(z.string()),
    quarantined: z.array(QuarantinedDisk),
  })
  .openapi("Node");

function nodeView(config: Config, node: FleetNode, held: string[] = []): z.infer<typeof NodeSchema> {
  const { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes, memoryFreeMb } = node;
  return {
    id: node.id,
    name: node.name,
    address: node.address,
    state: node.state,
    capacity: { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes, memoryFreeMb },
    caps: { ...capsOf(node, config), defaults: node.maxCores === null && node.maxMemoryMb === null && node.maxDiskBytes === null },
    claimed: node.claimed,
    pid: node.pid,
    joinedAt: iso(node.joinedAt),
    lastHeartbeatAt: iso(node.lastHeartbeatAt),
    lostAt: isoOrNull(node.lostAt),
    unreachable: node.unreachableSince === null ? null : { since: iso(node.unreachableSince), reason: node.unreachableReason ?? "missed a deadline" },
    disks: held,
    quarantined: node.quarantined,
  };
}

/** Caps an operator sets on a join token or a node; null (on a node) goes back to the fleet's default. */
const CapsBody = z.strictObject({
  maxCores: z.int().min(1).max(4096).nullable().optional(),
  maxMemoryMb: z.int().min(64).max(16 * 1024 * 1024).nullable().optional(),
  maxDiskGb: z.int().min(1).max(1024 * 1024).nullable().optional(),
});

const capColumns = (caps: z.infer<typeof CapsBody>) => ({
  ...(caps.maxCores !== undefined ? { maxCores: caps.maxCores } : {}),
  ...(caps.maxMemoryMb !== undefined ? { maxMemoryMb: caps.maxMemoryMb } : {}),
  ...(caps.maxDiskGb !== undefined ? { maxDiskBytes: caps.maxDiskGb === null ? null : caps.maxDiskGb * GIB } : {}),
});

const MintToken = CapsBody.extend({
  /** How many nodes it may admit (each join spends one). */
  uses: z.int().min(1).max(100).default(1),
  ttlSeconds: z.int().min(60).max(7 * 24 * 3600).default(3600),
  note: z.string().trim().max(200).optional(),
}).openapi("MintJoinToken", { example: { uses: 1, ttlSeconds: 3600, maxDiskGb: 500, note: "node-4 in fra1" } });

const JoinTokenSchema = z
  .object({
    id: z.string(),
    usesLeft: z.int(),
    maxCores: z.int().nullable(),
    maxMemoryMb: z.int().nullable(),
    maxDiskGb: z.number().nullable(),
    note: z.string().nullable(),
    createdAt: z.string(),
    expiresAt: z.string(),
    lastUsedAt: z.string().nullable(),
  })
  .openapi("JoinToken");

type JoinTokenRow = typeof nodeJoinTokens.$inferSelect;

const tokenView = (row: JoinTokenRow): z.infer<typeof JoinTokenSchema> => ({
  id: row.id,
  usesLeft: row.usesLeft,
  maxCores: row.maxCores,
  maxMemoryMb: row.maxMemoryMb,
  maxDiskGb: row.maxDiskBytes === null ? null : row.maxDiskBytes / GIB,
  note: row.note,
  createdAt: iso(row.createdAt),
  expiresAt: iso(row.expiresAt),
  lastUsedAt: isoOrNull(row.lastUsedAt),
});

const NodeParam = z.object({ node: z.string().min(1).max(64).openapi({ param: { name: "node", in: "path" }, example: "node_4f2…" }) });
const operatorErrors = { 401: errorResponse("Missing or wrong operator token (UNAUTHORIZED)"), 404: errorResponse("No such node (NODE_NOT_FOUND)") };

export const nodeRoutes = newRouter();

nodeRoutes.openapi(
  createRoute({
    method: "post",
    path: "/join",
    summary: "A new builder node joins the fleet (a join token, never an API key)",
    tags: ["Fleet"],
    security: [{ joinToken: [] }],
    request: { body: jsonBody(NodeJoin) },
    responses: {
      200: { description: "Joined: the new node's id and signing key", content: { "application/json": { schema: NodeJoined } } },
      400: errorResponse("Invalid request"),
      401: errorResponse("Missing, unknown, used up or expired join token"),
      403: errorResponse("The join names an existing node: a node joins again by signing with its own key (FORBIDDEN)"),
      409: errorResponse("Another node has that name (NAME_TAKEN)"),
    },
  }),
  async (c) => {
    const config = c.get("config");
    if (!config.BUILDER_SECRET) throw new ApiError("INTERNAL", "BUILDER_SECRET is unset: node keys cannot be derived");
    const presented = /^Bearer\s+(\S+)$/i.exec(c.req.header("Authorization") ?? "")?.[1];
    if (!presented || !JOIN_TOKEN_PATTERN.test(presented)) throw new ApiError("UNAUTHORIZED", "joining requires a join token (`svc admin nodes token`)");
    const { nodeId } = unwrap(await fleetStub(c.env).join(await hashSecret(presented), c.req.valid("json")));
    forgetFleet();
    return c.json(
      {
        nodeId,
        key: await nodeKey(config.BUILDER_SECRET, nodeId),
        heartbeatSeconds: config.NODE_HEARTBEAT_SECONDS,
        appsDomain: config.APPS_DOMAIN,
        leaseSeconds: config.NODE_LEASE_SECONDS,
      },
      200,
    );
  },
);

export const operatorNodeRoutes = newRouter();
operatorNodeRoutes.use("*", requireOperator);

operatorNodeRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List the fleet's nodes (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    responses: {
      200: { description: "Nodes", content: { "application/json": { schema: z.object({ data: z.array(NodeSchema) }) } } },
      401: operatorErrors[401],
    },
  }),
  async (c) => {
    const placed = await c.get("db").select({ id: disks.id, nodeId: disks.nodeId }).from(disks).where(isNotNull(disks.nodeId));
    const held = (id: string) => placed.filter((disk) => disk.nodeId === id).map((disk) => disk.id);
    return c.json({ data: (await fleetStub(c.env).view()).map((node) => nodeView(c.get("config"), node, held(node.id))) }, 200);
  },
);

for (const command of ["cordon", "uncordon", "drain"] as const) {
  operatorNodeRoutes.openapi(
    createRoute({
      method: "post",
      path: `/{node}/${command}`,
      summary:
        command === "cordon"
          ? "Stop placing new work on a node (operator only)"
          : command === "uncordon"
            ? "Place work on a node again (operator only)"
            : "Stop placing work on a node, to empty it (operator only)",
      tags: ["Fleet"],
      security: [{ operatorToken: [] }],
      request: { params: NodeParam },
      responses: {
        200: { description: "The node", content: { "application/json": { schema: z.object({ data: NodeSchema }) } } },
        ...operatorErrors,
        409: errorResponse("The node is lost (NODE_LOST)"),
      },
    }),
    async (c) => {
      const node = unwrap(await fleetStub(c.env).command(c.req.valid("param").node, command));
      forgetFleet();
      return c.json({ data: nodeView(c.get("config"), node) }, 200);
    },
  );
}

operatorNodeRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{node}/lost",
    summary: "Declare a node lost now, as its heartbeat deadline would (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: NodeParam },
    responses: { 200: { description: "The node", content: { "application/json": { schema: z.object({ data: NodeSchema }) } } }, ...operatorErrors },
  }),
  async (c) => {
    const node = unwrap(await fleetStub(c.env).declareLost(c.req.valid("param").node, "declared lost by the operator"));
    forgetFleet();
    return c.json({ data: nodeView(c.get("config"), node) }, 200);
  },
);

operatorNodeRoutes.openapi(
  createRoute({
    method: "post",
    path: "/{node}/failover",
    summary: "Declare a node lost and restore its disks elsewhere from their newest backups now, without the grace period (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: NodeParam },
    responses: { 200: { description: "The node", content: { "application/json": { schema: z.object({ data: NodeSchema }) } } }, ...operatorErrors },
  }),
  async (c) => {
    const node = unwrap(await fleetStub(c.env).declareLost(c.req.valid("param").node, "declared lost by the operator", true));
    forgetFleet();
    return c.json({ data: nodeView(c.get("config"), node) }, 200);
  },
);

operatorNodeRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{node}",
    summary: "Remove an empty node from the fleet (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: NodeParam },
    responses: {
      200: { description: "Removed", content: { "application/json": { schema: z.object({ data: z.object({ id: z.string(), removed: z.literal(true) }) }) } } },
      ...operatorErrors,
      409: errorResponse("The node still holds disks, apps or jobs (NODE_NOT_EMPTY)"),
    },
  }),
  async (c) => {
    const id = c.req.valid("param").node;
    unwrap(await fleetStub(c.env).remove(id));
    forgetFleet();
    return c.json({ data: { id, removed: true as const } }, 200);
  },
);

operatorNodeRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{node}/quarantine/{name}",
    summary: "Delete a stale disk copy a node set aside (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: NodeParam.extend({ name: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/).openapi({ param: { name: "name", in: "path" } }) }) },
    responses: {
      200: { description: "Deleted", content: { "application/json": { schema: z.object({ data: z.object({ name: z.string(), removed: z.literal(true) }) }) } } },
      ...operatorErrors,
      502: errorResponse("The node could not be reached (BUILDER_UNAVAILABLE)"),
    },
  }),
  async (c) => {
    const { node: id, name } = c.req.valid("param");
    const node = await nodeRef(c.env, id);
    const removed = await removeQuarantined(c.get("config"), node, name);
    if (!removed.ok) throw new ApiError(removed.status === 404 ? "NOT_FOUND" : "BUILDER_UNAVAILABLE", removed.message);
    // The node lists what is left at its next heartbeat; ask it now so the listing is current.
    await listQuarantine(c.get("config"), node).catch(() => null);
    return c.json({ data: { name, removed: true as const } }, 200);
  },
);

operatorNodeRoutes.openapi(
  createRoute({
    method: "patch",
    path: "/{node}",
    summary: "Change what a node is believed to have at most (operator only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: NodeParam, body: jsonBody(CapsBody.openapi("NodeCaps", { example: { maxDiskGb: 500, maxMemoryMb: null } })) },
    responses: { 200: { description: "The node", content: { "application/json": { schema: z.object({ data: NodeSchema }) } } }, ...operatorErrors },
  }),
  async (c) => {
    const node = unwrap(await fleetStub(c.env).setCaps(c.req.valid("param").node, capColumns(c.req.valid("json"))));
    forgetFleet();
    return c.json({ data: nodeView(c.get("config"), node) }, 200);
  },
);

/** Join tokens live under /v1/operator/join-tokens (a path of their own: node ids and "join-tokens" never meet). */
export const joinTokenRoutes = newRouter();
joinTokenRoutes.use("*", requireOperator);

joinTokenRoutes.openapi(
  createRoute({
    method: "post",
    path: "/",
    summary: "Mint a join token that admits new nodes (operator only; shown once)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { body: jsonBody(MintToken) },
    responses: {
      201: {
        description: "The token (its value appears only here)",
        content: { "application/json": { schema: z.object({ data: JoinTokenSchema.extend({ token: z.string() }) }) } },
      },
      400: errorResponse("Invalid request"),
      401: operatorErrors[401],
    },
  }),
  async (c) => {
    const body = c.req.valid("json");
    const token = `${JOIN_TOKEN_PREFIX}${randomBase62(40)}`;
    const now = Date.now();
    const row: JoinTokenRow = {
      id: newId("joinToken"),
      hash: await hashSecret(token),
      usesLeft: body.uses,
      maxCores: body.maxCores ?? null,
      maxMemoryMb: body.maxMemoryMb ?? null,
      maxDiskBytes: body.maxDiskGb == null ? null : body.maxDiskGb * GIB,
      note: body.note ?? null,
      createdAt: now,
      expiresAt: now + body.ttlSeconds * 1000,
      lastUsedAt: null,
    };
    await c.get("db").insert(nodeJoinTokens).values(row);
    return c.json({ data: { ...tokenView(row), token } }, 201);
  },
);

joinTokenRoutes.openapi(
  createRoute({
    method: "get",
    path: "/",
    summary: "List the join tokens not yet used up or expired (operator only; never their values)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    responses: {
      200: { description: "Tokens", content: { "application/json": { schema: z.object({ data: z.array(JoinTokenSchema) }) } } },
      401: operatorErrors[401],
    },
  }),
  async (c) => {
    const now = Date.now();
    const rows = await c.get("db").select().from(nodeJoinTokens).orderBy(desc(nodeJoinTokens.createdAt));
    return c.json({ data: rows.filter((row) => row.usesLeft > 0 && row.expiresAt > now).map(tokenView) }, 200);
  },
);

joinTokenRoutes.openapi(
  createRoute({
    method: "delete",
    path: "/{id}",
    summary: "Revoke a join token (operator only); nodes it admitted stay members",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    request: { params: z.object({ id: z.string().max(64).openapi({ param: { name: "id", in: "path" } }) }) },
    responses: {
      200: { description: "Revoked", content: { "application/json": { schema: z.object({ data: z.object({ id: z.string(), revoked: z.literal(true) }) }) } } },
      401: operatorErrors[401],
      404: errorResponse("No such token (NOT_FOUND)"),
    },
  }),
  async (c) => {
    const { id } = c.req.valid("param");
    const removed = await c.get("db").delete(nodeJoinTokens).where(eq(nodeJoinTokens.id, id)).returning({ id: nodeJoinTokens.id });
    if (removed.length === 0) throw new ApiError("NOT_FOUND", `no join token ${id}`);
    return c.json({ data: { id, revoked: true as const } }, 200);
  },
);
