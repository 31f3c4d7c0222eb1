// API tokens: the CLI's and scripts' credentials. Made here (the secret shown once, with a
// copy button), listed with their last use, revoked at once.
import { useState } from "preact/hooks";
import { ApiError, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { LastUsed } from "../components/LastUsed";
import { Named, SecretList } from "../components/SecretList";
import { when } from "../lib/format";

type Token = Schemas["TokenOut"];

export function Tokens() {
  return (
    <SecretList<Token, Schemas["TokenCreated"]>
      title="API tokens"
      lead={
        <>
          Tokens let the <code>einsora</code> command line and your scripts act as you, in this
          tenant. Each is shown once when made; only its hash is kept.
        </>
      }
      noun="tokens"
      heading="Your tokens"
      row="token"
      list={() =>
        allPages((cursor) => ok(api.GET("/v1/tokens", { params: { query: { limit: 200, cursor } } })))
      }
      columns={[
        {
          label: "Name",
          cell: (t) => (
            <Named name={t.name} id={t.id} badge={t.operator ? <span class="badge tone-busy"> operator</span> : null} />
          ),
        },
        { label: "Made", cell: (t) => <time dateTime={t.created_at}>{when(t.created_at)}</time> },
        { label: "Last used", cell: (t) => <LastUsed at={t.last_used_at} /> },
        {
          label: "Expires",
          cell: (t) => (t.expires_at ? <time dateTime={t.expires_at}>{when(t.expires_at)}</time> : <span class="dim">never</span>),
        },
      ]}
      empty={{ title: "No tokens", body: <p>Make one above for the CLI or a script.</p> }}
      make={(onMade) => <MakeToken onMade={onMade} />}
      shown={(made) => ({
        label: `Token ${made.name}`,
        secret: made.token,
        hint: (
          <>
            Use it with <code>EINSORA_TOKEN=…</code> or <code>einsora login</code>.
          </>
        ),
      })}
      revoke={{
        what: (t) => `token ${t.name}`,
        consequence: "Anything that uses it is refused from its next request, on every api replica.",
        call: (t) => ok(api.DELETE("/v1/tokens/{id}", { params: { path: { id: t.id } } })),
      }}
    />
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
