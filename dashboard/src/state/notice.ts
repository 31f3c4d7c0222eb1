// A one-off message for the next page ("Signed in as …", "Workload launched"), read once.
import { signal } from "@preact/signals";

export const notice = signal<string | null>(null);

export function tell(message: string): void {
  notice.value = message;
}
