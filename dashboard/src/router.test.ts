import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ROUTES, match } from "./router";
import { nextPath } from "./pages/SignIn";

describe("the router", () => {
  it("has exactly the paths the api serves the app at", () => {
    // Vitest runs in dashboard/.
    const source = readFileSync("../services/api/src/einsora/api/dashboard.py", "utf8");
    const block = source.slice(source.indexOf("SPA_PATHS = ("), source.indexOf(")\n", source.indexOf("SPA_PATHS = (")));
    const served = [...block.matchAll(/"([^"]+)"/g)].map((m) => m[1]);
    expect(served).toEqual([...ROUTES]);
  });
  it("matches a path to its page, with its parameters", () => {
    expect(match("/workloads/w-01m8t50rn6yq5t05paw4")).toEqual({
      route: "/workloads/{id}",
      params: { id: "w-01m8t50rn6yq5t05paw4" },
    });
    expect(match("/workloads")).toEqual({ route: "/workloads", params: {} });
    expect(match("/workloads/a/b").route).toBeNull();
  });
  it("goes back after signing in only to a page of this app", () => {
    expect(nextPath("/usage?x=1")).toBe("/usage?x=1");
    for (const bad of [null, "https://evil.example/", "//evil.example", "/\\evil.example", "javascript:alert(1)"]) {
      expect(nextPath(bad)).toBe("/workloads");
    }
  });
});
