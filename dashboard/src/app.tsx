import type { JSX } from "preact";
import { useEffect, useState } from "preact/hooks";
import { api, ok, type Schemas } from "./api";
import { AppPage } from "./pages/app";
import { AppsPage } from "./pages/apps";
import { CronPage } from "./pages/cron";
import { CronsPage } from "./pages/crons";
import { DiskPage } from "./pages/disk";
import { DisksPage } from "./pages/disks";
import { KeysPage } from "./pages/keys";
import { WebhooksPage } from "./pages/webhooks";
import { SignIn } from "./pages/sign-in";
import { Link, match, navigate, usePath } from "./router";
import { session } from "./session";

/**
 * The signed-in key's own list entry (found by its display prefix), for its
 * name and scopes: undefined while it loads, null if the list does not show it.
 */
export type Me = Schemas["ApiKey"] | null | undefined;

const NAV = [
  ["/apps", "Apps"],
  ["/disks", "Disks"],
  ["/crons", "Cron jobs"],
  ["/webhooks", "Webhooks"],
  ["/keys", "API keys"],
] as const;

function useSession() {
  const [state, setState] = useState(session.get());
  useEffect(() => session.subscribe(() => setState(session.get())), []);
  return state;
}

/** Which key is signed in: the list entry whose `start` begins the secret. */
async function whoAmI(key: string): Promise<Me> {
  const keys = await ok(api.GET("/v1/api-keys"));
  return keys.find((k) => key.startsWith(k.start)) ?? null;
}

/** The page for a path: the first route whose pattern matches. */
function Page({ path, me }: { path: string; me: Me }) {
  const routes: [string, (p: Record<string, string>) => JSX.Element][] = [
    ["/apps", () => <AppsPage />],
    ["/apps/:name", (p) => <AppPage name={p.name!} tab="overview" />],
    ["/apps/:name/:tab", (p) => <AppPage name={p.name!} tab={p.tab!} />],
    ["/disks", () => <DisksPage />],
    ["/disks/:name", (p) => <DiskPage name={p.name!} />],
    ["/crons", () => <CronsPage />],
    ["/crons/:ref", (p) => <CronPage idOrName={p.ref!} />],
    ["/webhooks", () => <WebhooksPage />],
    ["/keys", () => <KeysPage me={me} />],
  ];
  for (const [pattern, page] of routes) {
    const params = match(pattern, path);
    if (params) return page(params);
  }
  return (
    <section>
      <h1>Not found</h1>
      <p>
        There is no page at <code>{path}</code>. <Link href="/apps">Go to your apps</Link>.
      </p>
    </section>
  );
}

export function App() {
  const { key, reason } = useSession();
  const path = usePath();
  const [me, setMe] = useState<Me>(undefined);

  useEffect(() => {
    if (path === "/" || path === "") navigate("/apps");
  }, [path]);
  useEffect(() => {
    setMe(undefined);
    if (key !== null) void whoAmI(key).then(setMe, () => setMe(null));
  }, [key]);

  if (key === null) return <SignIn reason={reason} />;
  const section = NAV.find(([href]) => path === href || path.startsWith(`${href}/`));
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top">
        <Link href="/apps" class="brand">
          svc
        </Link>
        <nav class="main-nav" aria-label="Main">
          {NAV.map(([href, label]) => (
            <Link key={href} href={href} aria-current={section?.[0] === href ? "page" : undefined}>
              {label}
            </Link>
          ))}
        </nav>
        <div class="who">
          {me ? (
            <span title={`Scopes: ${me.scopes.join(", ")}`}>
              Key <strong>{me.name}</strong> <code>{me.start}…</code> ({me.scopes.join(", ")})
            </span>
          ) : null}
          <button type="button" onClick={() => session.signOut()}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main">
        <Page path={path} me={me} />
      </main>
    </>
  );
}
