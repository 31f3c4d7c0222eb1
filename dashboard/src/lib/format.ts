// How numbers, times and states read on a page. Plain functions, tested alone (format.test.ts).
import type { WorkloadState } from "../api/client";

/** "45 s", "3 min", "2 h", "5 d": how long ago `iso` was, from `now`. */
export function age(iso: string, now: number = Date.now()): string {
  const seconds = Math.max(0, Math.floor((now - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h`;
  return `${Math.floor(hours / 24)} d`;
}

/** "2026-12-01 14:03:07" in the reader's own time zone. */
export function when(iso: string): string {
  const d = new Date(iso);
  const pad = (n: number) => String(n).padStart(2, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

/** MiB as "512 MiB", "16 GiB", "1.5 TiB". */
export function mib(value: number): string {
  if (value < 1024) return `${value} MiB`;
  const gib = value / 1024;
  if (gib < 1024) return `${trim(gib)} GiB`;
  return `${trim(gib / 1024)} TiB`;
}

/** A number with at most one decimal, none when it rounds to a whole one. */
export function trim(value: number): string {
  return String(Math.round(value * 10) / 10);
}

/** Hours as "0.25 h", "12 h", "1,234 h". */
export function hours(value: number): string {
  if (value === 0) return "0 h";
  if (value < 10) return `${value.toFixed(2)} h`;
  return `${Math.round(value).toLocaleString("en")} h`;
}

/** Token counts as "950", "12.3 k", "4.5 M". */
export function tokens(value: number): string {
  if (value < 1000) return String(value);
  if (value < 1_000_000) return `${trim(value / 1000)} k`;
  return `${trim(value / 1_000_000)} M`;
}

export type Tone = "ok" | "busy" | "idle" | "bad" | "gone";

/** How a state looks: running is ok, the way there busy, parked idle, failed bad. */
export function tone(state: WorkloadState): Tone {
  switch (state) {
    case "running":
      return "ok";
    case "pending":
    case "queued":
    case "scheduled":
    case "starting":
    case "parking":
    case "removing":
      return "busy";
    case "parked":
      return "idle";
    case "failed":
    case "preempted":
      return "bad";
    case "removed":
      return "gone";
  }
}

/** The user's actions a state allows (the api refuses the others with a 409 anyway). */
export function actions(state: WorkloadState): { park: boolean; resume: boolean; remove: boolean; open: boolean } {
  return {
    park: ["pending", "queued", "scheduled", "starting", "running"].includes(state),
    resume: ["parked", "failed", "preempted"].includes(state),
    remove: !["removing", "removed"].includes(state),
    open: state === "running",
  };
}
