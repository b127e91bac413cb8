import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { placeholderProblems } from "../../scripts/deploy-check.js";
import { ROOT } from "../../scripts/local-stack.js";

describe("npm run deploy's configuration check", () => {
  it("refuses the shipped production environment: every placeholder and localhost address is named", async () => {
    const problems = placeholderProblems(await readFile(join(ROOT, "wrangler.toml"), "utf8"));
    expect(problems.map((p) => p.split(" = ")[0])).toEqual(["database_id", "PUBLIC_URL", "APPS_DOMAIN", "DOMAIN_CNAME_TARGET", "CF_ZONE_ID", "S3_ENDPOINT"]);
  });

  it("accepts a production environment with real addresses, and refuses a BUILDER_URL or a localhost left in it", () => {
    const real = `[vars]\nPUBLIC_URL = "http://127.0.0.1:8787"\n[env.production]\ndatabase_id = "6f1e3c1a-2b4d-4e5f-9a8b-7c6d5e4f3a2b"\nPUBLIC_URL = "https://api.svc.dev"\nAPPS_DOMAIN = "svc.app"\nS3_ENDPOINT = "https://0123abcd.r2.cloudflarestorage.com"\n`;
    expect(placeholderProblems(real)).toEqual([]);
    expect(placeholderProblems(`${real}BUILDER_URL = "https://node.svc.dev"\n`)).toEqual([expect.stringMatching(/BUILDER_URL is set/)]);
    expect(placeholderProblems(real.replace("https://api.svc.dev", "http://localhost:8787"))).toEqual([expect.stringMatching(/^PUBLIC_URL/)]);
    expect(placeholderProblems("[vars]\n")).toEqual(["wrangler.toml has no [env.production] section"]);
  });
});
