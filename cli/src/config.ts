import { chmod, mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, isAbsolute, join } from "node:path";
import { CliError } from "./output.js";

/** Where `npm start` serves the API, so a fresh checkout needs no configuration. */
export const DEFAULT_API_URL = "http://127.0.0.1:8787";

/** What `svc login` saves. */
export type SavedConfig = { apiUrl: string; apiKey: string };

/** The settings a command runs with, and where each came from (for hints). */
export type ResolvedConfig = {
  apiUrl: string;
  apiUrlSource: "env" | "file" | "default";
  apiKey: string | undefined;
  apiKeySource: "env" | "file" | undefined;
  /** The config file, whether or not it exists. */
  file: string;
};

/** `$XDG_CONFIG_HOME/svc/config.json`, else `~/.config/svc/config.json` (relative XDG paths are ignored, per the XDG spec). */
export function configFile(env: NodeJS.ProcessEnv): string {
  const xdg = env.XDG_CONFIG_HOME;
  const base = xdg && isAbsolute(xdg) ? xdg : join(env.HOME || homedir(), ".config");
  return join(base, "svc", "config.json");
}

/**
 * Checks that a URL is an http(s) origin (with optional path prefix) and drops
 * trailing slashes, so routes can be appended as `${apiUrl}/v1/...`.
 * Returns undefined when it is not usable.
 */
export function normalizeApiUrl(raw: string): string | undefined {
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    return undefined;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return undefined;
  if (url.search || url.hash || url.username || url.password) return undefined;
  return `${url.origin}${url.pathname}`.replace(/\/+$/, "");
}

/** Reads the saved login; undefined when there is none. A damaged file is an error that says how to recover. */
export async function readSaved(file: string): Promise<SavedConfig | undefined> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new CliError(`could not read ${file}`, [err instanceof Error ? err.message : String(err)], "check the file's permissions");
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (!isSavedConfig(parsed)) {
    throw new CliError(
      `could not read ${file}`,
      ['expected JSON {"apiUrl": "...", "apiKey": "..."}'],
      "run `svc logout` and `svc login` again",
    );
  }
  return { apiUrl: parsed.apiUrl, apiKey: parsed.apiKey };
}

function isSavedConfig(value: unknown): value is SavedConfig {
  return (
    typeof value === "object" &&
    value !== null &&
    "apiUrl" in value &&
    "apiKey" in value &&
    typeof value.apiUrl === "string" &&
    typeof value.apiKey === "string"
  );
}

/** The saved login with SVC_API_URL / SVC_API_KEY laid over it, the way CI sets credentials without a file. */
export async function resolveConfig(env: NodeJS.ProcessEnv): Promise<ResolvedConfig> {
  const file = configFile(env);
  const saved = await readSaved(file);
  let apiUrl = saved?.apiUrl ?? DEFAULT_API_URL;
  let apiUrlSource: ResolvedConfig["apiUrlSource"] = saved ? "file" : "default";
  if (env.SVC_API_URL) {
    const normalized = normalizeApiUrl(env.SVC_API_URL);
    if (!normalized) {
      throw new CliError("SVC_API_URL is not a usable API address", [`got "${env.SVC_API_URL}"`], "set it to an http(s) URL such as http://127.0.0.1:8787");
    }
    apiUrl = normalized;
    apiUrlSource = "env";
  }
  if (env.SVC_API_KEY) return { apiUrl, apiUrlSource, apiKey: env.SVC_API_KEY.trim(), apiKeySource: "env", file };
  return { apiUrl, apiUrlSource, apiKey: saved?.apiKey, apiKeySource: saved ? "file" : undefined, file };
}

/**
 * Writes the login where only the user can read it: directory 0700, file 0600,
 * written to a temporary file first so a crash never leaves half a config.
 */
export async function saveConfig(file: string, config: SavedConfig): Promise<void> {
  const dir = dirname(file);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const temp = `${file}.${process.pid}.tmp`;
  await writeFile(temp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  await chmod(temp, 0o600);
  await rename(temp, file);
}

/** Deletes the saved login; false when there was none. */
export async function removeConfig(file: string): Promise<boolean> {
  try {
    await rm(file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw err;
  }
}
