import type { WorkloadState } from "../api/client";
import { tone } from "../lib/format";

/** A workload's state, coloured by what it means (and always spelled out, never colour alone). */
export function StateBadge({ state }: { state: WorkloadState }) {
  return <span class={`badge tone-${tone(state)}`}>{state}</span>;
}
