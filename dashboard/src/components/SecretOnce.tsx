import { CopyButton } from "./CopyButton";

/** A secret shown once: read-only, selectable, with a copy button and the warning. */
export function SecretOnce({ label, secret, note }: { label: string; secret: string; note?: string }) {
  const id = `secret-${label.replace(/\W+/g, "-").toLowerCase()}`;
  return (
    <div class="secret" role="region" aria-label={label}>
      <label for={id}>{label}</label>
      <div class="secret-row">
        <input id={id} class="mono" readOnly value={secret} onFocus={(e) => e.currentTarget.select()} />
        <CopyButton text={secret} />
      </div>
      <p class="hint">
        {note ?? "Shown now and never again: copy it somewhere safe. Only its hash is kept."}
      </p>
    </div>
  );
}
