// A new member's invitation link (`/join#code=inv_…`): they choose a password, and are signed
// in as the user the invitation names. The code leaves the address bar at once.
import { useEffect, useState } from "preact/hooks";
import { ApiError, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { navigate } from "../router";
import { signedIn } from "../state/session";
import { tell } from "../state/notice";

export const MIN_PASSWORD = 12;

export function Join() {
  const [code, setCode] = useState<string | null>(null);
  const [password, setPassword] = useState("");
  const [again, setAgain] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [mismatch, setMismatch] = useState<string | undefined>(undefined);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    document.title = "Join · Einsora";
    const hash = location.hash;
    if (hash.startsWith("#code=")) {
      setCode(decodeURIComponent(hash.slice("#code=".length)));
      history.replaceState(null, "", location.pathname);
    }
  }, []);

  const submit = async (event: Event) => {
    event.preventDefault();
    setError(null);
    if (password !== again) {
      setMismatch("The two passwords differ.");
      return;
    }
    setMismatch(undefined);
    if (code === null) return;
    setBusy(true);
    try {
      const found = await ok(api.POST("/v1/sessions/invitation", { body: { code, password } }));
      signedIn(found);
      tell(
        `Welcome, ${found.user.username}: you are a member of ${found.tenant.name}. Next time, ` +
          `sign in as ${found.user.username} with this password.`,
      );
      navigate("/workloads", { replace: true });
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };

  const passwordError = error?.forField("password");
  return (
    <main id="main" class="center">
      <div class="card narrow">
        <h1>Join Einsora</h1>
        {code === null ? (
          <p>
            This page opens from the invitation link an admin of your tenant gave you; the link
            ends with <code>#code=inv_…</code>. Ask them for a new one if it is lost.
          </p>
        ) : (
          <>
            <p>Choose the password you will sign in with.</p>
            <ErrorNote error={passwordError ? null : error} />
            <form onSubmit={submit} noValidate>
              <Field
                id="new-password"
                label="Password"
                hint={`At least ${MIN_PASSWORD} characters; a few words make a good one.`}
                error={passwordError}
              >
                <input
                  {...described("new-password", passwordError, true)}
                  type="password"
                  autoComplete="new-password"
                  minLength={MIN_PASSWORD}
                  required
                  value={password}
                  onInput={(e) => setPassword(e.currentTarget.value)}
                />
              </Field>
              <Field id="password-again" label="The same password again" error={mismatch}>
                <input
                  {...described("password-again", mismatch)}
                  type="password"
                  autoComplete="new-password"
                  required
                  value={again}
                  onInput={(e) => setAgain(e.currentTarget.value)}
                />
              </Field>
              <button type="submit" class="button primary wide" disabled={busy}>
                {busy ? "Joining…" : "Join"}
              </button>
            </form>
          </>
        )}
      </div>
    </main>
  );
}
