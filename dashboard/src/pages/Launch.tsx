// Launch: what to run (kind), on what (a class, with what is free now), where (a region and
// the fallback classes to try in order), and an endpoint's model and runtime. The api checks
// everything; each refusal is shown beside the field it names.
import { useEffect, useState } from "preact/hooks";
import { ApiError, type MachineClass, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Link } from "../components/Link";
import { Page } from "../components/Page";
import { Failed, Loading } from "../components/States";
import { buildLaunch, type LaunchForm, classLabel, fieldOf } from "../lib/launch";
import { navigate } from "../router";
import { tell } from "../state/notice";
import * as live from "../state/live";

type Region = Schemas["RegionOut"];

const EMPTY: LaunchForm = {
  kind: "notebook",
  name: "",
  class: "",
  count: "1",
  region: "",
  fallback: "",
  fallbackAfter: "",
  model: "",
  runtime: "llamacpp",
  replicas: "1",
  contextLength: "",
};

export function Launch() {
  const [classes, setClasses] = useState<MachineClass[] | null>(null);
  const [regions, setRegions] = useState<Region[]>([]);
  const [loadError, setLoadError] = useState<ApiError | null>(null);
  const [form, setForm] = useState<LaunchForm>(EMPTY);
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);

  const load = () => {
    setLoadError(null);
    Promise.all([
      allPages((cursor) => ok(api.GET("/v1/classes", { params: { query: { limit: 200, cursor } } }))),
      allPages((cursor) => ok(api.GET("/v1/regions", { params: { query: { limit: 200, cursor } } }))),
    ])
      .then(([foundClasses, foundRegions]) => {
        setClasses(foundClasses);
        setRegions(foundRegions);
        setForm((f) => ({ ...f, class: f.class || pickClass(foundClasses) }));
      })
      .catch((failure: unknown) => setLoadError(failure instanceof ApiError ? failure : null));
  };
  useEffect(load, []);

  const set = (change: Partial<LaunchForm>) => setForm((f) => ({ ...f, ...change }));
  const errorFor = (field: keyof LaunchForm) =>
    error?.details.find((d) => fieldOf(d.field) === field)?.message;
  const unplaced = error !== null && !error.details.some((d) => fieldOf(d.field) !== null);

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const made = await ok(api.POST("/v1/workloads", { body: buildLaunch(form) }));
      live.upsert(made);
      tell(`Launched ${made.name}: it shows here as it starts.`);
      navigate(`/workloads/${made.id}`);
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };

  if (loadError !== null) {
    return (
      <Page title="Launch">
        <Failed what="the classes" error={loadError} retry={load} />
      </Page>
    );
  }
  if (classes === null) {
    return (
      <Page title="Launch">
        <Loading what="the classes" />
      </Page>
    );
  }
  const chosen = classes.find((c) => c.name === form.class);
  const endpoint = form.kind === "endpoint";
  return (
    <Page title="Launch" actions={<Link href="/workloads" class="button">Back to workloads</Link>}>
      <form class="form card" onSubmit={submit} noValidate aria-describedby="launch-error">
        <div id="launch-error">{unplaced ? <ErrorNote error={error} /> : null}</div>
        <fieldset class="field">
          <legend>Kind</legend>
          <div class="choices">
            {(
              [
                ["notebook", "Notebook", "Jupyter, opened in your browser"],
                ["endpoint", "Model endpoint", "a model served through OpenAI's API"],
                ["vm", "VM", "a virtual machine"],
              ] as const
            ).map(([value, label, what]) => (
              <label key={value} class={`choice${form.kind === value ? " chosen" : ""}`}>
                <input
                  type="radio"
                  name="kind"
                  value={value}
                  checked={form.kind === value}
                  onChange={() => set({ kind: value })}
                />
                <span>
                  <strong>{label}</strong>
                  <span class="dim"> {what}</span>
                </span>
              </label>
            ))}
          </div>
          {errorFor("kind") ? <p class="field-error">{errorFor("kind")}</p> : null}
        </fieldset>

        <Field
          id="launch-name"
          label={endpoint ? "Model name" : "Name"}
          hint={endpoint ? "What clients send as `model` to the gateway." : "Optional; one is made up when empty."}
          error={errorFor("name")}
        >
          <input
            {...described("launch-name", errorFor("name"), true)}
            value={form.name}
            autoCapitalize="none"
            spellcheck={false}
            onInput={(e) => set({ name: e.currentTarget.value })}
          />
        </Field>

        <Field
          id="launch-class"
          label="Class"
          hint={chosen ? chosen.description : undefined}
          error={errorFor("class")}
        >
          <select
            {...described("launch-class", errorFor("class"), chosen !== undefined)}
            value={form.class}
            onChange={(e) => set({ class: e.currentTarget.value })}
          >
            {classes.map((c) => (
              <option key={c.name} value={c.name}>
                {classLabel(c)}
              </option>
            ))}
          </select>
        </Field>

        <div class="row">
          <Field id="launch-count" label="Count" hint="GPUs (or CPU shares) of the class." error={errorFor("count")}>
            <input
              {...described("launch-count", errorFor("count"), true)}
              type="number"
              min={1}
              max={64}
              inputMode="numeric"
              value={form.count}
              onInput={(e) => set({ count: e.currentTarget.value })}
            />
          </Field>
          <Field id="launch-region" label="Region" error={errorFor("region")}>
            <select
              {...described("launch-region", errorFor("region"))}
              value={form.region}
              onChange={(e) => set({ region: e.currentTarget.value })}
            >
              <option value="">This control plane's own</option>
              {regions.map((r) => (
                <option key={r.name} value={r.name}>
                  {r.name} ({r.machines} machine{r.machines === 1 ? "" : "s"})
                </option>
              ))}
            </select>
          </Field>
        </div>

        <Field
          id="launch-fallback"
          label="Fallback chain"
          hint="Optional: substitutes to try, in order, when this has no room. Comma-separated steps: class:NAME (or just NAME), machine:ID, region:NAME, and for endpoints model:NAME and replicas:N."
          error={errorFor("fallback")}
        >
          <input
            {...described("launch-fallback", errorFor("fallback"), true)}
            value={form.fallback}
            placeholder="e.g. a100-80gb, region:office, cpu-8c-32g"
            autoCapitalize="none"
            spellcheck={false}
            onInput={(e) => set({ fallback: e.currentTarget.value })}
          />
        </Field>
        <Field
          id="launch-fallback-after"
          label="Wait before each fallback step (seconds)"
          hint="Optional: how long to stay queued at one step before trying the next; 0 tries them all at once."
          error={errorFor("fallbackAfter")}
        >
          <input
            {...described("launch-fallback-after", errorFor("fallbackAfter"), true)}
            value={form.fallbackAfter}
            inputMode="numeric"
            placeholder="0"
            onInput={(e) => set({ fallbackAfter: e.currentTarget.value })}
          />
        </Field>

        {endpoint ? (
          <fieldset class="group">
            <legend>Model endpoint</legend>
            <Field
              id="launch-model"
              label="Model file"
              hint="A path or https:// URI of a .gguf or .safetensors file (never a pickle)."
              error={errorFor("model")}
            >
              <input
                {...described("launch-model", errorFor("model"), true)}
                class="mono"
                value={form.model}
                placeholder="/models/qwen2.5-0.5b.gguf"
                autoCapitalize="none"
                spellcheck={false}
                onInput={(e) => set({ model: e.currentTarget.value })}
              />
            </Field>
            <div class="row">
              <Field id="launch-runtime" label="Runtime" error={errorFor("runtime")}>
                <select
                  {...described("launch-runtime", errorFor("runtime"))}
                  value={form.runtime}
                  onChange={(e) => set({ runtime: e.currentTarget.value })}
                >
                  <option value="llamacpp">llama.cpp (any machine)</option>
                  <option value="vllm">vLLM (NVIDIA)</option>
                  <option value="mlx">MLX (Apple Silicon)</option>
                </select>
              </Field>
              <Field id="launch-replicas" label="Replicas" error={errorFor("replicas")}>
                <input
                  {...described("launch-replicas", errorFor("replicas"))}
                  type="number"
                  min={1}
                  inputMode="numeric"
                  value={form.replicas}
                  onInput={(e) => set({ replicas: e.currentTarget.value })}
                />
              </Field>
              <Field id="launch-context" label="Context length" error={errorFor("contextLength")}>
                <input
                  {...described("launch-context", errorFor("contextLength"))}
                  type="number"
                  min={16}
                  inputMode="numeric"
                  placeholder="the model's"
                  value={form.contextLength}
                  onInput={(e) => set({ contextLength: e.currentTarget.value })}
                />
              </Field>
            </div>
          </fieldset>
        ) : null}

        <div class="actions">
          <button type="submit" class="button primary" disabled={busy}>
            {busy ? "Launching…" : "Launch"}
          </button>
        </div>
      </form>
    </Page>
  );
}

/** The first class some machine offers now (a CPU class on a laptop), else the first. */
function pickClass(classes: MachineClass[]): string {
  const offered = classes.filter((c) => c.regions.length > 0);
  const free = offered.find((c) => (c.free ?? 0) > 0);
  return (free ?? offered[0] ?? classes[0])?.name ?? "";
}
