// The clink-wasm console: plain JavaScript over the public REST API (/api/v1). The token lives in
// sessionStorage (this tab only) and goes out only as an Authorization header to this origin.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { token: "", admin: false, tenant: "", tenants: [], timer: 0 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

class APIError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || ("HTTP " + status));
    this.status = status;
    this.problem = problem;
  }
}

async function api(method, path, { body, type, query } = {}) {
  const q = new URLSearchParams(query || {});
  // The admin acts for the tenant picked in the header; a tenant token acts for its own.
  if (state.admin && state.tenant && /^\/api\/v1\/(modules|pipelines)/.test(path)) q.set("tenant", state.tenant);
  const url = path + (q.toString() ? "?" + q : "");
  const headers = { Authorization: "Bearer " + state.token, Accept: "application/json" };
  if (type) headers["Content-Type"] = type;
  const resp = await fetch(url, { method, headers, body });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
  if (!resp.ok) throw new APIError(resp.status, data || {});
  return data;
}

function problemText(err) {
  if (!(err instanceof APIError)) return String(err.message || err);
  const p = err.problem;
  let s = p.detail || p.title || ("HTTP " + err.status);
  if (p.field) s = p.field + ": " + s;
  if (p.code) s += " (" + p.code + ")";
  return s;
}

function fmtBytes(n) {
  if (n === 0) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (Number.isInteger(n) ? n : n.toFixed(1)) + " " + u[i];
}
const fmtTime = (s) => s ? new Date(s).toLocaleString() : "–";
const list = (a) => (a && a.length ? a.join(", ") : "–");

// ---- sign-in ----

async function signIn(token) {
  state.token = token;
  const page = await api("GET", "/api/v1/tenants", { query: { limit: "1000" } });
  state.tenants = page.items;
  // /metrics answers the admin only: that tells the two kinds of token apart whatever they look like.
  const probe = await fetch("/metrics", { headers: { Authorization: "Bearer " + token } });
  state.admin = probe.ok;
  if (!state.admin) {
    state.tenant = page.items[0].name;
  } else if (!state.tenants.some((t) => t.name === state.tenant)) {
    state.tenant = state.tenants.length ? state.tenants[0].name : "";
  }
  sessionStorage.setItem("clink.token", token);
  showApp();
}

function showApp() {
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#who").hidden = false;
  const pick = $("#tenant-pick");
  pick.hidden = !state.admin;
  $("#tenant-pick-label").hidden = !state.admin;
  pick.replaceChildren(...state.tenants.map((t) => el("option", { value: t.name }, t.name)));
  pick.value = state.tenant;
  $("#who-name").textContent = state.admin ? "admin" : "tenant " + state.tenant;
  $("#tenants-tab").hidden = !state.admin;
  refreshAll();
  // Keep the figures current while the tab is visible.
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (state.token && !document.hidden) refreshAll(); }, 10000);
}

function signOut() {
  closePipeline();
  sessionStorage.removeItem("clink.token");
  clearInterval(state.timer);
  Object.assign(state, { token: "", admin: false, tenant: "", tenants: [], timer: 0 });
  $("#app").hidden = true;
  $("#who").hidden = true;
  $("#signin").hidden = false;
  $("#token").value = "";
}

// ---- overview ----

const quotaRows = [
  ["max_pipelines", "Pipelines", (v) => v],
  ["max_subtasks", "Subtasks (all pipelines)", (v) => v],
  ["max_modules", "Modules", (v) => v],
  ["max_module_bytes", "Module size", fmtBytes],
  ["guest_memory_bytes", "Guest memory per instance", fmtBytes],
  ["cpu_time_per_record_ms", "CPU time per record", (v) => v + " ms"],
  ["guest_cpu_millicores", "Guest CPU (all pipelines)", (v) => (v ? v / 1000 + " cores" : "unbounded")],
  ["max_in_flight_records", "In-flight records per pipeline", (v) => v],
  ["hot_tier_bytes", "Hot tier per pipeline", fmtBytes],
  ["state_bytes", "Durable state", fmtBytes],
  ["lookup_requests_per_second", "Lookups", (v) => v + " /s"],
  ["allowed_lookup_hosts", "Allowed lookup hosts", list],
  ["allowed_kafka_brokers", "Allowed Kafka brokers", list],
  ["api_requests_per_second", "API requests", (v) => v + " /s"],
];

function meter(label, used, limit, fmt = (v) => v) {
  const pct = limit > 0 ? Math.min(100, (used / limit) * 100) : (used > 0 ? 100 : 0);
  const bar = el("div", { class: "bar" + (pct >= 100 ? " full" : pct >= 80 ? " high" : "") }, el("span"));
  bar.firstChild.style.width = pct + "%";
  return el("div", { class: "card meter", "data-quota": label },
    el("div", { class: "muted" }, label),
    el("div", { class: "figure" }, fmt(used), el("small", {}, " / " + fmt(limit))),
    bar);
}

async function loadOverview() {
  if (!state.tenant) {
    $("#usage-cards").replaceChildren(el("p", { class: "muted" }, "No tenant yet: create one with `clink-wasm tenant create NAME`."));
    $("#quota-table tbody").replaceChildren();
    return;
  }
  const t = await api("GET", "/api/v1/tenants/" + encodeURIComponent(state.tenant));
  const q = t.quotas, u = t.usage;
  // A quota lowered below usage stops nothing; new admissions are refused until it is back under.
  const over = (t.over_quota || []).map((x) => el("div", { class: "card result bad", "data-over-quota": x.quota },
    el("div", {}, "Over ", el("code", {}, x.quota), ": " + x.used + " used of " + x.limit),
    el("div", { class: "muted" }, "What runs keeps running; new pipelines, starts and rescales up are refused until usage is back under the quota.")));
  $("#usage-cards").replaceChildren(
    ...over,
    meter("Pipelines", u.pipelines, q.max_pipelines),
    meter("Subtasks", u.subtasks, q.max_subtasks),
    meter("Modules", u.modules, q.max_modules),
    el("div", { class: "card meter" }, el("div", { class: "muted" }, "Module bytes stored"), el("div", { class: "figure" }, fmtBytes(u.module_bytes))),
  );
  $("#quota-table tbody").replaceChildren(...quotaRows.map(([k, label, fmt]) =>
    el("tr", { "data-quota": k }, el("td", {}, label, " ", el("code", { class: "muted" }, k)), el("td", {}, fmt(q[k])))));
}

// ---- modules ----

async function loadModules() {
  $("#modules-error").hidden = true;
  let page;
  try {
    page = await api("GET", "/api/v1/modules", { query: { limit: "1000" } });
  } catch (err) {
    $("#modules-error").textContent = problemText(err);
    $("#modules-error").hidden = false;
    return;
  }
  $("#modules-empty").hidden = page.items.length > 0;
  $("#modules-table tbody").replaceChildren(...page.items.map((m) => el("tr", { "data-id": m.id },
    el("td", {}, m.name),
    el("td", {}, m.version),
    el("td", { title: m.id }, el("code", {}, m.id.slice(0, 12))),
    el("td", {}, fmtBytes(m.size)),
    el("td", {}, list(m.manifest.states)),
    el("td", {}, list(m.manifest.endpoints)),
    el("td", {}, list(m.used_by)),
    el("td", {}, fmtTime(m.created_at)),
    el("td", {}, el("button", { class: "danger", onclick: () => deleteModule(m) }, "Delete")),
  )));
}

async function deleteModule(m) {
  if (!confirm("Delete " + m.ref + "?")) return;
  try {
    await api("DELETE", "/api/v1/modules/" + m.id);
    await refreshAll();
  } catch (err) {
    $("#modules-error").textContent = problemText(err);
    $("#modules-error").hidden = false;
  }
}

async function upload(ev) {
  ev.preventDefault();
  const file = $("#upload-file").files[0];
  const out = $("#upload-result");
  if (!file) {
    out.replaceChildren(el("div", { class: "result bad" }, "Choose a .wasm file first."));
    return;
  }
  const query = {};
  if ($("#upload-name").value.trim()) query.name = $("#upload-name").value.trim();
  if ($("#upload-version").value.trim()) query.version = $("#upload-version").value.trim();
  $("#upload-button").disabled = true;
  out.replaceChildren(el("div", { class: "result" }, "Validating " + file.name + "…"));
  try {
    const m = await api("POST", "/api/v1/modules", { body: await file.arrayBuffer(), type: "application/wasm", query });
    out.replaceChildren(el("div", { class: "result ok", id: "upload-ok" },
      el("strong", {}, "Registered " + m.ref), " ", el("code", {}, m.id),
      el("div", { class: "muted" }, "states: " + list(m.manifest.states) + " · endpoints: " + list(m.manifest.endpoints) + " · " + (m.memory || ""))));
    await refreshAll();
  } catch (err) {
    const p = err.problem || {};
    const items = (p.problems || []).map((x) => el("li", {}, el("span", { class: "tag " + x.source }, x.source), x.detail));
    out.replaceChildren(el("div", { class: "result bad", id: "upload-problems" },
      el("strong", {}, file.name + " was refused"), el("div", {}, problemText(err)),
      items.length ? el("ul", {}, items) : ""));
  } finally {
    $("#upload-button").disabled = false;
  }
}

// ---- pipelines ----

async function loadPipelines() {
  const page = await api("GET", "/api/v1/pipelines", { query: { limit: "1000" } });
  $("#pipelines-empty").hidden = page.items.length > 0;
  $("#pipelines-table tbody").replaceChildren(...page.items.map((p) => el("tr", {},
    el("td", {}, p.name),
    el("td", {}, el("code", {}, p.id)),
    el("td", {}, el("span", { class: "state" }, p.state)),
    el("td", {}, p.revision),
    el("td", {}, p.subtasks),
    el("td", {}, list((p.modules || []).map((id) => id.slice(0, 12)))),
    el("td", {}, p.checkpoint ? "#" + p.checkpoint.id + " at " + fmtTime(p.checkpoint.at) : "–"),
    el("td", {}, fmtTime(p.updated_at)),
    el("td", {}, el("button", { class: "ghost open-pipeline", "data-id": p.id, onclick: () => openPipeline(p.id) }, "Open")),
  )));
}

// ---- pipeline detail: status, throughput, operators, outputs, checkpoints, errors ----

const detail = { id: "", timer: 0, last: null, rates: [] };

function openPipeline(id) {
  detail.id = id;
  detail.last = null;
  detail.rates = [];
  $("#pipeline-detail").hidden = false;
  $("#detail-message").textContent = "";
  clearInterval(detail.timer);
  detail.timer = setInterval(pollDetail, 1000);
  pollDetail();
}

function closePipeline() {
  clearInterval(detail.timer);
  detail.id = "";
  $("#pipeline-detail").hidden = true;
}

async function pipelineAction(what, body) {
  const msg = $("#detail-message");
  msg.textContent = what + "…";
  try {
    const r = await api("POST", "/api/v1/pipelines/" + detail.id + "/" + what, body ? { body: JSON.stringify(body), type: "application/json" } : {});
    msg.textContent = what === "savepoints" ? "Savepoint #" + r.savepoint + " committed" : what === "stop" ? "Stopped" + (r.savepoint ? " at savepoint #" + r.savepoint : "") : "Started";
  } catch (err) {
    msg.textContent = problemText(err);
  }
  await pollDetail();
  loadPipelines().catch(console.error);
}

function drawChart() {
  const c = $("#throughput-chart");
  const g = c.getContext("2d");
  const w = c.width, h = c.height, pts = detail.rates.slice(-60);
  g.clearRect(0, 0, w, h);
  const top = Math.max(1, ...pts);
  g.strokeStyle = "#5aa9ff";
  g.lineWidth = 2;
  g.beginPath();
  pts.forEach((v, i) => {
    const x = (i / 59) * (w - 4) + 2, y = h - 4 - (v / top) * (h - 12);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
  g.fillStyle = "#8aa4c8";
  g.font = "11px sans-serif";
  g.fillText(Math.round(top) + "/s", 6, 12);
}

// The SVG namespace, from the HTML parser (no URL in the source: the console names no origin).
const SVG = (() => { const t = document.createElement("template"); t.innerHTML = "<svg></svg>"; return t.content.firstChild.namespaceURI; })();
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

// drawGraph lays the graph out in columns by depth (sources first) and draws each node with
// its parallelism and records, each input as an edge (side outputs dashed).
function drawGraph(g, job) {
  const box = $("#detail-graph");
  if (!g || !g.nodes || !g.nodes.length) { box.replaceChildren(el("span", { class: "muted" }, "no graph")); return; }
  const depth = {};
  const inputs = {};
  for (const e of g.edges) (inputs[e.to] = inputs[e.to] || []).push(e.from);
  const d = (n, seen = new Set()) => {
    if (depth[n] !== undefined) return depth[n];
    if (seen.has(n)) return 0;
    seen.add(n);
    const ins = inputs[n] || [];
    return (depth[n] = ins.length ? 1 + Math.max(...ins.map((i) => d(i, seen))) : 0);
  };
  const cols = [];
  for (const n of g.nodes) (cols[d(n.name)] = cols[d(n.name)] || []).push(n);
  const W = 170, H = 52, GX = 60, GY = 18;
  const pos = {};
  cols.forEach((col, ci) => col.forEach((n, ri) => { pos[n.name] = { x: 10 + ci * (W + GX), y: 10 + ri * (H + GY) }; }));
  const width = 20 + cols.length * (W + GX) - GX, height = 20 + Math.max(...cols.map((c) => c.length)) * (H + GY) - GY;
  const recs = {};
  for (const s of [...(job.Sources || []), ...(job.Operators || []), ...(job.Sinks || [])]) recs[s.Node] = (recs[s.Node] || 0) + (s.RecordsIn || 0);
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  for (const e of g.edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    root.append(svg("path", { class: "edge" + (e.side ? " side" : ""), d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`, "data-edge": e.from + ">" + e.to }));
  }
  for (const n of g.nodes) {
    const p = pos[n.name];
    const label = n.kind === "operator" ? (n.module || "") : (n.type || n.kind);
    const gEl = svg("g", { class: "node " + n.kind, transform: `translate(${p.x},${p.y})`, "data-node": n.name },
      svg("rect", { width: W, height: H }),
      svg("text", { x: 10, y: 20 }, n.name + (n.parallelism > 1 ? " ×" + n.parallelism : "")),
      svg("text", { x: 10, y: 38, class: "sub" }, label + " · " + (recs[n.name] || 0) + " rec"));
    gEl.append(svg("title", {}, n.kind + " " + n.name + (n.endpoints ? ", endpoints " + n.endpoints.join(", ") : "")));
    root.append(gEl);
  }
  box.replaceChildren(root);
}

function showPanels(m) {
  const h = m.hot_tier;
  if (h && h.hits + h.misses > 0) {
    const pct = Math.round(h.hit_ratio * 1000) / 10;
    $("#hot-ratio").textContent = pct + "%";
    $("#hot-bar span").style.width = pct + "%";
    $("#hot-detail").textContent = `${h.hits} hits, ${h.misses} misses, ${h.evictions} evictions; ${fmtBytes(h.hot_bytes)} of ${h.hot_limit ? fmtBytes(h.hot_limit) : "unbounded"}`;
  }
  const bs = m.breakers || [];
  $("#breakers").replaceChildren(...(bs.length ? bs.map((b) => el("li", { "data-endpoint": b.endpoint },
    el("span", { title: b.origin }, b.endpoint), el("span", { class: "state-" + b.state }, b.state))) : [el("li", { class: "muted" }, "no lookup endpoints")]));
  if (m.cpu) {
    const cores = (c) => +c.toFixed(2) + " core" + (c === 1 ? "" : "s");
    $("#cpu-figure").textContent = m.cpu.cores > 0 ? cores(m.cpu.cores) : "unbounded";
    // Under CPU pressure the share is the quota times the host's capacity (host/server/capacity.go).
    const scaled = m.cpu.host_capacity < 1 && m.cpu.quota_cores > 0
      ? `; quota ${cores(m.cpu.quota_cores)} × host capacity ${Math.round(m.cpu.host_capacity * 100)} %` : "";
    $("#cpu-detail").textContent = `${m.cpu.guest_seconds.toFixed(2)} s of guest time, ${m.cpu.paused_seconds.toFixed(2)} s paused by the share${scaled}`;
  }
}

async function pollDetail() {
  const id = detail.id;
  if (!id) return;
  const base = "/api/v1/pipelines/" + id;
  try {
    const [p, m, cps, errs] = await Promise.all([api("GET", base), api("GET", base + "/metrics"), api("GET", base + "/checkpoints"), api("GET", base + "/errors")]);
    if (detail.id !== id) return;
    $("#detail-name").textContent = p.name;
    const running = p.run && (p.run.state === "running" || p.run.state === "starting" || p.run.state === "restarting");
    $("#detail-state").textContent = running ? p.run.state : p.state;
    $("#detail-start").disabled = !!running;
    $("#detail-stop").disabled = $("#detail-savepoint").disabled = !running;
    const job = m.job || { Sources: [], Operators: [], Sinks: [] };
    const sum = (l, f) => (l || []).reduce((a, s) => a + (s[f] || 0), 0);
    const rin = sum(job.Sources, "RecordsIn"), rout = sum(job.Sinks, "RecordsIn");
    const now = Date.now();
    if (detail.last && running) detail.rates.push(Math.max(0, (rout - detail.last.out) * 1000 / (now - detail.last.t)));
    detail.last = { out: rout, t: now };
    $("#detail-in").textContent = rin;
    $("#detail-out").textContent = rout;
    $("#detail-rate").textContent = running && detail.rates.length ? Math.round(detail.rates[detail.rates.length - 1]) : 0;
    $("#detail-inflight").textContent = sum(job.Operators, "InFlight");
    $("#detail-lag").textContent = fmtBytes(m.ingest_lag_bytes || 0);
    drawChart();
    drawGraph(m.graph, job);
    showPanels(m);
    const nodes = [...(job.Sources || []), ...(job.Operators || []), ...(job.Sinks || [])];
    $("#detail-nodes tbody").replaceChildren(...nodes.map((n) => el("tr", {},
      el("td", {}, n.Node), el("td", {}, n.Subtask), el("td", {}, n.RecordsIn), el("td", {}, n.RecordsOut),
      el("td", {}, n.InFlight || 0), el("td", {}, n.Suspended || 0), el("td", {}, n.InputDepth || 0))));
    $("#detail-checkpoints").replaceChildren(...(cps.items || []).slice(-30).map((c) =>
      el("li", { class: c.savepoint ? "savepoint" : "", title: fmtTime(c.at) + ", " + c.duration_ms + " ms, " + fmtBytes(c.state_bytes) }, (c.savepoint ? "savepoint #" : "#") + c.id)));
    const items = errs.items || [];
    $("#detail-errors").replaceChildren(...(items.length ? items.slice(-10).reverse().map((e) =>
      el("li", {}, fmtTime(e.at) + " " + (e.operator ? "operator " + e.operator + (e.key ? " key " + e.key : "") + (e.record ? " at " + e.record : "") + ": " : "") + e.error)) : [el("li", { class: "muted" }, errs.error || "none")]));
    const out = await fetch(base + "/output?limit=20" + (state.admin && state.tenant ? "&tenant=" + encodeURIComponent(state.tenant) : ""), { headers: { Authorization: "Bearer " + state.token } });
    if (out.ok && detail.id === id) $("#detail-output").textContent = (await out.text()) || "(no output yet)";
  } catch (err) {
    if (detail.id === id) $("#detail-message").textContent = problemText(err);
  }
}

async function createPipeline(ev) {
  ev.preventDefault();
  const out = $("#pipeline-result");
  let spec;
  try {
    spec = JSON.parse($("#pipeline-spec").value);
  } catch (err) {
    out.replaceChildren(el("div", { class: "result bad", id: "pipeline-problem" }, "The spec is not JSON: " + err.message));
    return;
  }
  try {
    const p = await api("POST", "/api/v1/pipelines", { body: JSON.stringify({ name: $("#pipeline-name").value.trim(), spec }), type: "application/json" });
    out.replaceChildren(el("div", { class: "result ok", id: "pipeline-ok" }, el("strong", {}, "Created " + p.name), " ", el("code", {}, p.id),
      el("div", { class: "muted" }, p.subtasks + " subtask(s), state " + p.state)));
    await refreshAll();
  } catch (err) {
    out.replaceChildren(el("div", { class: "result bad", id: "pipeline-problem" }, problemText(err)));
  }
}

// ---- tenants (admin) ----

async function loadTenants() {
  const page = await api("GET", "/api/v1/tenants", { query: { limit: "1000" } });
  state.tenants = page.items;
  const frac = (a, b) => el("span", { class: "frac" }, a + " / " + b);
  $("#tenants-table tbody").replaceChildren(...page.items.map((t) => el("tr", { class: t.name === state.tenant ? "current" : "" },
    el("td", {}, t.name),
    el("td", {}, frac(t.usage.pipelines, t.quotas.max_pipelines)),
    el("td", {}, frac(t.usage.subtasks, t.quotas.max_subtasks)),
    el("td", {}, frac(t.usage.modules, t.quotas.max_modules)),
    el("td", {}, fmtBytes(t.usage.module_bytes)),
    el("td", {}, t.quotas.api_requests_per_second),
    el("td", {}, list(t.quotas.allowed_lookup_hosts)),
    el("td", {}, fmtTime(t.created_at)),
  )));
}

async function refreshAll() {
  const jobs = [loadOverview(), loadModules()];
  if (state.tenant) jobs.push(loadPipelines());
  if (state.admin) jobs.push(loadTenants());
  for (const r of await Promise.allSettled(jobs)) {
    if (r.status === "rejected") {
      if (r.reason instanceof APIError && r.reason.status === 401) return signOut();
      console.error(r.reason);
    }
  }
}

// ---- wiring ----

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("#signin-error").hidden = true;
    try {
      await signIn($("#token").value.trim());
    } catch (err) {
      state.token = "";
      $("#signin-error").textContent = err instanceof APIError && err.status === 401 ? "That token is not valid." : problemText(err);
      $("#signin-error").hidden = false;
    }
  });
  $("#sign-out").addEventListener("click", signOut);
  $("#tenant-pick").addEventListener("change", (ev) => { state.tenant = ev.target.value; refreshAll(); });
  for (const b of document.querySelectorAll(".tabs button")) {
    b.addEventListener("click", () => {
      for (const o of document.querySelectorAll(".tabs button")) o.classList.toggle("active", o === b);
      for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== "tab-" + b.dataset.tab;
    });
  }
  $("#upload-form").addEventListener("submit", upload);
  $("#pipeline-form").addEventListener("submit", createPipeline);
  $("#upload-file").addEventListener("change", () => {
    const f = $("#upload-file").files[0];
    $("#drop-label").textContent = f ? f.name + " (" + fmtBytes(f.size) + ")" : "Drop a .wasm here or choose a file";
  });
  const drop = $("#drop");
  drop.addEventListener("dragover", () => drop.classList.add("over"));
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", () => drop.classList.remove("over"));
  $("#modules-refresh").addEventListener("click", loadModules);
  $("#pipelines-refresh").addEventListener("click", loadPipelines);
  $("#detail-start").addEventListener("click", () => pipelineAction("start"));
  $("#detail-stop").addEventListener("click", () => pipelineAction("stop", { savepoint: true }));
  $("#detail-savepoint").addEventListener("click", () => pipelineAction("savepoints"));
  $("#detail-close").addEventListener("click", closePipeline);
  const saved = sessionStorage.getItem("clink.token");
  if (saved) signIn(saved).catch(signOut);
});
