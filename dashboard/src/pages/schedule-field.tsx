import { useEffect, useState } from "preact/hooks";
import { type ApiError, api, asApiError, ok } from "../api";
import { ago, inZone } from "../format";

/** Every IANA zone the browser knows, for the time-zone field's suggestions. */
export const TIME_ZONES: readonly string[] = Intl.supportedValuesOf("timeZone");

/** How long typing pauses before the schedule is checked. */
const DEBOUNCE_MS = 250;

type Preview = { nextRuns: string[] } | { error: ApiError } | null;

/**
 * A cron schedule input that, as it is typed, shows the next five runs in the
 * job's time zone, or why the expression is invalid. The server checks it
 * (`GET /v1/crons/schedule-preview`), so the page and the API can never
 * disagree about the grammar.
 */
export function ScheduleField({ value, timezone, onInput, id }: { value: string; timezone: string; onInput: (value: string) => void; id: string }) {
  const [preview, setPreview] = useState<Preview>(null);
  useEffect(() => {
    if (value.trim() === "") {
      setPreview(null);
      return;
    }
    const abort = new AbortController();
    const timer = setTimeout(() => {
      ok(api.GET("/v1/crons/schedule-preview", { params: { query: { schedule: value, timezone: timezone || "UTC" } }, signal: abort.signal })).then(
        ({ data }) => setPreview({ nextRuns: data.nextRuns }),
        (err: unknown) => {
          if (!abort.signal.aborted) setPreview({ error: asApiError(err) });
        },
      );
    }, DEBOUNCE_MS);
    return () => {
      clearTimeout(timer);
      abort.abort();
    };
  }, [value, timezone]);

  const invalid = preview !== null && "error" in preview;
  return (
    <div class="schedule">
      <label for={id}>Schedule</label>
      <input
        id={id}
        name="schedule"
        value={value}
        onInput={(e) => onInput(e.currentTarget.value)}
        placeholder="0 3 * * *"
        spellcheck={false}
        autoComplete="off"
        required
        aria-invalid={invalid}
        aria-describedby={`${id}-help ${id}-preview`}
      />
      <p class="hint" id={`${id}-help`}>
        Five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12) day-of-week (0-7, 0 and 7 are Sunday), with <code>*</code>, lists{" "}
        <code>1,15</code>, ranges <code>1-5</code> and steps <code>*/15</code>.
      </p>
      <div id={`${id}-preview`} aria-live="polite" class="preview">
        {preview === null ? null : "error" in preview ? (
          <p class="error">
            <code>{preview.error.code}</code> {preview.error.message}
          </p>
        ) : (
          <>
            <p>Next runs ({timezone || "UTC"}):</p>
            <ol class="next-runs">
              {preview.nextRuns.map((run) => (
                <li key={run}>
                  <time dateTime={run}>{inZone(run, timezone || "UTC")}</time> <span class="muted">({ago(run)})</span>
                </li>
              ))}
            </ol>
          </>
        )}
      </div>
    </div>
  );
}
