// Your account: who you are here, your session, and your password (set one to sign in
// without a link; changing it ends your other sessions).
import { useState } from "preact/hooks";
import { ApiError, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Page } from "../components/Page";
import { when } from "../lib/format";
import { loadSession, session } from "../state/session";
import { MIN_PASSWORD } from "./Join";

export function Account() {
  const who = session.value;
  const [current, setCurrent] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [done, setDone] = useState(false);
  const [busy, setBusy] = useState(false);
  if (!who) return null;
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    setDone(false);
    try {
      await ok(
        api.PUT("/v1/me/password", {
          body: { password, current_password: who.has_password ? current : null },
        }),
      );
      setDone(true);
      setCurrent("");
      setPassword("");
      await loadSession();
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };
  const f = (field: string) => error?.forField(field);
  return (
    <Page title="Account">
      <section class="card" aria-labelledby="you-heading">
        <h2 id="you-heading">You</h2>
        <dl class="facts">
          <dt>Username</dt>
          <dd>{who.user.username}</dd>
          <dt>Tenant</dt>
          <dd>{who.tenant.name}</dd>
          <dt>Role</dt>
          <dd>
            {who.role}
            {who.operator ? " and operator" : ""}
          </dd>
          <dt>This session</dt>
          <dd>
            ends after {Math.round(who.idle_timeout_s / 3600)} hours unused, and at{" "}
            <time dateTime={who.expires_at}>{when(who.expires_at)}</time> at the latest
          </dd>
        </dl>
      </section>
      <form class="card form" onSubmit={submit} noValidate aria-labelledby="password-heading">
        <h2 id="password-heading">{who.has_password ? "Change your password" : "Set a password"}</h2>
        {who.has_password ? null : (
          <p class="hint">With a password you sign in without a link from the command line.</p>
        )}
        <ErrorNote error={error && !f("password") && !f("current_password") ? error : null} />
        <div role="status" aria-live="polite">
          {done ? <p class="success">Saved. Your other sessions have ended.</p> : null}
        </div>
        {who.has_password ? (
          <Field id="current-password" label="Current password" error={f("current_password")}>
            <input
              {...described("current-password", f("current_password"))}
              type="password"
              autoComplete="current-password"
              value={current}
              onInput={(e) => setCurrent(e.currentTarget.value)}
            />
          </Field>
        ) : null}
        <Field id="account-password" label="New password" hint={`At least ${MIN_PASSWORD} characters.`} error={f("password")}>
          <input
            {...described("account-password", f("password"), true)}
            type="password"
            autoComplete="new-password"
            value={password}
            onInput={(e) => setPassword(e.currentTarget.value)}
          />
        </Field>
        <div class="actions">
          <button type="submit" class="button primary" disabled={busy}>
            {busy ? "Saving…" : "Save password"}
          </button>
        </div>
      </form>
    </Page>
  );
}
