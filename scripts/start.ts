import { join } from "node:path";
import { ROOT, startLocalStack } from "./local-stack.js";

/**
 * `npm start`: the whole system on embedded defaults, no cloud account needed.
 * State persists in .wrangler/state (D1, R2, DOs) and .svc/ (admin key, builder
 * disks), so a restart keeps your data and your key.
 */
const port = Number(process.env.PORT ?? 8787);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error(`PORT must be a TCP port number, got ${process.env.PORT}`);
  process.exit(1);
}

// `npm start -- --nodes 3`: several builder nodes on this machine, to try placement and failover.
const nodesFlag = process.argv.indexOf("--nodes");
const nodes = nodesFlag === -1 ? 1 : Number(process.argv[nodesFlag + 1]);
if (!Number.isInteger(nodes) || nodes < 1 || nodes > 16) {
  console.error(`--nodes must be a number of builder nodes from 1 to 16, got ${process.argv[nodesFlag + 1]}`);
  process.exit(1);
}

console.log(`Starting the local platform (migrations, the Worker, ${nodes === 1 ? "a builder node" : `${nodes} builder nodes`})…`);
const stack = await startLocalStack({
  port,
  persistDir: join(ROOT, ".wrangler", "state"),
  stateDir: join(ROOT, ".svc"),
  secretsFile: join(ROOT, ".dev.vars"),
  output: "inherit",
  nodes,
}).catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});

console.log(`
Dashboard  ${stack.apiUrl}/  (sign in with the admin key)
API        ${stack.apiUrl}
Admin key  ${stack.adminKey}
${stack.nodes.map((node) => `Node       ${node.name} ${node.url} (pid ${node.pid()})`).join("\n")}

The key is also in .svc/local-admin-key. Try:
  npx svc login --local
  curl -H "Authorization: Bearer $(cat .svc/local-admin-key)" ${stack.apiUrl}/v1/api-keys
Cron triggers (wrangler.toml: retention sweep, cron watchdog) are fired on schedule by npm start.
The nodes: SVC_OPERATOR_TOKEN=<OPERATOR_TOKEN from .dev.vars> npx svc admin nodes
Press Ctrl-C to stop.`);

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    console.log("\nStopping…");
    void stack.stop().then(() => process.exit(0));
  });
}
