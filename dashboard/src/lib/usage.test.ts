import { describe, expect, it } from "vitest";
import { MAX_SERIES, days, niceMax, stack, totals } from "./usage";

const item = (group: string, gpu: number, tokens = 0) => ({
  group,
  gpu_hours: gpu,
  cpu_core_hours: 0,
  prompt_tokens: tokens,
  completion_tokens: 0,
});

describe("usage series", () => {
  it("are the UTC days of the window, today last", () => {
    expect(days(3, new Date("2026-12-01T23:30:00Z"))).toEqual(["2026-11-29", "2026-11-30", "2026-12-01"]);
  });
  it("stack per-day reports by group, biggest first", () => {
    const series = stack(["d1", "d2"], [[item("a", 1), item("b", 3)], [item("a", 2)]], "gpu_hours");
    expect(series).toEqual([
      { name: "a", values: [1, 2], total: 3 },
      { name: "b", values: [3, 0], total: 3 },
    ]);
  });
  it("fold the smallest groups into one, and drop what a label hides", () => {
    const many = Array.from({ length: MAX_SERIES + 2 }, (_, i) => item(`g${i}`, i + 1));
    const series = stack(["d"], [many], "gpu_hours");
    expect(series).toHaveLength(MAX_SERIES);
    expect(series.at(-1)?.name).toBe("3 others");
    expect(series.at(-1)?.total).toBe(1 + 2 + 3);
    expect(stack(["d"], [[item("w-1", 1), item("w-2", 2)]], "gpu_hours", (g) => (g === "w-2" ? "chat" : null))).toEqual([
      { name: "chat", values: [2], total: 2 },
    ]);
  });
  it("count tokens as prompt and completion together", () => {
    expect(totals(["2026-12-01"], [item("2026-12-01", 0, 7)], "tokens")[0]?.values).toEqual([7]);
    expect(totals(["2026-12-01"], [], "tokens")).toEqual([]);
  });
  it("round the axis up to 1, 2 or 5 of a power of ten", () => {
    expect(niceMax(0)).toBe(1);
    expect(niceMax(0.3)).toBe(0.5);
    expect(niceMax(7)).toBe(10);
    expect(niceMax(120)).toBe(200);
  });
});
