// Usage over time as chart series: one bar per day, stacked by group (usage.test.ts).
import type { Schemas } from "../api/client";

export type Measure = "gpu_hours" | "cpu_core_hours" | "tokens";
export type Breakdown = "total" | "class" | "user" | "endpoint";
type Item = Schemas["UsageItemOut"];

export function valueOf(item: Item, measure: Measure): number {
  return measure === "tokens" ? item.prompt_tokens + item.completion_tokens : item[measure];
}

/** The UTC days of a window ending today: ["2026-11-25", …, "2026-12-01"]. */
export function days(count: number, today: Date = new Date()): string[] {
  const end = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
  const out: string[] = [];
  for (let i = count - 1; i >= 0; i -= 1) {
    out.push(new Date(end - i * 86_400_000).toISOString().slice(0, 10));
  }
  return out;
}

export interface Series {
  /** The group (a class, a username, an endpoint's name; "total" for the whole tenant). */
  name: string;
  values: number[];
  total: number;
}

export const MAX_SERIES = 6;

/** Series over `dayList` from per-day reports (`perDay[i]` is the report of day i), the
 * biggest first; groups past MAX_SERIES - 1 summed as "other". `label` names a group. */
export function stack(
  dayList: string[],
  perDay: Item[][],
  measure: Measure,
  label: (group: string) => string | null = (g) => g,
): Series[] {
  const byName = new Map<string, number[]>();
  perDay.forEach((items, day) => {
    for (const item of items) {
      const name = label(item.group);
      if (name === null) continue;
      const values = byName.get(name) ?? new Array<number>(dayList.length).fill(0);
      values[day] = (values[day] ?? 0) + valueOf(item, measure);
      byName.set(name, values);
    }
  });
  const all = [...byName.entries()]
    .map(([name, values]) => ({ name, values, total: values.reduce((a, b) => a + b, 0) }))
    .filter((s) => s.total > 0)
    .sort((a, b) => b.total - a.total || a.name.localeCompare(b.name));
  if (all.length <= MAX_SERIES) return all;
  const kept = all.slice(0, MAX_SERIES - 1);
  const rest = all.slice(MAX_SERIES - 1);
  const other = new Array<number>(dayList.length).fill(0);
  for (const s of rest) s.values.forEach((v, i) => (other[i] = (other[i] ?? 0) + v));
  return [...kept, { name: `${rest.length} others`, values: other, total: other.reduce((a, b) => a + b, 0) }];
}

/** The day-grouped report (group "YYYY-MM-DD") as one series per day list. */
export function totals(dayList: string[], items: Item[], measure: Measure): Series[] {
  const values = dayList.map((d) => {
    const item = items.find((i) => i.group === d);
    return item ? valueOf(item, measure) : 0;
  });
  const total = values.reduce((a, b) => a + b, 0);
  return total > 0 ? [{ name: "total", values, total }] : [];
}

/** A round top for the y axis: 1, 2, 5 × 10^n at or above `max`. */
export function niceMax(max: number): number {
  if (max <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}
