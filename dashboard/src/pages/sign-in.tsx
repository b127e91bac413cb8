import { useState } from "preact/hooks";
import { ApiError, api, ok } from "../api";
import { type SignedOutReason, session } from "../session";
import { ErrorNote, useAction } from "../ui";

/** Why the API refused a key that worked before, in words. */
function refusal(reason: NonNullable<SignedOutReason>) {
  return (
    <div class="notice" role="alert">
      <p>
        <strong>You were signed out: the API refused the key.</strong>
      </p>
      <p>
        <code>{reason.code}</code> {reason.message}
      </p>
      <p>A deleted key stops working at once and an expired one at its expiry time. Sign in with a valid key.</p>
    </div>
  );
}

/** Sign-in with an API key. The key is checked with `GET /v1/api-keys` (any valid key may list) before it is kept. */
export function SignIn({ reason }: { reason: SignedOutReason }) {
  const [key, setKey] = useState("");
  const { busy, error, run } = useAction();
  const submit = (event: Event) => {
    event.preventDefault();
    const secret = key.trim();
    void run(async () => {
      if (secret === "") throw new ApiError("MISSING_KEY", "enter an API key (svc_…)", 0);
      await ok(api.GET("/v1/api-keys", { headers: { Authorization: `Bearer ${secret}` } }));
      session.signIn(secret);
    });
  };
  return (
    <main id="main" class="sign-in">
      <h1>Sign in to svc</h1>
      {reason && refusal(reason)}
      <form onSubmit={submit}>
        <label>
          API key
          <input
            type="password"
            name="apiKey"
            autoComplete="off"
            spellcheck={false}
            placeholder="svc_…"
            value={key}
            onInput={(e) => setKey(e.currentTarget.value)}
            required
          />
        </label>
        <p class="hint">
          The key is kept for this browser tab only and forgotten when you sign out or close the tab. <code>npm start</code> prints a local admin key.
        </p>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        <ErrorNote error={error} />
      </form>
    </main>
  );
}
