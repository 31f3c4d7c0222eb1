import { beforeEach, describe, expect, it } from "vitest";
import type { Workload } from "../api/client";
import { apply, ids, reasons, rows, stop, upsert } from "./live";

const workload = (id: string, created: string): Workload => ({
  id,
  tenant_id: "t-1",
  name: id,
  kind: "notebook",
  class: "cpu-1c-2g",
  count: 1,
  region: "local",
  spec: {},
  fallback: [],
  state: "pending",
  placement: null,
  created_at: created,
  updated_at: created,
});

describe("the live list", () => {
  beforeEach(() => stop());

  it("keeps the newest first as workloads come", () => {
    upsert(workload("w-old", "2026-12-01T10:00:00Z"));
    upsert(workload("w-new", "2026-12-01T11:00:00Z"));
    expect(ids.value).toEqual(["w-new", "w-old"]);
  });

  it("moves a row with a change, placement and reason included, and only that row", () => {
    upsert(workload("w-a", "2026-12-01T10:00:00Z"));
    upsert(workload("w-b", "2026-12-01T10:00:01Z"));
    const before = rows.get("w-b")?.value;
    const applied = apply({
      seq: 7,
      workload_id: "w-a",
      kind: "transition",
      state: "running",
      reason: "running on m-1",
      at: "2026-12-01T10:00:05Z",
      placement: { region: "local", machine: "m-1", placed_class: "cpu-1c-2g" },
    });
    expect(applied).toBe(true);
    expect(rows.get("w-a")?.value.state).toBe("running");
    expect(rows.get("w-a")?.value.placement?.machine).toBe("m-1");
    expect(reasons.get("w-a")?.value).toBe("running on m-1");
    expect(rows.get("w-b")?.value).toBe(before); // the same object: its row does not re-render
  });

  it("ignores a change older than what the row shows, and says when a row is unknown", () => {
    upsert({ ...workload("w-a", "2026-12-01T10:00:00Z"), state: "parked", updated_at: "2026-12-01T10:05:00Z" });
    apply({ seq: 3, workload_id: "w-a", kind: "transition", state: "running", reason: "", at: "2026-12-01T10:01:00Z" });
    expect(rows.get("w-a")?.value.state).toBe("parked");
    expect(
      apply({ seq: 4, workload_id: "w-zzz", kind: "note", state: "queued", reason: "", at: "2026-12-01T10:01:00Z" }),
    ).toBe(false);
  });
});
