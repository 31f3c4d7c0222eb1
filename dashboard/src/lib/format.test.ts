import { describe, expect, it } from "vitest";
import { actions, age, hours, mib, tokens, tone } from "./format";

describe("format", () => {
  const now = Date.parse("2026-12-01T12:00:00Z");
  it("says how long ago, in the largest unit that fits", () => {
    expect(age("2026-12-01T11:59:15Z", now)).toBe("45 s");
    expect(age("2026-12-01T11:57:00Z", now)).toBe("3 min");
    expect(age("2026-12-01T09:00:00Z", now)).toBe("3 h");
    expect(age("2026-11-26T12:00:00Z", now)).toBe("5 d");
    expect(age("2026-12-01T12:00:05Z", now)).toBe("0 s"); // a clock a little ahead
  });
  it("reads sizes and counts as people write them", () => {
    expect(mib(512)).toBe("512 MiB");
    expect(mib(23_585)).toBe("23 GiB");
    expect(mib(24_166)).toBe("23.6 GiB");
    expect(mib(16 * 1024)).toBe("16 GiB");
    expect(hours(0)).toBe("0 h");
    expect(hours(0.25)).toBe("0.25 h");
    expect(hours(1234.4)).toBe("1,234 h");
    expect(tokens(950)).toBe("950");
    expect(tokens(12_300)).toBe("12.3 k");
  });
  it("colours a state by what it means", () => {
    expect(tone("running")).toBe("ok");
    expect(tone("queued")).toBe("busy");
    expect(tone("parked")).toBe("idle");
    expect(tone("failed")).toBe("bad");
    expect(tone("removed")).toBe("gone");
  });
  it("offers only the actions a state allows", () => {
    expect(actions("running")).toEqual({ park: true, resume: false, remove: true, open: true });
    expect(actions("parked")).toEqual({ park: false, resume: true, remove: true, open: false });
    expect(actions("removed")).toEqual({ park: false, resume: false, remove: false, open: false });
  });
});
