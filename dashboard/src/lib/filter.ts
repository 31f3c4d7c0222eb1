// The workloads list's filters and search, as plain functions (filter.test.ts).
import type { Workload, WorkloadKind, WorkloadState } from "../api/client";

export interface Filters {
  /** A state, "active" (every state but removed), or "all". */
  state: WorkloadState | "active" | "all";
  kind: WorkloadKind | "all";
  /** Words that must each appear in the id, name, class, machine or region. */
  search: string;
}

export const NO_FILTERS: Filters = { state: "active", kind: "all", search: "" };

function haystack(w: Workload): string {
  return [w.id, w.name, w.class, w.kind, w.state, w.region, w.placement?.machine ?? ""]
    .join(" ")
    .toLowerCase();
}

export function matches(w: Workload, f: Filters): boolean {
  if (f.state === "active" ? w.state === "removed" : f.state !== "all" && w.state !== f.state) {
    return false;
  }
  if (f.kind !== "all" && w.kind !== f.kind) return false;
  const words = f.search.toLowerCase().split(/\s+/).filter(Boolean);
  if (words.length === 0) return true;
  const text = haystack(w);
  return words.every((word) => text.includes(word));
}

/** Filters as a query string (so a filtered list is a link), and back. */
export function toQuery(f: Filters): string {
  const q = new URLSearchParams();
  if (f.state !== NO_FILTERS.state) q.set("state", f.state);
  if (f.kind !== NO_FILTERS.kind) q.set("kind", f.kind);
  if (f.search) q.set("q", f.search);
  const s = q.toString();
  return s ? `?${s}` : "";
}

const STATES = new Set([
  "pending", "queued", "scheduled", "starting", "running", "parking", "parked", "removing",
  "removed", "failed", "preempted", "active", "all",
]);
const KINDS = new Set(["notebook", "endpoint", "vm", "all"]);

export function fromQuery(q: URLSearchParams): Filters {
  const state = q.get("state") ?? NO_FILTERS.state;
  const kind = q.get("kind") ?? NO_FILTERS.kind;
  return {
    state: (STATES.has(state) ? state : NO_FILTERS.state) as Filters["state"],
    kind: (KINDS.has(kind) ? kind : NO_FILTERS.kind) as Filters["kind"],
    search: q.get("q") ?? "",
  };
}
