// Machines: what each machine has (CPUs, memory, GPUs with model, memory and health), what of
// yours runs there, its last heartbeat, owner and sharing; and joining a machine (a one-time
// join token and the one command to run on it).
import { useEffect, useState } from "preact/hooks";
import { ApiError, type Machine, type Schemas, allPages, api, ok } from "../api/client";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Link } from "../components/Link";
import { Page } from "../components/Page";
import { CopyButton } from "../components/CopyButton";
import { SecretOnce } from "../components/SecretOnce";
import { Empty, Failed, Loading } from "../components/States";
import { age, mib } from "../lib/format";
import * as live from "../state/live";
import { now } from "../state/clock";

const STALE_S = 120;

export function Machines() {
  const [machines, setMachines] = useState<Machine[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [joining, setJoining] = useState(false);

  const load = () => {
    setError(null);
    allPages((cursor) => ok(api.GET("/v1/machines", { params: { query: { limit: 200, cursor } } })))
      .then(setMachines)
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
  };
  useEffect(() => {
    load();
    void live.start();
    const every = window.setInterval(load, 15_000); // heartbeats move on
    return () => window.clearInterval(every);
  }, []);

  return (
    <Page
      title="Machines"
      wide
      actions={
        <button type="button" class="button primary" onClick={() => setJoining(!joining)} aria-expanded={joining}>
          Join a machine
        </button>
      }
    >
      {joining ? <JoinMachine onClose={() => setJoining(false)} /> : null}
      {error !== null && machines === null ? (
        <Failed what="machines" error={error} retry={load} />
      ) : machines === null ? (
        <Loading what="machines" />
      ) : machines.length === 0 ? (
        <Empty title="No machines yet">
          <p>Join one of yours: it dials out to this control plane, and needs no open port.</p>
        </Empty>
      ) : (
        <ul class="machines" aria-label="Machines">
          {machines.map((m) => (
            <MachineCard key={m.id} machine={m} />
          ))}
        </ul>
      )}
    </Page>
  );
}

function MachineCard({ machine: m }: { machine: Machine }) {
  const inv = m.inventory;
  const e = m.enrolment;
  const heartbeat = m.heartbeat_at;
  const stale = heartbeat === null || (now.value - Date.parse(heartbeat)) / 1000 > STALE_S;
  const mine = live.ids.value
    .map((id) => live.rows.get(id)?.value)
    .filter((w) => w !== undefined && w.placement?.machine === m.id && w.state !== "removed");
  return (
    <li class="card machine">
      <div class="section-head">
        <h2>
          {inv?.hostname ?? m.id} <span class="mono dim small">{m.id}</span>
        </h2>
        <span class={`badge ${e?.revoked_at ? "tone-bad" : stale ? "tone-idle" : "tone-ok"}`}>
          {e?.revoked_at ? "revoked" : heartbeat === null ? "no heartbeat" : stale ? "silent" : "online"}
        </span>
      </div>
      <dl class="facts">
        <dt>Region</dt>
        <dd>{m.region ?? <span class="dim">not enrolled</span>}</dd>
        <dt>Owner</dt>
        <dd>{e?.owner_tenant_name ?? <span class="dim">—</span>}</dd>
        <dt>Sharing</dt>
        <dd>{e?.sharing ?? "—"}</dd>
        <dt>Last heartbeat</dt>
        <dd>
          {heartbeat ? (
            <time dateTime={heartbeat} title={heartbeat}>
              {age(heartbeat, now.value)} ago
            </time>
          ) : (
            <span class="dim">never</span>
          )}
        </dd>
        {inv ? (
          <>
            <dt>System</dt>
            <dd>
              {inv.os} {inv.arch}
              {inv.apple_chip ? `, ${inv.apple_chip}` : ""}
            </dd>
            <dt>CPUs</dt>
            <dd>
              {inv.cpus}
              {e?.usable && e.usable.cpus < inv.cpus ? <span class="dim"> ({e.usable.cpus} lent)</span> : null}
            </dd>
            <dt>Memory</dt>
            <dd>
              {mib(inv.memory_mib)}
              {e?.usable && e.usable.memory_mib < inv.memory_mib ? (
                <span class="dim"> ({mib(e.usable.memory_mib)} lent)</span>
              ) : null}
            </dd>
          </>
        ) : (
          <>
            <dt>Inventory</dt>
            <dd class="dim">not reported yet</dd>
          </>
        )}
        <dt>Workloads</dt>
        <dd>{m.workloads}</dd>
      </dl>
      {inv && (inv.gpus ?? []).length > 0 ? <Gpus gpus={inv.gpus ?? []} /> : inv ? <p class="dim">No GPUs.</p> : null}
      {mine.length > 0 ? (
        <div>
          <h3>Yours here</h3>
          <ul class="plain">
            {mine.map((w) =>
              w ? (
                <li key={w.id}>
                  <Link href={`/workloads/${w.id}`}>{w.name}</Link> <span class="dim">{w.state}</span>
                </li>
              ) : null,
            )}
          </ul>
        </div>
      ) : null}
    </li>
  );
}

function Gpus({ gpus }: { gpus: Schemas["Gpu"][] }) {
  return (
    <table class="table compact">
      <caption>GPUs</caption>
      <thead>
        <tr>
          <th scope="col">#</th>
          <th scope="col">Model</th>
          <th scope="col">Memory</th>
          <th scope="col">Health</th>
        </tr>
      </thead>
      <tbody>
        {gpus.map((g) => (
          <tr key={g.uuid}>
            <td>{g.index}</td>
            <td>
              {g.model}
              {g.mig ? " (MIG)" : ""}
            </td>
            <td>{mib(g.memory_mib)}</td>
            <td>
              <span class={`badge ${g.health === "ok" ? "tone-ok" : "tone-bad"}`}>{g.health}</span>
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function JoinMachine({ onClose }: { onClose: () => void }) {
  const [sharing, setSharing] = useState<Schemas["SharingLevel"]>("private");
  const [uses, setUses] = useState("1");
  const [hours, setHours] = useState("24");
  const [tunnel, setTunnel] = useState(true);
  const [made, setMade] = useState<Schemas["JoinTokenCreated"] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      setMade(
        await ok(
          api.POST("/v1/machines/join-tokens", {
            body: {
              sharing,
              uses: Number(uses) || (uses as unknown as number),
              expires_in_hours: Number(hours) || (hours as unknown as number),
              tunnel,
            },
          }),
        ),
      );
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };
  if (made !== null) {
    return (
      <section class="card" aria-labelledby="join-heading">
        <h2 id="join-heading">Run this on the machine</h2>
        <p>
          With <code>einsora-agent</code> installed there. The token works for {made.uses} machine
          {made.uses === 1 ? "" : "s"} until {new Date(made.expires_at).toLocaleString()}.
        </p>
        <pre class="code" tabIndex={0} aria-label="Join command">
          <code>{made.join_command}</code>
        </pre>
        <CopyButton text={made.join_command} label="Copy command" />
        <SecretOnce label="Join token" secret={made.token} />
        <button type="button" class="button" onClick={onClose}>
          Done
        </button>
      </section>
    );
  }
  const f = (name: string) => error?.forField(name);
  return (
    <section class="card" aria-labelledby="join-heading">
      <h2 id="join-heading">Join a machine</h2>
      <ErrorNote error={error && !error.details.length ? error : null} />
      <form class="form" onSubmit={submit} noValidate>
        <div class="row">
          <Field id="join-sharing" label="Sharing" error={f("sharing")}>
            <select {...described("join-sharing", f("sharing"))} value={sharing} onChange={(e) => setSharing(e.currentTarget.value as Schemas["SharingLevel"])}>
              <option value="private">Private: this tenant only</option>
              <option value="invite-only">Invite-only</option>
              <option value="community">Community</option>
            </select>
          </Field>
          <Field id="join-uses" label="Machines" error={f("uses")}>
            <input {...described("join-uses", f("uses"))} type="number" min={1} value={uses} onInput={(e) => setUses(e.currentTarget.value)} />
          </Field>
          <Field id="join-hours" label="Valid for (hours)" error={f("expires_in_hours")}>
            <input {...described("join-hours", f("expires_in_hours"))} type="number" min={1} value={hours} onInput={(e) => setHours(e.currentTarget.value)} />
          </Field>
        </div>
        <label class="check">
          <input type="checkbox" checked={tunnel} onChange={(e) => setTunnel(e.currentTarget.checked)} />
          Reach it through a tunnel it dials (for a machine behind NAT or a firewall)
        </label>
        <div class="actions">
          <button type="button" class="button" onClick={onClose}>
            Cancel
          </button>
          <button type="submit" class="button primary" disabled={busy}>
            {busy ? "Making a token…" : "Make a join token"}
          </button>
        </div>
      </form>
    </section>
  );
}
