// Berth console: router, API calls through the local server, DOM helpers, the chart.
// Everything from the API is put in the page as text (textContent), never as HTML.
"use strict";

const Berth = {
  pages: {},
  timers: [],
  visits: 0,
  info: null,
};

// el("td", {class: "x"}, "text", childNode, ...): text children become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(method, path, body) {
  const opts = { method, headers: { "X-Berth-Console": "1" } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch("/api" + path, opts);
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    const err = (data && data.error) || { code: "HTTP" + resp.status, message: resp.statusText };
    throw Object.assign(new Error(err.code + ": " + err.message), { status: resp.status, code: err.code });
  }
  return data;
}

function every(ms, fn) {
  const id = setInterval(fn, ms);
  Berth.timers.push(id);
  return id;
}

function fmtAge(iso) {
  if (!iso) return "";
  return fmtSeconds((Date.now() - Date.parse(iso)) / 1000);
}

function fmtSeconds(s) {
  if (s === null || s === undefined || isNaN(s)) return "";
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function usd(x) {
  return x === null || x === undefined ? "" : "$" + Number(x).toFixed(2);
}

function statusBadge(status) {
  return el("span", { class: "status s-" + status }, status);
}

function where(job) {
  const p = job.placement;
  if (!p) return job.site || "";
  if (p.site === "cloud") return "cloud " + p.region + " " + p.instance_type + (p.spot ? " spot" : "");
  return "on-prem " + (p.hosts || []).map((h) => h.host_id).join(", ");
}

function queueLine(job) {
  // "Why is it waiting": the scheduler's reason, place in the queue and its estimate (labelled).
  if (job.status !== "QUEUED") return null;
  const parts = [];
  if (job.queue_position) parts.push("position " + job.queue_position + " of " + job.queue_length);
  if (job.estimated_start) {
    parts.push("estimated start " + new Date(job.estimated_start).toLocaleString() +
      " (an estimate" + (job.estimated_start_basis === "burst" ? ": its burst wait ends" :
        ": on-prem GPUs predicted free") + ")");
  }
  return el("span", { class: "estimate", "data-testid": "queue-line" }, parts.join("; ") || "not ranked yet");
}

function errorBox(err) {
  return el("p", { class: "error", role: "alert" }, String(err.message || err));
}

// An inline SVG line chart: series [{name, cls, points: [[t, v]], max}], time on x.
function lineChart(series, width, height) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  const pad = 28;
  const all = series.flatMap((s) => s.points);
  if (!all.length) return svg;
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
  const add = (name, attrs, text) => {
    const n = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.appendChild(n);
    return n;
  };
  add("line", { x1: pad, y1: height - pad, x2: width - 8, y2: height - pad });
  add("line", { x1: pad, y1: 8, x2: pad, y2: height - pad });
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const max = s.max || Math.max(...s.points.map((p) => p[1]), 1);
    const pts = s.points.map(([t, v]) => {
      const x = pad + ((t - t0) / (t1 - t0)) * (width - pad - 8);
      const y = height - pad - (v / max) * (height - pad - 8);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    add("polyline", { class: s.cls, points: pts.join(" ") });
    add("text", { x: pad + 4 + i * 170, y: height - 8 }, s.name + " (max " + Math.round(max) + ")");
  });
  return svg;
}

function route() {
  for (const id of Berth.timers) clearInterval(id);
  Berth.timers = [];
  const hash = location.hash || "#/jobs";
  const [, page, ...rest] = hash.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === page || (page === "job" && a.dataset.page === "jobs"));
  }
  const main = document.getElementById("main");
  main.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  const render = Berth.pages[page] || Berth.pages.jobs;
  // A page resolves when it is shown (data-loaded-ms), with the answers still filling parts of it in,
  // if any (data-complete-ms once they have all arrived). A newer route leaves these alone.
  const visit = ++Berth.visits;
  const started = performance.now();
  const stamp = (key) => {
    if (visit === Berth.visits) main.dataset[key] = String(Math.round(performance.now() - started));
  };
  delete main.dataset.loadedMs;
  delete main.dataset.completeMs;
  Promise.resolve(render(main, arg))
    .then((rest) => {
      stamp("loadedMs");
      return Promise.allSettled(rest || []);
    }, (err) => {
      if (visit === Berth.visits) main.replaceChildren(errorBox(err));
      stamp("loadedMs");
    })
    .finally(() => {
      stamp("completeMs");
      if (visit === Berth.visits) main.dataset.page = page;
    });
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  try {
    Berth.info = await (await fetch("/console.json")).json();
    document.getElementById("who").textContent =
      "signed as " + (Berth.info.profile || "default") + " → " + Berth.info.api_url;
  } catch (e) { /* the header is informative only */ }
  route();
});
