import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { newId } from "../../worker/lib/ids";
import { sweep } from "../../worker/services/retention";
import { call, json, newAccount } from "./helpers";

describe("scheduled() retention sweep", () => {
  it("deletes backups past retention and abandoned uploads, keeps the rest", async () => {
    const { accountId, adminKey: key } = await newAccount();
    const disk = (await json<{ data: { id: string } }>(await call("/v1/disks", { method: "POST", key, body: { name: "ret", sizeGb: 1 } }))).data;
    const now = Date.now();
    const rows = [
      { id: newId("backup"), expiresAt: now - 1000 },
      { id: newId("backup"), expiresAt: now + 86_400_000 },
    ];
    for (const row of rows) {
      const objectKey = `backups/${disk.id}/${row.id}.tar.gz`;
      await env.BUCKET.put(objectKey, "x");
      await env.DB.prepare(
        "INSERT INTO backups (id, account_id, disk_id, status, size_bytes, object_key, created_at, completed_at, expires_at) VALUES (?, ?, ?, 'ready', 1, ?, ?, ?, ?)",
      )
        .bind(row.id, accountId, disk.id, objectKey, now - 10 * 86_400_000, now - 10 * 86_400_000, row.expiresAt)
        .run();
    }
    const abandoned = newId("upload");
    const fresh = newId("upload");
    for (const [id, expiresAt] of [
      [abandoned, now - 1000],
      [fresh, now + 3_600_000],
    ] as const) {
      const objectKey = `restore-uploads/${disk.id}/${id}.tar.gz`;
      await env.BUCKET.put(objectKey, "partial");
      await env.DB.prepare(
        "INSERT INTO restore_uploads (id, account_id, disk_id, size_bytes, object_key, expires_at, created_at) VALUES (?, ?, ?, 10, ?, ?, ?)",
      )
        .bind(id, accountId, disk.id, objectKey, expiresAt, now - 3_600_000)
        .run();
    }
    const result = await sweep(env, now);
    expect(result.backups).toBeGreaterThanOrEqual(1);
    const left = await env.DB.prepare("SELECT id FROM backups WHERE disk_id = ?").bind(disk.id).all<{ id: string }>();
    expect(left.results.map((r) => r.id)).toEqual([rows[1]!.id]);
    expect(await env.BUCKET.head(`backups/${disk.id}/${rows[0]!.id}.tar.gz`)).toBeNull();
    const uploads = await env.DB.prepare("SELECT id FROM restore_uploads WHERE disk_id = ?").bind(disk.id).all<{ id: string }>();
    expect(uploads.results.map((r) => r.id)).toEqual([fresh]);
    expect(await env.BUCKET.head(`restore-uploads/${disk.id}/${abandoned}.tar.gz`)).toBeNull();
  });
});

describe("the request log's retention", () => {
  it("deletes entries by age through the index on `at`, not by reading the whole table", async () => {
    const plan = await env.DB.prepare("EXPLAIN QUERY PLAN DELETE FROM request_logs WHERE at < ?").bind(Date.now()).all<{ detail: string }>();
    expect(plan.results.map((row) => row.detail).join("\n")).toMatch(/USING (COVERING )?INDEX request_logs_at_idx/);
  });
});
