// One workload: its timeline (newest first, live from its event stream), its placement, the
// actions its state allows (Open, Park, Resume, Remove), its export, and for an endpoint the
// code that calls it through the gateway.
import { useEffect, useRef, useState } from "preact/hooks";
import {
  ApiError,
  type Schemas,
  type Snapshot,
  type Workload,
  type WorkloadChange,
  allPages,
  api,
  ok,
} from "../api/client";
import { Confirm } from "../components/Confirm";
import { CopyButton } from "../components/CopyButton";
import { ErrorNote } from "../components/ErrorNote";
import { Link } from "../components/Link";
import { Notice } from "../components/Notice";
import { Page } from "../components/Page";
import { StateBadge } from "../components/StateBadge";
import { Empty, Failed, Loading } from "../components/States";
import { actions, when } from "../lib/format";
import { stepLabel } from "../lib/launch";
import { type Entry, fromChange, newestFirst, openaiSnippet } from "../lib/timeline";
import { session } from "../state/session";
import * as live from "../state/live";

type Action = "park" | "resume" | "remove" | "open";

export function WorkloadPage({ id }: { id: string }) {
  const [workload, setWorkload] = useState<Workload | null>(null);
  const [loadError, setLoadError] = useState<ApiError | null>(null);
  const [entries, setEntries] = useState<Entry[] | null>(null);
  const [streaming, setStreaming] = useState(false);
  const [busy, setBusy] = useState<Action | null>(null);
  const [actionError, setActionError] = useState<ApiError | null>(null);
  const [confirming, setConfirming] = useState(false);
  const entriesRef = useRef<Entry[]>([]);

  const setTimeline = (next: Entry[]) => {
    entriesRef.current = next;
    setEntries(next);
  };

  const loadTimeline = async () => {
    // The route answers a page of JSON here (an event stream only with `follow=true`).
    const items = await allPages(
      async (cursor) =>
        (await ok(
          api.GET("/v1/workloads/{id}/events", {
            params: { path: { id }, query: { limit: 200, cursor } },
          }),
        )) as Schemas["TimelinePage"],
    );
    setTimeline(newestFirst([...items, ...entriesRef.current]));
  };

  const loadAll = async () => {
    setLoadError(null);
    try {
      const found = await ok(api.GET("/v1/workloads/{id}", { params: { path: { id } } }));
      setWorkload(found);
      await loadTimeline();
    } catch (failure) {
      setLoadError(failure instanceof ApiError ? failure : null);
    }
  };

  useEffect(() => {
    void loadAll();
    // The stream: a snapshot first (the timeline is read again then, so nothing committed
    // before the stream began is missed), then each change, appended as it comes.
    const source = new EventSource(`/v1/workloads/${encodeURIComponent(id)}/events?follow=true`);
    source.addEventListener("open", () => setStreaming(true));
    source.addEventListener("error", () => setStreaming(false));
    source.addEventListener("snapshot", (event) => {
      const snapshot = JSON.parse((event as MessageEvent<string>).data) as Snapshot;
      for (const change of snapshot.workloads) merge(change, false);
      void loadTimeline().catch(() => undefined);
    });
    source.addEventListener("workload", (event) => {
      const data = (event as MessageEvent<string>).data;
      if (data) merge(JSON.parse(data) as WorkloadChange, true);
    });
    return () => source.close();
  }, [id]);

  const merge = (change: WorkloadChange, asEntry: boolean) => {
    if (change.workload_id !== id) return;
    setWorkload((w) =>
      w === null || Date.parse(w.updated_at) > Date.parse(change.at)
        ? w
        : { ...w, state: change.state, updated_at: change.at, placement: change.placement ?? w.placement ?? null },
    );
    live.apply(change);
    if (asEntry) setTimeline(newestFirst([fromChange(change), ...entriesRef.current]));
  };

  const act = async (action: Action) => {
    setBusy(action);
    setActionError(null);
    try {
      if (action === "open") {
        // A tab opened now, while the click still counts, and pointed at the site once the
        // one-time link is minted; it cannot reach back to this page.
        const tab = window.open("about:blank", "_blank");
        if (tab) tab.opener = null;
        try {
          const access = await ok(
            api.POST("/v1/workloads/{id}/access", { params: { path: { id } } }),
          );
          if (tab) tab.location.href = access.url;
          else window.open(access.url, "_blank", "noopener,noreferrer");
        } catch (failure) {
          tab?.close();
          throw failure;
        }
        return;
      }
      const path = { params: { path: { id } } };
      const done =
        action === "park"
          ? await ok(api.POST("/v1/workloads/{id}/park", path))
          : action === "resume"
            ? await ok(api.POST("/v1/workloads/{id}/resume", path))
            : await ok(api.DELETE("/v1/workloads/{id}", path));
      setWorkload(done);
      live.upsert(done);
      await loadTimeline(); // what the api records itself ("park requested by …")
    } catch (failure) {
      setActionError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(null);
    }
  };

  if (loadError !== null) {
    return (
      <Page title="Workload">
        {loadError.status === 404 ? (
          <Empty title={`No workload ${id}`}>
            <p>It does not exist in this tenant.</p>
            <Link href="/workloads" class="button">
              All workloads
            </Link>
          </Empty>
        ) : (
          <Failed what="the workload" error={loadError} retry={() => void loadAll()} />
        )}
      </Page>
    );
  }
  if (workload === null) {
    return (
      <Page title="Workload">
        <Loading what="the workload" />
      </Page>
    );
  }

  const can = actions(workload.state);
  const who = session.value;
  const spec = workload.spec as Record<string, unknown>;
  return (
    <Page
      title={workload.name}
      wide
      actions={
        <div class="toolbar" role="toolbar" aria-label="Workload actions">
          <button type="button" class="button primary" disabled={!can.open || busy !== null} onClick={() => act("open")}>
            {busy === "open" ? "Opening…" : "Open"}
          </button>
          <button type="button" class="button" disabled={!can.park || busy !== null} onClick={() => act("park")}>
            {busy === "park" ? "Parking…" : "Park"}
          </button>
          <button type="button" class="button" disabled={!can.resume || busy !== null} onClick={() => act("resume")}>
            {busy === "resume" ? "Resuming…" : "Resume"}
          </button>
          <button
            type="button"
            class="button danger"
            disabled={!can.remove || busy !== null}
            onClick={() => setConfirming(true)}
          >
            Remove
          </button>
          <a class="button" href={`/v1/workloads/${encodeURIComponent(id)}/export`} download={`${id}-export.json`}>
            Download full log
          </a>
        </div>
      }
    >
      <Notice />
      <ErrorNote error={actionError} />
      <Confirm
        open={confirming}
        title={`Remove ${workload.name}?`}
        confirm="Remove"
        danger
        onCancel={() => setConfirming(false)}
        onConfirm={() => {
          setConfirming(false);
          void act("remove");
        }}
      >
        <p>
          It stops, and its disks are deleted. Its timeline and usage stay, and its export can
          still be downloaded.
        </p>
      </Confirm>
      <div class="split">
        <section class="card" aria-labelledby="about-heading">
          <h2 id="about-heading">About</h2>
          <dl class="facts">
            <dt>State</dt>
            <dd id="workload-state">
              <StateBadge state={workload.state} />
            </dd>
            <dt>ID</dt>
            <dd class="mono">{workload.id}</dd>
            <dt>Kind</dt>
            <dd>{workload.kind}</dd>
            <dt>Class</dt>
            <dd class="mono">
              {workload.class}
              {workload.count > 1 ? ` × ${workload.count}` : ""}
            </dd>
            <dt>Region</dt>
            <dd>{workload.region}</dd>
            <dt>Placement</dt>
            <dd>
              {workload.placement ? <Placement placement={workload.placement} /> : <span class="dim">not placed yet</span>}
            </dd>
            <dt>Fallback</dt>
            <dd>
              {workload.fallback.length ? (
                workload.fallback.map((step) => stepLabel(step)).join(" → ") +
                (workload.fallback_after_s ? `, each after ${workload.fallback_after_s} s` : "")
              ) : (
                <span class="dim">none</span>
              )}
            </dd>
            <dt>Launched</dt>
            <dd>
              <time dateTime={workload.created_at}>{when(workload.created_at)}</time>
            </dd>
            {workload.replica_of ? (
              <>
                <dt>Replica of</dt>
                <dd>
                  <Link href={`/workloads/${workload.replica_of}`}>{workload.replica_of}</Link>
                </dd>
              </>
            ) : null}
            {workload.kind === "endpoint" ? (
              <>
                <dt>Model</dt>
                <dd class="mono">{String(spec.model ?? "—")}</dd>
                <dt>Runtime</dt>
                <dd>{String(spec.runtime ?? "command")}</dd>
              </>
            ) : null}
          </dl>
          {workload.kind === "endpoint" && who ? (
            <div class="snippet">
              <h3>Call it through the gateway</h3>
              <p class="hint">
                With OpenAI's Python SDK and a <Link href="/gateway-keys">gateway key</Link>:
              </p>
              <pre class="code" tabIndex={0} aria-label="Python code">
                <code>{openaiSnippet(who.gateway_url, workload.name)}</code>
              </pre>
              <CopyButton text={openaiSnippet(who.gateway_url, workload.name)} label="Copy code" />
            </div>
          ) : null}
        </section>
        <section class="card" aria-labelledby="timeline-heading">
          <div class="section-head">
            <h2 id="timeline-heading">Timeline</h2>
            <span class={`live live-${streaming ? "live" : "reconnecting"}`}>
              <span class="dot" aria-hidden="true" />
              {streaming ? "Live" : "Connecting…"}
            </span>
          </div>
          {entries === null ? (
            <Loading what="the timeline" />
          ) : entries.length === 0 ? (
            <Empty title="Nothing recorded yet" />
          ) : (
            <ol class="timeline" aria-live="polite" aria-relevant="additions">
              {entries.map((e) => (
                <li key={`${e.at}|${e.state}|${e.reason}`} class={`entry ${e.kind}`}>
                  <time dateTime={e.at}>{when(e.at)}</time>
                  <span class="entry-head">
                    {e.kind === "transition" ? <StateBadge state={e.state} /> : <span class="note-tag">note</span>}
                  </span>
                  <span class="reason">{e.reason}</span>
                  {e.request_id ? <span class="mono dim request">{e.request_id}</span> : null}
                </li>
              ))}
            </ol>
          )}
        </section>
      </div>
    </Page>
  );
}

function Placement({ placement }: { placement: Schemas["PlacementOut"] }) {
  return (
    <>
      <span class="mono">{placement.machine}</span> in {placement.region} as{" "}
      <span class="mono">{placement.placed_class}</span>
      {placement.host ? <p class="hint">{placement.host.note}</p> : null}
    </>
  );
}
