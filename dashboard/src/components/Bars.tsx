// A stacked bar chart in SVG (no chart library: a few dozen lines). It is an image with a
// summary for screen readers; the same figures are in the table beside it.
import type { Series } from "../lib/usage";
import { niceMax } from "../lib/usage";

const HEIGHT = 180;
const LEFT = 48;
const BOTTOM = 28;

export function Bars({
  days,
  series,
  format,
  label,
}: {
  days: string[];
  series: Series[];
  format: (value: number) => string;
  label: string;
}) {
  const sums = days.map((_, i) => series.reduce((a, s) => a + (s.values[i] ?? 0), 0));
  const top = niceMax(Math.max(0, ...sums));
  const width = Math.max(320, days.length * 28 + LEFT + 8);
  const slot = (width - LEFT - 8) / days.length;
  const bar = Math.max(4, Math.min(28, slot * 0.7));
  const y = (v: number) => (HEIGHT - BOTTOM) * (1 - v / top) + 4;
  const every = Math.ceil(days.length / 8);
  const summary = `${label}: ${format(sums.reduce((a, b) => a + b, 0))} over ${days.length} days`;
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${width} ${HEIGHT}`} role="img" aria-label={summary} preserveAspectRatio="none">
        {[0, 0.5, 1].map((f) => (
          <g key={f}>
            <line class="grid" x1={LEFT} x2={width - 4} y1={y(top * f)} y2={y(top * f)} />
            <text class="axis" x={LEFT - 6} y={y(top * f) + 4} text-anchor="end">
              {format(top * f)}
            </text>
          </g>
        ))}
        {days.map((day, i) => {
          let base = 0;
          const x = LEFT + i * slot + (slot - bar) / 2;
          return (
            <g key={day}>
              {series.map((s, k) => {
                const v = s.values[i] ?? 0;
                if (v <= 0) return null;
                const y0 = y(base);
                base += v;
                const y1 = y(base);
                return (
                  <rect key={s.name} class={`series-${k}`} x={x} y={y1} width={bar} height={Math.max(1, y0 - y1)}>
                    <title>{`${day} · ${s.name}: ${format(v)}`}</title>
                  </rect>
                );
              })}
              {i % every === 0 ? (
                <text class="axis" x={x + bar / 2} y={HEIGHT - 8} text-anchor="middle">
                  {day.slice(5)}
                </text>
              ) : null}
            </g>
          );
        })}
      </svg>
      {series.length > 1 ? (
        <figcaption>
          <ul class="legend">
            {series.map((s, k) => (
              <li key={s.name}>
                <span class={`swatch series-${k}`} aria-hidden="true" />
                {s.name}
              </li>
            ))}
          </ul>
        </figcaption>
      ) : null}
    </figure>
  );
}
