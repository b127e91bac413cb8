/**
 * The signed-in API key, kept for this tab only: sessionStorage survives a
 * reload but not the tab, and is never shared with other tabs or written to
 * disk for later (never localStorage, never a URL or cookie). Signing out, or
 * the API refusing the key, forgets it.
 */

const STORAGE_KEY = "svc.apiKey";

/** Why the tab is signed out: nothing yet, the user's choice, or the API's answer (code and message). */
export type SignedOutReason = { code: string; message: string } | null;

type State = { key: string | null; reason: SignedOutReason };

let state: State = { key: sessionStorage.getItem(STORAGE_KEY), reason: null };
const listeners = new Set<() => void>();

function set(next: State): void {
  state = next;
  if (next.key === null) sessionStorage.removeItem(STORAGE_KEY);
  else sessionStorage.setItem(STORAGE_KEY, next.key);
  for (const listener of listeners) listener();
}

export const session = {
  get: (): State => state,
  key: (): string | null => state.key,
  signIn(key: string): void {
    set({ key, reason: null });
  },
  signOut(): void {
    set({ key: null, reason: null });
  },
  /** The API answered 401 to the key in use: back to sign-in, saying why. */
  expire(reason: { code: string; message: string }): void {
    if (state.key !== null) set({ key: null, reason });
  },
  subscribe(listener: () => void): () => void {
    listeners.add(listener);
    return () => listeners.delete(listener);
  },
};
