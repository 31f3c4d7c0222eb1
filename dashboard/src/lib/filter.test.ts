import { describe, expect, it } from "vitest";
import type { Workload } from "../api/client";
import { NO_FILTERS, fromQuery, matches, toQuery } from "./filter";

const workload = (over: Partial<Workload>): Workload => ({
  id: "w-01m8t50rn6yq5t05paw4",
  tenant_id: "t-1",
  name: "notebook-05paw4",
  kind: "notebook",
  class: "cpu-1c-2g",
  count: 1,
  region: "local",
  spec: {},
  fallback: [],
  state: "running",
  placement: { region: "local", machine: "m-gpubox", placed_class: "cpu-1c-2g" },
  created_at: "2026-12-01T12:00:00Z",
  updated_at: "2026-12-01T12:00:00Z",
  ...over,
});

describe("filters", () => {
  it("hide removed workloads unless asked", () => {
    expect(matches(workload({ state: "removed" }), NO_FILTERS)).toBe(false);
    expect(matches(workload({ state: "removed" }), { ...NO_FILTERS, state: "all" })).toBe(true);
    expect(matches(workload({ state: "parked" }), { ...NO_FILTERS, state: "running" })).toBe(false);
  });
  it("filter by kind", () => {
    expect(matches(workload({ kind: "vm" }), { ...NO_FILTERS, kind: "notebook" })).toBe(false);
    expect(matches(workload({ kind: "vm" }), { ...NO_FILTERS, kind: "vm" })).toBe(true);
  });
  it("search every word in the id, name, class and machine, in any case", () => {
    const w = workload({});
    expect(matches(w, { ...NO_FILTERS, search: "GPUBOX" })).toBe(true);
    expect(matches(w, { ...NO_FILTERS, search: "05paw4 cpu-1c" })).toBe(true);
    expect(matches(w, { ...NO_FILTERS, search: "05paw4 l40s" })).toBe(false);
    expect(matches(w, { ...NO_FILTERS, search: "   " })).toBe(true);
  });
  it("live in the address, and come back from it the same (unknown values ignored)", () => {
    const f = { state: "parked", kind: "endpoint", search: "chat bot" } as const;
    expect(fromQuery(new URLSearchParams(toQuery(f).slice(1)))).toEqual(f);
    expect(toQuery(NO_FILTERS)).toBe("");
    expect(fromQuery(new URLSearchParams("state=<script>&kind=nope"))).toEqual(NO_FILTERS);
  });
});
