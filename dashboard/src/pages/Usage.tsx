// Usage: GPU-hours, CPU core-hours and tokens per day for the tenant, as a chart, in total or
// by class, user or endpoint; the window's sums as a table and as CSV; quota use against the
// operator's limits.
import { useEffect, useState } from "preact/hooks";
import { ApiError, type Schemas, api, fetchRaw, ok } from "../api/client";
import { Bars } from "../components/Bars";
import { ErrorNote } from "../components/ErrorNote";
import { Page } from "../components/Page";
import { Empty, Failed, Loading } from "../components/States";
import { hours, tokens } from "../lib/format";
import { type Breakdown, type Measure, type Series, days, stack, totals, valueOf } from "../lib/usage";
import { session } from "../state/session";
import * as live from "../state/live";

type Item = Schemas["UsageItemOut"];
type Report = Schemas["UsageReportOut"];
type Group = Schemas["UsageGroupBy"];

const GROUP_OF: Record<Breakdown, Group> = {
  total: "tenant",
  class: "class",
  user: "user",
  endpoint: "endpoint",
};

const MEASURES: { value: Measure; label: string }[] = [
  { value: "gpu_hours", label: "GPU-hours" },
  { value: "cpu_core_hours", label: "CPU core-hours" },
  { value: "tokens", label: "Tokens" },
];

/** A usage report as JSON (the route also answers CSV, which the typed client cannot tell). */
async function report(query: { from: string; to: string; group_by: Group }): Promise<Report> {
  return (await ok(api.GET("/v1/usage", { params: { query } }))) as Report;
}

function range(dayList: string[], i: number): { from: string; to: string } {
  const from = `${dayList[i]}T00:00:00Z`;
  const next = new Date(Date.parse(from) + 86_400_000).toISOString().replace(".000Z", "Z");
  return { from, to: next };
}

export function Usage() {
  const [span, setSpan] = useState(7);
  const [measure, setMeasure] = useState<Measure>("gpu_hours");
  const [breakdown, setBreakdown] = useState<Breakdown>("total");
  const [series, setSeries] = useState<Series[] | null>(null);
  const [sums, setSums] = useState<Item[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [csvError, setCsvError] = useState<ApiError | null>(null);
  const dayList = days(span);
  const group = GROUP_OF[breakdown];
  const from = range(dayList, 0).from;
  const to = range(dayList, dayList.length - 1).to;

  // An endpoint's id → its name (the api sums replicas into their endpoint and leaves out
  // workloads that are not endpoints); one no longer listed keeps its id.
  const label = (g: string): string | null => (breakdown === "endpoint" ? groupName(g, breakdown) : g);

  const load = async () => {
    setError(null);
    setSeries(null);
    setSums(null);
    try {
      const whole = report({ from, to, group_by: group });
      if (breakdown === "total") {
        const [byDay, all] = await Promise.all([
          report({ from, to, group_by: "day" }),
          whole,
        ]);
        setSeries(totals(dayList, byDay.items, measure));
        setSums(all.items);
      } else {
        // The api sums by one group at a time: a report per day makes the stacks.
        const perDay = await Promise.all(
          dayList.map((_, i) =>
            report({ ...range(dayList, i), group_by: group }),
          ),
        );
        setSeries(stack(dayList, perDay.map((r: Report) => r.items), measure, label));
        setSums((await whole).items);
      }
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    }
  };

  useEffect(() => {
    void live.start();
  }, []);
  useEffect(() => {
    void load();
  }, [span, measure, breakdown, live.load.value]);

  const downloadCsv = async () => {
    setCsvError(null);
    try {
      const q = new URLSearchParams({ from, to, group_by: group });
      const answer = await fetchRaw(`/v1/usage?${q}`, { headers: { Accept: "text/csv" } });
      const url = URL.createObjectURL(await answer.blob());
      const a = document.createElement("a");
      a.href = url;
      a.download = `einsora-usage-${group}-${dayList[0]}-${dayList[dayList.length - 1]}.csv`;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (failure) {
      setCsvError(failure instanceof ApiError ? failure : null);
    }
  };

  const format = measure === "tokens" ? tokens : hours;
  const tokensByClass = measure === "tokens" && breakdown === "class";
  return (
    <Page title="Usage" wide>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="What to show">
        <div class="field inline">
          <label for="usage-window">Window</label>
          <select id="usage-window" value={String(span)} onChange={(e) => setSpan(Number(e.currentTarget.value))}>
            <option value="7">Last 7 days</option>
            <option value="14">Last 14 days</option>
            <option value="30">Last 30 days</option>
          </select>
        </div>
        <div class="field inline">
          <label for="usage-measure">Measure</label>
          <select id="usage-measure" value={measure} onChange={(e) => setMeasure(e.currentTarget.value as Measure)}>
            {MEASURES.map((m) => (
              <option key={m.value} value={m.value}>
                {m.label}
              </option>
            ))}
          </select>
        </div>
        <div class="field inline">
          <label for="usage-by">By</label>
          <select id="usage-by" value={breakdown} onChange={(e) => setBreakdown(e.currentTarget.value as Breakdown)}>
            <option value="total">The whole tenant</option>
            <option value="class">Class</option>
            <option value="user">User</option>
            <option value="endpoint">Endpoint</option>
          </select>
        </div>
        <div class="field inline push">
          <button type="button" class="button" onClick={downloadCsv}>
            Download CSV
          </button>
        </div>
      </form>
      <ErrorNote error={csvError} title="CSV" />
      <div class="split">
        <section class="card" aria-labelledby="chart-heading">
          <h2 id="chart-heading">
            {MEASURES.find((m) => m.value === measure)?.label} per day
          </h2>
          {tokensByClass ? (
            <p class="hint">
              Tokens are spent by a key on an endpoint, not on a class: there are none to show
              by class. Choose “User”, “Endpoint” or “The whole tenant”.
            </p>
          ) : null}
          {error !== null ? (
            <Failed what="usage" error={error} retry={() => void load()} />
          ) : series === null ? (
            <Loading what="usage" />
          ) : series.length === 0 ? (
            <Empty title="No usage in this window">
              <p>GPU-hours count while workloads run; tokens while endpoints answer.</p>
            </Empty>
          ) : (
            <Bars days={dayList} series={series} format={format} label={`${measure} per day`} />
          )}
        </section>
        <Quota />
      </div>
      <section class="card" aria-labelledby="sums-heading">
        <h2 id="sums-heading">Sums over the window</h2>
        {sums === null ? (
          error ? null : <Loading what="the sums" />
        ) : sums.length === 0 ? (
          <Empty title="Nothing counted in this window" />
        ) : (
          <div class="table-wrap">
            <table class="table">
              <thead>
                <tr>
                  <th scope="col">{breakdown === "total" ? "Tenant" : breakdown === "endpoint" ? "Workload" : breakdown === "class" ? "Class" : "User"}</th>
                  <th scope="col" class="num">GPU-hours</th>
                  <th scope="col" class="num">CPU core-hours</th>
                  <th scope="col" class="num">Tokens</th>
                </tr>
              </thead>
              <tbody>
                {sums.map((item) => (
                  <tr key={item.group}>
                    <td class="mono">{groupName(item.group, breakdown)}</td>
                    <td class="num">{hours(item.gpu_hours)}</td>
                    <td class="num">{hours(item.cpu_core_hours)}</td>
                    <td class="num">{tokens(valueOf(item, "tokens"))}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </Page>
  );
}

function groupName(group: string, breakdown: Breakdown): string {
  if (breakdown === "total") return session.value?.tenant.name ?? group;
  if (breakdown === "endpoint") return live.rows.get(group)?.value.name ?? group;
  return group;
}

function Meter({ label, used, limit, unit }: { label: string; used: number; limit: number | null; unit: string }) {
  const share = limit ? Math.min(1, used / limit) : 0;
  return (
    <div class="meter-row">
      <div class="meter-label">
        <span>{label}</span>
        <span class="mono">
          {unit === "h" ? hours(used) : used} {limit === null ? "(no limit)" : `of ${unit === "h" ? hours(limit) : limit}`}
        </span>
      </div>
      {limit !== null ? (
        <meter min={0} max={limit} value={used} low={limit * 0.75} high={limit * 0.9} optimum={0} aria-label={label}>
          {Math.round(share * 100)}%
        </meter>
      ) : null}
    </div>
  );
}

function Quota() {
  const who = session.value;
  const [quota, setQuota] = useState<Schemas["TenantQuotaOut"] | null>(null);
  const [limits, setLimits] = useState<Schemas["TenantLimitsOut"] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  useEffect(() => {
    if (!who) return;
    const path = { params: { path: { id: who.tenant.id } } };
    Promise.all([ok(api.GET("/v1/tenants/{id}/quota", path)), ok(api.GET("/v1/tenants/{id}/limits", path))])
      .then(([q, l]) => {
        setQuota(q);
        setLimits(l);
      })
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
  }, [who?.tenant.id]);
  return (
    <section class="card" aria-labelledby="quota-heading">
      <h2 id="quota-heading">Quota and limits</h2>
      {error ? (
        <Failed what="the quota" error={error} />
      ) : quota === null || limits === null ? (
        <Loading what="the quota" />
      ) : (
        <>
          <Meter label="GPUs held now" used={quota.use.gpus_total} limit={quota.quota.max_gpus_total} unit="" />
          <Meter label="GPU-hours, last 7 days" used={quota.use.gpu_hours_7d} limit={quota.quota.gpu_hours_per_7d} unit="h" />
          {Object.entries(quota.quota.max_gpus).map(([name, limit]) => (
            <Meter key={name} label={`${name} held now`} used={quota.use.gpus[name] ?? 0} limit={limit} unit="" />
          ))}
          <Meter label="Workloads not removed" used={limits.workloads} limit={limits.max_workloads} unit="" />
          <p class="hint">
            {quota.quota.updated_at ? "Set by the operator." : "The operator has set no quota for this tenant."}{" "}
            API requests: {limits.requests_per_minute ?? "no limit"} a minute per token or session.
          </p>
        </>
      )}
    </section>
  );
}
