import { createRoute, z } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import { NodeCapacity, NodeJoin, NodeJoined, QuarantinedDisk } from "../../builder/src/protocol";
import type { FleetNode, FleetResult } from "../../durable-objects/fleet";
import type { AppEnv } from "../context";
import { isNotNull } from "drizzle-orm";
import { disks, NODE_STATES } from "../db/schema";
import { listQuarantine, nodeKey, removeQuarantined } from "../lib/builder-client";
import { ApiError } from "../lib/errors";
import { errorResponse, jsonBody, newRouter } from "../lib/router";
import { iso, isoOrNull } from "../lib/time";
import { fleetStub, forgetFleet, nodeRef } from "../services/fleet";
import { requireOperator, sameSecret } from "./accounts";

/**
 * The fleet's doors (DESIGN §10): `POST /v1/nodes/join` for builder nodes
 * holding the join token, and `/v1/operator/nodes…` for the operator token.
 * Neither takes an API key: no account may see or change the fleet.
 */

const requireJoinToken: MiddlewareHandler<AppEnv> = async (c, next) => {
  const token = c.get("config").NODE_JOIN_TOKEN;
  const presented = /^Bearer\s+(\S+)$/i.exec(c.req.header("Authorization") ?? "")?.[1];
  if (!token || !presented || !(await sameSecret(presented, token))) throw new ApiError("UNAUTHORIZED", "joining requires the node join token");
  await next();
};

function unwrap<T>(result: FleetResult<T>): T {
  if (!result.ok) throw new ApiError(result.code, result.message);
  return result.value;
}

const NodeSchema = z
  .object({
    id: z.string(),
    name: z.string(),
    address: z.string(),
    state: z.enum(NODE_STATES),
    capacity: NodeCapacity,
    pid: z.number().int().nullable(),
    joinedAt: z.string(),
    lastHeartbeatAt: z.string(),
    lostAt: z.string().nullable(),
    /** Ids of the disks whose copy of record is on the node. */
    disks: z.array(z.string()),
    quarantined: z.array(QuarantinedDisk),
  })
  .openapi("Node");

function nodeView(node: FleetNode, held: string[] = []): z.infer<typeof NodeSchema> {
  const { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes } = node;
  return {
    id: node.id,
    name: node.name,
    address: node.address,
    state: node.state,
    capacity: { cores, memoryMb, diskTotalBytes, diskFreeBytes, runningJobs, processes },
    pid: node.pid,
    joinedAt: iso(node.joinedAt),
    lastHeartbeatAt: iso(node.lastHeartbeatAt),
    lostAt: isoOrNull(node.lostAt),
    disks: held,
    quarantined: node.quarantined,
  };
}

const NodeParam = z.object({ node: z.string().min(1).max(64).openapi({ param: { name: "node", in: "path" }, example: "node_4f2…" }) });
const operatorErrors = { 401: errorResponse("Missing or wrong operator token (UNAUTHORIZED)"), 404: errorResponse("No such node (NODE_NOT_FOUND)") };

export const nodeRoutes = newRouter();

nodeRoutes.openapi(
  createRoute({
    method: "post",
    path: "/join",
    summary: "A builder node joins the fleet (join token only)",
    tags: ["Fleet"],
    security: [{ operatorToken: [] }],
    middleware: [requireJoinToken] as const,
    request: { body: jsonBody(NodeJoin) },
    responses: {
      200: { description: "Joined: the node's id and signing key", content: { "application/json": { schema: NodeJoined } } },
      400: errorResponse("Invalid request"),
      401: errorResponse("Missing or wrong join token"),
      409: errorResponse("Another node has that name (NAME_TAKEN)"),
    },
  }),
  async (c) => {
    const config = c.get("config");
    if (!config.BUILDER_SECRET) throw new ApiError("INTERNAL", "BUILDER_SECRET is unset: node keys cannot be derived");
    const { nodeId } = unwrap(await fleetStub(c.env).join(c.req.valid("json")));
    forgetFleet();
    return c.json({ nodeId, key: await nodeKey(config.BUILDER_SECRET, nodeId), heartbeatSeconds: config.NODE_HEARTBEAT_SECONDS }, 200);
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
    return c.json({ data: (await fleetStub(c.env).view()).map((node) => nodeView(node, held(node.id))) }, 200);
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
      return c.json({ data: nodeView(node) }, 200);
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
    return c.json({ data: nodeView(node) }, 200);
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
    return c.json({ data: nodeView(node) }, 200);
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
