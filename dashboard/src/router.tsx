import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";

/**
 * Client-side routes on real paths (the Worker answers every dashboard path
 * with index.html): `history.pushState` to move, `popstate` for back/forward.
 */

const NAVIGATED = "svc:navigate";

export function navigate(to: string): void {
  if (to === location.pathname + location.search) return;
  history.pushState(null, "", to);
  dispatchEvent(new Event(NAVIGATED));
}

/** The current path, re-rendering on every navigation. */
export function usePath(): string {
  const [path, setPath] = useState(location.pathname);
  useEffect(() => {
    const update = () => setPath(location.pathname);
    addEventListener("popstate", update);
    addEventListener(NAVIGATED, update);
    return () => {
      removeEventListener("popstate", update);
      removeEventListener(NAVIGATED, update);
    };
  }, []);
  return path;
}

/** Matches `/apps/:name` style patterns; parameters are URI-decoded. */
export function match(pattern: string, path: string): Record<string, string> | null {
  const want = pattern.split("/");
  const have = path.replace(/\/+$/, "").split("/");
  if (want.length !== have.length) return null;
  const params: Record<string, string> = {};
  for (const [i, part] of want.entries()) {
    const actual = have[i]!;
    if (part.startsWith(":")) {
      if (actual === "") return null;
      params[part.slice(1)] = decodeURIComponent(actual);
    } else if (part !== actual) {
      return null;
    }
  }
  return params;
}

type LinkProps = { href: string; children: ComponentChildren; class?: string; "aria-current"?: "page" | undefined };

/** An ordinary link (middle-click, copy address work) that moves inside the page on a plain click. */
export function Link({ href, children, ...attributes }: LinkProps) {
  const onClick = (event: MouseEvent) => {
    if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    navigate(href);
  };
  return (
    <a href={href} onClick={onClick} {...attributes}>
      {children}
    </a>
  );
}
