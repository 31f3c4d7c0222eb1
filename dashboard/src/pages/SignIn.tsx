// Sign in: with a one-time link (its code rides in the URL's fragment, which never reaches a
// server, and leaves the address bar at once), or with a username and password.
import { useEffect, useState } from "preact/hooks";
import { ApiError, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Notice } from "../components/Notice";
import { Loading } from "../components/States";
import { navigate, query } from "../router";
import { session, signedIn } from "../state/session";
import { tell } from "../state/notice";

/** Where to go after signing in: a path of this app only (never another site). */
export function nextPath(raw: string | null): string {
  if (raw === null || !raw.startsWith("/") || raw.startsWith("//") || raw.startsWith("/\\")) {
    return "/workloads";
  }
  return raw;
}

export function SignIn() {
  const next = nextPath(query().get("next"));
  const [exchanging, setExchanging] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const [tenant, setTenant] = useState("");
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    document.title = "Sign in · Einsora";
    const hash = location.hash;
    if (!hash.startsWith("#link=")) return;
    const code = decodeURIComponent(hash.slice("#link=".length));
    // The code leaves the address bar (and the history) before anything else happens.
    history.replaceState(null, "", location.pathname + location.search);
    setExchanging(true);
    ok(api.POST("/v1/sessions/link", { body: { code } }))
      .then((found) => {
        signedIn(found);
        tell(`Signed in as ${found.user.username} in ${found.tenant.name}.`);
        navigate(next, { replace: true });
      })
      .catch((failure: unknown) => {
        setError(failure instanceof ApiError ? failure : null);
        setExchanging(false);
      });
  }, []);

  useEffect(() => {
    if (!exchanging && session.value && !location.hash) navigate(next, { replace: true });
  }, [session.value, exchanging]);

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const found = await ok(
        api.POST("/v1/sessions", {
          body: { username: username.trim(), password, tenant: tenant.trim() || null },
        }),
      );
      signedIn(found);
      navigate(next, { replace: true });
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };

  if (exchanging) {
    return (
      <main id="main" class="center">
        <Loading what="your sign-in link" />
      </main>
    );
  }
  const fieldError = (name: string) => error?.forField(name);
  return (
    <main id="main" class="center">
      <div class="card narrow">
        <h1>Sign in to Einsora</h1>
        <Notice />
        <ErrorNote error={error} />
        <form onSubmit={submit} noValidate>
          <Field id="username" label="Username" error={fieldError("username")}>
            <input
              {...described("username", fieldError("username"))}
              name="username"
              autoComplete="username"
              autoCapitalize="none"
              spellcheck={false}
              required
              value={username}
              onInput={(e) => setUsername(e.currentTarget.value)}
            />
          </Field>
          <Field id="password" label="Password" error={fieldError("password")}>
            <input
              {...described("password", fieldError("password"))}
              name="password"
              type="password"
              autoComplete="current-password"
              required
              value={password}
              onInput={(e) => setPassword(e.currentTarget.value)}
            />
          </Field>
          <details class="more">
            <summary>More options</summary>
            <Field
              id="tenant"
              label="Tenant"
              hint="Leave empty for the first tenant you joined."
              error={fieldError("tenant")}
            >
              <input
                {...described("tenant", fieldError("tenant"), true)}
                name="tenant"
                autoCapitalize="none"
                value={tenant}
                onInput={(e) => setTenant(e.currentTarget.value)}
              />
            </Field>
          </details>
          <button type="submit" class="button primary wide" disabled={busy}>
            {busy ? "Signing in…" : "Sign in"}
          </button>
        </form>
        <p class="hint">
          The owner signs in with a one-time link: Solo prints one when it first starts, and{" "}
          <code>einsora dashboard</code> prints a new one at any time.
        </p>
      </div>
    </main>
  );
}
