import { describe, expect, it } from "vitest";
import type { MachineClass } from "../api/client";
import { buildLaunch, classLabel, fieldOf, type LaunchForm, stepLabel } from "./launch";

const form: LaunchForm = {
  kind: "notebook",
  name: "",
  class: "cpu-1c-2g",
  count: "1",
  region: "",
  fallback: "",
  fallbackAfter: "",
  model: "",
  runtime: "llamacpp",
  replicas: "1",
  contextLength: "",
};

describe("the launch body", () => {
  it("sends only what was chosen", () => {
    expect(buildLaunch(form)).toEqual({ kind: "notebook", class: "cpu-1c-2g", count: 1 });
  });
  it("keeps the fallback steps in order, a bare name being a class", () => {
    const body = buildLaunch({
      ...form,
      fallback: " cpu-4c-16g, ,region: office, machine:m-1,replicas:1, model:chat ",
      fallbackAfter: "30",
    });
    expect(body.fallback).toEqual([
      { class: "cpu-4c-16g" },
      { region: "office" },
      { machine: "m-1" },
      { replicas: 1 },
      { model: "chat" },
    ]);
    expect(body.fallback_after_s).toBe(30);
  });
  it("labels stored steps in words", () => {
    expect(stepLabel({ class: "a100-80gb" })).toBe("class a100-80gb");
    expect(stepLabel({ machine: "m-1", region: "office" })).toBe("machine m-1");
    expect(stepLabel({ replicas: 1 })).toBe("1 replica");
  });
  it("puts an endpoint's model and runtime in its spec", () => {
    const body = buildLaunch({
      ...form,
      kind: "endpoint",
      name: "chat",
      model: " /m/qwen.gguf ",
      replicas: "2",
      contextLength: "2048",
    });
    expect(body).toMatchObject({
      kind: "endpoint",
      name: "chat",
      spec: { runtime: "llamacpp", model: "/m/qwen.gguf", replicas: 2, context_length: 2048 },
    });
  });
  it("sends what is not a number as typed, so the api names the field", () => {
    expect(buildLaunch({ ...form, count: "two" }).count).toBe("two");
  });
  it("maps the api's field names to the form's", () => {
    expect(fieldOf("spec.model")).toBe("model");
    expect(fieldOf("fallback.1")).toBe("fallback");
    expect(fieldOf("class")).toBe("class");
    expect(fieldOf("spec.unknown")).toBeNull();
  });
});

describe("a class as the picker shows it", () => {
  const cls = (over: Partial<MachineClass>): MachineClass => ({
    name: "cpu-1c-2g",
    accelerator: "cpu",
    description: "",
    model: null,
    memory_gib: 2,
    cpus: 1,
    regions: ["local"],
    ...over,
  });
  it("says what it is and what is free now", () => {
    expect(classLabel(cls({ free: 3 }))).toBe("cpu-1c-2g · 1 CPU, 2 GiB · 3 free now");
    expect(classLabel(cls({ regions: [] }))).toBe("cpu-1c-2g · 1 CPU, 2 GiB · none offered now");
    expect(
      classLabel(cls({ name: "l40s-48gb", accelerator: "nvidia", model: "NVIDIA L40S", memory_gib: 48, free: 0 })),
    ).toBe("l40s-48gb · NVIDIA L40S, 48 GiB · 0 free now");
  });
  it("names a MIG slice and an automatic class as such", () => {
    const slice = { name: "h200-1g.18gb", accelerator: "nvidia" as const, model: "H200", memory_gib: 16 };
    expect(classLabel(cls({ ...slice, mig_profile: "1g.18gb", automatic: true, free: 2 }))).toBe(
      "h200-1g.18gb · MIG 1g.18gb slice of H200 · 2 free now",
    );
    const nvl = { name: "h200-nvl-140gb", accelerator: "nvidia" as const, model: "H200 NVL" };
    expect(classLabel(cls({ ...nvl, memory_gib: 140, automatic: true, free: 1 }))).toBe(
      "h200-nvl-140gb · H200 NVL, 140 GiB (automatic) · 1 free now",
    );
  });
});
