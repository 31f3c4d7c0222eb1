// Gateway keys: what clients of model endpoints present to the inference gateway (OpenAI's
// API). Made here (the key shown once), listed, revoked at once.
import { useState } from "preact/hooks";
import { ApiError, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { LastUsed } from "../components/LastUsed";
import { Named, SecretList } from "../components/SecretList";
import { when } from "../lib/format";
import { session } from "../state/session";

type Key = Schemas["GatewayKeyOut"];

export function GatewayKeys() {
  const gateway = session.value?.gateway_url ?? "";
  return (
    <SecretList<Key, Schemas["GatewayKeyCreated"]>
      title="Gateway keys"
      lead={
        <>
          Clients of your model endpoints send a key to the gateway at <code>{gateway}</code>, as
          OpenAI's API key. Each key is shown once when made.
        </>
      }
      noun="gateway keys"
      heading="Keys"
      row="key"
      list={() =>
        allPages((cursor) => ok(api.GET("/v1/gateway/keys", { params: { query: { limit: 200, cursor } } })))
      }
      columns={[
        { label: "Name", cell: (k) => <Named name={k.name} id={k.id} /> },
        { label: "Endpoints", cell: (k) => (k.models ? k.models.join(", ") : <span class="dim">all</span>) },
        {
          label: "Limits",
          cell: (k) => (
            <span>
              {k.rpm ? `${k.rpm} req/min` : "no request limit"}, {k.tpm ? `${k.tpm} tokens/min` : "no token limit"}
            </span>
          ),
        },
        { label: "Last used", cell: (k) => <LastUsed at={k.last_used_at} /> },
        { label: "Made", cell: (k) => <time dateTime={k.created_at}>{when(k.created_at)}</time> },
      ]}
      empty={{ title: "No gateway keys", body: <p>Make one above, then call an endpoint with OpenAI's SDK.</p> }}
      make={(onMade) => <MakeKey onMade={onMade} />}
      shown={(made) => ({ label: `Key ${made.name}`, secret: made.key })}
      revoke={{
        what: (k) => `key ${k.name}`,
        consequence: "The gateway refuses it within a second, on every replica.",
        call: (k) => ok(api.DELETE("/v1/gateway/keys/{id}", { params: { path: { id: k.id } } })),
      }}
    />
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
