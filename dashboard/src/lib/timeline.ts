// A workload's timeline as the page shows it: newest first, each entry once, whether it came
// from the timeline's pages or from the event stream (timeline.test.ts).
import type { TimelineEntry, WorkloadChange } from "../api/client";

export interface Entry {
  at: string;
  kind: TimelineEntry["kind"];
  state: TimelineEntry["state"];
  reason: string;
  request_id?: string | null;
}

function key(e: Entry): string {
  return `${Date.parse(e.at)}|${e.kind}|${e.state}|${e.reason}`;
}

/** `entries` (any order, repeats allowed) newest first, each once. */
export function newestFirst(entries: Entry[]): Entry[] {
  const seen = new Set<string>();
  const unique: Entry[] = [];
  for (const e of entries) {
    const k = key(e);
    if (!seen.has(k)) {
      seen.add(k);
      unique.push(e);
    }
  }
  return unique.sort((a, b) => Date.parse(b.at) - Date.parse(a.at));
}

export function fromChange(change: WorkloadChange): Entry {
  return {
    at: change.at,
    kind: change.kind,
    state: change.state,
    reason: change.reason,
    request_id: change.request_id ?? null,
  };
}

/** The Python a client runs to call an endpoint through the gateway with OpenAI's SDK. */
export function openaiSnippet(gatewayUrl: string, model: string): string {
  return [
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url=${JSON.stringify(gatewayUrl)}, api_key="esk_…")  # a gateway key`,
    "reply = client.chat.completions.create(",
    `    model=${JSON.stringify(model)},`,
    '    messages=[{"role": "user", "content": "Hello!"}],',
    ")",
    "print(reply.choices[0].message.content)",
  ].join("\n");
}
