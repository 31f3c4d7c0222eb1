import { useState } from "preact/hooks";

/** Copies `text`; says so (or says to copy it by hand where the browser will not). */
export function CopyButton({ text, label = "Copy" }: { text: string; label?: string }) {
  const [done, setDone] = useState<"" | "copied" | "failed">("");
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(text);
      setDone("copied");
    } catch {
      setDone("failed");
    }
  };
  return (
    <span class="copy">
      <button type="button" class="button small" onClick={copy}>
        {label}
      </button>
      <span class="copy-status" role="status" aria-live="polite">
        {done === "copied" ? "Copied" : done === "failed" ? "Select it and copy by hand" : ""}
      </span>
    </span>
  );
}
