// The tenant's workloads, live: every page of GET /v1/workloads once, then the event stream
// (GET /v1/events, server-sent events) moves each row as the scheduler changes it. Each
// workload is a signal of its own, so a change re-renders its row and nothing else.
//
// EventSource reconnects by itself and sends Last-Event-ID, so the api resumes the stream
// where it broke: nothing is missed or applied twice. A change for a workload this page has
// not seen (launched elsewhere) fetches it.
import { type Signal, batch, computed, signal } from "@preact/signals";
import {
  allPages,
  api,
  ok,
  type Snapshot,
  type Workload,
  type WorkloadChange,
  ApiError,
} from "../api/client";

export type Load = "idle" | "loading" | "ready" | "failed";
export type Stream = "connecting" | "live" | "reconnecting" | "closed";

export const rows = new Map<string, Signal<Workload>>();
/** The ids, newest first; a new array whenever a workload comes or goes. */
export const ids = signal<string[]>([]);
export const load = signal<Load>("idle");
export const loadError = signal<ApiError | null>(null);
export const stream = signal<Stream>("closed");
/** The last change applied per workload, for its row's reason. */
export const reasons = new Map<string, Signal<string>>();

let source: EventSource | null = null;
const fetching = new Set<string>();

function reorder(): void {
  ids.value = [...rows.values()]
    .map((r) => r.value)
    .sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0))
    .map((w) => w.id);
}

/** Put a workload in (or replace it), keeping the order. */
export function upsert(workload: Workload): void {
  const row = rows.get(workload.id);
  if (row !== undefined) {
    row.value = workload;
    return;
  }
  rows.set(workload.id, signal(workload));
  reorder();
}

/** Apply one change (or a snapshot's entry) to its row; false when the row is unknown. */
export function apply(change: WorkloadChange): boolean {
  const row = rows.get(change.workload_id);
  if (row === undefined) return false;
  const w = row.value;
  // A change older than what the row shows already (read after it) changes nothing.
  if (Date.parse(w.updated_at) > Date.parse(change.at)) return true;
  row.value = {
    ...w,
    state: change.state,
    updated_at: change.at,
    placement: change.placement ?? w.placement ?? null,
  };
  const reason = reasons.get(change.workload_id);
  if (reason === undefined) reasons.set(change.workload_id, signal(change.reason));
  else reason.value = change.reason;
  return true;
}

async function fetchOne(id: string): Promise<void> {
  if (fetching.has(id)) return;
  fetching.add(id);
  try {
    upsert(await ok(api.GET("/v1/workloads/{id}", { params: { path: { id } } })));
  } catch {
    // Gone again, or not ours: the next change or snapshot says what it is.
  } finally {
    fetching.delete(id);
  }
}

function received(changes: WorkloadChange[]): void {
  batch(() => {
    for (const change of changes) {
      if (!apply(change)) void fetchOne(change.workload_id);
    }
  });
}

/** Load every workload, then follow the stream (once per page load; later calls reuse it). */
export async function start(): Promise<void> {
  if (load.value === "loading" || load.value === "ready") return;
  load.value = "loading";
  loadError.value = null;
  try {
    const all = await allPages((cursor) =>
      ok(api.GET("/v1/workloads", { params: { query: { limit: 200, cursor } } })),
    );
    batch(() => {
      rows.clear();
      for (const w of all) rows.set(w.id, signal(w));
      reorder();
    });
    load.value = "ready";
  } catch (error) {
    loadError.value =
      error instanceof ApiError ? error : new ApiError(0, "internal", String(error), null);
    load.value = "failed";
    return;
  }
  follow();
}

function follow(): void {
  if (source !== null) return;
  stream.value = "connecting";
  source = new EventSource("/v1/events");
  source.addEventListener("open", () => {
    stream.value = "live";
  });
  source.addEventListener("error", () => {
    stream.value = source?.readyState === EventSource.CLOSED ? "closed" : "reconnecting";
  });
  source.addEventListener("snapshot", (event) => {
    const snapshot = JSON.parse((event as MessageEvent<string>).data) as Snapshot;
    received(snapshot.workloads);
  });
  source.addEventListener("workload", (event) => {
    const data = (event as MessageEvent<string>).data;
    if (data) received([JSON.parse(data) as WorkloadChange]);
  });
}

/** Stop following and forget everything (signing out). */
export function stop(): void {
  source?.close();
  source = null;
  stream.value = "closed";
  rows.clear();
  reasons.clear();
  ids.value = [];
  load.value = "idle";
}

/** How many workloads are in each state (for the filter's counts). */
export const counts = computed(() => {
  const found: Record<string, number> = {};
  for (const id of ids.value) {
    const state = rows.get(id)?.value.state;
    if (state !== undefined) found[state] = (found[state] ?? 0) + 1;
  }
  return found;
});
