// Workloads: the tenant's list, live from the event stream, with filters and search that live
// in the address (a filtered list is a link). Each row is its own signal: a change re-renders
// that row alone.
import { memo } from "preact/compat";
import { useEffect } from "preact/hooks";
import { Link } from "../components/Link";
import { Notice } from "../components/Notice";
import { Page } from "../components/Page";
import { StateBadge } from "../components/StateBadge";
import { Empty, Failed, Loading } from "../components/States";
import { type Filters, NO_FILTERS, fromQuery, matches, toQuery } from "../lib/filter";
import { age } from "../lib/format";
import { navigate, query } from "../router";
import * as live from "../state/live";
import { now } from "../state/clock";

const STATE_CHOICES: { value: Filters["state"]; label: string }[] = [
  { value: "active", label: "Not removed" },
  { value: "all", label: "All" },
  { value: "running", label: "Running" },
  { value: "pending", label: "Pending" },
  { value: "queued", label: "Queued" },
  { value: "scheduled", label: "Scheduled" },
  { value: "starting", label: "Starting" },
  { value: "parking", label: "Parking" },
  { value: "parked", label: "Parked" },
  { value: "failed", label: "Failed" },
  { value: "preempted", label: "Preempted" },
  { value: "removing", label: "Removing" },
  { value: "removed", label: "Removed" },
];

const Row = memo(function Row({ id }: { id: string }) {
  const row = live.rows.get(id);
  if (row === undefined) return null;
  const w = row.value;
  const placed = w.placement;
  return (
    <tr data-workload={w.id} data-state={w.state}>
      <td data-label="Name">
        <div>
          <Link href={`/workloads/${w.id}`} class="strong">
            {w.name}
          </Link>
          <div class="mono dim small">{w.id}</div>
        </div>
      </td>
      <td data-label="State">
        <StateBadge state={w.state} />
      </td>
      <td data-label="Kind">{w.kind}</td>
      <td data-label="Class" class="mono">
        {w.class}
        {w.count > 1 ? ` × ${w.count}` : ""}
      </td>
      <td data-label="Placement">
        {placed ? (
          <span>
            <span class="mono">{placed.machine}</span>
            <span class="dim"> · {placed.region}</span>
          </span>
        ) : (
          <span class="dim">not placed</span>
        )}
      </td>
      <td data-label="Age">
        <time dateTime={w.created_at} title={w.created_at}>
          {age(w.created_at, now.value)}
        </time>
      </td>
    </tr>
  );
});

function LiveIndicator() {
  const s = live.stream.value;
  const text =
    s === "live" ? "Live" : s === "reconnecting" ? "Reconnecting…" : s === "connecting" ? "Connecting…" : "Not live";
  return (
    <span class={`live live-${s}`} role="status" aria-live="polite">
      <span class="dot" aria-hidden="true" />
      {text}
    </span>
  );
}

export function Workloads() {
  const filters = fromQuery(query());
  useEffect(() => {
    void live.start();
  }, []);

  const set = (change: Partial<Filters>) =>
    navigate(`/workloads${toQuery({ ...filters, ...change })}`, { replace: true });

  const state = live.load.value;
  const all = live.ids.value;
  const shown = all.filter((id) => {
    const row = live.rows.get(id);
    return row !== undefined && matches(row.value, filters);
  });
  const counts = live.counts.value;
  const filtered = filters.state !== NO_FILTERS.state || filters.kind !== "all" || filters.search;

  return (
    <Page
      title="Workloads"
      wide
      actions={
        <>
          <LiveIndicator />
          <Link href="/launch" class="button primary">
            Launch
          </Link>
        </>
      }
    >
      <Notice />
      <form class="filters" role="search" onSubmit={(e) => e.preventDefault()}>
        <div class="field inline">
          <label for="filter-state">State</label>
          <select
            id="filter-state"
            value={filters.state}
            onChange={(e) => set({ state: e.currentTarget.value as Filters["state"] })}
          >
            {STATE_CHOICES.map((c) => (
              <option key={c.value} value={c.value}>
                {c.label}
                {counts[c.value] ? ` (${counts[c.value]})` : ""}
              </option>
            ))}
          </select>
        </div>
        <div class="field inline">
          <label for="filter-kind">Kind</label>
          <select
            id="filter-kind"
            value={filters.kind}
            onChange={(e) => set({ kind: e.currentTarget.value as Filters["kind"] })}
          >
            <option value="all">All kinds</option>
            <option value="notebook">Notebooks</option>
            <option value="endpoint">Endpoints</option>
            <option value="vm">VMs</option>
          </select>
        </div>
        <div class="field inline grow">
          <label for="filter-search">Search</label>
          <input
            id="filter-search"
            type="search"
            placeholder="name, id, class, machine…"
            value={filters.search}
            onInput={(e) => set({ search: e.currentTarget.value })}
          />
        </div>
      </form>
      {state === "loading" || state === "idle" ? (
        <Loading what="workloads" />
      ) : state === "failed" ? (
        <Failed what="workloads" error={live.loadError.value} retry={() => void live.start()} />
      ) : all.length === 0 ? (
        <Empty title="No workloads yet">
          <p>Launch a notebook, a model endpoint or a VM, and it shows here as it starts.</p>
          <Link href="/launch" class="button primary">
            Launch a workload
          </Link>
        </Empty>
      ) : shown.length === 0 && !filtered ? (
        <Empty title="Nothing running or waiting">
          <p>
            {all.length} removed workload{all.length === 1 ? " is" : "s are"} hidden.
          </p>
          <div class="actions">
            <button type="button" class="button" onClick={() => set({ state: "all" })}>
              Show them
            </button>
            <Link href="/launch" class="button primary">
              Launch a workload
            </Link>
          </div>
        </Empty>
      ) : shown.length === 0 ? (
        <Empty title="No workload matches these filters">
          <button type="button" class="button" onClick={() => navigate("/workloads", { replace: true })}>
            Clear the filters
          </button>
        </Empty>
      ) : (
        <>
          <p class="count" aria-live="polite">
            {filtered
              ? `${shown.length} of ${all.length} workloads`
              : `${shown.length} workload${shown.length === 1 ? "" : "s"}` +
                (all.length > shown.length ? ` (${all.length - shown.length} removed, hidden)` : "")}
          </p>
          <div class="table-wrap">
            <table class="table responsive workloads">
              <caption class="visually-hidden">The tenant's workloads, newest first</caption>
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">State</th>
                  <th scope="col">Kind</th>
                  <th scope="col">Class</th>
                  <th scope="col">Placement</th>
                  <th scope="col">Age</th>
                </tr>
              </thead>
              <tbody>
                {shown.map((id) => (
                  <Row key={id} id={id} />
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
    </Page>
  );
}
