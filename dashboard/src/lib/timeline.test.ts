import { describe, expect, it } from "vitest";
import { type Entry, newestFirst, openaiSnippet } from "./timeline";

const e = (at: string, state: Entry["state"], reason: string): Entry => ({
  at,
  kind: "transition",
  state,
  reason,
});

describe("the timeline", () => {
  it("is newest first, each entry once, whether it came from a page or the stream", () => {
    const page = [e("2026-12-01T12:00:00Z", "pending", "created"), e("2026-12-01T12:00:01Z", "scheduled", "placed")];
    const streamed = [e("2026-12-01T12:00:01.000000Z", "scheduled", "placed"), e("2026-12-01T12:00:03Z", "running", "up")];
    expect(newestFirst([...page, ...streamed]).map((x) => x.state)).toEqual([
      "running",
      "scheduled",
      "pending",
    ]);
  });
  it("gives the code that calls an endpoint through the gateway", () => {
    const code = openaiSnippet("http://127.0.0.1:8082/v1", 'chat"bot');
    expect(code).toContain('OpenAI(base_url="http://127.0.0.1:8082/v1"');
    expect(code).toContain('model="chat\\"bot"'); // a name cannot break out of the string
  });
});
