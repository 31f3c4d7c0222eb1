// Now, every 15 s: ages ("3 min") move on without a reload, and no more often than they need.
import { signal } from "@preact/signals";

export const now = signal(Date.now());

if (typeof window !== "undefined") {
  window.setInterval(() => {
    now.value = Date.now();
  }, 15_000);
}
