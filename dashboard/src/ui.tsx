import type { ComponentChildren } from "preact";
import { useCallback, useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { type ApiError, asApiError } from "./api";
import { ago, dateTime, formatBytes } from "./format";

/** What the pages share: loading, polling, actions with their errors, and the small pieces every table uses. */

type Loaded<T> = { data: T | undefined; error: ApiError | null; reload: () => Promise<void> };

/** Loads data when `deps` change; `reload()` loads again (after an action, or on a poll). */
export function useLoad<T>(load: () => Promise<T>, deps: readonly unknown[]): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<ApiError | null>(null);
  const latest = useRef(load);
  latest.current = load;
  const reload = useCallback(async () => {
    try {
      setData(await latest.current());
      setError(null);
    } catch (err) {
      setError(asApiError(err));
    }
  }, []);
  // Loads again whenever one of the caller's dependencies changes.
  useEffect(() => {
    setData(undefined);
    void reload();
  }, deps);
  return { data, error, reload };
}

/** Calls `tick` every `ms` while `active` (a run is running, a backup is being made, a log is tailed). */
export function usePoll(tick: () => unknown, ms: number, active: boolean): void {
  const latest = useRef(tick);
  latest.current = tick;
  useEffect(() => {
    if (!active) return;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout>;
    const loop = async () => {
      await latest.current();
      if (!stopped) timer = setTimeout(loop, ms);
    };
    timer = setTimeout(loop, ms);
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [ms, active]);
}

/** An action's state: running, and the error it ended with (shown next to what started it). */
export function useAction(): { busy: boolean; error: ApiError | null; run: (action: () => Promise<unknown>) => Promise<void> } {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const run = useCallback(async (action: () => Promise<unknown>) => {
    setBusy(true);
    setError(null);
    try {
      await action();
    } catch (err) {
      setError(asApiError(err));
    } finally {
      setBusy(false);
    }
  }, []);
  return { busy, error, run };
}

/** An API error with its code and message (and each invalid field), announced to screen readers. */
export function ErrorNote({ error, children }: { error: ApiError | null; children?: ComponentChildren }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <code>{error.code}</code> {error.message}
      {error.details.length > 0 && (
        <ul>
          {error.details.map((d) => (
            <li key={d.field}>
              <code>{d.field}</code>: {d.message}
            </li>
          ))}
        </ul>
      )}
      {children}
    </div>
  );
}

type ActionProps = {
  label: string;
  run: () => Promise<unknown>;
  /** Ask first, with this question (deletes, rollbacks, restores). */
  confirm?: string;
  danger?: boolean;
  disabled?: boolean;
  title?: string;
};

/** A button that runs one API action, asks first when it must, and shows the error beside itself. */
export function Action({ label, run, confirm, danger, disabled, title }: ActionProps) {
  const { busy, error, run: start } = useAction();
  const [asking, setAsking] = useState(false);
  const yes = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    if (asking) yes.current?.focus();
  }, [asking]);
  const go = async () => {
    setAsking(false);
    await start(run);
  };
  return (
    <span class="action">
      {asking ? (
        <span class="confirm">
          <span>{confirm}</span>
          <button type="button" ref={yes} class={danger ? "danger" : "primary"} onClick={go}>
            {label}
          </button>
          <button type="button" onClick={() => setAsking(false)}>
            Cancel
          </button>
        </span>
      ) : (
        <button
          type="button"
          class={danger ? "danger" : undefined}
          disabled={busy || disabled}
          title={title}
          onClick={() => (confirm ? setAsking(true) : go())}
        >
          {busy ? `${label}…` : label}
        </button>
      )}
      <ErrorNote error={error} />
    </span>
  );
}

/**
 * Names up to this long (and every id) stay whole on one line in a table.
 * Longer ones (a DNS label reaches 52 characters) may break at a hyphen, so
 * two of them in one row do not push the table past a laptop's screen.
 */
const WHOLE_NAME_CHARS = 32;

/** The class of a name in a table: kept on one line, or (when very long) allowed to break at its hyphens. */
export const nameClass = (name: string) => (name.length <= WHOLE_NAME_CHARS ? "name" : "name long");

/** A time as "3 minutes ago", the full time on hover. */
export function Time({ iso, empty = "-" }: { iso: string | null | undefined; empty?: string }) {
  if (!iso) return <span>{empty}</span>;
  return (
    <time dateTime={iso} title={dateTime(iso)}>
      {ago(iso)}
    </time>
  );
}

export function Bytes({ value }: { value: number | null | undefined }) {
  return <span title={value === null || value === undefined ? undefined : `${value} bytes`}>{formatBytes(value)}</span>;
}

/** A status word, coloured by what it means. */
export function Badge({ status }: { status: string }) {
  return <span class={`badge badge-${status}`}>{status}</span>;
}

/** A log that keeps the newest line in view while it grows, unless the reader scrolled up. */
export function LogView({ text, label, empty = "(no output yet)" }: { text: string; label: string; empty?: string }) {
  const ref = useRef<HTMLPreElement>(null);
  const pinned = useRef(true);
  useLayoutEffect(() => {
    const el = ref.current;
    if (el && pinned.current) el.scrollTop = el.scrollHeight;
  }, [text]);
  const onScroll = () => {
    const el = ref.current;
    if (el) pinned.current = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
  };
  return (
    <pre class="log" role="log" ref={ref} onScroll={onScroll} aria-label={label}>
      {text === "" ? empty : text}
    </pre>
  );
}

/** An upload or pack in progress: a native progress bar and the numbers. */
export function ProgressBar({ label, value, max }: { label: string; value: number; max: number }) {
  const percent = max > 0 ? Math.min(100, Math.floor((value / max) * 100)) : 0;
  return (
    <div class="progress">
      <label>
        {label} {percent}% ({formatBytes(value)} of {formatBytes(max)})
        <progress value={value} max={max} />
      </label>
    </div>
  );
}

/**
 * A table of rows. On a narrow screen each row becomes a card (styles.css; a
 * cell's `data-label` names it there); wider, a table whose rows cannot fit
 * (very long names) scrolls inside its own box instead of widening the page.
 */
export function Table({ children, class: className, live }: { children: ComponentChildren; class?: string; live?: boolean }) {
  return (
    <div class="table-box">
      <table class={className} aria-live={live ? "polite" : undefined}>
        {children}
      </table>
    </div>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="empty">{children}</p>;
}

/** Something loading, or its error (with `children` after it: where to go instead). */
export function Pending({ error, children }: { error: ApiError | null; children?: ComponentChildren }) {
  return error ? <ErrorNote error={error}>{children}</ErrorNote> : <p class="muted">Loading…</p>;
}
