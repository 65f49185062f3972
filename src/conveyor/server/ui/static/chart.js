// A small line chart in SVG: time on x, one or more series on y. No dependencies.
const NS = "http://www.w3.org/2000/svg";
const W = 560, H = 200, L = 48, R = 12, T = 10, B = 26;

function el(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

export function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function fmt(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
}

let chartZone;  // undefined: the browser's zone; "UTC"
export function setChartZone(z) { chartZone = z; }

function clock(t) {
  return t.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", timeZone: chartZone, timeZoneName: "short" });
}

// series: [{label, color, points: [{t: Date, v: number|null}]}]; returns an <svg>.
export function lineChart(series, { from, to } = {}) {
  const all = series.flatMap((s) => s.points);
  const t0 = (from ?? all[0]?.t ?? new Date()).getTime();
  const t1 = Math.max((to ?? all.at(-1)?.t ?? new Date()).getTime(), t0 + 1000);
  const ymax = niceMax(Math.max(0, ...all.map((p) => p.v ?? 0)));
  const x = (t) => L + ((t.getTime() - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  for (const f of [0, 0.5, 1]) {
    const v = ymax * f;
    svg.append(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e3e6eb" }));
    svg.append(el("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#667085" }, fmt(v)));
  }
  for (const [t, anchor] of [[new Date(t0), "start"], [new Date(t1), "end"]]) {
    svg.append(el("text", { x: x(t), y: H - 8, "text-anchor": anchor, "font-size": 11, fill: "#667085" }, clock(t)));
  }
  for (const s of series) {
    let d = "", pen = "M";
    for (const p of s.points) {
      if (p.v === null || p.v === undefined) { pen = "M"; continue; }
      d += `${pen}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)} `;
      pen = "L";
    }
    if (d) svg.append(el("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, "data-series": s.label }));
    if (s.points.filter((p) => p.v !== null && p.v !== undefined).length === 1) {
      const p = s.points.find((q) => q.v !== null && q.v !== undefined);
      svg.append(el("circle", { cx: x(p.t), cy: y(p.v), r: 3, fill: s.color }));
    }
  }
  if (!all.some((p) => p.v !== null && p.v !== undefined)) {
    svg.append(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", "font-size": 12, fill: "#667085" },
      "no samples yet"));
  }
  return svg;
}
