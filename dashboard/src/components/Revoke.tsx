// A revoke button that asks first, naming what stops working.
import { useState } from "preact/hooks";
import { Confirm } from "./Confirm";

export function RevokeButton({
  what,
  consequence,
  onRevoke,
}: {
  what: string;
  consequence: string;
  onRevoke: () => Promise<void>;
}) {
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  return (
    <>
      <button
        type="button"
        class="button small danger"
        disabled={busy}
        aria-label={`Revoke ${what}`}
        onClick={() => setAsking(true)}
      >
        {busy ? "Revoking…" : "Revoke"}
      </button>
      <Confirm
        open={asking}
        title={`Revoke ${what}?`}
        confirm="Revoke"
        danger
        onCancel={() => setAsking(false)}
        onConfirm={async () => {
          setAsking(false);
          setBusy(true);
          try {
            await onRevoke();
          } finally {
            setBusy(false);
          }
        }}
      >
        <p>{consequence}</p>
      </Confirm>
    </>
  );
}
