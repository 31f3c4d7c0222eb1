// When a credential was last used: "3 min ago", or "never".
import { age } from "../lib/format";
import { now } from "../state/clock";

export function LastUsed({ at }: { at: string | null | undefined }) {
  return at ? <time dateTime={at}>{age(at, now.value)} ago</time> : <span class="dim">never</span>;
}
