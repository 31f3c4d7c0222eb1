import { render, screen } from "@testing-library/preact";
import { describe, expect, it } from "vitest";
import { ApiError } from "../api/client";
import { Bars } from "./Bars";
import { ErrorNote } from "./ErrorNote";
import { Field, described } from "./Field";
import { StateBadge } from "./StateBadge";

describe("components", () => {
  it("an error shows the api's message and its request ID", () => {
    const error = new ApiError(409, "conflict", "resume a running workload? it is running", "req-01abc");
    render(<ErrorNote error={error} />);
    const alert = screen.getByRole("alert");
    expect(alert.textContent).toContain("it is running");
    expect(alert.textContent).toContain("req-01abc");
  });

  it("a field's error is beside it, and tied to its control", () => {
    render(
      <Field id="launch-model" label="Model file" error="pickle weights are refused">
        <input {...described("launch-model", "pickle weights are refused")} />
      </Field>,
    );
    const input = screen.getByLabelText("Model file");
    expect(input.getAttribute("aria-invalid")).toBe("true");
    expect(input.getAttribute("aria-describedby")).toBe("launch-model-error");
    expect(document.getElementById("launch-model-error")?.textContent).toBe("pickle weights are refused");
  });

  it("a state is spelled out, not colour alone", () => {
    render(<StateBadge state="failed" />);
    const badge = screen.getByText("failed");
    expect(badge.className).toContain("tone-bad");
  });

  it("a chart stacks each day's groups and says what it shows", () => {
    const { container } = render(
      <Bars
        days={["2026-11-30", "2026-12-01"]}
        series={[
          { name: "a", values: [1, 2], total: 3 },
          { name: "b", values: [0, 1], total: 1 },
        ]}
        format={(v) => `${v} h`}
        label="GPU-hours per day"
      />,
    );
    expect(container.querySelectorAll("rect")).toHaveLength(3); // no bar for a zero
    expect(screen.getByRole("img").getAttribute("aria-label")).toBe("GPU-hours per day: 4 h over 2 days");
    expect(screen.getByText("b")).toBeTruthy(); // the legend
  });
});
