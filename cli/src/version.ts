import { readFileSync } from "node:fs";

/** The project's version from package.json, so `svc --version` and the User-Agent never drift from the release. */
export const VERSION: string = (() => {
  const pkg: unknown = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return typeof pkg === "object" && pkg !== null && "version" in pkg && typeof pkg.version === "string" ? pkg.version : "0.0.0";
})();
