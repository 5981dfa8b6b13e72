// The idem dashboard: reads the admin API with the token the operator enters (kept in this
// tab's sessionStorage only) and renders it. Everything shown is set as text, never as HTML.
"use strict";

const TOKEN_KEY = "idem.admin-token";
// `/ui?refresh=N` polls every N seconds (1-60, default 5).
const POLL_MS = Math.min(60, Math.max(1, Number(new URLSearchParams(location.search).get("refresh")) || 5)) * 1000;
const RECORDS_EVERY = 3; // records are listed every third poll
const STATE_LIMIT = 1000;
const HISTORY = 60; // samples kept for the chart (5 minutes)
const OUTCOMES = ["executed", "replayed", "in_flight", "unknown", "mismatch", "refused",
  "store_unavailable", "fenced", "passthrough", "queried"];
const COLORS = {
  executed: "#2f5bea", replayed: "#12b76a", in_flight: "#7a5af8", unknown: "#f79009",
  mismatch: "#ee46bc", refused: "#667085", store_unavailable: "#d92d20", fenced: "#b54708",
  passthrough: "#98a2b3", queried: "#0ba5ec",
};

const $ = (id) => document.getElementById(id);
const figure = (name) => document.querySelector(`[data-figure="${name}"]`);

let token = sessionStorage.getItem(TOKEN_KEY) || "";
let timer = null;
let polls = 0;
const samples = [];

function say(text, isError) {
  const m = $("message");
  m.textContent = text || "";
  m.className = isError ? "message error" : "message";
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

class Refused extends Error {}
class Missing extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({ authorization: `Bearer ${token}` }, options.headers || {});
  const res = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  if (res.status === 401) throw new Refused("the gateway refused this token");
  if (res.status === 404) throw new Missing(path);
  const text = await res.text();
  if (!res.ok) {
    let detail = text;
    try { detail = JSON.parse(text).error || text; } catch (_) { /* plain text */ }
    throw new Error(`${res.status}: ${detail}`);
  }
  return text;
}

async function apiJson(path, options) {
  return JSON.parse(await api(path, options));
}

// Prometheus text format: `name{a="b",c="d"} value`.
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sum(metrics, name, match) {
  let total = 0;
  for (const s of metrics) {
    if (s.name !== name) continue;
    if (match && !Object.entries(match).every(([k, v]) => s.labels[k] === v)) continue;
    total += s.value;
  }
  return total;
}

function fmtCount(n) { return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "–"; }
function fmtMs(seconds) {
  if (!Number.isFinite(seconds)) return "–";
  const ms = seconds * 1000;
  return ms < 1 ? `${ms.toFixed(3)} ms` : ms < 100 ? `${ms.toFixed(2)} ms` : `${ms.toFixed(0)} ms`;
}
function fmtAge(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function renderMetrics(metrics) {
  const now = Date.now();
  const counts = {};
  for (const o of OUTCOMES) counts[o] = sum(metrics, "idem_requests_total", { outcome: o });
  const total = OUTCOMES.reduce((a, o) => a + counts[o], 0);
  figure("requests-total").textContent = fmtCount(total);
  figure("requests-executed").textContent = fmtCount(counts.executed);
  figure("requests-replayed").textContent = fmtCount(counts.replayed);
  figure("claims-held").textContent = fmtCount(sum(metrics, "idem_claims_held"));
  const hits = sum(metrics, "idem_cache_hits_total");
  const misses = sum(metrics, "idem_cache_misses_total");
  figure("cache-ratio").textContent = hits + misses > 0
    ? `${((100 * hits) / (hits + misses)).toFixed(1)} %` : "off / idle";

  const prev = samples[samples.length - 1];
  samples.push({ t: now, counts });
  if (samples.length > HISTORY + 1) samples.shift();

  const body = $("outcomes");
  body.replaceChildren();
  for (const o of OUTCOMES) {
    const tr = el("tr");
    const name = el("td", o.replace("_", " "));
    name.style.setProperty("--c", COLORS[o]);
    tr.append(name);
    const since = el("td", fmtCount(counts[o]), "num");
    since.dataset.figure = `outcome-${o}`;
    tr.append(since);
    const rate = prev ? (counts[o] - prev.counts[o]) / ((now - prev.t) / 1000) : NaN;
    tr.append(el("td", Number.isFinite(rate) ? rate.toFixed(2) : "–", "num"));
    body.append(tr);
  }
  drawChart();
  renderLatency(metrics);
}

function renderLatency(metrics) {
  const ops = [...new Set(metrics.filter((s) => s.name === "idem_store_op_seconds_count").map((s) => s.labels.op))];
  const body = $("latency");
  body.replaceChildren();
  for (const op of ops) {
    const count = sum(metrics, "idem_store_op_seconds_count", { op });
    if (!count) continue;
    const mean = sum(metrics, "idem_store_op_seconds_sum", { op }) / count;
    // The smallest bucket bound holding 99 % of the calls.
    const buckets = metrics
      .filter((s) => s.name === "idem_store_op_seconds_bucket" && s.labels.op === op)
      .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), n: s.value }))
      .sort((a, b) => a.le - b.le);
    const p99 = (buckets.find((b) => b.n >= 0.99 * count) || { le: Infinity }).le;
    const tr = el("tr");
    tr.append(el("td", op));
    const calls = el("td", fmtCount(count), "num");
    calls.dataset.figure = `store-calls-${op}`;
    tr.append(calls);
    tr.append(el("td", fmtMs(mean), "num"));
    tr.append(el("td", p99 === Infinity ? "> 2.5 s" : fmtMs(p99), "num"));
    body.append(tr);
  }
  if (!body.children.length) {
    const tr = el("tr");
    const td = el("td", "no store calls yet", "muted");
    td.colSpan = 4;
    tr.append(td);
    body.append(tr);
  }
}

function drawChart() {
  const svg = $("chart");
  const NS = "http://www.w3.org/2000/svg";
  const W = 800, H = 220, L = 44, B = 20, T = 10;
  svg.replaceChildren();
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].t - samples[i - 1].t) / 1000;
    const r = {};
    for (const o of OUTCOMES) r[o] = Math.max(0, (samples[i].counts[o] - samples[i - 1].counts[o]) / dt);
    rates.push(r);
  }
  const shown = OUTCOMES.filter((o) => rates.some((r) => r[o] > 0));
  const max = Math.max(1, ...rates.map((r) => shown.reduce((a, o) => a + r[o], 0)));
  const slot = (W - L - 8) / HISTORY;
  const y = (v) => H - B - ((H - B - T) * v) / max;
  const line = (x1, y1, x2, y2, color) => {
    const l = document.createElementNS(NS, "line");
    l.setAttribute("x1", x1); l.setAttribute("y1", y1); l.setAttribute("x2", x2); l.setAttribute("y2", y2);
    l.setAttribute("stroke", color); l.setAttribute("stroke-width", "1");
    svg.append(l);
  };
  const text = (tx, ty, s, anchor) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", tx); t.setAttribute("y", ty); t.setAttribute("text-anchor", anchor || "end");
    t.textContent = s;
    svg.append(t);
  };
  for (const f of [0, 0.5, 1]) {
    line(L, y(max * f), W - 8, y(max * f), "#e3e6eb");
    text(L - 6, y(max * f) + 4, (max * f).toFixed(max < 10 ? 1 : 0));
  }
  text(L, H - 4, `${Math.round((HISTORY * POLL_MS) / 60000)} min ago`, "start");
  text(W - 8, H - 4, "now");
  // One stacked bar per interval, newest on the right.
  const first = HISTORY - rates.length;
  rates.forEach((r, i) => {
    let base = 0;
    for (const o of shown) {
      if (r[o] <= 0) continue;
      const rect = document.createElementNS(NS, "rect");
      rect.setAttribute("x", L + (first + i) * slot + 1);
      rect.setAttribute("width", Math.max(1, slot - 2));
      rect.setAttribute("y", y(base + r[o]));
      rect.setAttribute("height", y(base) - y(base + r[o]));
      rect.setAttribute("fill", COLORS[o]);
      svg.append(rect);
      base += r[o];
    }
  });
  const legend = $("legend");
  legend.replaceChildren();
  if (!rates.length) {
    legend.append(el("span", "collecting the first interval…", "muted"));
  } else if (!shown.length) {
    legend.append(el("span", "no requests in the last intervals", "muted"));
  }
  for (const o of shown) {
    const s = el("span", o.replace("_", " "));
    s.style.setProperty("--c", COLORS[o]);
    legend.append(s);
  }
}

async function countState(state) {
  const r = await apiJson(`/admin/records?state=${state}&limit=${STATE_LIMIT + 1}`);
  return r.count > STATE_LIMIT ? `${STATE_LIMIT}+` : fmtCount(r.count);
}

async function refreshRecords() {
  const [processing, completed, unknown] = await Promise.all(
    ["processing", "completed", "unknown"].map(countState));
  figure("records-processing").textContent = processing;
  figure("records-completed").textContent = completed;
  figure("records-unknown").textContent = unknown;
  figure("cards-unknown").textContent = unknown;
  await refreshStuck();
}

function recordQuery(r) {
  const q = new URLSearchParams({ namespace: r.namespace, key: r.key });
  if (r.principal !== null && r.principal !== undefined) q.set("principal", r.principal);
  return q.toString();
}

async function resolve(r, body, row) {
  for (const b of row.querySelectorAll("button")) b.disabled = true;
  try {
    await api(`/admin/record/resolve?${recordQuery(r)}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    say(`${r.namespace} / ${r.key}: ${body.outcome === "release" ? "released; a retry will run it" : `completed with status ${body.status}; retries replay it`}.`);
    row.remove();
    await refreshRecords();
  } catch (e) {
    say(`${r.key}: ${e.message}`, true);
    for (const b of row.querySelectorAll("button")) b.disabled = false;
  }
}

function settleCell(r, row) {
  const cell = el("td");
  cell.append($("settle").content.cloneNode(true));
  const release = cell.querySelector(".release");
  const complete = cell.querySelector(".complete");
  const form = cell.querySelector(".completeform");
  release.addEventListener("click", () => {
    if (!release.classList.contains("confirm")) {
      release.classList.add("confirm");
      release.textContent = "Confirm release";
      return;
    }
    resolve(r, { outcome: "release" }, row);
  });
  complete.addEventListener("click", () => { form.hidden = !form.hidden; });
  cell.querySelector(".cancel").addEventListener("click", () => { form.hidden = true; });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const status = Number(form.querySelector(".status").value);
    if (!(status >= 200 && status <= 599)) { say("status must be 200-599", true); return; }
    const body = form.querySelector(".body").value;
    const settle = { outcome: "complete", status, body };
    try { JSON.parse(body); settle.headers = { "content-type": "application/json" }; } catch (_) { /* not JSON */ }
    resolve(r, settle, row);
  });
  return cell;
}

async function refreshStuck() {
  const age = $("stuckage").value.trim() || "5m";
  const [unknown, stuck] = await Promise.all([
    apiJson(`/admin/records?state=unknown&limit=200`),
    apiJson(`/admin/records?state=processing&older_than=${encodeURIComponent(age)}&limit=200`),
  ]);
  const body = $("stuck");
  // A form being filled in is kept until it is saved or cancelled.
  if (body.querySelector(".completeform:not([hidden])") || body.querySelector("button.confirm")) return;
  const records = [...unknown.records, ...stuck.records];
  const ids = records.map((r) => JSON.stringify([r.namespace, r.principal, r.key, r.state, r.fence]));
  // The same records as shown: only their ages change, and buttons stay where they are.
  if (ids.join("\n") === [...body.children].map((row) => row.dataset.id).join("\n")) {
    for (const row of body.children) row.querySelector(".age").textContent = fmtAge(Number(row.dataset.since));
  } else {
    render(records, ids, body);
  }
  $("stuckempty").hidden = body.children.length > 0;
  $("stucktable").hidden = body.children.length === 0;
}

function render(records, ids, body) {
  body.replaceChildren();
  records.forEach((r, i) => {
    const row = el("tr");
    row.dataset.id = ids[i];
    row.dataset.since = String(r.unknown_since_ms ?? r.created_at_ms);
    row.dataset.key = r.key;
    row.dataset.namespace = r.namespace;
    row.append(el("td", r.namespace));
    row.append(el("td", r.principal ?? "–", "mono"));
    row.append(el("td", r.key, "mono"));
    const st = el("td");
    st.append(el("span", r.state, `state ${r.state}`));
    row.append(st);
    row.append(el("td", fmtAge(Number(row.dataset.since)), "nowrap age"));
    row.append(el("td", r.fence, "num"));
    row.append(el("td", r.request_id ?? "–", "mono"));
    row.append(settleCell(r, row));
    body.append(row);
  });
}

// At audit level "operator" the trail leaves out a fresh claim and its completion: say so,
// with what the key's record tells of them (the API sends it when a namespace is given).
function operatorNote(record) {
  const at = (ms) => new Date(ms).toISOString().replace("T", " ").replace("Z", "");
  let text = " The store records operator events only (audit level operator): a fresh claim and its"
    + " completion are left to the record; [audit] level = \"all\" records every transition.";
  if (record) {
    text += ` Record: ${record.state}, fence ${record.fence}, claimed ${at(record.created_at_ms)}`;
    if (record.state === "completed") {
      text += `, completed ${at(record.completed_at_ms)} (status ${record.status})`;
    }
    text += ".";
  }
  return text;
}

async function searchAudit(ev) {
  if (ev) ev.preventDefault();
  const key = $("auditkey").value.trim();
  const ns = $("auditns").value.trim();
  const note = $("auditnote");
  const table = $("audittable");
  if (!key) { note.textContent = "Enter a key."; return; }
  const q = new URLSearchParams({ key, limit: "200" });
  if (ns) q.set("namespace", ns);
  try {
    const r = await apiJson(`/admin/audit?${q}`);
    const body = $("audit");
    body.replaceChildren();
    for (const e of r.events) {
      const row = el("tr");
      row.append(el("td", new Date(e.at_ms).toISOString().replace("T", " ").replace("Z", "")));
      row.append(el("td", e.event));
      row.append(el("td", e.namespace));
      row.append(el("td", e.key, "mono"));
      row.append(el("td", e.fence, "num"));
      row.append(el("td", e.outcome ?? "–"));
      row.append(el("td", e.status ?? "–", "num"));
      row.append(el("td", e.request_id ?? "–", "mono"));
      row.append(el("td", e.instance ?? "–", "mono"));
      row.append(el("td", e.actor ?? "–"));
      body.append(row);
    }
    note.textContent = `${r.events.length} event${r.events.length === 1 ? "" : "s"} for ${key}, newest first.`
      + (r.level === "operator" ? operatorNote(r.record) : "");
    note.dataset.figure = "audit-count";
    note.dataset.count = String(r.events.length);
    table.hidden = r.events.length === 0;
  } catch (e) {
    table.hidden = true;
    note.dataset.count = "";
    note.textContent = e instanceof Missing
      ? "This gateway has no audit trail endpoint (/admin/audit)."
      : `Audit search failed: ${e.message}`;
    if (e instanceof Refused) signOut(e.message);
  }
}

async function poll() {
  try {
    const metrics = await api("/metrics").then(parseMetrics).catch((e) => {
      if (e instanceof Missing) return null;
      throw e;
    });
    if (metrics) renderMetrics(metrics);
    if (polls % RECORDS_EVERY === 0) await refreshRecords();
    polls += 1;
    document.body.dataset.loaded = String(polls);
    figure("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if ($("message").className.includes("error")) say("");
  } catch (e) {
    if (e instanceof Refused) { signOut(e.message); return; }
    say(`Could not refresh: ${e.message}`, true);
  }
}

async function health() {
  const h = $("health");
  try {
    const res = await fetch("/readyz", { cache: "no-store" });
    h.textContent = res.ok ? "ready" : "store unavailable";
    h.className = res.ok ? "pill ok" : "pill bad";
  } catch (_) {
    h.textContent = "unreachable";
    h.className = "pill bad";
  }
}

function signIn() {
  $("signin").hidden = true;
  $("signedin").hidden = false;
  $("board").hidden = false;
  say("");
  polls = 0;
  samples.length = 0;
  clearInterval(timer);
  poll();
  timer = setInterval(() => { poll(); health(); }, POLL_MS);
}

function signOut(why) {
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(timer);
  $("board").hidden = true;
  $("signedin").hidden = true;
  $("signin").hidden = false;
  delete document.body.dataset.loaded;
  say(why || "Enter the admin token to see the gateway.", Boolean(why));
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    signIn();
  });
  $("signout").addEventListener("click", () => signOut());
  $("stuckform").addEventListener("submit", (ev) => { ev.preventDefault(); refreshRecords().catch((e) => say(e.message, true)); });
  $("auditform").addEventListener("submit", searchAudit);
  $("every").textContent = `${POLL_MS / 1000} s`;
  health();
  if (token) signIn(); else signOut();
});
