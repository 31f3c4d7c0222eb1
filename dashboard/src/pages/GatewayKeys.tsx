// Gateway keys: what clients of model endpoints present to the inference gateway (OpenAI's
// API). Made here (the key shown once), listed, revoked at once.
import { useEffect, useState } from "preact/hooks";
import { ApiError, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Page } from "../components/Page";
import { RevokeButton } from "../components/Revoke";
import { SecretOnce } from "../components/SecretOnce";
import { Empty, Failed, Loading } from "../components/States";
import { age, when } from "../lib/format";
import { session } from "../state/session";
import { now } from "../state/clock";

type Key = Schemas["GatewayKeyOut"];

export function GatewayKeys() {
  const [keys, setKeys] = useState<Key[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [revokeError, setRevokeError] = useState<ApiError | null>(null);
  const [made, setMade] = useState<Schemas["GatewayKeyCreated"] | null>(null);
  const load = () => {
    setError(null);
    allPages((cursor) => ok(api.GET("/v1/gateway/keys", { params: { query: { limit: 200, cursor } } })))
      .then(setKeys)
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
  };
  useEffect(load, []);
  const gateway = session.value?.gateway_url ?? "";
  return (
    <Page title="Gateway keys">
      <p class="lead">
        Clients of your model endpoints send a key to the gateway at <code>{gateway}</code>, as
        OpenAI's API key. Each key is shown once when made.
      </p>
      <MakeKey
        onMade={(key) => {
          setMade(key);
          load();
        }}
      />
      {made ? (
        <div class="card highlight">
          <SecretOnce label={`Key ${made.name}`} secret={made.key} />
          <button type="button" class="button small" onClick={() => setMade(null)}>
            I have copied it
          </button>
        </div>
      ) : null}
      <ErrorNote error={revokeError} />
      <section class="card" aria-labelledby="keys-heading">
        <h2 id="keys-heading">Keys</h2>
        {error ? (
          <Failed what="gateway keys" error={error} retry={load} />
        ) : keys === null ? (
          <Loading what="gateway keys" />
        ) : keys.length === 0 ? (
          <Empty title="No gateway keys">
            <p>Make one above, then call an endpoint with OpenAI's SDK.</p>
          </Empty>
        ) : (
          <div class="table-wrap">
            <table class="table responsive">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Endpoints</th>
                  <th scope="col">Limits</th>
                  <th scope="col">Last used</th>
                  <th scope="col">Made</th>
                  <th scope="col">
                    <span class="visually-hidden">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {keys.map((k) => (
                  <tr key={k.id} data-key={k.id}>
                    <td data-label="Name">
                      <div>
                        <strong>{k.name}</strong>
                        <div class="mono dim small">{k.id}</div>
                      </div>
                    </td>
                    <td data-label="Endpoints">{k.models ? k.models.join(", ") : <span class="dim">all</span>}</td>
                    <td data-label="Limits">
                      <span>
                        {k.rpm ? `${k.rpm} req/min` : "no request limit"}, {k.tpm ? `${k.tpm} tokens/min` : "no token limit"}
                      </span>
                    </td>
                    <td data-label="Last used">
                      {k.last_used_at ? (
                        <time dateTime={k.last_used_at}>{age(k.last_used_at, now.value)} ago</time>
                      ) : (
                        <span class="dim">never</span>
                      )}
                    </td>
                    <td data-label="Made">
                      <time dateTime={k.created_at}>{when(k.created_at)}</time>
                    </td>
                    <td data-label="">
                      <RevokeButton
                        what={`key ${k.name}`}
                        consequence="The gateway refuses it within a second, on every replica."
                        onRevoke={async () => {
                          setRevokeError(null);
                          try {
                            await ok(api.DELETE("/v1/gateway/keys/{id}", { params: { path: { id: k.id } } }));
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

function MakeKey({ onMade }: { onMade: (made: Schemas["GatewayKeyCreated"]) => void }) {
  const [name, setName] = useState("");
  const [models, setModels] = useState("");
  const [rpm, setRpm] = useState("");
  const [tpm, setTpm] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    const n = (text: string) => Number(text) || (text as unknown as number);
    try {
      const body: Schemas["GatewayKeyCreate"] = { name: name.trim() };
      const list = models.split(",").map((s) => s.trim()).filter(Boolean);
      if (list.length) body.models = list;
      if (rpm.trim()) body.rpm = n(rpm.trim());
      if (tpm.trim()) body.tpm = n(tpm.trim());
      onMade(await ok(api.POST("/v1/gateway/keys", { body })));
      setName("");
      setModels("");
      setRpm("");
      setTpm("");
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };
  const f = (field: string) =>
    error?.details.find((d) => d.field === field || d.field.startsWith(`${field}.`))?.message;
  const named = ["name", "models", "rpm", "tpm"].some((x) => f(x));
  return (
    <form class="card form" onSubmit={submit} noValidate aria-labelledby="make-key-heading">
      <h2 id="make-key-heading">Make a key</h2>
      <ErrorNote error={error && !named ? error : null} />
      <div class="row">
        <Field id="key-name" label="Name" error={f("name")}>
          <input {...described("key-name", f("name"))} value={name} onInput={(e) => setName(e.currentTarget.value)} />
        </Field>
        <Field id="key-models" label="Endpoints" hint="Comma-separated names; empty: all." error={f("models")}>
          <input {...described("key-models", f("models"), true)} value={models} onInput={(e) => setModels(e.currentTarget.value)} />
        </Field>
      </div>
      <div class="row">
        <Field id="key-rpm" label="Requests per minute" hint="Empty: no limit." error={f("rpm")}>
          <input {...described("key-rpm", f("rpm"), true)} type="number" min={1} inputMode="numeric" value={rpm} onInput={(e) => setRpm(e.currentTarget.value)} />
        </Field>
        <Field id="key-tpm" label="Tokens per minute" hint="Empty: no limit." error={f("tpm")}>
          <input {...described("key-tpm", f("tpm"), true)} type="number" min={1} inputMode="numeric" value={tpm} onInput={(e) => setTpm(e.currentTarget.value)} />
        </Field>
      </div>
      <div class="actions">
        <button type="submit" class="button primary" disabled={busy}>
          {busy ? "Making…" : "Make key"}
        </button>
      </div>
    </form>
  );
}
