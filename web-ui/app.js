// joader dashboard: polls the JSON API and renders tiles, tables and charts. The charts are
// uPlot 1.6.32 (https://github.com/leeoniya/uPlot, MIT, see uPlot.LICENSE), vendored as
// uPlot.iife.min.js and uPlot.min.css and embedded in the binary with this file: no CDN, the
// page works offline.
//
// Naming convention, checked by a test against the API: the variables `st`, `job`, `ds` and
// `pt` only ever hold /v1/stats, an element of /v1/jobs, an element of /v1/datasets and a
// sample of /v1/stats/history, so every field read through them must exist there.
"use strict";

const POLL_MS = 2000;
const WINDOW_S = 300; // the charts show the last five minutes
const COLORS = ["#5eb1ff", "#4cd497", "#f5b94c", "#ff6b6b", "#c38bff", "#4fd1d9", "#ff9f6b", "#a3b1c9"];

const token = new URLSearchParams(location.search).get("token");
const history = []; // samples of /v1/stats/history, oldest first
const jobColors = new Map();
let lastOk = 0;
let clockOffset = 0; // wall-clock seconds at the server's start (history times are uptimes)

function $(id) { return document.getElementById(id); }

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
  if (!res.ok) {
    let msg = res.status + " " + res.statusText;
    try { const e = await res.json(); msg = e.error.code + ": " + e.error.message; } catch (_) { /* not JSON */ }
    throw new Error(path + ": " + msg);
  }
  return res.json();
}

// ---------------------------------------------------------------- formatting

function fmtCount(n) {
  if (n == null) return "–";
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " G";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + " M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + " k";
  return String(Math.round(n));
}
function fmtBytes(b) {
  if (b == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i === 0 ? b.toFixed(0) : b.toFixed(b >= 100 ? 0 : 1)) + " " + u[i];
}
// A job's bytes from object stores: this epoch's, the last epoch's beside it ("–": none, as
// for local datasets).
function fmtStore(job) {
  if (!job.store_read_bytes) return "–";
  return fmtBytes(job.store_read_bytes_epoch) + ' <span class="unit">(last ' + fmtBytes(job.store_read_bytes_last_epoch) + ")</span>";
}
function fmtNum(v) { return v >= 1e4 ? fmtCount(v) : String(+v.toFixed(2)); }
function fmtPct(x) { return x == null || !isFinite(x) ? "–" : (100 * x).toFixed(1) + " %"; }
function fmtRate(r) { return r == null ? "–" : r >= 100 ? r.toFixed(0) : r.toFixed(1); }
function fmtDuration(s) {
  if (s == null) return "–";
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function colorOf(name) {
  if (!jobColors.has(name)) jobColors.set(name, COLORS[jobColors.size % COLORS.length]);
  return jobColors.get(name);
}

// ---------------------------------------------------------------- series from the history

// The history's `t` is the server's uptime; the charts show wall-clock time.
function times() {
  return history.map((pt) => pt.t + clockOffset);
}

// Per-interval values from samples `lag` apart, aligned with the history (null where unknown);
// `f(a, b, dt)` returns a value or null.
function derive(f, lag = 1) {
  return history.map((b, i) => {
    const a = history[i - lag];
    const v = a && b.t > a.t ? f(a, b, b.t - a.t) : null;
    return v != null && isFinite(v) ? v : null;
  });
}

function jobRateSeries(name) {
  return derive((a, b, dt) => {
    const x = a.jobs[name], y = b.jobs[name];
    if (!x || !y || y.acknowledged < x.acknowledged) return null;
    return (y.acknowledged - x.acknowledged) / dt;
  });
}

function hitRatioSeries() {
  // Over a few samples: one second of a slow job is too few requests for a ratio.
  return derive((a, b) => {
    const r = b.requests - a.requests;
    return r > 0 ? (b.hits - a.hits) / r : null;
  }, 5);
}

function cpuSeries() {
  return derive((a, b, dt) => (a.cpu_s == null || b.cpu_s == null ? null : (100 * (b.cpu_s - a.cpu_s)) / dt));
}

function memSeries() {
  return history.map((pt) => pt.bytes_in_use);
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
  return null;
}

// ---------------------------------------------------------------- charts (uPlot)

const CHART_H = 150;
const charts = new Map(); // element id -> uPlot
const hm = uPlot.fmtDate("{HH}:{mm}"), hms = uPlot.fmtDate("{HH}:{mm}:{ss}");
// Clock labels of the time axis; none too close to the right edge, where it would be cut.
function clockLabels(u, ts) {
  const fmt = ts.every((t) => t % 60 === 0) ? hm : hms;
  return ts.map((t) => (u.valToPos(t, "x") > u.bbox.width / uPlot.pxRatio - 14 ? "" : fmt(new Date(t * 1000))));
}
const axis = {
  stroke: "#8b95ad",
  font: "11px system-ui, sans-serif",
  grid: { stroke: "#2a3450", width: 1 },
  ticks: { stroke: "#2a3450", width: 1, size: 4 },
};

// Out of the charts, their legends show the newest values; over one, those under the cursor.
function showNewest(u) {
  const last = u.data[0].length - 1;
  if (u.cursor.idx == null && last >= 0 && u.legend.idxs[0] !== last) u.setLegend({ idx: last });
}

// A time chart in `#id` of `data` ([times, ...values]). series: [{label, color, fill}];
// y: {fmt (axis), value (legend), range, incrs, size}. The time axis spans the history, at
// least 30 s.
function makeChart(id, data, series, y) {
  const el = $(id);
  return new uPlot(
    {
      width: el.clientWidth || 300,
      height: CHART_H,
      padding: [10, 12, 0, 0],
      cursor: { sync: { key: "joader" }, drag: { x: false, y: false } },
      legend: { markers: { width: 0, fill: (u, i) => series[i - 1].color } },
      scales: {
        x: { time: true, range: (u, min, max) => (max == null ? [min, max] : [Math.min(min, max - 30), max]) },
        y: { range: y.range },
      },
      axes: [
        // space: a label ("14:49:50", about 50 px at 11 px) plus a gap, so that none overlap.
        { ...axis, size: 22, gap: 3, space: 70, incrs: [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600], values: clockLabels },
        { ...axis, size: y.size || 48, gap: 4, incrs: y.incrs, values: (u, vs) => vs.map(y.fmt) },
      ],
      series: [
        { label: "time", value: (u, t) => (t == null ? "–" : hms(new Date(t * 1000))) },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 1.5,
          fill: s.fill ? s.color + "26" : undefined,
          points: { show: false },
          value: (u, v) => (v == null ? "–" : (y.value || y.fmt)(v)),
        })),
      ],
      hooks: { setLegend: [showNewest] },
    },
    data,
    el,
  );
}

// Creates the chart `id` the first time (or again when `key`, its set of series, changes) and
// gives it `data` ([times, ...values]).
function chart(id, key, data, series, y) {
  let u = charts.get(id);
  if (u && u.key !== key) {
    u.destroy();
    u = null;
  }
  if (u) {
    u.setData(data);
  } else {
    u = makeChart(id, data, series, y);
    u.key = key;
    charts.set(id, u);
  }
}

// A sparkline of `values` at `ts`, as a small inline SVG (it lives in a table row rebuilt on
// every poll).
function spark(ts, values, color) {
  const pts = values.map((v, i) => [ts[i], v]).filter(([, v]) => v != null);
  if (pts.length < 2) return "";
  const t0 = ts[0], span = ts[ts.length - 1] - t0 || 1;
  const max = Math.max(...pts.map(([, v]) => v)) || 1;
  const xy = pts.map(([t, v]) => ((100 * (t - t0)) / span).toFixed(1) + "," + (21 - (20 * v) / max).toFixed(1));
  return '<svg class="spark" viewBox="0 0 100 22" preserveAspectRatio="none"><polyline stroke="' + color + '" points="' + xy.join(" ") + '"/></svg>';
}

// ---------------------------------------------------------------- rendering

function renderTiles(st, jobs) {
  const running = jobs.filter((job) => job.state === "running");
  const total = running.reduce((a, job) => a + job.samples_per_s, 0);
  $("k-throughput").textContent = fmtRate(total);
  $("k-hit").textContent = fmtPct(st.requests ? st.hit_ratio : null);
  $("k-hit-sub").textContent = fmtCount(st.hits) + " of " + fmtCount(st.requests) + " requests";
  $("k-saved").textContent = fmtCount(st.decodes_saved);
  $("k-saved-sub").textContent = fmtCount(st.decodes) + " decodes, " + fmtCount(st.loads) + " reads done";
  $("k-mem").textContent = fmtBytes(st.bytes_in_use);
  $("k-mem-sub").textContent = "of " + fmtBytes(st.capacity_bytes) + " shared memory";
  $("k-mem-bar").style.width = (st.capacity_bytes ? (100 * st.bytes_in_use) / st.capacity_bytes : 0) + "%";
  $("k-slots").textContent = fmtCount(st.slots_in_use);
  $("k-slots-sub").textContent = "of " + fmtCount(st.slot_capacity) + " slots";
  $("k-slots-bar").style.width = (st.slot_capacity ? (100 * st.slots_in_use) / st.slot_capacity : 0) + "%";
  const cpu = lastValue(cpuSeries());
  $("k-cpu").textContent = cpu == null ? "–" : cpu.toFixed(0) + " %";
  $("k-cpu-sub").textContent = "RSS " + fmtBytes(st.process_rss_bytes) + " · " + (st.process_cpu_s == null ? "–" : st.process_cpu_s.toFixed(1)) + " s total";
  // The disk tier of encoded bytes from object stores (null: the server has none).
  const dc = st.disk_cache;
  $("k-disk-tile").hidden = !dc;
  if (dc) {
    const reads = dc.hits + dc.misses;
    $("k-disk").textContent = fmtBytes(dc.bytes);
    $("k-disk-bar").style.width = (dc.capacity_bytes ? (100 * dc.bytes) / dc.capacity_bytes : 0) + "%";
    $("k-disk-sub").textContent =
      "of " + fmtBytes(dc.capacity_bytes) + " · " + fmtCount(dc.objects) + " objects · hits " +
      fmtPct(reads ? dc.hits / reads : null) + " · " + fmtBytes(dc.store_read_bytes) + " from the store" +
      (dc.writing ? "" : " · writing stopped (" + fmtCount(dc.write_errors) + " errors)");
  }
  $("meta").textContent = "instance " + st.instance + " · v" + st.version + " · up " + fmtDuration(st.uptime_s);
}

function renderJobs(jobs) {
  $("jobs-count").textContent = jobs.length ? "(" + jobs.length + ")" : "";
  const body = $("jobs");
  if (!jobs.length) {
    body.innerHTML = '<tr><td colspan="11" class="empty">no jobs yet</td></tr>';
    return;
  }
  const ts = times();
  body.innerHTML = jobs
    .map((job) => {
      const frac = job.subset_size ? Math.min(1, (job.position + 1) / job.subset_size) : 0;
      const epochs = job.epochs == null ? "∞" : job.epochs;
      const stallPct = job.age_s > 0 ? job.stall_s / job.age_s : 0;
      const title = job.reason ? ' title="' + esc(job.reason) + '"' : "";
      return (
        '<tr data-job="' + esc(job.name) + '" data-rate="' + job.samples_per_s.toFixed(3) + '">' +
        '<td class="name"><i class="swatch" style="color:' + colorOf(job.name) + '">●</i> ' + esc(job.name) + "</td>" +
        "<td>" + esc(job.dataset) + "</td>" +
        '<td><span class="badge ' + esc(job.state) + '"' + title + ">" + esc(job.state) + "</span></td>" +
        '<td class="num">' + (job.epoch + 1) + " / " + epochs + "</td>" +
        '<td><div class="progress"><div class="bar"><div style="width:' + (100 * frac).toFixed(1) + '%"></div></div><span>' +
        fmtCount(job.position + 1) + " / " + fmtCount(job.subset_size) + "</span></div></td>" +
        // A running job's recent rate; an ended job's mean over its own run, labelled so.
        '<td class="num rate"' + (job.samples_per_s_over === "run" ? ' title="mean over the job\'s run, from its first credit to its last acknowledgement"' : "") + ">" +
        fmtRate(job.samples_per_s) + (job.samples_per_s_over === "run" ? ' <span class="unit">(run mean)</span>' : "") + "</td>" +
        "<td>" + spark(ts, jobRateSeries(job.name), colorOf(job.name)) + "</td>" +
        '<td class="num">' + fmtPct(job.hits + job.misses ? job.hit_ratio : null) + "</td>" +
        '<td class="num">' + fmtStore(job) + "</td>" +
        '<td class="num">' + job.stall_s.toFixed(1) + " s <span class=\"unit\">(" + fmtPct(stallPct) + ")</span></td>" +
        '<td class="num">' + fmtCount(job.errors) + "</td></tr>"
      );
    })
    .join("");
}

function renderDatasets(datasets) {
  $("datasets-count").textContent = datasets.length ? "(" + datasets.length + ")" : "";
  const body = $("datasets");
  if (!datasets.length) {
    body.innerHTML = '<tr><td colspan="5" class="empty">no datasets yet</td></tr>';
    return;
  }
  body.innerHTML = datasets
    .map((ds) => {
      const src = ds.source.kind + ": " + (ds.source.path || "");
      const items = ds.state === "indexing" ? fmtCount(ds.progress) + "…" : fmtCount(ds.items);
      const title = ds.error ? ' title="' + esc(ds.error) + '"' : "";
      return (
        '<tr data-dataset="' + esc(ds.name) + '"><td class="name">' + esc(ds.name) + "</td>" +
        '<td><span class="badge ' + esc(ds.state) + '"' + title + ">" + esc(ds.state) + "</span></td>" +
        '<td class="num">' + items + "</td>" +
        '<td class="num">' + (ds.classes ? ds.classes.length : "–") + "</td>" +
        '<td class="src" title="' + esc(src) + '">' + esc(src) + "</td></tr>"
      );
    })
    .join("");
}

function renderFacts(st) {
  const facts = [
    ["Loader queue", fmtCount(st.loader_queue)],
    ["Workers", fmtCount(st.loader_workers)],
    ["Loader busy", st.loader_busy_s.toFixed(1) + " s"],
    ["Read from storage", fmtBytes(st.bytes_read)],
    ["Sampler rounds", fmtCount(st.rounds)],
    ["Mean share", st.mean_share.toFixed(2) + " jobs/pick"],
    ["Evictions", fmtCount(st.evictions)],
    ["Load errors", fmtCount(st.load_errors)],
    ["Waiting for room", fmtCount(st.waiting_for_space)],
    ["Misses", fmtCount(st.misses)],
  ];
  $("facts").innerHTML = facts.map(([k, v]) => "<dt>" + esc(k) + "</dt><dd>" + esc(v) + "</dd>").join("");
}

function renderCharts(jobs) {
  const ts = times();
  const names = jobs.map((job) => job.name);
  const upFrom0 = (u, min, max) => [0, max > 0 ? max * 1.15 : 10];
  chart("c-throughput", names.join("\n"), [ts, ...names.map(jobRateSeries)],
    names.map((n) => ({ label: n, color: colorOf(n) })),
    { fmt: fmtNum, value: fmtRate, range: upFrom0 });
  chart("c-hit", "", [ts, hitRatioSeries()], [{ label: "hit ratio", color: "#4cd497", fill: true }],
    { fmt: (v) => (100 * v).toFixed(0) + " %", value: fmtPct, range: () => [0, 1] });
  // (Options are read when a chart is made: the range reads the capacity when it is called.)
  const cap = () => (history.length ? history[history.length - 1].capacity_bytes : 0);
  chart("c-mem", "", [ts, memSeries()], [{ label: "in use", color: "#5eb1ff", fill: true }], {
    fmt: (v) => fmtBytes(v).replace(".0 ", " "),
    value: fmtBytes,
    size: 58,
    range: (u, min, max) => [0, Math.min(cap() || Infinity, max > 0 ? max * 1.15 : 1)],
    incrs: Array.from({ length: 50 }, (_, i) => 2 ** i), // binary steps: 256 MiB, 512 MiB, …
  });
  chart("c-cpu", "", [ts, cpuSeries()], [{ label: "CPU", color: "#f5b94c", fill: true }],
    { fmt: fmtNum, value: (v) => v.toFixed(0) + " %", range: upFrom0 });
}

// ---------------------------------------------------------------- polling

async function refresh() {
  try {
    const since = history.length ? history[history.length - 1].t : null;
    const [st, jobsDoc, datasetsDoc, hist] = await Promise.all([
      api("/v1/stats"),
      api("/v1/jobs"),
      api("/v1/datasets"),
      api("/v1/stats/history" + (since == null ? "" : "?since=" + since)),
    ]);
    for (const pt of hist.samples) {
      if (history.length && pt.t < history[history.length - 1].t) history.length = 0; // restarted
      if (!history.length) clockOffset = Date.now() / 1000 - st.uptime_s;
      history.push(pt);
    }
    while (history.length && history[history.length - 1].t - history[0].t > WINDOW_S) history.shift();
    const jobs = jobsDoc.jobs;
    renderTiles(st, jobs);
    renderJobs(jobs);
    renderDatasets(datasetsDoc.datasets);
    renderFacts(st);
    renderCharts(jobs);
    lastOk = Date.now();
    $("error").hidden = true;
  } catch (e) {
    $("error").hidden = false;
    $("error").textContent =
      "Cannot load data: " + e.message + (String(e.message).includes("unauthorized") ? " — open this page with ?token=<token>" : "");
  }
  const stale = Date.now() - lastOk > 3 * POLL_MS;
  $("live").classList.toggle("stale", stale);
  $("live-text").textContent = stale ? "stale" : "live";
}

refresh();
setInterval(refresh, POLL_MS);
window.addEventListener("resize", () => {
  for (const [id, u] of charts) u.setSize({ width: $(id).clientWidth, height: CHART_H });
});
