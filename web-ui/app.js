// joader dashboard: polls the JSON API and draws everything itself (no libraries, no CDN).
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

// Per-interval values from consecutive samples; `f(a, b, dt)` returns a value or null.
function derive(f, lag = 1) {
  const out = [];
  for (let i = lag; i < history.length; i++) {
    const a = history[i - lag], b = history[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    const v = f(a, b, dt);
    if (v != null && isFinite(v)) out.push([b.t, v]);
  }
  return out;
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
  return history.map((pt) => [pt.t, pt.bytes_in_use]);
}

// ---------------------------------------------------------------- drawing

function setupCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300, h = canvas.clientHeight || 130;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// The time axis: the last five minutes, or less while the history is shorter (at least 30 s).
function timeWindow() {
  if (!history.length) return { t0: -60, t1: 0 };
  const t1 = history[history.length - 1].t;
  const span = Math.min(WINDOW_S, Math.max(30, t1 - history[0].t));
  return { t0: t1 - span, t1 };
}

function fmtAgo(s) {
  return s === 0 ? "now" : s % 60 === 0 ? "-" + s / 60 + " min" : "-" + s + " s";
}

// series: [{color, points: [[t, v]], fill}]; opts: {max, fmt}
function drawChart(canvas, series, opts) {
  const { ctx, w, h } = setupCanvas(canvas);
  const left = 54, right = 8, top = 6, bottom = 18;
  const pw = w - left - right, ph = h - top - bottom;
  const { t0, t1 } = timeWindow();
  const span = t1 - t0;
  let max = opts.max;
  if (max == null) {
    let m = 0;
    for (const s of series) for (const [t, v] of s.points) if (t >= t0 && v > m) m = v;
    max = niceMax(m * 1.1);
  }
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8b95ad";
  ctx.strokeStyle = "#2a3450";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = top + ph - (ph * i) / 4;
    ctx.beginPath();
    ctx.moveTo(left, Math.round(y) + 0.5);
    ctx.lineTo(left + pw, Math.round(y) + 0.5);
    ctx.stroke();
    ctx.fillText(opts.fmt((max * i) / 4), left - 6, y);
  }
  ctx.textBaseline = "alphabetic";
  const step = [10, 15, 30, 60].find((s) => span / s <= 5) || 60;
  for (let ago = 0; ago <= span + 0.001; ago += step) {
    const xx = left + pw * (1 - ago / span);
    ctx.textAlign = ago === 0 ? "right" : "center";
    if (xx - left > 14) ctx.fillText(fmtAgo(ago), xx, h - 4);
  }
  const x = (t) => left + pw * ((t - t0) / span);
  const y = (v) => top + ph - ph * Math.min(1, Math.max(0, v / max));
  for (const s of series) {
    const pts = s.points.filter(([t]) => t >= t0);
    if (pts.length === 0) continue;
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.8;
    ctx.lineJoin = "round";
    ctx.beginPath();
    pts.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    if (s.fill) {
      ctx.lineTo(x(pts[pts.length - 1][0]), top + ph);
      ctx.lineTo(x(pts[0][0]), top + ph);
      ctx.closePath();
      ctx.globalAlpha = 0.15;
      ctx.fillStyle = s.color;
      ctx.fill();
      ctx.globalAlpha = 1;
    }
    if (pts.length === 1) {
      ctx.fillStyle = s.color;
      ctx.beginPath();
      ctx.arc(x(pts[0][0]), y(pts[0][1]), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    }
  }
  if (series.every((s) => s.points.length === 0)) {
    ctx.fillStyle = "#8b95ad";
    ctx.textAlign = "center";
    ctx.fillText("collecting…", left + pw / 2, top + ph / 2);
  }
}

function drawSpark(canvas, points, color) {
  const { ctx, w, h } = setupCanvas(canvas);
  const { t0, t1 } = timeWindow();
  const pts = points.filter(([t]) => t >= t0);
  if (pts.length < 2) return;
  const max = Math.max(...pts.map((p) => p[1])) || 1;
  const x = (t) => (w * (t - t0)) / (t1 - t0);
  const y = (v) => h - 2 - (h - 4) * (v / max);
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  pts.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
  ctx.stroke();
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
  const cpu = cpuSeries();
  $("k-cpu").textContent = cpu.length ? cpu[cpu.length - 1][1].toFixed(0) + " %" : "–";
  $("k-cpu-sub").textContent = "RSS " + fmtBytes(st.process_rss_bytes) + " · " + (st.process_cpu_s == null ? "–" : st.process_cpu_s.toFixed(1)) + " s total";
  $("meta").textContent = "instance " + st.instance + " · v" + st.version + " · up " + fmtDuration(st.uptime_s);
}

function renderJobs(jobs) {
  $("jobs-count").textContent = jobs.length ? "(" + jobs.length + ")" : "";
  const body = $("jobs");
  if (!jobs.length) {
    body.innerHTML = '<tr><td colspan="10" class="empty">no jobs yet</td></tr>';
    return;
  }
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
        '<td class="num rate">' + fmtRate(job.samples_per_s) + "</td>" +
        '<td><canvas class="spark" data-spark="' + esc(job.name) + '"></canvas></td>' +
        '<td class="num">' + fmtPct(job.hits + job.misses ? job.hit_ratio : null) + "</td>" +
        '<td class="num">' + job.stall_s.toFixed(1) + " s <span class=\"unit\">(" + fmtPct(stallPct) + ")</span></td>" +
        '<td class="num">' + fmtCount(job.errors) + "</td></tr>"
      );
    })
    .join("");
  for (const c of body.querySelectorAll("canvas[data-spark]")) {
    const name = c.getAttribute("data-spark");
    drawSpark(c, jobRateSeries(name), colorOf(name));
  }
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
  const names = jobs.map((job) => job.name);
  drawChart($("c-throughput"), names.map((n) => ({ color: colorOf(n), points: jobRateSeries(n) })), { fmt: (v) => fmtCount(v) });
  $("l-throughput").innerHTML = names
    .map((n) => '<span><i style="background:' + colorOf(n) + '"></i>' + esc(n) + "</span>")
    .join("");
  drawChart($("c-hit"), [{ color: "#4cd497", points: hitRatioSeries(), fill: true }], { max: 1, fmt: (v) => (100 * v).toFixed(0) + "%" });
  const cap = history.length ? history[history.length - 1].capacity_bytes : 0;
  const mem = memSeries();
  const memMax = Math.max(1, ...mem.map((p) => p[1]));
  drawChart($("c-mem"), [{ color: "#5eb1ff", points: mem, fill: true }], {
    max: Math.min(cap || Infinity, niceMax(memMax * 1.1)),
    fmt: (v) => fmtBytes(v).replace(" ", ""),
  });
  drawChart($("c-cpu"), [{ color: "#f5b94c", points: cpuSeries(), fill: true }], { fmt: (v) => v.toFixed(0) });
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
      history.push(pt);
    }
    while (history.length && history[history.length - 1].t - history[0].t > WINDOW_S + 10) history.shift();
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
window.addEventListener("resize", () => refresh());
