// The seedgrid dashboard: reads the JSON API of the service that serves it and draws SVG.
// Nothing is loaded from elsewhere. Text from the API (spec names, condition keys, errors) is
// untrusted, so it only ever enters the page as text nodes, never as HTML.
"use strict";

// Run statuses that end in an error of the run itself (not a cancel).
const FAILED_STATUSES = ["failed", "diverged"];
// How many of an experiment's runs failed: its counts, else the failed runs at hand.
const failedCount = (detail, failedRuns) => (detail.counts
  ? FAILED_STATUSES.reduce((n, s) => n + (detail.counts[s] || 0), 0) : failedRuns.length);
const TOKEN_KEY = "seedgrid.token";
const SVG_NS = "http://www.w3.org/2000/svg";
const REFRESH_MS = 3000;
// Bounds on what a page fetches (the curves of at most this many runs, CURVE_RUNS to a request).
const MAX_CURVE_RUNS_PER_CONDITION = 20;
const MAX_CURVE_RUNS = 200;
const RUNS_PAGE = 1000;
const MAX_RUN_PAGES = 10;
const POINTS_PAGE = 10000;
const MAX_RUN_POINT_PAGES = 5;
// Comparisons per /stats page (api_schemas.pages.COMPARISONS_PAGE, the server's bound): a grid
// with more is paged through, never asked for whole (a 422).
const COMPARISONS_PAGE = 2000;
// Shared conditions per GET /compare page (api_schemas.pages.COMPARE_PAGE).
const COMPARE_PAGE = 200;
// Runs per GET /experiments/{id}/curves (api_schemas.pages.CURVE_RUNS; each curve is cut at
// CURVE_POINTS = POINTS_PAGE x MAX_RUN_POINT_PAGES points, the bound of a run page's curves).
const CURVE_RUNS = 20;
// The statuses of the service's enums (api_schemas' RunStatus and ExperimentStatus), which the
// route serving this page writes into its <meta name="seedgrid-statuses">: every experiment
// status, and those of a run and of an experiment not ended yet (`pending`: handed to Ray, no
// worker yet).
const STATUSES = JSON.parse(document.querySelector('meta[name="seedgrid-statuses"]').content);
const ACTIVE = new Set([...STATUSES.run_active, ...STATUSES.experiment_active]);
// Distinct condition colours, readable on the light and the dark background; past the list,
// hues a golden angle apart.
const COLORS = ["#2f6fd6", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#b8860b", "#7b4173",
  "#31a354", "#e6550d", "#756bb1", "#3182bd", "#636363"];
const THEME_KEY = "seedgrid.theme";
// Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond.
const T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
  2.16, 2.145, 2.131, 2.12, 2.11, 2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056,
  2.052, 2.048, 2.045, 2.042];

const main = document.getElementById("main");
let chartCount = 0;  // numbers each chart's clip path
let generation = 0;  // bumped on every navigation: a render that awaited a stale view stops
let refreshTimer = null;
let authRequired = null;
let trainersCache = null;
const curveCache = new Map();  // "runId/name" -> points, kept only for runs that have ended
const listState = { name: "", status: "", tag: "", trainer: "" };
const picked = new Set();  // the experiments ticked on the list for a side-by-side comparison
const knownTags = new Set();  // every tag the list has shown, offered by its tag filter
const experimentState = { id: null, metric: null, curveMetric: null, seeds: false, log: false,
  hidden: new Set(), openWarnings: new Set(), comparisonsOffset: 0 };
const runState = { id: null, log: false };
const sortState = new Map();  // table role -> { column, descending }, kept across refreshes

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

function svg(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = String(value);
    else if (key === "style") setStyle(node, String(value));
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// "name: value; ..." one property at a time through the CSSOM: the page's Content-Security-Policy
// (style-src 'self') refuses style attributes and style.cssText.
function setStyle(node, text) {
  for (const rule of text.split(";")) {
    const [name, ...value] = rule.split(":");
    if (name.trim()) node.style.setProperty(name.trim(), value.join(":").trim());
  }
}

function fmt(x) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a < 1e-3 || a >= 1e5 ? x.toExponential(2) : Number(x.toPrecision(4)).toString();
}

function fmtP(p) {
  if (p === null || p === undefined) return "—";
  return p < 1e-4 ? p.toExponential(1) : p.toFixed(4);
}

function fmtInterval(ci) {
  if (!ci || ci[0] === null || ci[1] === null) return "—";
  return `[${fmt(ci[0])}, ${fmt(ci[1])}]`;
}

// A variance ratio's interval: a null high end is unbounded (no ratio above it is rejected).
function fmtRatioInterval(ci) {
  if (!ci || ci[0] === null) return "—";
  return `[${fmt(ci[0])}, ${ci[1] === null ? "∞" : fmt(ci[1])}]`;
}

function fmtTime(t) {
  return t ? t.replace("T", " ").replace(/\.\d+/, "").replace(/\+00:00$|Z$/, "") : "—";
}

function fmtValue(v) {
  return typeof v === "number" ? fmt(v) : levelText(v);
}

function statusBadge(status) {
  return el("span", { class: `status status-${status}`, "data-status": status, text: status });
}

// A bar with one segment per run status (its colour from app.css), in the order of `counts`.
function progress(counts, total) {
  const done = total - STATUSES.run_active.reduce((n, s) => n + (counts[s] || 0), 0);
  const segments = Object.entries(counts).filter(([, n]) => n > 0 && total > 0)
    .map(([status, n]) => el("span", { class: `seg seg-${status}`, "data-role": "progress-segment",
      "data-status": status, title: `${status}: ${n}`, style: `width:${(100 * n) / total}%` }));
  return el("span", { "data-role": "progress" }, el("span", { class: "bar", role: "img",
    "aria-label": Object.entries(counts).filter(([, n]) => n).map(([s, n]) => `${s} ${n}`)
      .join(", ") || "no runs" }, segments), `${done}/${total}`);
}

function conditionColor(index) {
  return index < COLORS.length ? COLORS[index] : `hsl(${(index * 137.5) % 360} 65% 45%)`;
}

// A table whose headers sort it (click or Enter on a header; again to reverse). Numbers sort
// as numbers ("—" last), text as text; the order survives the page's refreshes.
function sortableTable(role, headers, rows, attrs = {}) {
  const body = el("tbody", {}, rows);
  const cells = sortHeaders(role, headers, body);
  applySort(role, body, cells);
  return el("table", { ...attrs, "data-role": role }, el("thead", {}, el("tr", {}, cells)), body);
}

// Header cells whose buttons sort `body`'s rows by their column (again: the other way round).
function sortHeaders(role, headers, body) {
  const cells = headers.map((h, column) => el("th", { "aria-sort": "none" },
    el("button", { type: "button", class: "sort", "data-role": "sort-header", text: h,
      onclick: () => {
        const state = sortState.get(role);
        sortState.set(role, { column, descending: state && state.column === column
          ? !state.descending : false });
        applySort(role, body, cells);
      } })));
  return cells;
}

function applySort(role, body, cells) {
  const state = sortState.get(role);
  if (!state) return;
  const key = (row) => {
    const text = row.children[state.column] ? row.children[state.column].textContent.trim() : "";
    const number = text.match(/^[-+]?\d*\.?\d+(?:e[-+]?\d+)?/i);
    return number ? Number(number[0]) : text;
  };
  const rank = (v) => (typeof v === "number" ? 0 : v === "" || v === "—" ? 2 : 1);
  const rows = [...body.children].sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    if (rank(x) !== rank(y)) return rank(x) - rank(y);
    const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
    return state.descending ? -order : order;
  });
  body.replaceChildren(...rows);
  cells.forEach((cell, i) => cell.setAttribute("aria-sort", i !== state.column ? "none"
    : state.descending ? "descending" : "ascending"));
}

// A grid level as condition keys write it (api_schemas.levels): a string as it is, anything
// else as JSON, so that one condition reads the same here, in the CLI and in the figures.
function levelText(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

// A comparison's factor and levels: "stop_gradient: false vs true".
function pairText(c) {
  return `${c.factor}: ${levelText(c.a)} vs ${levelText(c.b)}`;
}

function conditionLabel(condition) {
  const entries = Object.entries(condition);
  return entries.length ? entries.map(([k, v]) => `${k}=${levelText(v)}`).join(", ") : "(no grid)";
}

// A condition key as shown: an experiment without a grid has one condition, keyed "".
function keyText(key) {
  return key || "(no grid)";
}

function factsList(pairs) {
  return el("dl", { class: "facts" },
    pairs.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
}

function keyValueTable(object, role) {
  const rows = Object.entries(object || {});
  if (!rows.length) return el("p", { class: "muted", text: "none" });
  return el("table", { "data-role": role, class: "key-values" },
    el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }),
      el("td", { text: fmtValue(v) })))));
}

function section(title, role, ...children) {
  return el("section", { "data-role": role }, el("h2", { text: title }), ...children);
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    this.status = status;
  }
}

// The token this tab holds, as the Authorization header every request of the page sends.
function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path) {
  const headers = { Accept: "application/json", ...authHeaders() };
  const response = await fetch(path, { headers });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (_) { /* not JSON: keep the status text */ }
    throw new ApiError(response.status, detail);
  }
  return response.json();
}

// Every page of a paged list, up to `maxPages` pages; `truncated` says whether more were left.
async function apiPages(path, pageSize, maxPages) {
  const items = [];
  for (let page = 0; page < maxPages; page++) {
    const sep = path.includes("?") ? "&" : "?";
    const batch = await api(`${path}${sep}limit=${pageSize}&offset=${page * pageSize}`);
    items.push(...batch);
    if (batch.length < pageSize) return { items, truncated: false };
  }
  return { items, truncated: true };
}

// Whether the service wants a token, read from its public schema, so that the page asks for
// the token instead of sending requests it knows will be refused.
async function needsToken() {
  if (authRequired === null) {
    const schema = await (await fetch("/openapi.json")).json();
    authRequired = Boolean(schema.components && schema.components.securitySchemes
      && schema.components.securitySchemes.bearerAuth);
  }
  return authRequired;
}

async function trainers() {
  if (trainersCache === null) trainersCache = await api("/trainers");
  return trainersCache;
}

// ---------------------------------------------------------------- token login

function updateLoginState() {
  const state = document.getElementById("login-state");
  const held = Boolean(sessionStorage.getItem(TOKEN_KEY));
  state.textContent = held ? "token held for this tab" : (authRequired ? "token needed" : "");
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  trainersCache = null;
  route();
});

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  trainersCache = null;
  route();
});

// ---------------------------------------------------------------- charts

function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (lo === Infinity) return [0, 1];
  if (lo === hi) { const pad = Math.abs(lo) * 0.05 || 1; return [lo - pad, hi + pad]; }
  const pad = (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

// A y axis on a linear or log10 scale: `scale(v)` is the pixel row, `ticks` its labels.
function yAxis(values, top, bottom, log) {
  const finite = values.filter((v) => Number.isFinite(v) && (!log || v > 0));
  const [lo, hi] = extent(log ? finite.map(Math.log10) : finite);
  const row = (u) => bottom - ((u - lo) / (hi - lo)) * (bottom - top);
  const scale = (v) => row(log ? Math.log10(v) : v);
  // log: a tick per decade ("1e-6"), or plain ticks where the values span less than two
  const decades = log ? niceTicks(lo, hi).filter(Number.isInteger) : [];
  const ticks = !log ? niceTicks(lo, hi).map((t) => [t, row(t)])
    : decades.length >= 2 ? decades.map((e) => [10 ** e, row(e), Math.abs(e) >= 3 ? `1e${e}` : fmt(10 ** e)])
      : niceTicks(10 ** lo, 10 ** hi).filter((t) => t > 0).map((t) => [t, row(Math.log10(t))]);
  return { scale, ticks };
}

function frame(width, height, margin, ticksY, ticksX, xLabel, yLabel) {
  const g = svg("g", { class: "axis" });
  for (const [value, y, label] of ticksY) {
    g.append(svg("line", { class: "grid", x1: margin.left, x2: width - margin.right, y1: y, y2: y }),
      svg("text", { x: margin.left - 4, y: y + 3, "text-anchor": "end", text: label || fmt(value) }));
  }
  for (const [value, x] of ticksX) {
    g.append(svg("text", { x, y: height - margin.bottom + 14, "text-anchor": "middle", text: fmt(value) }));
  }
  g.append(svg("line", { x1: margin.left, x2: margin.left, y1: margin.top, y2: height - margin.bottom }),
    svg("line", { x1: margin.left, x2: width - margin.right, y1: height - margin.bottom,
      y2: height - margin.bottom }));
  if (xLabel) g.append(svg("text", { x: (margin.left + width - margin.right) / 2, y: height - 4,
    "text-anchor": "middle", text: xLabel }));
  if (yLabel) g.append(svg("text", { x: 12, y: margin.top - 8, text: yLabel }));
  return g;
}

// Quantile with linear interpolation between order statistics (numpy's default).
function quantile(sorted, q) {
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

// The width a chart gets: the page's content width (sections' padding taken off), so that it
// spans its section; the SVG's viewBox lets it shrink with a narrower window.
function chartWidth(columns = 1) {
  const content = Math.max(480, main.clientWidth - 80);
  return Math.floor((content - 16 * (columns - 1)) / columns);
}

function chartSvg(width, height, attrs) {
  return svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`,
    preserveAspectRatio: "xMinYMin meet", ...attrs });
}

// A seed's sideways offset in [-1, 1], fixed by its seed, so that ties stay apart and a point
// keeps its place across refreshes.
function jitter(seed) {
  return ((((seed + 1) * 2654435761) % 4096) / 4096) * 2 - 1;
}

// Shortens every text[data-fit] of `root` (once in the page, where text can be measured) to its
// data-fit width in pixels, with an ellipsis; the whole text stays in its <title>.
function fitLabels(root) {
  for (const text of root.querySelectorAll("text[data-fit]")) {
    const limit = Number(text.dataset.fit);
    const whole = text.textContent;
    let keep = whole.length;
    while (keep > 1 && text.getComputedTextLength() > limit) {
      keep -= 1;
      text.textContent = `${whole.slice(0, keep)}…`;
    }
  }
}

// A condition key's [factor, value] pairs ("loss=mse,r=0.1": [["loss", "mse"], ["r", "0.1"]]).
function gridParts(key) {
  return key.split(/,\s*(?=[^,=\s]+=)/).map((part) => {
    const at = part.indexOf("=");
    return at < 0 ? [null, part] : [part.slice(0, at), part.slice(at + 1)];
  });
}

// Per condition, a box (quartiles, median, whiskers at min and max) and every seed as a point
// that hover and keyboard focus name (condition, seed, value) in `readout`; Enter opens its run.
// Each condition's label is its number in the legend over its grid values, one per line (the
// factors' names once, at the left, where every condition has the same factors), each line
// shortened to its slot: labels never overlap.
function distributionChart(groups, metric, log, readout) {
  const width = chartWidth();
  const parsed = groups.map((g) => gridParts(g.key));
  const factors = parsed.length ? parsed[0].map((p) => p[0]) : [];
  const shared = factors.length > 0 && factors.length <= 4 && factors.every(Boolean)
    && parsed.every((ps) => ps.length === factors.length && ps.every((p, k) => p[0] === factors[k]));
  const lines = shared ? factors.length : Math.min(3, Math.max(...parsed.map((ps) => ps.length), 1));
  const left = shared ? Math.min(150, Math.max(64, 14 + 6.5 * Math.max(...factors.map((f) => f.length)))) : 64;
  const margin = { top: 24, right: 16, bottom: 38 + 15 * lines, left };
  const height = 300 + margin.bottom;
  const all = groups.flatMap((g) => g.points.map((p) => p.value));
  const y = yAxis(all, margin.top, height - margin.bottom, log);
  const slot = (width - margin.left - margin.right) / Math.max(groups.length, 1);
  const chart = chartSvg(width, height, { "data-role": "distribution", "data-metric": metric });
  chart.append(frame(width, height, margin, y.ticks, [], null, metric));
  const show = (text) => { readout.textContent = text; };
  groups.forEach((group, i) => {
    const cx = margin.left + slot * (i + 0.5);
    const g = svg("g", { "data-role": "condition-distribution", "data-condition": group.key });
    const values = group.points.map((p) => p.value).filter((v) => Number.isFinite(v)
      && (!log || v > 0)).sort((a, b) => a - b);
    const half = Math.min(36, slot * 0.32);
    if (values.length) {
      const [q1, med, q3] = [0.25, 0.5, 0.75].map((q) => quantile(values, q));
      g.append(
        svg("line", { x1: cx, x2: cx, y1: y.scale(values[0]), y2: y.scale(values[values.length - 1]),
          stroke: group.color }),
        svg("rect", { "data-role": "box", x: cx - half, width: 2 * half, y: y.scale(q3),
          height: Math.max(1, y.scale(q1) - y.scale(q3)), fill: group.color, "fill-opacity": 0.14,
          stroke: group.color }),
        svg("line", { x1: cx - half, x2: cx + half, y1: y.scale(med), y2: y.scale(med),
          stroke: group.color, "stroke-width": 2 }));
    }
    for (const point of group.points) {
      if (!Number.isFinite(point.value) || (log && point.value <= 0)) continue;
      const label = `${group.key}, seed ${point.seed}: ${fmt(point.value)} (run ${point.runId})`;
      const open = () => { location.hash = `#/runs/${point.runId}`; };
      g.append(svg("circle", { "data-role": "seed-point", "data-condition": group.key,
        "data-run-id": point.runId, "data-seed": point.seed, class: "seed-point",
        cx: cx + jitter(point.seed) * half * 0.85, cy: y.scale(point.value), r: 4,
        fill: group.color, tabindex: 0, role: "link", "aria-label": label,
        onclick: open, onfocus: () => show(label), onmouseenter: () => show(label),
        onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } } },
      svg("title", { text: label })));
    }
    const parts = [`#${i + 1}`, ...(shared ? parsed[i].map((p) => p[1])
      : parsed[i].map(([f, v]) => (f === null ? v : `${f}=${v}`)))];
    const shown = parts.length > lines + 1
      ? [...parts.slice(0, lines), parts.slice(lines).join(", ")] : parts;
    shown.forEach((part, line) => g.append(svg("text", { x: cx, "text-anchor": "middle",
      y: height - margin.bottom + 16 + 15 * line, "data-role": line ? "condition-label-line"
        : "condition-label", "data-fit": Math.max(8, slot - 8), class: line ? null : "label-key",
      text: part }, svg("title", { text: group.key }))));
    g.append(svg("text", { x: cx, y: height - 6, "text-anchor": "middle", "data-fit":
      Math.max(8, slot - 8), text: `n=${group.points.length}` }));
    chart.append(g);
  });
  if (shared) {
    chart.append(svg("g", { "data-role": "factor-names" }, factors.map((f, k) => svg("text", {
      x: margin.left - 6, y: height - margin.bottom + 31 + 15 * k, "text-anchor": "end",
      "data-fit": margin.left - 12, class: "label-key", text: f }))));
  }
  return chart;
}

// Config against result: parallel coordinates, an axis per grid factor (its levels in the
// grid's order) and one for the metric (on the page's scale), each completed run a line through
// its levels and its value, coloured by the value (blue low, red high). Hover or Tab names the
// run in `readout`; Enter opens it.
function parallelChart(grid, runs, metric, log, readout) {
  const factors = Object.keys(grid);
  const axes = [...factors, metric];
  const width = chartWidth();
  const margin = { top: 34, right: 90, bottom: 16, left: 90 };
  const height = 340;
  const top = margin.top;
  const bottom = height - margin.bottom;
  const xAt = (k) => margin.left + (k * (width - margin.left - margin.right)) / (axes.length - 1);
  const lines = runs.filter((r) => Number.isFinite(r.value) && (!log || r.value > 0));
  const y = yAxis(lines.map((r) => r.value), top, bottom, log);
  const levelRow = factors.map((f) => {
    const levels = grid[f].map((v) => JSON.stringify(v));
    return (v) => {
      const i = levels.indexOf(JSON.stringify(v));
      return levels.length === 1 ? (top + bottom) / 2 : top + (i / (levels.length - 1)) * (bottom - top);
    };
  });
  const sorted = lines.map((r) => r.value).sort((u, v) => u - v);
  const colour = (v) => {
    const rank = sorted.length > 1 ? sorted.indexOf(v) / (sorted.length - 1) : 0.5;
    return `hsl(${Math.round(220 - 220 * rank)}, 70%, 48%)`;
  };
  const chart = chartSvg(width, height, { "data-role": "parallel", "data-metric": metric });
  const axisGroup = svg("g", { class: "axis" });
  axes.forEach((name, k) => {
    const x = xAt(k);
    axisGroup.append(svg("line", { x1: x, x2: x, y1: top, y2: bottom }),
      svg("text", { x, y: top - 14, "text-anchor": "middle", class: "label-key",
        "data-role": "parallel-axis", "data-fit": Math.max(40, xAt(1) - xAt(0) - 12), text: name }));
    const ticks = k < factors.length ? grid[name].map((v) => [levelRow[k](v), fmtValue(v)])
      : y.ticks.map(([value, row, label]) => [row, label || fmt(value)]);
    for (const [row, label] of ticks) {
      axisGroup.append(svg("text", { x: k === axes.length - 1 ? x + 6 : x - 6, y: row + 3,
        "text-anchor": k === axes.length - 1 ? "start" : "end", text: label }));
    }
  });
  const show = (text) => { readout.textContent = text; };
  const paths = svg("g", {});
  for (const r of lines) {
    const rows = [...factors.map((f, k) => levelRow[k](r.condition[f])), y.scale(r.value)];
    const d = rows.map((row, k) => `${k ? "L" : "M"}${xAt(k).toFixed(1)},${row.toFixed(1)}`).join("");
    const label = `${keyText(r.key)}, seed ${r.seed}: ${fmt(r.value)} (run ${r.runId})`;
    const open = () => { location.hash = `#/runs/${r.runId}`; };
    paths.append(svg("path", { d, "data-role": "parallel-line", "data-run-id": r.runId,
      class: "parallel-line", stroke: colour(r.value), fill: "none", tabindex: 0, role: "link",
      "aria-label": label, onclick: open, onfocus: () => show(label), onmouseenter: () => show(label),
      onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } } },
    svg("title", { text: label })));
  }
  chart.append(axisGroup, paths);
  return chart;
}

// One chart of curves: per series a mean line, a ±std band (shaded) and the 95% CI of the
// mean (dashed), and single seeds when asked.
function curveChart(series, { xLabel, yLabel, log, width = chartWidth(), height = 340, role }) {
  const margin = { top: 24, right: 16, bottom: 40, left: 64 };
  const ys = series.flatMap((s) => [...s.mean.map((p) => p[1]),
    ...(s.band || []).flatMap((p) => [p[1], p[2]]),
    ...(s.seeds || []).flatMap((c) => c.map((p) => p[1]))]);
  const xs = series.flatMap((s) => s.mean.map((p) => p[0]));
  const [x0, x1] = extent(xs);
  const left = margin.left;
  const right = width - margin.right;
  const scaleX = (x) => left + ((x - x0) / (x1 - x0)) * (right - left);
  const y = yAxis(ys, margin.top, height - margin.bottom, log);
  const ok = (v) => Number.isFinite(v) && (!log || v > 0);
  const point = (x, v) => `${scaleX(x).toFixed(1)},${y.scale(v).toFixed(1)}`;
  const path = (pts) => {
    let d = "";
    let pen = "M";
    for (const [x, v] of pts) {
      if (!ok(v)) { pen = "M"; continue; }
      d += `${pen}${point(x, v)}`;
      pen = "L";
    }
    return d;
  };
  const chart = chartSvg(width, height, { "data-role": role });
  // The axes fit the means, bands and seeds; a wider interval is cut at the plot's edge.
  const clip = `plot-${++chartCount}`;
  chart.append(svg("clipPath", { id: clip }, svg("rect", { x: left, y: margin.top,
    width: right - left, height: height - margin.bottom - margin.top })),
  frame(width, height, margin, y.ticks, niceTicks(x0, x1).map((t) => [t, scaleX(t)]),
    xLabel, yLabel));
  for (const s of series) {
    const g = svg("g", { "data-condition": s.key, "clip-path": `url(#${clip})` });
    const pts = (s.band || []).filter((p) => ok(p[1]) && ok(p[2]));
    if (pts.length) {
      const upper = pts.map((p) => point(p[0], p[2]));
      const lower = pts.slice().reverse().map((p) => point(p[0], p[1]));
      g.append(svg("path", { "data-role": "band", "data-condition": s.key,
        d: `M${upper.join("L")}L${lower.join("L")}Z`, fill: s.color, "fill-opacity": 0.13,
        stroke: "none" }));
    }
    if (s.ci && s.ci.some((p) => ok(p[1]))) {
      g.append(svg("path", { "data-role": "ci-band", "data-condition": s.key,
        d: `${path(s.ci.map((p) => [p[0], p[1]]))}${path(s.ci.map((p) => [p[0], p[2]]))}`,
        fill: "none", stroke: s.color, "stroke-width": 1, "stroke-dasharray": "4 3" }));
    }
    for (const seed of s.seeds || []) {
      g.append(svg("path", { "data-role": "seed-curve", "data-condition": s.key, d: path(seed),
        fill: "none", stroke: s.color, "stroke-opacity": 0.8, "stroke-width": 1.3 }));
    }
    g.append(svg("path", { "data-role": "mean-curve", "data-condition": s.key, d: path(s.mean),
      fill: "none", stroke: s.color, "stroke-width": s.seeds && s.seeds.length ? 3 : 2.2 }));
    chart.append(g);
  }
  return chart;
}

// Mean, mean ± sample standard deviation and the mean's 95% t interval across seeds at each
// step that some seed logged (no interval where fewer than 3 did).
function meanBand(curves) {
  const byStep = new Map();
  for (const curve of curves) {
    for (const [step, value] of curve) {
      if (!Number.isFinite(value)) continue;
      if (!byStep.has(step)) byStep.set(step, []);
      byStep.get(step).push(value);
    }
  }
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  const mean = [];
  const band = [];
  const ci = [];
  for (const step of steps) {
    const vs = byStep.get(step);
    const m = vs.reduce((a, b) => a + b, 0) / vs.length;
    const sd = vs.length > 1
      ? Math.sqrt(vs.reduce((a, v) => a + (v - m) ** 2, 0) / (vs.length - 1)) : 0;
    mean.push([step, m]);
    band.push([step, m - sd, m + sd]);
    // from 3 seeds on: with 2 the interval (t = 12.7) says little and swamps the chart
    const half = vs.length > 2 ? (T95[vs.length - 2] || 1.96) * (sd / Math.sqrt(vs.length)) : NaN;
    ci.push([step, m - half, m + half]);
  }
  return { mean, band, ci };
}

// ---------------------------------------------------------------- views

function scheduleRefresh(active, view) {
  clearTimeout(refreshTimer);
  if (active) {
    const gen = generation;
    refreshTimer = setTimeout(() => { if (gen === generation) view(); }, REFRESH_MS);
  }
}

function showError(error) {
  main.replaceChildren(el("p", { class: "error", "data-role": "error", text: String(error.message || error) }));
  if (error.status === 401) {
    main.append(el("p", { text: "Enter the service's API token (SEEDGRID_API_TOKEN) above." }));
  }
}

// The list's controls are built once per visit; each refresh replaces only the rows, so typing
// in the search box is not interrupted. New experiments appear without a reload. Every filter
// is the API's (GET /experiments: q, tag, trainer, status); the search also narrows the rows
// shown at once, as the API will.
async function showList() {
  const gen = generation;
  const search = el("input", { type: "search", placeholder: "search name, note, tags, trainer",
    "data-role": "name-filter", value: listState.name });
  const statusFilter = el("select", { "data-role": "status-filter" },
    ["", ...STATUSES.experiment].map((s) =>
      el("option", { value: s, selected: s === listState.status, text: s || "any status" })));
  const trainerNames = new Set((await trainers()).map((t) => t.name));
  const tagFilter = el("select", { "data-role": "tag-filter" });
  const trainerFilter = el("select", { "data-role": "trainer-filter" });
  const note = el("span", { class: "muted" });
  const body = el("tbody");
  let page = [];
  let searchTimer = null;
  const options = (select, values, current, any) => select.replaceChildren(
    ...["", ...[...new Set([...values, current].filter(Boolean))].sort()].map((v) =>
      el("option", { value: v, selected: v === current, text: v || any })));
  const headers = sortHeaders("experiments", ["id", "name", "trainer", "status", "progress",
    "tags", "created", "finished", "compare"], body);
  // Two ticked experiments open their side-by-side page (GET /compare).
  const compareButton = el("button", { type: "button", "data-role": "compare-picked",
    onclick: () => { const [a, b] = [...picked]; location.hash = `#/compare/${a}/${b}`; } });
  const updateCompare = () => {
    compareButton.disabled = picked.size !== 2;
    compareButton.textContent = picked.size === 2 ? `compare #${[...picked].join(" with #")}`
      : `tick two experiments to compare them (${picked.size} ticked)`;
  };
  updateCompare();
  const render = () => {
    const needle = listState.name.toLowerCase();
    const shown = page.filter((e) => [e.name, e.note || "", e.trainer, ...e.tags]
      .some((text) => text.toLowerCase().includes(needle)));
    body.replaceChildren(...shown.map((e) => el("tr", { "data-role": "experiment-row",
      "data-experiment-id": e.id },
    el("td", { text: e.id }),
    el("td", {}, el("a", { href: `#/experiments/${e.id}`, text: e.name })),
    el("td", { text: e.trainer }), el("td", {}, statusBadge(e.status)),
    el("td", {}, progress(e.counts, e.n_runs)),
    el("td", { "data-role": "tags" }, tagChips(e.tags, (tag) => {
      listState.tag = tag; route();
    })),
    el("td", { text: fmtTime(e.created_at) }), el("td", { text: fmtTime(e.finished_at) }),
    el("td", {}, el("input", { type: "checkbox", "data-role": "compare-pick",
      "data-experiment-id": e.id, checked: picked.has(e.id),
      "aria-label": `compare experiment ${e.id}`,
      onchange: (event) => {
        if (event.target.checked) picked.add(e.id); else picked.delete(e.id);
        // at most two: the oldest tick gives way
        while (picked.size > 2) picked.delete(picked.values().next().value);
        render();
        updateCompare();
      } })))));
    if (!shown.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "muted",
      text: "no experiments" })));
    note.textContent = page.length === 1000 ? "the newest 1000 shown" : "";
    applySort("experiments", body, headers);
  };
  const load = async () => {
    const query = new URLSearchParams({ limit: 1000 });
    for (const [name, value] of [["status", listState.status], ["tag", listState.tag],
      ["trainer", listState.trainer], ["q", listState.name]]) if (value) query.set(name, value);
    const fetched = await api(`/experiments?${query}`);
    if (gen !== generation) return;
    page = fetched;
    for (const e of page) {
      e.tags.forEach((t) => knownTags.add(t));
      trainerNames.add(e.trainer);
    }
    options(tagFilter, knownTags, listState.tag, "any tag");
    options(trainerFilter, trainerNames, listState.trainer, "any trainer");
    render();
    scheduleRefresh(true, () => load().catch(showError));
  };
  search.addEventListener("input", () => {
    listState.name = search.value;
    render();
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => load().catch(showError), 300);
  });
  statusFilter.addEventListener("change", () => { listState.status = statusFilter.value; route(); });
  tagFilter.addEventListener("change", () => { listState.tag = tagFilter.value; route(); });
  trainerFilter.addEventListener("change", () => { listState.trainer = trainerFilter.value; route(); });
  await load();
  if (gen !== generation) return;
  main.replaceChildren(el("h1", { text: "Experiments" }),
    el("div", { class: "controls" }, search, tagFilter, trainerFilter, statusFilter, note,
      compareButton),
    el("table", { "data-role": "experiments" }, el("thead", {}, el("tr", {}, headers)), body));
}

// The curves of metric `name` of these runs of one experiment ([step, value] points each, in
// the runs' order): an ended run's from the cache, the others asked CURVE_RUNS runs to a request
// (GET /experiments/{id}/curves), not a request per run: a refresh of a running experiment's
// page costs a few requests, not hundreds.
async function runCurves(experimentId, runs, name) {
  const missing = runs.filter((r) => !curveCache.has(`${r.id}/${name}`));
  const batches = [];
  for (let i = 0; i < missing.length; i += CURVE_RUNS) batches.push(missing.slice(i, i + CURVE_RUNS));
  const fetched = new Map();
  await Promise.all(batches.map(async (batch) => {
    const answer = await api(`/experiments/${experimentId}/curves?name=${encodeURIComponent(name)}&`
      + batch.map((r) => `run=${r.id}`).join("&"));
    for (const r of batch) {
      const points = (answer.curves[String(r.id)] || []).map(([s, v]) => [s, v === null ? NaN : v]);
      if (!ACTIVE.has(r.status)) curveCache.set(`${r.id}/${name}`, points);
      fetched.set(r.id, points);
    }
  }));
  return runs.map((r) => fetched.get(r.id) || curveCache.get(`${r.id}/${name}`));
}

async function curvesSection(runs, conditions, gen) {
  const metric = experimentState.curveMetric;
  if (!metric) return [el("p", { class: "muted", text: "no points logged yet" })];
  const started = runs.filter((r) => r.started_at !== null);
  const chosen = [];
  for (const { key } of conditions) {
    chosen.push(...started.filter((r) => r.condition_key === key)
      .slice(0, MAX_CURVE_RUNS_PER_CONDITION));
  }
  const limited = chosen.slice(0, MAX_CURVE_RUNS);
  const curves = await runCurves(experimentState.id, limited, metric);
  if (gen !== generation) return null;
  const series = conditions.map(({ key, color }) => {
    const own = curves.filter((_, j) => limited[j].condition_key === key && curves[j].length);
    return { key, color, ...meanBand(own), n: own.length,
      seeds: experimentState.seeds ? own : [] };
  }).filter((s) => s.mean.length);
  const note = chosen.length > limited.length || started.length > chosen.length
    ? el("p", { class: "muted", text: `curves of ${limited.length} runs (at most `
      + `${MAX_CURVE_RUNS_PER_CONDITION} per condition, ${MAX_CURVE_RUNS} in all)` }) : null;
  if (!series.length) return [el("p", { class: "muted", text: `no ${metric} points logged yet` })];
  return [
    el("p", { class: "muted", text: "Line: the mean across seeds; shaded: mean ± one standard "
      + "deviation; dashed: the mean's 95% confidence interval (t)"
      + (experimentState.seeds ? "; thin lines: single seeds." : ".") }),
    curveChart(series, { xLabel: "step", yLabel: metric, log: experimentState.log,
      role: "curves" }),
    note];
}

// Significance marks of a Holm-adjusted p-value.
function holmMark(p) {
  return p === null || p === undefined ? "" : p < 0.01 ? "**" : p < 0.05 ? "*" : "";
}

// Which page of the comparisons the table shows, with buttons to the pages on either side; null
// when they fit one page.
function comparisonsPager(stats, rerender) {
  if (stats.offset === 0 && stats.next_offset === null) return null;
  const go = (offset) => () => { experimentState.comparisonsOffset = offset; rerender(); };
  const previous = Math.max(0, stats.offset - COMPARISONS_PAGE);
  return el("p", { class: "controls", "data-role": "comparisons-pager" },
    el("span", { "data-role": "comparisons-shown", text: `comparisons ${stats.offset + 1}`
      + `–${stats.offset + stats.comparisons.length} of ${stats.total_comparisons}` }), " ",
    stats.offset > 0 ? el("button", { type: "button", "data-role": "comparisons-previous",
      onclick: go(previous), text: `← previous ${COMPARISONS_PAGE}` }) : null, " ",
    stats.next_offset !== null ? el("button", { type: "button", "data-role": "comparisons-next",
      onclick: go(stats.next_offset), text: `next ${COMPARISONS_PAGE} →` }) : null);
}

// The answer first: per factor, its headline comparison (the pooled pair with the smallest
// Holm p) in words: the variance ratio with its interval on the analysis scale and
// its Holm p, the mean difference with its interval and Holm p, and a confound if any.
// Variance ratios as a forest plot: per row (a headline comparison, or a condition two
// experiments share) its ratio a square, its primary 95% interval a line (an end at 0 or ∞ runs
// to the axis' edge as an arrow), a dashed line at 1 (no change), on a log axis; the Holm p at
// the right (or the raw p, where `raw`: comparisons that stand alone). `rows`: { key, label,
// comparison }.
function forestPlot(rows, scaleName, role = "forest", raw = false) {
  const comparisons = rows.map((r) => r.comparison);
  const width = Math.min(chartWidth(), 980);
  const rowHeight = 24;
  const margin = { top: 8, right: 120, bottom: 34, left: Math.min(300, Math.floor(width * 0.34)) };
  const height = margin.top + rowHeight * comparisons.length + margin.bottom;
  const ends = comparisons.flatMap((c) => [c.var_ratio, ...(c.primary_ci95 || [])])
    .filter((v) => Number.isFinite(v) && v > 0);
  const lo = Math.floor(Math.log10(Math.min(1, ...ends)) - 0.3);
  const hi = Math.ceil(Math.log10(Math.max(1, ...ends)) + 0.3);
  const left = margin.left;
  const right = width - margin.right;
  const x = (v) => left + ((Math.log10(v) - lo) / (hi - lo)) * (right - left);
  const chart = chartSvg(width, height, { "data-role": role,
    "aria-label": `variance ratio a / b of ${scaleName} with its 95% interval, per row` });
  const axis = svg("g", { class: "axis" });
  const bottom = height - margin.bottom;
  const step = Math.max(1, Math.ceil((hi - lo) / 8));
  for (let e = lo; e <= hi; e += step) {
    axis.append(svg("line", { class: "grid", x1: x(10 ** e), x2: x(10 ** e), y1: margin.top, y2: bottom }),
      svg("text", { x: x(10 ** e), y: bottom + 14, "text-anchor": "middle",
        text: Math.abs(e) >= 3 ? `1e${e}` : fmt(10 ** e) }));
  }
  axis.append(svg("line", { x1: left, x2: right, y1: bottom, y2: bottom }),
    svg("line", { "data-role": "forest-one", x1: x(1), x2: x(1), y1: margin.top, y2: bottom,
      "stroke-dasharray": "4 3" }),
    svg("text", { x: (left + right) / 2, y: height - 4, "text-anchor": "middle",
      text: `variance ratio a / b of ${scaleName} (log axis), 95% interval` }));
  chart.append(axis);
  rows.forEach(({ key, label, comparison: c }, i) => {
    const y = margin.top + rowHeight * (i + 0.5);
    const [low, high] = c.primary_ci95 || [null, null];
    const g = svg("g", { "data-role": "forest-row", "data-key": key },
      svg("title", { text: `${label}: ratio ${fmt(c.var_ratio)} ${fmtRatioInterval(c.primary_ci95)}` }));
    g.append(svg("text", { x: left - 8, y: y + 4, "text-anchor": "end", "data-fit": left - 16,
      text: label }));
    if (c.primary_ci95) {
      const x1 = low > 0 ? x(low) : left;
      const x2 = high === null ? right : x(high);
      g.append(svg("line", { "data-role": "forest-interval", x1, x2, y1: y, y2: y,
        stroke: "currentColor", "stroke-width": 2, class: "forest-line" }));
      if (!(low > 0)) g.append(svg("path", { d: `M${left + 6},${y - 4}L${left},${y}L${left + 6},${y + 4}`, class: "forest-line" }));
      if (high === null) g.append(svg("path", { d: `M${right - 6},${y - 4}L${right},${y}L${right - 6},${y + 4}`, class: "forest-line" }));
    }
    if (Number.isFinite(c.var_ratio) && c.var_ratio > 0) {
      g.append(svg("rect", { "data-role": "forest-ratio", x: x(c.var_ratio) - 4, y: y - 4,
        width: 8, height: 8, class: "forest-mark" }));
    }
    const p = raw ? c.primary_p : c.primary_p_holm_factor;
    g.append(svg("text", { x: right + 8, y: y + 4, "data-role": "forest-p",
      text: raw ? `p ${fmtP(p)} (raw)` : `Holm p ${fmtP(p)} ${holmMark(p)}` }));
    chart.append(g);
  });
  return chart;
}

// Buttons that download the paper-ready figures (GET /experiments/{id}/figure, drawn by the
// service as `seedgrid figure` draws them) of the metric and scale the page shows.
function figureButtons(id, metric, scale, curves) {
  const download = async (name, format, button) => {
    const query = new URLSearchParams({ name, format, metric, scale });
    button.disabled = true;
    try {
      const response = await fetch(`/experiments/${id}/figure?${query}`, { headers: authHeaders() });
      if (!response.ok) throw new ApiError(response.status, response.statusText);
      const link = el("a", { href: URL.createObjectURL(await response.blob()),
        download: `seedgrid-${id}-${name}.${format}` });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (error) {
      // said beside the button: the page stays as it is
      button.after(el("span", { class: "error", "data-role": "figure-error",
        text: ` ${error.message || error}` }));
    } finally { button.disabled = false; }
  };
  const button = (name, format) => el("button", { type: "button", "data-role": "figure-download",
    "data-figure": name, "data-format": format, text: format.toUpperCase(),
    onclick: (e) => download(name, format, e.currentTarget) });
  return el("p", { class: "controls", "data-role": "figure-downloads" },
    el("span", { class: "muted", text: "Figures for the paper:" }),
    el("span", {}, "forest plot ", button("forest", "svg"), " ", button("forest", "png")),
    el("span", {}, "every seed per condition ", button("distribution", "svg"), " ",
      button("distribution", "png")),
    // (where the runs logged the metric as points)
    curves ? el("span", {}, "curves ", button("curves", "svg"), " ", button("curves", "png")) : null);
}

function headline(stats, id, curves) {
  const byFactor = new Map();
  for (const c of stats.comparisons) {
    if (c.within !== null) continue;
    const best = byFactor.get(c.factor);
    const p = c.primary_p_holm_factor === null ? 2 : c.primary_p_holm_factor;
    if (!best || p < best.p) byFactor.set(c.factor, { c, p });
  }
  if (!byFactor.size) return null;
  const scale = stats.scale === "log" ? `log ${stats.metric}` : stats.metric;
  return el("section", { class: "headline", "data-role": "headline" },
    el("h2", { text: `The answer: does each factor change the seed-to-seed variance of ${scale}?` }),
    [...byFactor.values()].map(({ c }) => {
      const p = c.primary_p_holm_factor;
      const verdict = p === null ? "untested" : p < 0.05 ? "differs" : "no difference shown";
      return el("p", { "data-role": "headline-comparison", "data-factor": c.factor },
        el("strong", { text: pairText(c) }),
        ` — variance ${verdict}: ratio `,
        el("span", { "data-role": "headline-ratio", text: fmt(c.var_ratio) }), " ",
        el("span", { "data-role": "headline-interval", text: fmtRatioInterval(c.primary_ci95) }),
        " (95% CI, raw), Holm p ",
        el("span", { "data-role": "headline-p", text: fmtP(p) }),
        `${holmMark(p) ? ` ${holmMark(p)}` : ""}; mean a − b `,
        el("span", { "data-role": "headline-mean", text: `${fmt(c.mean_diff)} ${fmtInterval(c.mean_diff_ci95)}` }),
        `, Holm p ${fmtP(c.mean_p_holm_factor)}.`,
        (c.confounds || []).length ? el("span", { class: "warn", "data-role": "headline-confound",
          text: ` Confounded: also changes ${c.confounds.map((d) => `${d.field} ${d.a} → ${d.b}`).join(", ")}.` }) : null);
    }),
    forestPlot([...byFactor.values()].map(({ c }) => ({ key: c.factor, comparison: c,
      label: pairText(c) })), scale),
    figureButtons(id, stats.metric, stats.scale, curves));
}

// One row per comparison: the primary test in the cells, the secondary tests in tooltips.
function comparisonsTable(stats) {
  const rows = stats.comparisons.map((c) => {
    const p = c.primary_p_holm_factor;
    const pairingNote = c.pairing === "paired"
      ? `${c.paired_seeds} seeds ran at both levels (same random streams); seed correlation `
        + fmt(c.seed_correlation)
      : c.pairing_note || "the levels did not run the same seeds";
    const dof = c.dof_a === null ? ""
      : `within-cell variances on ${c.dof_a} / ${c.dof_b} degrees of freedom. `;
    const secondary = `${dof}Secondary tests: F-test p ${fmtP(c.f_test_p)} raw, ${fmtP(c.f_test_p_holm_factor)} `
      + `Holm (factor), assumes normal seeds; Brown–Forsythe p ${fmtP(c.brown_forsythe_p)} raw, `
      + `${fmtP(c.brown_forsythe_p_holm_factor)} Holm (factor)`;
    const resamples = c.primary_resamples === null ? "" : `; ${c.primary_resamples} `
      + `re-assignments, ${c.primary_exact ? "all enumerated" : "drawn at random"}`;
    return el("tr", { "data-role": "comparison-row", "data-factor": c.factor },
      el("td", { text: c.factor }),
      el("td", {}, `${levelText(c.a)} vs ${levelText(c.b)}`,
        // a confound: the two levels also change other config fields (defaults included)
        (c.confounds || []).length ? el("div", { class: "warn", "data-role": "confound",
          title: "the two levels also differ in these config fields (resolved as the runs "
            + "train, defaults included): the comparison measures them too",
          text: `confounded: also changes ${c.confounds.map((d) => `${d.field} ${d.a} → ${d.b}`)
            .join(", ")}` }) : null),
      el("td", { text: c.within === null ? "pooled" : conditionLabel(c.within) }),
      el("td", { text: `${c.n_a} / ${c.n_b}` }),
      el("td", { "data-role": "pairing", title: pairingNote, text: c.pairing }),
      el("td", { text: `${fmt(c.var_a)} / ${fmt(c.var_b)}` }),
      el("td", { "data-role": "var-ratio", title: secondary, text: fmt(c.var_ratio) }),
      el("td", { "data-role": "var-ratio-ci", text: fmtRatioInterval(c.primary_ci95),
        title: `the ratios the primary test does not reject at 0.05; F interval (normal `
          + `theory): ${fmtRatioInterval(c.var_ratio_ci95_f)}` }),
      el("td", { "data-role": "primary-p", title: (c.primary_test || "no test") + resamples,
        text: fmtP(c.primary_p) }),
      el("td", { "data-role": "holm-p", title: `Holm over every comparison: `
        + fmtP(c.primary_p_holm_all) }, fmtP(p), " ", el("span", { class: "sig",
        text: holmMark(p) })),
      // Pooled over other factors only: the variance of all runs of each level.
      el("td", { "data-role": "marginal-ratio", text: fmt(c.marginal_var_ratio),
        title: c.marginal_var_ratio === null ? null : "the ratio of the variances of all runs "
          + "of each level, cell means included: an effect of the other factors inflates it "
          + "(descriptive, untested)" }),
      el("td", { title: `${c.mean_test || "no test"}: p ${fmtP(c.mean_p)} raw, `
        + `${fmtP(c.mean_p_holm_factor)} Holm (factor)`,
      text: `${fmt(c.mean_diff)} ${fmtInterval(c.mean_diff_ci95)}` }),
      // The texts are long: listed under Warnings, counted here (hover for them).
      el("td", { class: "warn", title: c.warnings.join("\n") || null,
        text: c.warnings.length ? `${c.warnings.length} ⚠` : "" }));
  });
  return el("div", { class: "table-scroll" },
    // the interval is the raw test's (each comparison alone), the Holm p adjusted: say so
    el("p", { class: "muted", "data-role": "interval-note", text: "The 95% CI and the primary "
      + "p are raw (each comparison alone); Holm p is adjusted over the factor's comparisons, "
      + "so an interval excluding 1 beside a Holm p above 0.05 is significant alone, not after "
      + "the adjustment." }),
    sortableTable("comparisons", ["factor",
      "levels a vs b", "within", "n", "pairing", "var a / var b (within cells)", "var ratio",
      "95% CI (primary, raw)", "primary p (raw)", "Holm p (factor)", "marginal ratio (pooled)",
      "mean a − b [95% CI]", "warnings"], rows, { class: "numbers" }));
}

function omnibusTable(stats) {
  return el("table", { "data-role": "omnibus" },
    el("thead", {}, el("tr", {}, ["factor (omnibus)", "levels", "n", "primary p (raw)",
      "Brown–Forsythe p (raw)"].map((h) => el("th", { text: h })))),
    el("tbody", {}, stats.omnibus.map((o) => el("tr", {}, el("td", { text: o.factor }),
      el("td", { text: o.levels.map(levelText).join(", ") }),
      el("td", { text: o.n.join(", ") }),
      el("td", { "data-role": "omnibus-primary-p", title: o.primary_test || null,
        text: fmtP(o.primary_p) }),
      el("td", { text: fmtP(o.brown_forsythe_p) })))));
}

function conditionsTable(stats, numberOf) {
  return el("div", { class: "table-scroll" }, sortableTable("conditions", ["#", "condition", "n",
    "mean", "95% CI of mean", "std", "median", "min", "max", "warnings"],
  stats.conditions.map((c) => el("tr", { "data-role": "condition-row",
    "data-condition": c.condition_key, "data-n": c.n },
  el("td", { text: numberOf.get(c.condition_key) || "" }),
  el("td", { text: c.condition_key }), el("td", { text: c.n }), el("td", { text: fmt(c.mean) }),
  el("td", { text: fmtInterval(c.ci95) }), el("td", { text: fmt(c.std) }),
  el("td", { text: fmt(c.median) }), el("td", { text: fmt(c.min) }),
  el("td", { text: fmt(c.max) }),
  el("td", { class: "warn", title: c.warnings.join("\n") || null,
    text: c.warnings.length ? `${c.warnings.length} ⚠` : "" })))));
}

function runsTable(runs, metric) {
  return el("div", { class: "table-scroll" }, sortableTable("runs", ["run", "condition", "seed",
    "status", "attempts", metric, "warnings"], runs.map((r) => el("tr", { "data-role": "run-row" },
    el("td", {}, el("a", { href: `#/runs/${r.id}`, "data-role": "run-link", text: r.id })),
    el("td", { text: r.condition_key }), el("td", { text: r.seed }),
    el("td", {}, statusBadge(r.status)), el("td", { text: r.attempts }),
    el("td", { text: fmt(r.metrics[metric]) }),
    el("td", { class: "warn", text: r.warnings.length || "" })))));
}

// Warnings grouped by kind (a diagnostic's warning, an error, a statistics warning with its
// numbers left out), each with its count; the runs or conditions it concerns on expand.
function warningsList(runs, stats) {
  const kinds = new Map();
  const add = (kind, title, item) => {
    if (!kinds.has(kind)) kinds.set(kind, { title, items: [] });
    kinds.get(kind).items.push(item);
  };
  const shape = (text) => text.replace(/[-+]?\d*\.?\d+(?:e[-+]?\d+)?/gi, "#");
  for (const r of runs) {
    const where = `run ${r.id} (${r.condition_key}, seed ${r.seed})`;
    for (const w of r.warnings) {
      add(`run:${w.diagnostic || shape(w.message || "")}`, w.message || JSON.stringify(w),
        w.diagnostic ? `${where}: ${w.diagnostic} = ${fmt(w.value)}, threshold ${fmt(w.threshold)}`
          : where);
    }
    // a cancelled run's note (cancelled while running) is no warning: the cancel was asked for
    if (r.error && r.status !== "cancelled") add(`error:${r.error}`, `ended with: ${r.error}`, `${where}: ${r.status}`);
  }
  if (stats) {
    for (const c of stats.conditions) for (const w of c.warnings) add(`stats:${shape(w)}`, w, `${c.condition_key}: ${w}`);
    for (const c of stats.comparisons) {
      for (const w of c.warnings) {
        add(`stats:${shape(w)}`, w, pairText(c)
          + `${c.within === null ? " (pooled)" : ` within ${conditionLabel(c.within)}`}: ${w}`);
      }
    }
    for (const o of stats.omnibus) for (const w of o.warnings) add(`stats:${shape(w)}`, w, `${o.factor}: ${w}`);
  }
  if (!kinds.size) return el("p", { class: "muted", text: "no warnings" });
  const MAX_ITEMS = 200;
  // which kinds are expanded survives the refreshes of a running experiment
  const open = experimentState.openWarnings;
  return el("ul", { class: "warn warnings", "data-role": "warnings" }, [...kinds].map(([kind, k]) =>
    el("li", { "data-role": "warning-kind" }, el("details", { open: open.has(kind),
      ontoggle: (e) => { if (e.target.open) open.add(kind); else open.delete(kind); } },
      el("summary", {}, el("span", { "data-role": "warning-title", text: k.title }), " ",
        el("span", { class: "count", "data-role": "warning-count", text: `× ${k.items.length}` })),
      el("ul", {}, k.items.slice(0, MAX_ITEMS).map((t) => el("li", { class: "muted", text: t })),
        k.items.length > MAX_ITEMS ? el("li", { class: "muted",
          text: `and ${k.items.length - MAX_ITEMS} more` }) : null)))));
}

// Which control has the keyboard focus, as a selector that finds its counterpart after the
// view is rebuilt (a refresh or a control's change), so that focus stays where it was.
function focusedSelector() {
  const active = document.activeElement;
  if (!active || !main.contains(active) || !active.dataset || !active.dataset.role) return null;
  const attrs = ["role", "legend", "condition", "runId", "metric"].filter((k) => active.dataset[k] !== undefined)
    .map((k) => `[data-${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}="${CSS.escape(active.dataset[k])}"]`);
  return attrs.join("");
}

function replaceView(children) {
  const focused = focusedSelector();
  main.replaceChildren(...children.filter(Boolean));
  fitLabels(main);
  const again = focused && main.querySelector(focused);
  if (again) again.focus();
}

// A run that ended without completing: its values are the last it logged, never final ones.
function endedBadly(status) {
  return !ACTIVE.has(status) && status !== "completed";
}

// The conditions' key: its number, colour and grid values; a click (or Enter) hides or shows a
// condition on every chart of the page.
function conditionLegend(conditions, rerender, place) {
  return el("div", { class: "legend", "data-role": "legend" }, conditions.map((c) => el("button", {
    type: "button", class: "legend-item", "data-role": "legend-item", "data-legend": place,
    "data-condition": c.key,
    "aria-pressed": String(!experimentState.hidden.has(c.key)),
    title: experimentState.hidden.has(c.key) ? "hidden: click to show" : "click to hide",
    onclick: () => {
      if (experimentState.hidden.has(c.key)) experimentState.hidden.delete(c.key);
      else experimentState.hidden.add(c.key);
      rerender();
    } }, el("span", { class: "swatch", style: `background:${c.color}` }),
  el("span", { class: "legend-number", text: `#${c.number}` }), ` ${keyText(c.key)}`)),
  experimentState.hidden.size ? el("button", { type: "button", "data-role": "show-all",
    "data-legend": place,
    text: "show all", onclick: () => { experimentState.hidden.clear(); rerender(); } }) : null);
}

// The config-against-result view of an experiment with two or more grid factors.
function parallelSection(detail, runs, metric, visible) {
  const grid = detail.spec.grid || {};
  if (Object.keys(grid).length < 2) return null;
  const shown = new Set(visible.map((c) => c.key));
  const lines = runs.filter((r) => r.status === "completed" && shown.has(r.condition_key)
    && typeof r.metrics[metric] === "number").map((r) => ({ runId: r.id, seed: r.seed,
    key: r.condition_key, condition: r.condition, value: r.metrics[metric] }));
  if (!lines.length) return null;
  const readout = el("p", { class: "readout", "data-role": "parallel-readout", "aria-live": "polite",
    text: "Hover or Tab to a line for its run; Enter opens it." });
  return section(`Config against ${metric}`, "parallel-section",
    el("p", { class: "muted", text: "Every completed run is a line through its grid values and "
      + `its ${metric}${experimentState.log ? " (log axis)" : ""}, coloured by the value (blue `
      + "low, red high): where the lines of one level fan out, that level's seeds spread." }),
    parallelChart(grid, lines, metric, experimentState.log, readout), readout);
}

async function showExperiment(id) {
  const gen = generation;
  if (experimentState.id !== id) Object.assign(experimentState,
    { id, metric: null, curveMetric: null, seeds: false, log: null, hidden: new Set(),
      openWarnings: new Set(), comparisonsOffset: 0 });
  const rerender = () => showExperiment(id).catch(showError);
  const detail = await api(`/experiments/${id}`);
  // the charts start on the spec's analysis scale (the statistics' scale); the checkbox changes it
  if (experimentState.log === null) {
    experimentState.log = ((detail.spec.analysis || {}).scale || "raw") === "log";
  }
  const trainer = (await trainers()).find((t) => t.name === detail.trainer);
  const { items: runs, truncated } = await apiPages(`/experiments/${id}/runs`, RUNS_PAGE, MAX_RUN_PAGES);
  if (gen !== generation) return;
  // imported results name their metrics in their spec; a trainer's are in GET /trainers. Only
  // those some run holds a final value of are offered, and curves only of names with points.
  const known = detail.spec.imported ? detail.spec.imported.metrics
    : trainer ? trainer.metrics : [];
  const logged = new Set(runs.flatMap((r) => Object.keys(r.metrics)));
  experimentState.metric = experimentState.metric || detail.spec.metric
    || (trainer && trainer.primary_metric);
  const metric = experimentState.metric;
  const metrics = [...new Set([metric, ...known.filter((m) => logged.has(m))])].filter(Boolean);
  const curveMetrics = detail.curve_metrics || [];
  if (!curveMetrics.includes(experimentState.curveMetric)) {
    experimentState.curveMetric = curveMetrics.includes(metric) ? metric
      : curveMetrics.find((m) => known.includes(m)) || curveMetrics[0] || null;
  }
  const finished = runs.some((r) => r.status === "completed");
  let stats = null;
  let statsProblem = null;
  if (finished) {
    // one page of the comparisons (the whole list when it fits one: the same stored page)
    const page = `limit=${COMPARISONS_PAGE}&offset=${experimentState.comparisonsOffset}`;
    try { stats = await api(`/experiments/${id}/stats?metric=${encodeURIComponent(metric)}&${page}`); }
    catch (error) { statsProblem = error.message; }
  }
  // The headline's comparisons are the pooled ones of every factor: where the comparisons take
  // more than one page, they come on a page of their own (?pooled=true), so that the first
  // screen answers for every factor, whichever page the table shows.
  let headlineStats = stats;
  if (stats && (stats.offset > 0 || stats.next_offset !== null)) {
    try {
      headlineStats = await api(`/experiments/${id}/stats?metric=${encodeURIComponent(metric)}`
        + `&pooled=true&limit=${COMPARISONS_PAGE}`);
    } catch (error) { headlineStats = stats; }
  }
  const params = await paramsTable(id, metric);
  const conditionKeys = stats ? stats.conditions.map((c) => c.condition_key)
    : [...new Set(runs.map((r) => r.condition_key))];
  for (const key of new Set(runs.map((r) => r.condition_key))) {
    if (!conditionKeys.includes(key)) conditionKeys.push(key);
  }
  const conditions = conditionKeys.map((key, i) => ({ key, number: i + 1, color: conditionColor(i) }));
  const visible = conditions.filter((c) => !experimentState.hidden.has(c.key));
  const numberOf = new Map(conditions.map((c) => [c.key, c.number]));
  const curves = detail.spec.imported ? [el("p", { class: "muted", "data-role": "no-curves",
    text: "imported results hold final metrics only: no curves" })]
    : await curvesSection(runs, visible, gen);
  const reports = [];
  for (const name of (trainer && finished ? trainer.reports : [])) {
    try { reports.push([name, await api(`/experiments/${id}/reports/${encodeURIComponent(name)}`)]); }
    catch (error) { reports.push([name, error.message]); }
  }
  if (gen !== generation || curves === null) return;

  const select = (role, value, options, onchange) => el("select", { "data-role": role,
    onchange: (e) => { onchange(e.target.value); rerender(); } },
  options.map((m) => el("option", { value: m, selected: m === value, text: m })));
  const toggle = (role, label, key) => el("label", {}, el("input", { type: "checkbox",
    "data-role": role, checked: experimentState[key],
    onchange: (e) => { experimentState[key] = e.target.checked; rerender(); } }),
  ` ${label}`);

  const groups = visible.map(({ key, color }) => ({ key, color, points: runs
    .filter((r) => r.condition_key === key && r.status === "completed"
      && typeof r.metrics[metric] === "number")
    .map((r) => ({ runId: r.id, seed: r.seed, value: r.metrics[metric] })) }));
  const readout = el("p", { class: "readout", "data-role": "point-readout", "aria-live": "polite",
    text: "Hover or Tab to a point for its condition, seed and value; Enter opens its run." });
  // A failed or stopped experiment, or one some of whose runs failed (running or ended
  // partial), says why first, with the first failed run's error. A cancelled run is no error
  // (its cancel was asked for): a user-cancelled experiment opens without a red line.
  const failedRuns = runs.filter((r) => r.error && FAILED_STATUSES.includes(r.status));
  const firstFailed = failedRuns.sort((a, b) => a.id - b.id)[0];
  const problem = detail.message || firstFailed ? el("div", { class: "problem",
    "data-role": "problem" },
  detail.message ? el("p", { class: "error", "data-role": "experiment-message", text: detail.message }) : null,
  firstFailed ? el("p", { "data-role": "first-error" },
    `${failedCount(detail, failedRuns)} of ${detail.n_runs} runs failed. First error: `,
    el("a", { href: `#/runs/${firstFailed.id}`, text: `run ${firstFailed.id}` }),
    ` (${keyText(firstFailed.condition_key)}, seed ${firstFailed.seed}, ${firstFailed.status}): `,
    el("code", { class: "error", text: firstFailed.error })) : null) : null;
  const anyPoint = groups.some((g) => g.points.length);

  replaceView([
    el("p", {}, el("a", { href: "#/", text: "← experiments" })),
    el("h1", {}, `${detail.name} `, el("span", { class: "muted", text: `#${detail.id}` })),
    labelsLine(detail),
    problem,
    stats ? headline(headlineStats, id, curveMetrics.includes(stats.metric)) : null,
    // what its seeds per condition cannot let the test say (as submit said)
    (detail.seed_warnings || []).length ? el("ul", { class: "warn", "data-role": "seed-warnings" },
      detail.seed_warnings.map((w) => el("li", { text: w }))) : null,
    factsList([["status", statusBadge(detail.status)], ["trainer", detail.trainer],
      ...(detail.queue_position ? [["queue", el("span", { "data-role": "queue-position",
        text: detail.queue_position === 1 ? "next to start"
          : `${detail.queue_position - 1} queued experiments ahead of it` })]] : []),
      ...(detail.waiting_for ? [["waiting", el("span", { class: "error",
        "data-role": "waiting-for", text: detail.waiting_for })]] : []),
      ["progress", progress(detail.counts, detail.n_runs)],
      ["conditions × seeds", detail.n_conditions && detail.n_runs % detail.n_conditions === 0
        ? `${detail.n_conditions} conditions × ${detail.n_runs / detail.n_conditions} seeds = ${detail.n_runs} runs`
        : `${detail.n_conditions} conditions, ${detail.n_runs} runs`],
      ["created", fmtTime(detail.created_at)], ["finished", fmtTime(detail.finished_at)],
      ["counts", Object.entries(detail.counts).filter(([, n]) => n).map(([s, n]) => `${s} ${n}`).join(", ")]]),
    el("div", { class: "controls" }, el("label", {}, "metric ", select("metric-select", metric,
      metrics, (v) => { experimentState.metric = v; experimentState.comparisonsOffset = 0; })),
    toggle("log-scale", "log scale", "log"),
    ACTIVE.has(detail.status) ? el("span", { class: "muted", text: "refreshing while it runs" }) : null),
    section(`Distribution of ${metric} per condition`, "distribution-section",
      conditionLegend(conditions, rerender, "distribution"),
      anyPoint ? [el("p", { class: "muted", text: "Every completed seed is a point (click one "
        + "for its run); the box spans the quartiles, the bar is the median, the whiskers "
        + "reach min and max. Click a condition above to hide or show it." }),
      distributionChart(groups, metric, experimentState.log, readout), readout]
        : el("p", { class: "muted", "data-role": "no-distribution", text: finished
          ? `no completed run of the conditions shown has a value of ${metric}`
          : ACTIVE.has(detail.status) ? "no run has completed yet: a point per seed appears as "
            + "each completes" : "no run completed: nothing to compare" }),
      stats ? conditionsTable(stats, numberOf) : statsProblem ? el("p", { class: "muted",
        text: statsProblem }) : null),
    section("Comparisons of variance", "comparisons-section",
      stats && stats.interim ? el("p", { class: "warn", "data-role": "interim-note",
        text: stats.interim_note || "Interim: this adaptive experiment is still adding seeds; "
          + "every p-value and interval here is an interim look." }) : null,
      el("p", { class: "muted", text: "Variances are within cells (each run against its own "
        + "condition), so the other factors' effects on the mean never count as seed variance"
        + (stats && stats.scale === "log" ? "; on the log scale, of the metric's logarithm" : "")
        + ". pooled: every run at each level, over all levels of the other factors; within: "
        + "the other factors held at the levels shown. The primary test is a randomisation test "
        + "of squared deviations from each cell's centre (paired: signs flipped within each seed "
        + "both levels ran, the centre between the cell's median and the midpoint of its "
        + "shortest half up to 15 seeds, the median from 16; unpaired: permuted within cells, "
        + "from one mode-aligned centre at 6-15 seeds, the cell medians otherwise; hover a p for "
        + "the test's name); its 95% CI holds the ratios it "
        + "does not reject (∞: unbounded). * / **: its Holm-adjusted p below 0.05 / 0.01 over "
        + "the factor's comparisons. Hover a cell for the F-test, Brown–Forsythe, the mean "
        + "test and pairing. Click a header to sort." }),
      stats && stats.comparisons.length ? comparisonsTable(stats)
        : el("p", { class: "muted", text: "no comparisons (a grid factor with two levels and "
          + "completed runs is needed)" }),
      stats ? comparisonsPager(stats, rerender) : null,
      stats && stats.omnibus.length ? el("div", { class: "table-scroll" }, omnibusTable(stats)) : null,
      stats && stats.source_decomposition ? el("div", { class: "table-scroll" },
        el("table", { "data-role": "source-decomposition" },
          el("thead", {}, el("tr", {}, ["within", "source", "n", "variance", "95% CI"]
            .map((h) => el("th", { text: h })))),
          el("tbody", {}, stats.source_decomposition.flatMap((d) => d.sources.map((s) =>
            el("tr", {}, el("td", { text: conditionLabel(d.within) }), el("td", { text: s.source }),
              el("td", { text: s.n }), el("td", { text: fmt(s.var) }),
              el("td", { text: fmtInterval(s.var_ci95) }))))))) : null),
    parallelSection(detail, runs, metric, visible),
    section(`Curves of ${experimentState.curveMetric || "—"}`, "curves-section",
      detail.spec.imported || !curveMetrics.length ? null : el("div", { class: "controls" },
        el("label", {}, "curve ", select("curve-metric-select", experimentState.curveMetric,
          curveMetrics, (v) => { experimentState.curveMetric = v; })),
        toggle("show-seeds", "show single seeds", "seeds")),
      detail.spec.imported || !curveMetrics.length ? null : conditionLegend(conditions, rerender, "curves"),
      curves),
    paramsSection(params),
    section("Warnings", "warnings-section", warningsList(runs, stats)),
    reports.length ? section("Reports", "reports-section", reports.map(([name, body]) =>
      el("details", { open: true, "data-role": "report", "data-report": name },
        el("summary", { text: name }), el("pre", { text: typeof body === "string" ? body
          : JSON.stringify(body, null, 2) })))) : null,
    detail.adaptive ? section("Adaptive seeding", "adaptive-section",
      el("pre", { text: JSON.stringify(detail.adaptive, null, 2) })) : null,
    section("Runs", "runs-section", truncated ? el("p", { class: "muted",
      text: `the first ${runs.length} runs` }) : null, runsTable(runs, metric)),
    section("Spec", "spec-section", el("pre", { text: JSON.stringify(detail.spec, null, 2) })),
  ]);
  scheduleRefresh(ACTIVE.has(detail.status), rerender);
}

async function showRun(id) {
  const gen = generation;
  if (runState.id !== id) Object.assign(runState, { id, log: false });
  const run = await api(`/runs/${id}`);
  const { items: points, truncated } = await apiPages(`/runs/${id}/metrics`, POINTS_PAGE,
    MAX_RUN_POINT_PAGES);
  if (gen !== generation) return;
  const byName = new Map();
  for (const p of points) {
    if (!byName.has(p.name)) byName.set(p.name, []);
    byName.get(p.name).push([p.step, p.value === null ? NaN : p.value]);
  }
  // The trainer's own curves first, those it also reports a final value of leading (in that
  // order), the system's (sys/: memory, time) last.
  const finals = Object.keys(run.metrics);
  const rank = (name) => (name.startsWith("sys/") ? [2, 0]
    : finals.includes(name) ? [0, finals.indexOf(name)] : [1, 0]);
  const ordered = [...byName].sort(([m], [n]) => {
    const [a, b] = [rank(m), rank(n)];
    return a[0] - b[0] || a[1] - b[1];
  });
  const width = chartWidth(2);
  const charts = ordered.map(([name, pts]) => el("figure", { "data-metric": name },
    curveChart([{ key: name, color: COLORS[0], mean: pts }], { xLabel: "step", yLabel: name,
      log: runState.log, width, height: 240, role: "run-curve" })));
  const history = run.attempt_history || [];
  // an attempt's traceback is the run's (shown whole below), not a table cell
  const historyKeys = [...new Set(history.flatMap((h) => Object.keys(h)))]
    .filter((k) => k !== "traceback");
  const bad = endedBadly(run.status);
  const rerender = () => showRun(id).catch(showError);
  replaceView([
    el("p", {}, el("a", { href: `#/experiments/${run.experiment_id}`, text: "← experiment" })),
    el("h1", { text: `Run ${run.id}: ${keyText(run.condition_key)}, seed ${run.seed}` }),
    // A run that ended badly shows why before anything else.
    run.error || run.traceback ? section(`Why it ended: ${run.status}`, "error-section",
      run.error ? el("p", { class: "error", "data-role": "run-error", text: run.error }) : null,
      run.failed_at ? el("p", {}, "at ", el("code", { text: run.failed_at })) : null,
      run.traceback ? el("pre", { "data-role": "traceback", text: run.traceback }) : null) : null,
    factsList([["status", statusBadge(run.status)], ["attempts", String(run.attempts)],
      ["started", fmtTime(run.started_at)], ["finished", fmtTime(run.finished_at)],
      ["error", run.error || "—"],
      ["failed at", run.failed_at || "—"],
      ["stopped by", run.stop ? `${run.stop.checks.join(", ")} at epoch ${run.stop.epoch}: `
        + run.stop.reason : "—"]]),
    section(run.status === "completed" ? "Final metrics" : bad
      ? `Last logged values (the run ${run.status}: not final)` : "Last logged values (still running)",
    "run-metrics-section", keyValueTable(run.metrics, "run-metrics")),
    section("Curves", "run-curves-section",
      el("div", { class: "controls" }, el("label", {}, el("input", { type: "checkbox",
        "data-role": "run-log-scale", checked: runState.log,
        onchange: (e) => { runState.log = e.target.checked; rerender(); } }), " log scale")),
      truncated ? el("p", { class: "muted", text: `the first ${points.length} points` }) : null,
      charts.length ? el("div", { class: "charts" }, charts)
        : el("p", { class: "muted", text: "no points logged yet" })),
    section("Diagnostics", "diagnostics-section", keyValueTable(run.diagnostics, "diagnostics")),
    section("Warnings", "run-warnings-section", run.warnings.length
      ? el("ul", { class: "warn" }, run.warnings.map((w) => el("li", { text: w.message
        ? `${w.message} (${w.diagnostic} = ${fmt(w.value)}, threshold ${fmt(w.threshold)})`
        : JSON.stringify(w) })))
      : el("p", { class: "muted", text: "no warnings" })),
    section("Attempt history", "attempts-section", history.length
      ? el("div", { class: "table-scroll" }, el("table", { "data-role": "attempts" },
        el("thead", {}, el("tr", {}, historyKeys.map((k) => el("th", { text: k })))),
        el("tbody", {}, history.map((h) => el("tr", {}, historyKeys.map((k) =>
          el("td", { text: h[k] === undefined ? "" : fmtValue(h[k]) })))))))
      : el("p", { class: "muted", text: "one attempt, no retries" })),
    section("Provenance", "provenance-section", keyValueTable(run.provenance, "provenance")),
    section("Config (as run)", "config-section", el("pre", { text: JSON.stringify(run.config, null, 2) })),
  ]);
  scheduleRefresh(ACTIVE.has(run.status), rerender);
}

// ---------------------------------------------------------------- tags, notes, params table

const paramsState = { all: false };  // the params table shows every config field, not only those that vary

function tagChips(tags, onPick) {
  return tags.map((tag) => el("button", { type: "button", class: "tag", "data-role": "tag",
    title: `only experiments tagged ${tag}`, text: tag, onclick: () => onPick(tag) }));
}

// The experiment's tags (each one opens the list filtered by it) and its note.
function labelsLine(detail) {
  if (!detail.tags.length && !detail.note) return null;
  return el("div", { class: "labels", "data-role": "labels" },
    tagChips(detail.tags, (tag) => { Object.assign(listState, { tag, name: "", status: "",
      trainer: "" }); location.hash = "#/"; }),
    detail.note ? el("p", { class: "note", "data-role": "note", text: detail.note }) : null);
}

// GET /experiments/{id}/params, or the reason it could not be read.
async function paramsTable(id, metric) {
  try { return await api(`/experiments/${id}/params?metric=${encodeURIComponent(metric)}`); }
  catch (error) { return { problem: error.message }; }
}

// Every condition's config side by side with its n, mean and std: the fields that vary across
// the conditions first (marked), the others on demand.
function paramsSection(params) {
  const holder = el("div");
  const draw = () => {
    const varying = new Set(params.varying);
    const fields = paramsState.all ? params.fields : params.varying;
    holder.replaceChildren(el("div", { class: "table-scroll" }, el("table", { class: "numbers", "data-role": "params" },
      el("thead", {}, el("tr", {}, ["condition", "n", `mean ${params.metric}`, "std"]
        .map((h) => el("th", { text: h })), fields.map((f) => el("th", { text: f,
        class: varying.has(f) ? "varying" : null, "data-role": varying.has(f) ? "varying-field"
          : "field" })))),
      el("tbody", {}, params.conditions.map((c) => el("tr", { "data-role": "params-row",
        "data-condition": c.condition_key },
      el("td", { text: conditionLabel(c.condition) }), el("td", { text: c.n }),
      el("td", { text: fmt(c.mean) }), el("td", { text: fmt(c.std) }),
      fields.map((f) => el("td", { class: varying.has(f) ? "varying" : null,
        text: fmtValue(c.config[f]) }))))))));
  };
  draw();
  const all = el("label", {}, el("input", { type: "checkbox", "data-role": "params-all",
    checked: paramsState.all, onchange: (e) => { paramsState.all = e.target.checked; draw(); } }),
  " show every config field");
  return section("Parameters", "params-section", params.problem
    ? el("p", { class: "muted", text: params.problem })
    : [el("p", { class: "muted", text: params.varying.length
      ? `Each condition's config as its runs train with it; ${params.varying.join(", ")} `
        + "differ between conditions (shown first, highlighted)."
      : "No config field differs between the conditions." }), all, holder]);
}

async function route() {
  generation += 1;
  clearTimeout(refreshTimer);
  try {
    const locked = (await needsToken()) && !sessionStorage.getItem(TOKEN_KEY);
    updateLoginState();
    if (locked) {
      main.replaceChildren(el("p", { "data-role": "token-needed",
        text: "This service needs its API token (SEEDGRID_API_TOKEN): enter it above. It is "
          + "kept in this tab's session storage only and sent as an Authorization header." }));
      return;
    }
    const hash = location.hash || "#/";
    let match;
    if ((match = hash.match(/^#\/experiments\/(\d+)$/))) await showExperiment(Number(match[1]));
    else if ((match = hash.match(/^#\/runs\/(\d+)$/))) await showRun(Number(match[1]));
    else if ((match = hash.match(/^#\/compare\/(\d+)\/(\d+)$/))) {
      await showCompare(Number(match[1]), Number(match[2]));
    }
    else await showList();
  } catch (error) {
    showError(error);
  }
}

// ---------------------------------------------------------------- two experiments side by side

const compareState = { a: null, b: null, offset: 0, scale: "" };

// Two experiments of one trainer, condition by condition (GET /compare): per shared condition
// the variance ratio a / b with its interval as a forest plot and a table with the tests of
// /stats (the factor is "experiment"), what else differs between their base configs (the
// comparison measures that too), and the conditions only one of them ran.
async function showCompare(a, b) {
  const gen = generation;
  if (compareState.a !== a || compareState.b !== b) {
    Object.assign(compareState, { a, b, offset: 0, scale: "" });
  }
  const [ea, eb] = await Promise.all([api(`/experiments/${a}`), api(`/experiments/${b}`)]);
  let cmp = null;
  let problem = null;
  try {
    const query = new URLSearchParams({ a, b, limit: COMPARE_PAGE, offset: compareState.offset });
    if (compareState.scale) query.set("scale", compareState.scale);
    cmp = await api(`/compare?${query}`);
  } catch (error) { problem = error.message; }
  if (gen !== generation) return;
  const rerender = () => showCompare(a, b).catch(showError);
  const scaleName = cmp && cmp.scale === "log" ? `log ${cmp.metric}` : cmp ? cmp.metric : "";
  const rows = cmp ? cmp.conditions.map((c) => el("tr", { "data-role": "compare-row",
    "data-condition": c.condition_key },
  el("td", { text: keyText(c.condition_key) + (c.condition_key_b && c.condition_key_b
    !== c.condition_key ? ` (b: ${c.condition_key_b})` : "") }),
  el("td", { text: `${c.a.n} / ${c.b.n}` }),
  el("td", { text: `${fmt(c.a.mean)} / ${fmt(c.b.mean)}` }),
  el("td", { text: `${fmt(c.comparison.var_a)} / ${fmt(c.comparison.var_b)}` }),
  el("td", { "data-role": "compare-ratio", text: fmt(c.comparison.var_ratio) }),
  el("td", { "data-role": "compare-interval", text: fmtRatioInterval(c.comparison.primary_ci95) }),
  el("td", { "data-role": "compare-p", title: c.comparison.primary_test || null,
    text: fmtP(c.comparison.primary_p) }),
  el("td", { text: `${fmt(c.comparison.mean_diff)} ${fmtInterval(c.comparison.mean_diff_ci95)}` }),
  el("td", { class: "warn", title: c.comparison.warnings.join("\n") || null,
    text: c.comparison.warnings.length ? `${c.comparison.warnings.length} ⚠` : "" }))) : [];
  const go = (offset) => () => { compareState.offset = offset; rerender(); };
  replaceView([
    el("p", {}, el("a", { href: "#/", text: "← experiments" })),
    el("h1", {}, "Compare ", el("a", { href: `#/experiments/${a}`, text: `#${a} ${ea.name}` }),
      " (a) with ", el("a", { href: `#/experiments/${b}`, text: `#${b} ${eb.name}` }), " (b)"),
    problem ? el("p", { class: "error", "data-role": "compare-problem", text: problem }) : null,
    el("div", { class: "controls" }, el("label", {}, "scale ", el("select", {
      "data-role": "compare-scale", onchange: (e) => {
        compareState.scale = e.target.value; compareState.offset = 0; rerender();
      } }, [["", "the specs' (default)"], ["raw", "raw"], ["log", "log"]].map(([value, text]) =>
      el("option", { value, selected: value === compareState.scale, text }))))),
    cmp ? el("p", { "data-role": "compare-summary" }, `${cmp.total_conditions} condition`
      + `${cmp.total_conditions === 1 ? "" : "s"} both completed runs of; ${cmp.metric} on the `
      + `${cmp.scale} scale` + (cmp.scale_note ? ` (${cmp.scale_note})` : "") + ". Each row "
      + "tests a's seeds against b's as /stats tests two levels, and stands alone: its p is "
      + "raw, not adjusted for the conditions compared.")
      : null,
    cmp && cmp.config_differences.length ? el("p", { class: "warn", "data-role": "compare-confounds",
      text: "The base configs also differ, so every row measures these too: "
        + cmp.config_differences.map((d) => `${d.field} ${d.a} → ${d.b}`).join(", ") }) : null,
    cmp && cmp.conditions.length ? section(`Variance ratio a / b of ${scaleName} per condition`,
      "compare-forest-section", forestPlot(cmp.conditions.map((c) => ({ key: c.condition_key,
        label: keyText(c.condition_key), comparison: c.comparison })), scaleName, "compare-forest",
      true))
      : null,
    cmp ? section("Side by side", "compare-section", cmp.conditions.length
      ? el("div", { class: "table-scroll" }, sortableTable("compare", ["condition", "n a / b",
        "mean a / b", "var a / var b (within)", "var ratio", "95% CI (primary, raw)",
        "primary p (raw)", "mean a − b [95% CI]", "warnings"], rows,
      { class: "numbers" }))
      : el("p", { class: "muted", text: "no condition has completed runs in both" }),
    cmp.offset > 0 || cmp.next_offset !== null ? el("p", { class: "controls" },
      cmp.offset > 0 ? el("button", { type: "button", text: "← previous",
        onclick: go(Math.max(0, cmp.offset - COMPARE_PAGE)) }) : null,
      cmp.next_offset !== null ? el("button", { type: "button", text: "next →",
        onclick: go(cmp.next_offset) }) : null) : null,
    cmp.only_in_a.length ? el("p", { class: "muted", "data-role": "only-in-a",
      text: `only a (#${a}) ran: ${cmp.only_in_a.map(keyText).join("; ")}` }) : null,
    cmp.only_in_b.length ? el("p", { class: "muted", "data-role": "only-in-b",
      text: `only b (#${b}) ran: ${cmp.only_in_b.map(keyText).join("; ")}` }) : null) : null,
  ]);
}

// ---------------------------------------------------------------- theme

// Dark or light: the system's (prefers-color-scheme) until the toggle picks one, which this
// browser then remembers (localStorage).
const darkScheme = window.matchMedia("(prefers-color-scheme: dark)");

function applyTheme() {
  const chosen = localStorage.getItem(THEME_KEY);
  if (chosen) document.documentElement.dataset.theme = chosen;
  else delete document.documentElement.dataset.theme;
  const dark = chosen ? chosen === "dark" : darkScheme.matches;
  const button = document.getElementById("theme-toggle");
  button.textContent = dark ? "light mode" : "dark mode";
  button.setAttribute("aria-pressed", String(dark));
}

document.getElementById("theme-toggle").addEventListener("click", () => {
  const dark = document.getElementById("theme-toggle").getAttribute("aria-pressed") === "true";
  localStorage.setItem(THEME_KEY, dark ? "light" : "dark");
  applyTheme();
});
darkScheme.addEventListener("change", applyTheme);
applyTheme();

// Charts are drawn at the window's width: a resize draws them again (once it settles).
let resizeTimer = null;
let drawnWidth = main.clientWidth;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    if (Math.abs(main.clientWidth - drawnWidth) < 40) return;
    drawnWidth = main.clientWidth;
    if (!main.querySelector("select:focus, input:focus")) route();
  }, 300);
});

window.addEventListener("hashchange", route);
route();
