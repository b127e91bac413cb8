// The chaos run's app (scripts/chaos/load.ts): acknowledges a write only once it is
// on its disk (written and fsync'd), and reads back what its disk holds.
const { closeSync, existsSync, fsyncSync, openSync, readFileSync, writeSync } = require("node:fs");
const { createServer } = require("node:http");

const disk = process.env.SVC_DISK_PATH;
const ledger = `${disk}/ledger`;
const fd = openSync(ledger, "a");
const read = (file) => (existsSync(file) ? readFileSync(file) : "");

createServer((req, res) => {
  const url = new URL(req.url, "http://app");
  if (url.pathname === "/healthz") return res.end("ok\n");
  if (req.method === "POST" && url.pathname === "/write") {
    const seq = Number(url.searchParams.get("seq"));
    if (!Number.isSafeInteger(seq) || seq < 0) {
      res.writeHead(400);
      return res.end("seq must be a whole number\n");
    }
    writeSync(fd, `${seq}\n`);
    fsyncSync(fd);
    return res.end(`ok ${seq}\n`);
  }
  if (url.pathname === "/ledger") return res.end(read(ledger));
  if (url.pathname === "/cron-runs") return res.end(read(`${disk}/cron-runs`));
  res.writeHead(404);
  res.end();
}).listen(Number(process.env.PORT), () => console.log(`ledger on ${disk} listening on ${process.env.PORT}`));

process.on("SIGTERM", () => {
  closeSync(fd);
  process.exit(0);
});
