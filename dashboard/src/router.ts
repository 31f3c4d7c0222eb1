// The dashboard's routes: the api serves index.html at each of these paths (SPA_PATHS in
// services/api/src/einsora/api/dashboard.py; router.test.ts checks the two agree), and this
// picks the page from the path, with the History API, without reloading.
import { signal } from "@preact/signals";

export const ROUTES = [
  "/",
  "/sign-in",
  "/join",
  "/workloads",
  "/workloads/{id}",
  "/launch",
  "/machines",
  "/usage",
  "/gateway-keys",
  "/tokens",
  "/members",
  "/account",
] as const;

export type Route = (typeof ROUTES)[number];

export interface Match {
  route: Route | null;
  params: Record<string, string>;
}

/** The route a path names, with its parameters (`{id}`), or route null. */
export function match(path: string): Match {
  const parts = path.split("/").filter(Boolean);
  for (const route of ROUTES) {
    const pattern = route.split("/").filter(Boolean);
    if (pattern.length !== parts.length) continue;
    const params: Record<string, string> = {};
    let fits = true;
    pattern.forEach((piece, i) => {
      const part = parts[i] ?? "";
      if (piece.startsWith("{")) params[piece.slice(1, -1)] = decodeURIComponent(part);
      else if (piece !== part) fits = false;
    });
    if (fits) return { route, params };
  }
  return { route: null, params: {} };
}

const here = () =>
  typeof location === "undefined" ? "/" : location.pathname + location.search;

/** The current path and query, as a signal the app renders from. */
export const location$ = signal(here());

export function navigate(to: string, { replace = false } = {}): void {
  if (to === here()) return;
  if (replace) history.replaceState(null, "", to);
  else history.pushState(null, "", to);
  location$.value = here();
  window.scrollTo?.(0, 0);
}

if (typeof window !== "undefined") {
  window.addEventListener("popstate", () => {
    location$.value = here();
  });
}

/** The query parameters of the current location. */
export function query(): URLSearchParams {
  const at = location$.value;
  const q = at.indexOf("?");
  return new URLSearchParams(q >= 0 ? at.slice(q + 1) : "");
}
