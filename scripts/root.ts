import { fileURLToPath } from "node:url";

/** The repository's root directory, whoever imports this. */
export const ROOT = fileURLToPath(new URL("..", import.meta.url)).replace(/\/$/, "");
