import type { Scope } from "./db/schema";
import type { Db } from "./db/client";
import type { Config, Env } from "./env";

/** Who is calling: resolved from the API key by the auth middleware. */
export type Principal = { keyId: string; keyName: string; accountId: string; scopes: Scope[] };

/** Hono's typed context for every route (STYLE 5). */
export type AppEnv = {
  Bindings: Env;
  Variables: {
    requestId: string;
    config: Config;
    db: Db;
    principal: Principal;
  };
};
