// A confirmation as a modal <dialog>: the browser keeps focus inside it and Escape cancels.
import type { ComponentChildren } from "preact";
import { useEffect, useRef } from "preact/hooks";

export function Confirm({
  open,
  title,
  children,
  confirm,
  onConfirm,
  onCancel,
  danger = false,
}: {
  open: boolean;
  title: string;
  children: ComponentChildren;
  confirm: string;
  onConfirm: () => void;
  onCancel: () => void;
  danger?: boolean;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const dialog = ref.current;
    if (dialog === null) return;
    if (open && !dialog.open) dialog.showModal?.();
    if (!open && dialog.open) dialog.close();
  }, [open]);
  return (
    <dialog ref={ref} class="dialog" aria-labelledby="confirm-title" onCancel={onCancel}>
      <h2 id="confirm-title">{title}</h2>
      <div class="dialog-body">{children}</div>
      <div class="actions">
        <button type="button" class="button" onClick={onCancel}>
          Cancel
        </button>
        <button type="button" class={`button ${danger ? "danger" : "primary"}`} onClick={onConfirm}>
          {confirm}
        </button>
      </div>
    </dialog>
  );
}
