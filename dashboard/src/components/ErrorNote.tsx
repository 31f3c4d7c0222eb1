// An api error as a person reads it: what went wrong, in the api's words, and the request ID
// to quote when asking for help (the operator finds every log line of it by that ID).
import type { ApiError } from "../api/client";

export function ErrorNote({ error, title }: { error: ApiError | null; title?: string }) {
  if (error === null) return null;
  return (
    <div class="error-note" role="alert">
      {title ? <strong>{title}: </strong> : null}
      <span class="error-message">{error.message}</span>
      {error.requestId ? (
        <span class="request-id">
          {" "}
          Request ID <code>{error.requestId}</code>
        </span>
      ) : null}
    </div>
  );
}
