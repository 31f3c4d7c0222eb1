// What a page shows while it loads, when it has nothing to show, and when it failed: each
// designed, never a blank area.
import type { ComponentChildren } from "preact";
import type { ApiError } from "../api/client";
import { ErrorNote } from "./ErrorNote";

export function Loading({ what }: { what: string }) {
  return (
    <div class="state-box" role="status" aria-live="polite" aria-busy="true">
      <span class="spinner" aria-hidden="true" />
      Loading {what}…
    </div>
  );
}

export function Empty({ title, children }: { title: string; children?: ComponentChildren }) {
  return (
    <div class="state-box empty">
      <p class="empty-title">{title}</p>
      {children}
    </div>
  );
}

export function Failed({
  what,
  error,
  retry,
}: {
  what: string;
  error: ApiError | null;
  retry?: () => void;
}) {
  return (
    <div class="state-box failed">
      <ErrorNote error={error} title={`Could not load ${what}`} />
      {retry ? (
        <button type="button" class="button" onClick={retry}>
          Try again
        </button>
      ) : null}
    </div>
  );
}
