// gpuwarden console: plain JS and SVG, no library. Fetches /api/state on every server-sent
// "update" event and redraws; the plots fetch /api/failures/ID/evidence and /api/jobs/ID/gpus.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token");
const SVGNS = "http://www.w3.org/2000/svg";
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];
const CAT_COLOUR = {
  "busy": "#3fae6a", "idle": "#c9ced6", "partially-idle": "#9aa3b1", "straggler-wait": "#e6a817",
  "checkpoint-stall": "#4a90d9", "input-wait": "#7d5fb2", "hung": "#e0622a", "lost-to-failure": "#b3141b",
  "no-telemetry": "#eceff3",
};
let plotted = { failure: null, job: null };

function api(path) {
  const headers = TOKEN ? { "Authorization": "Bearer " + TOKEN } : {};
  return fetch(path, { headers }).then((r) => {
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  });
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function t(ts) { return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "-"; }
function usd(x) { return "$" + Number(x).toFixed(2); }

function renderFleet(fleet) {
  const root = document.getElementById("fleet");
  root.replaceChildren();
  for (const n of fleet.nodes) {
    const flags = n.flags.length ? " " + n.flags.join(",") : "";
    const box = el("div", { class: "node" + (n.drained ? " drained" : ""), "data-node": n.node },
      el("div", { class: "name", text: n.node }),
      el("div", { class: "state", text: (n.state || "state ?") + flags + (n.reason ? " - " + n.reason : "") }));
    const grid = el("div", { class: "gpus" });
    for (const g of n.gpus) {
      const cls = g.severity ? "sev-" + g.severity : (g.job_id ? "sev-none" : "idle");
      const title = `${n.node} GPU ${g.index}` + (g.job_id ? ` job ${g.job_id}` : " (no job)") +
        (g.pattern ? `: ${g.pattern} (${g.severity})` : "");
      grid.append(el("span", { class: "cell " + cls, title, "data-gpu": String(g.index), text: String(g.index) }));
    }
    box.append(grid);
    root.append(box);
  }
}

function renderFailures(failures) {
  const body = document.querySelector("#failures tbody");
  body.replaceChildren();
  for (const f of failures) {
    const where = f.gpu_index !== undefined && f.gpu_index !== null ? `${f.node} GPU ${f.gpu_index}` : f.node;
    const ev = (f.evidence || []).slice(0, 2).map((e) =>
      `${e.signal}=${e.value}${e.unit ? " " + e.unit : ""}` + (e.threshold !== undefined && e.threshold !== null
        ? ` (threshold ${e.threshold})` : "") + ` at ${t(e.ts)}`);
    const btn = el("button", { text: "plot" });
    btn.addEventListener("click", () => { plotted.failure = f.failure_id; plotEvidence(f.failure_id); });
    body.append(el("tr", { "data-failure": f.failure_id },
      el("td", { class: "sev sev-" + f.severity, text: f.severity }),
      el("td", { text: f.pattern }),
      el("td", { text: where }),
      el("td", { text: f.job_id || "-" }),
      el("td", { text: t(f.first_seen) }),
      el("td", { text: f.state }),
      el("td", {}, el("div", { text: f.verdict }), el("div", { class: "evidence", text: ev.join("; ") })),
      el("td", { text: `${f.cost.affected_gpus} GPUs, ${usd(f.cost.usd_per_hour)}/h` }),
      el("td", {}, btn)));
  }
  if (!failures.length) body.append(el("tr", {}, el("td", { colspan: "9", class: "muted", text: "no failures" })));
}

function renderRemediations(rems, breaker) {
  const b = document.getElementById("breaker");
  b.textContent = breaker.open ? "breaker: OPEN - " + breaker.reason : "breaker: closed";
  b.className = "badge " + (breaker.open ? "open" : "closed");
  const body = document.querySelector("#remediations tbody");
  body.replaceChildren();
  for (const r of rems) {
    const dec = r.decision + (r.dry_run && r.decision !== "dry-run" ? " (dry run)" : "");
    body.append(el("tr", {},
      el("td", { text: t(r.decided_at) }),
      el("td", { class: "dec-" + r.decision, text: dec }),
      el("td", { text: r.action }),
      el("td", { text: r.node }),
      el("td", { text: r.reason }),
      el("td", { class: "evidence", text: (r.argv || []).join(" ") })));
  }
  if (!rems.length) body.append(el("tr", {}, el("td", { colspan: "6", class: "muted", text: "no decisions" })));
}

function wasteBar(report) {
  const w = 600, h = 18;
  const s = svg("svg", { width: w, height: h, role: "img", "aria-label": "breakdown" });
  let x = 0;
  for (const b of report.breakdown) {
    if (b.gpu_hours <= 0) continue;
    const bw = report.gpu_hours > 0 ? (b.gpu_hours / report.gpu_hours) * w : 0;
    const r = svg("rect", { x, y: 0, width: Math.max(bw, 0.5), height: h, fill: CAT_COLOUR[b.category] || "#999" });
    const tt = svg("title", {});
    tt.textContent = `${b.category}: ${b.gpu_hours.toFixed(4)} GPU-h, ${usd(b.usd)} (${b.share_pct}%)`;
    r.append(tt);
    s.append(r);
    x += bw;
  }
  return s;
}

function renderJobs(jobs) {
  const root = document.getElementById("jobs");
  root.replaceChildren();
  for (const r of jobs) {
    const rows = r.breakdown.filter((b) => b.gpu_hours > 0).map((b) => el("tr", {},
      el("td", {}, el("span", { class: "cell", "data-cat": b.category }), " " + b.category),
      el("td", { text: b.gpu_hours.toFixed(4) + " GPU-h" }), el("td", { text: usd(b.usd) }),
      el("td", { text: b.share_pct.toFixed(1) + " %" }), el("td", { text: b.side || "" })));
    const btn = el("button", { text: "GPUs side by side" });
    btn.addEventListener("click", () => { plotted.job = r.job_id; plotJob(r.job_id); });
    const tensor = r.tensor_activity_pct_mean !== undefined && r.tensor_activity_pct_mean !== null
      ? `tensor activity ${r.tensor_activity_pct_mean.toFixed(1)} % (${r.tensor_activity_gpus} GPUs)`
      : "tensor activity not reported";
    const card = el("div", { class: "job", "data-job": r.job_id },
      el("div", { class: "title", text: `job ${r.job_id}${r.name ? " " + r.name : ""} (${r.user || "?"}) - ` +
        `${r.state}${r.final ? ", final" : ", as of " + t(r.as_of)} - ${r.gpu_count} GPUs, ` +
        `${r.gpu_hours.toFixed(3)} GPU-h, ${usd(r.usd)}; busy ${r.busy_pct.toFixed(1)} %, ` +
        `wasted ${r.waste_gpu_hours.toFixed(3)} GPU-h (${usd(r.waste_usd)}); ${tensor}` }),
      el("div", { class: "verdict", text: r.verdict }),
      wasteBar(r),
      el("table", {}, el("tbody", {}, ...rows)),
      el("div", { class: "muted", text: "do: " + (r.recommendations || []).join(" ") }),
      el("div", { class: "muted", text: "cannot tell: " + (r.cannot_determine || []).slice(0, 3).join("; ") }),
      btn);
    root.append(card);
  }
  for (const c of root.querySelectorAll(".cell[data-cat]")) {
    // colour through an SVG swatch: no inline style attributes under the page's CSP
    const sw = svg("svg", { width: 12, height: 12 });
    sw.append(svg("rect", { width: 12, height: 12, rx: 2, fill: CAT_COLOUR[c.dataset.cat] || "#999" }));
    c.replaceWith(sw);
  }
  if (!jobs.length) root.append(el("div", { class: "muted", text: "no job verdicts yet" }));
}

function linePlot(lines, opts) {
  const w = 760, h = 220, ml = 50, mr = 10, mt = 10, mb = 28;
  const s = svg("svg", { width: w, height: h, role: "img" });
  const pts = lines.flatMap((l) => l.points);
  const xs = pts.map((p) => p[0]).concat(opts.fault ? [opts.fault] : []);
  const ys = pts.map((p) => p[1]).concat(opts.threshold !== null && opts.threshold !== undefined ? [opts.threshold] : []);
  if (!xs.length || !ys.length) {
    const tx = svg("text", { x: 10, y: 20, class: "small" });
    tx.textContent = "no windows to plot yet";
    s.append(tx);
    return s;
  }
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || x0 + 1;
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) * 1.05 || 1;
  const X = (x) => ml + ((x - x0) / Math.max(x1 - x0, 1e-9)) * (w - ml - mr);
  const Y = (y) => h - mb - ((y - y0) / Math.max(y1 - y0, 1e-9)) * (h - mt - mb);
  s.append(svg("line", { x1: ml, y1: h - mb, x2: w - mr, y2: h - mb, class: "axis" }));
  s.append(svg("line", { x1: ml, y1: mt, x2: ml, y2: h - mb, class: "axis" }));
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    const tx = svg("text", { x: 4, y: Y(v) + 3, class: "small" });
    tx.textContent = v.toFixed(v >= 100 ? 0 : 2);
    s.append(tx);
  }
  for (const v of [x0, x1]) {
    const tx = svg("text", { x: X(v) - (v === x1 ? 60 : 0), y: h - 8, class: "small" });
    tx.textContent = t(v).slice(11);
    s.append(tx);
  }
  lines.forEach((l, i) => {
    if (!l.points.length) return;
    const d = l.points.map((p, j) => (j ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ");
    const path = svg("path", { d, class: "line", stroke: COLOURS[i % COLOURS.length] });
    const tt = svg("title", {});
    tt.textContent = l.label;
    path.append(tt);
    s.append(path);
  });
  if (opts.threshold !== null && opts.threshold !== undefined && opts.absolute) {
    s.append(svg("line", { x1: ml, x2: w - mr, y1: Y(opts.threshold), y2: Y(opts.threshold), class: "thr" }));
  }
  if (opts.fault) {
    s.append(svg("line", { x1: X(opts.fault), x2: X(opts.fault), y1: mt, y2: h - mb, class: "fault" }));
    const tx = svg("text", { x: X(opts.fault) + 3, y: mt + 10, class: "small" });
    tx.textContent = "fault " + t(opts.fault).slice(11);
    s.append(tx);
  }
  return s;
}

function plotEvidence(id) {
  api("/api/failures/" + encodeURIComponent(id) + "/evidence").then((d) => {
    const root = document.getElementById("evidence-plot");
    // a ratio threshold (vs the job median) is not on the plotted scale: drawn for absolute signals only
    const absolute = d.unit !== "ratio";
    root.replaceChildren(
      el("div", { class: "caption", text: `${d.pattern} on ${d.node}${d.gpu_index !== null && d.gpu_index !== undefined
        ? " GPU " + d.gpu_index : ""}: ${d.series} around the fault; evidence ${d.signal}` +
        (d.threshold !== null ? ` (threshold ${d.threshold} ${d.unit || ""})` : "") }),
      linePlot(d.lines, { threshold: d.threshold, fault: d.fault_ts, absolute }));
  }).catch(() => {});
}

function plotJob(id) {
  api("/api/jobs/" + encodeURIComponent(id) + "/gpus?series=util").then((d) => {
    const root = document.getElementById("job-plot");
    root.replaceChildren(el("div", { class: "caption", text: `job ${id}: GPU utilisation (%) per GPU, side by side` }),
      linePlot(d.lines, {}));
  }).catch(() => {});
}

function refresh() {
  return api("/api/state").then((s) => {
    renderFleet(s.fleet);
    renderFailures(s.failures);
    renderRemediations(s.remediations, s.breaker);
    renderJobs(s.jobs);
    document.getElementById("counts").textContent = `state v${s.version}`;
    document.body.dataset.version = String(s.version);
    if (!plotted.failure && s.failures.length) plotted.failure = s.failures[0].failure_id;
    if (plotted.failure) plotEvidence(plotted.failure);
    if (!plotted.job && s.jobs.length) plotted.job = s.jobs[0].job_id;
    if (plotted.job) plotJob(plotted.job);
  });
}

function connect() {
  const live = document.getElementById("live");
  const es = new EventSource("/api/events" + (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : ""));
  let busy = false, again = false;
  es.addEventListener("update", () => {
    if (busy) { again = true; return; }
    busy = true;
    refresh().catch(() => {}).finally(() => { busy = false; if (again) { again = false; refresh().catch(() => {}); } });
  });
  es.onopen = () => { live.textContent = "live"; live.className = "badge on"; };
  es.onerror = () => { live.textContent = "reconnecting"; live.className = "badge off"; };
}

document.addEventListener("DOMContentLoaded", () => { refresh().catch(() => {}); connect(); });
