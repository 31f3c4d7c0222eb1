// API tokens: the CLI's and scripts' credentials. Made here (the secret shown once, with a
// copy button), listed with their last use, revoked at once.
import { useEffect, useState } from "preact/hooks";
import { ApiError, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Page } from "../components/Page";
import { RevokeButton } from "../components/Revoke";
import { SecretOnce } from "../components/SecretOnce";
import { Empty, Failed, Loading } from "../components/States";
import { age, when } from "../lib/format";
import { now } from "../state/clock";

type Token = Schemas["TokenOut"];

export function Tokens() {
  const [tokens, setTokens] = useState<Token[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [revokeError, setRevokeError] = useState<ApiError | null>(null);
  const [made, setMade] = useState<Schemas["TokenCreated"] | null>(null);

  const load = () => {
    setError(null);
    allPages((cursor) => ok(api.GET("/v1/tokens", { params: { query: { limit: 200, cursor } } })))
      .then(setTokens)
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
  };
  useEffect(load, []);

  return (
    <Page title="API tokens">
      <p class="lead">
        Tokens let the <code>einsora</code> command line and your scripts act as you, in this
        tenant. Each is shown once when made; only its hash is kept.
      </p>
      <MakeToken
        onMade={(token) => {
          setMade(token);
          load();
        }}
      />
      {made ? (
        <div class="card highlight">
          <SecretOnce label={`Token ${made.name}`} secret={made.token} />
          <p class="hint">
            Use it with <code>EINSORA_TOKEN=…</code> or <code>einsora login</code>.
          </p>
          <button type="button" class="button small" onClick={() => setMade(null)}>
            I have copied it
          </button>
        </div>
      ) : null}
      <ErrorNote error={revokeError} />
      <section class="card" aria-labelledby="tokens-heading">
        <h2 id="tokens-heading">Your tokens</h2>
        {error ? (
          <Failed what="tokens" error={error} retry={load} />
        ) : tokens === null ? (
          <Loading what="tokens" />
        ) : tokens.length === 0 ? (
          <Empty title="No tokens">
            <p>Make one above for the CLI or a script.</p>
          </Empty>
        ) : (
          <div class="table-wrap">
            <table class="table responsive">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Made</th>
                  <th scope="col">Last used</th>
                  <th scope="col">Expires</th>
                  <th scope="col">
                    <span class="visually-hidden">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {tokens.map((t) => (
                  <tr key={t.id} data-token={t.id}>
                    <td data-label="Name">
                      <div>
                        <strong>{t.name}</strong>
                        {t.operator ? <span class="badge tone-busy"> operator</span> : null}
                        <div class="mono dim small">{t.id}</div>
                      </div>
                    </td>
                    <td data-label="Made">
                      <time dateTime={t.created_at}>{when(t.created_at)}</time>
                    </td>
                    <td data-label="Last used">
                      {t.last_used_at ? (
                        <time dateTime={t.last_used_at}>{age(t.last_used_at, now.value)} ago</time>
                      ) : (
                        <span class="dim">never</span>
                      )}
                    </td>
                    <td data-label="Expires">
                      {t.expires_at ? <time dateTime={t.expires_at}>{when(t.expires_at)}</time> : <span class="dim">never</span>}
                    </td>
                    <td data-label="">
                      <RevokeButton
                        what={`token ${t.name}`}
                        consequence="Anything that uses it is refused from its next request, on every api replica."
                        onRevoke={async () => {
                          setRevokeError(null);
                          try {
                            await ok(api.DELETE("/v1/tokens/{id}", { params: { path: { id: t.id } } }));
                            load();
                          } catch (failure) {
                            setRevokeError(failure instanceof ApiError ? failure : null);
                          }
                        }}
                      />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </Page>
  );
}

function MakeToken({ onMade }: { onMade: (made: Schemas["TokenCreated"]) => void }) {
  const [name, setName] = useState("");
  const [days, setDays] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const body: Schemas["TokenCreate"] = { name: name.trim() };
      if (days.trim()) body.expires_in_days = Number(days) || (days as unknown as number);
      onMade(await ok(api.POST("/v1/tokens", { body })));
      setName("");
      setDays("");
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };
  const f = (field: string) => error?.forField(field);
  return (
    <form class="card form" onSubmit={submit} noValidate aria-labelledby="make-token-heading">
      <h2 id="make-token-heading">Make a token</h2>
      <ErrorNote error={error && !f("name") && !f("expires_in_days") ? error : null} />
      <div class="row">
        <Field id="token-name" label="Name" hint="What uses it: “laptop”, “ci”." error={f("name")}>
          <input {...described("token-name", f("name"), true)} value={name} onInput={(e) => setName(e.currentTarget.value)} />
        </Field>
        <Field id="token-days" label="Expires after (days)" hint="Empty: 90 days, the most for a token made here." error={f("expires_in_days")}>
          <input
            {...described("token-days", f("expires_in_days"), true)}
            type="number"
            min={1}
            inputMode="numeric"
            value={days}
            onInput={(e) => setDays(e.currentTarget.value)}
          />
        </Field>
      </div>
      <div class="actions">
        <button type="submit" class="button primary" disabled={busy}>
          {busy ? "Making…" : "Make token"}
        </button>
      </div>
    </form>
  );
}
