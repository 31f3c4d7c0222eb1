// A labelled form control with its hint and its error beside it: the api's message for this
// field (`details[].field`), tied to the control for screen readers.
import type { ComponentChildren } from "preact";

export function Field({
  id,
  label,
  hint,
  error,
  children,
}: {
  id: string;
  label: string;
  hint?: ComponentChildren;
  error?: string | undefined;
  children: ComponentChildren;
}) {
  return (
    <div class={`field${error ? " invalid" : ""}`}>
      <label for={id}>{label}</label>
      {children}
      {hint ? (
        <p class="hint" id={`${id}-hint`}>
          {hint}
        </p>
      ) : null}
      {error ? (
        <p class="field-error" id={`${id}-error`} role="alert">
          {error}
        </p>
      ) : null}
    </div>
  );
}

/** The aria attributes a control inside `Field` carries. */
export function described(id: string, error: string | undefined, hint = false) {
  const by = [hint ? `${id}-hint` : "", error ? `${id}-error` : ""].filter(Boolean).join(" ");
  return {
    id,
    "aria-invalid": error ? ("true" as const) : undefined,
    "aria-describedby": by || undefined,
  };
}
