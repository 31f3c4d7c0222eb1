// The launch form as the api's body, and the api's field names as the form's (launch.test.ts).
import type { MachineClass, Schemas } from "../api/client";
import { mib, trim } from "./format";

export interface LaunchForm {
  kind: "notebook" | "endpoint" | "vm";
  name: string;
  class: string;
  count: string;
  region: string;
  fallback: string;
  fallbackAfter: string;
  model: string;
  runtime: string;
  replicas: string;
  contextLength: string;
}

/** A number the person typed, or the text itself (so the api names what is wrong with it). */
function number(text: string): number {
  const n = Number(text.trim());
  return text.trim() !== "" && Number.isFinite(n) ? n : (text as unknown as number);
}

export function buildLaunch(form: LaunchForm): Schemas["WorkloadCreate"] {
  const body: Schemas["WorkloadCreate"] = {
    kind: form.kind,
    class: form.class,
    count: number(form.count || "1"),
  };
  if (form.name.trim()) body.name = form.name.trim();
  if (form.region) body.region = form.region;
  const fallback = parseFallback(form.fallback);
  if (fallback.length) body.fallback = fallback;
  if (form.fallbackAfter.trim()) body.fallback_after_s = number(form.fallbackAfter);
  if (form.kind === "endpoint") {
    const spec: Record<string, unknown> = { runtime: form.runtime };
    if (form.model.trim()) spec.model = form.model.trim();
    if (form.replicas.trim() && form.replicas.trim() !== "1") spec.replicas = number(form.replicas);
    if (form.contextLength.trim()) spec.context_length = number(form.contextLength);
    body.spec = spec;
  }
  return body;
}

export type FallbackStep = Schemas["FallbackStepIn"];
/**
 * The chain as typed, one step per comma: `kind:value` as the CLI's `--fallback` takes it
 * (`class:a100-80gb, region:office, machine:m-1, model:chat, replicas:1`); a bare name is a
 * class. An unknown kind is sent as typed, so the api names the step that is wrong.
 */
export function parseFallback(text: string): FallbackStep[] {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)
    .map((step) => {
      const colon = step.indexOf(":");
      if (colon < 0) return { class: step };
      const kind = step.slice(0, colon).trim();
      const value = step.slice(colon + 1).trim();
      if (kind === "replicas") return { replicas: number(value) };
      return { [kind]: value } as FallbackStep;
    });
}

/** A stored step as a person reads it: "class a100-80gb", "region office", "1 replica". */
export function stepLabel(step: Record<string, unknown>): string {
  if (typeof step.replicas === "number") {
    return `${step.replicas} replica${step.replicas === 1 ? "" : "s"}`;
  }
  for (const kind of ["class", "machine", "region", "model"]) {
    if (typeof step[kind] === "string") return `${kind} ${step[kind] as string}`;
  }
  return JSON.stringify(step);
}

const FIELDS: Record<string, keyof LaunchForm> = {
  kind: "kind",
  name: "name",
  class: "class",
  count: "count",
  region: "region",
  fallback_after_s: "fallbackAfter",
  "spec.model": "model",
  "spec.runtime": "runtime",
  "spec.replicas": "replicas",
  "spec.context_length": "contextLength",
  "spec.command": "model",
};

/** The form field an api error's `field` names (`fallback.0` is the fallback field). */
export function fieldOf(apiField: string): keyof LaunchForm | null {
  if (apiField === "fallback" || apiField.startsWith("fallback.")) return "fallback";
  return FIELDS[apiField] ?? null;
}

/** "cpu-1c-2g · 1 CPU, 2 GiB · 3 free now" (or "none offered now"). */
export function classLabel(c: MachineClass): string {
  const what =
    c.accelerator === "cpu"
      ? `${trim(c.cpus)} CPU${c.cpus === 1 ? "" : "s"}, ${mib(c.memory_gib * 1024)}`
      : c.mig_profile
        ? `MIG ${c.mig_profile} slice of ${c.model ?? c.accelerator}`
        : `${c.model ?? c.accelerator}, ${mib(c.memory_gib * 1024)}${c.automatic ? " (automatic)" : ""}`;
  const free =
    c.regions.length === 0
      ? "none offered now"
      : c.free === undefined || c.free === null
        ? `in ${c.regions.join(", ")}`
        : `${c.free} free now`;
  return `${c.name} · ${what} · ${free}`;
}
