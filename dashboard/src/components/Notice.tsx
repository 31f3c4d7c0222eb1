import { notice } from "../state/notice";

/** The pending notice, in a polite live region, with a button to dismiss it. */
export function Notice() {
  const message = notice.value;
  return (
    <div class="notice-slot" role="status" aria-live="polite">
      {message ? (
        <div class="notice">
          <span>{message}</span>
          <button type="button" class="button small" onClick={() => (notice.value = null)}>
            Dismiss
          </button>
        </div>
      ) : null}
    </div>
  );
}
