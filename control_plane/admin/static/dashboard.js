// Ballast on-call dashboard. No dependencies: the charts are hand-written SVG.
// Views (deep links): #/  ·  #/pop/P  ·  #/pop/P/group/G?range=1h&seq=N  ·  #/decision/N
"use strict";

const API = "/dashboard/api";
const RANGES = ["15m", "1h", "6h", "24h"];
const COLORS = ["#2f7ed8", "#e4572e", "#17a398", "#9d4edd", "#f0a202", "#6c757d"];
const KIND_CLASS = {
  weight_shift: "shift", return: "return", threshold_breach: "breach", hold: "hold",
  steady: "steady", tier_action: "tier", nack: "nack", config_applied: "config",
  config_rejected: "nack",
};

function kindClass(kind) {
  const text = String(kind);
  return KIND_CLASS[kind] || (text.startsWith("ramp_") ? "ramp" : text.startsWith("tier_") ? "tier" : "other");
}
const SVG = "http://www.w3.org/2000/svg";
const MARK_ROWS = 3;
const state = { overview: null, viewStream: null, panelStream: null, panelGeneration: 0,
                refreshTimer: null, pollTimer: null, route: null };

// -- small DOM helpers (text only: names and NACK messages never become markup) ------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") Object.assign(el.style, value);  // CSSOM: allowed by the CSP
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) {
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return el;
}

function badge(status) {
  return h("span", { class: `badge ${String(status).toLowerCase()}` }, status);
}

function kindTag(kind) {
  return h("span", { class: `kind ${kindClass(kind)}` }, kind);
}

function hhmmss(iso) {
  return String(iso).slice(11, 19);
}

function weightsText(weights) {
  if (!weights) return "";
  return Object.entries(weights).map(([origin, w]) => `${origin} ${w}`).join(" / ");
}

function weightBar(weights, origins) {
  const names = origins || Object.keys(weights || {});
  return h("span", { class: "wbar", title: weightsText(weights) },
    names.map((name, i) => h("span", {
      class: "wseg", style: { width: `${(weights || {})[name] || 0}%`, background: COLORS[i % COLORS.length] },
    })));
}

function popLink(pop) {
  return h("a", { href: `#/pop/${encodeURIComponent(pop)}` }, pop);
}

function groupLink(pop, group) {
  return h("a", { href: `#/pop/${encodeURIComponent(pop)}/group/${encodeURIComponent(group)}` },
    group);
}

function decisionLink(seq) {
  return h("a", { href: `#/decision/${seq}`, class: "seq" }, `#${seq}`);
}

async function getJSON(path) {
  const response = await fetch(API + path, { headers: { Accept: "application/json" } });
  if (response.status === 401) {
    location.assign("/login");  // no session (cookie), or it ended
    throw new Error("not signed in");
  }
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// -- actions: the session's CSRF token on every POST (admin/sessions.py) ---------------------

let session = null;  // GET /session: who this page is signed in as, and the CSRF token

async function currentSession() {
  if (!session) {
    const response = await fetch("/session", { headers: { Accept: "application/json" } });
    if (response.status === 401) {
      location.assign("/login");
      throw new Error("not signed in");
    }
    session = await response.json();
  }
  return session;
}

async function postJSON(path) {
  const { csrf, csrf_header: header } = await currentSession();
  const headers = { Accept: "application/json" };
  if (csrf) headers[header] = csrf;
  const response = await fetch(path, { method: "POST", headers });
  if (response.status === 401) {
    location.assign("/login");
    throw new Error("not signed in");
  }
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

async function signOut() {
  try { await postJSON("/logout"); } finally { location.assign("/login"); }
}

async function showSignOut() {
  const { who } = await currentSession();
  document.getElementById("sign-out").hidden = who !== "session";
}

function setView(...children) {
  const view = document.getElementById("view");
  view.replaceChildren(...children.flat());
}

function crumbs(...parts) {
  document.getElementById("crumbs").replaceChildren(
    ...parts.flatMap((part, i) => (i ? [h("span", { class: "sep" }, "›"), part] : [part])));
}

// -- routing -------------------------------------------------------------------------------

function parseRoute() {
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(search || "");
  if (parts[0] === "pop" && parts[1] && parts[2] === "group" && parts[3]) {
    return { name: "group", pop: parts[1], group: parts[3], range: params.get("range") || "1h",
             seq: params.get("seq") };
  }
  if (parts[0] === "pop" && parts[1]) return { name: "pop", pop: parts[1] };
  if (parts[0] === "decision" && parts[1]) return { name: "decision", seq: parts[1] };
  return { name: "overview" };
}

function groupHash(route, changes) {
  const next = { ...route, ...changes };
  const params = new URLSearchParams({ range: next.range });
  if (next.seq) params.set("seq", next.seq);
  return `#/pop/${encodeURIComponent(next.pop)}/group/${encodeURIComponent(next.group)}?${params}`;
}

async function render() {
  const route = parseRoute();
  const previous = state.route;
  state.route = route;
  document.body.dataset.view = route.name;
  const sameStream = previous && previous.name === route.name && previous.pop === route.pop
    && previous.group === route.group;
  if (!sameStream) openViewStream(route);
  clearInterval(state.pollTimer);
  try {
    if (route.name === "overview") await renderOverview(route);
    else if (route.name === "pop") await renderPop(route);
    else if (route.name === "group") await renderGroup(route);
    else await renderDecision(route);
  } catch (err) {
    setView(h("p", { class: "error" }, `Cannot show this view: ${err.message}`));
  }
  if (route.name === "overview" || route.name === "pop") {
    // Node sync states change without decision records (ACKs): a slow refresh shows them.
    state.pollTimer = setInterval(() => scheduleRefresh(0), 5000);
  }
}

function scheduleRefresh(delay) {
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(async () => {
    const route = state.route;
    try {
      if (route.name === "overview") await renderOverview(route);
      else if (route.name === "pop") await renderPop(route);
      else if (route.name === "group") await renderGroup(route);
    } catch (err) {
      document.getElementById("live").textContent = `refresh failed: ${err.message}`;
    }
  }, delay);
}

// -- header: version in force, last config change -------------------------------------------

function showVersion(desired) {
  document.getElementById("version").replaceChildren(
    h("span", { class: "muted" }, "desired "), h("code", {}, desired.version));
}

function configPanel(config) {
  const items = [];
  for (const kind of ["config_applied", "config_rejected"]) {
    const record = config[kind];
    if (!record) {
      items.push(h("div", { class: "config none" }, kindTag(kind), " none in the recent log"));
      continue;
    }
    const detail = record.detail || {};
    const lines = kind === "config_applied" ? (detail.diff || []) : (detail.problems || []);
    items.push(h("div", { class: `config ${kind}` },
      h("div", {}, kindTag(kind), " ", decisionLink(record.seq), " ", h("time", {}, record.time),
        " ", h("code", {}, record.config_version || "")),
      h("div", { class: "rule" }, record.rule),
      lines.length ? h("details", {}, h("summary", {},
        kind === "config_applied" ? `diff (${detail.diff_lines ?? lines.length} lines)`
          : `${lines.length} problems`),
      h("pre", {}, lines.join("\n"))) : null));
  }
  return h("section", { class: "panel configs" }, h("h2", {}, "Desired state"), items);
}

// -- overview --------------------------------------------------------------------------------

async function renderOverview(route) {
  const data = await getJSON("/overview");
  if (state.route !== route) return;  // navigated away while this was loading
  state.overview = data;
  showVersion(data.desired);
  fillFilterOptions(data);
  crumbs(h("span", {}, "Fleet"));
  const cards = data.pops.map((pop) => {
    const more = pop.node_count - pop.nodes.length;
    return h("article", { class: "pop card", "data-pop": pop.name },
      h("h3", {}, popLink(pop.name), pop.known ? null : h("span", { class: "warn" }, " not in desired state")),
      h("p", { class: "counts" }, `${pop.node_count} nodes `,
        Object.entries(pop.by_status).filter(([, n]) => n).map(([st, n]) =>
          h("span", { class: `badge ${st.toLowerCase()}` }, `${n} ${st}`)),
        " ", h("span", { class: "muted" },
          Object.entries(pop.envoy_versions).map(([v, n]) => `${v.startsWith("gRPC") ? "" : "Envoy "}${v} ×${n}`).join(", "))),
      h("ul", { class: "nodes" }, pop.nodes.map((node) => h("li", { class: "node", "data-node": node.node_id },
        badge(node.status), " ", node.node_id, " ", h("span", { class: "muted" }, node.envoy_version),
        node.last_nack ? h("div", { class: "nack" }, `${node.last_nack.type} NACK: ${node.last_nack.message}`) : null)),
      more > 0 ? h("li", { class: "muted" }, `+${more} more`) : null),
      pop.nacked.length ? h("div", { class: "nacked" }, h("strong", {}, "NACKed: "),
        pop.nacked.map((n) => h("div", { class: "nack" }, `${n.node_id}: ${n.last_nack ? n.last_nack.message : ""}`))) : null,
      h("p", {}, `${pop.groups} groups, `, h("strong", {}, `${pop.away_count} away from home`)),
      pop.away.length ? h("ul", { class: "away" }, pop.away.map((g) => h("li", {},
        groupLink(pop.name, g.group), " ", weightBar(g.weights), " ", weightsText(g.weights)))) : null,
      Object.keys(pop.tier_actions).length ? h("div", { class: "tiers" }, h("strong", {}, "Tier actions: "),
        Object.entries(pop.tier_actions).map(([g, a]) => h("div", {}, groupLink(pop.name, g), `: ${a.description}`))) : null,
      originReadings(pop.name, (data.origins || {})[pop.name] || {}));
  });
  setView(configPanel(data.config), rolloutPanel(data.rollout), h("section", { class: "pops" }, cards),
    servedCertificatesPanel(data.served_certificates || []));
}

// each origin's last reading in a PoP, per group, as /status has it (lifecycle/status.py): weight,
// 5xx rate, p95 and health score (below 0 past five times a threshold: drawn as such)
function originReadings(pop, groups) {
  const names = Object.keys(groups);
  if (!names.length) return null;
  const cell = (value, text, cls) => h("td", { class: cls || "" }, value === null || value === undefined ? "–" : text);
  return names.map((group) => {
    const reading = groups[group];
    return h("table", { class: "origins", "data-group": group, "data-read-at": String(reading.read_at_ms) },
      h("caption", {}, groupLink(pop, group), h("span", { class: "muted" },
        ` read ${new Date(reading.read_at_ms).toISOString().slice(11, 19)}Z`)),
      h("tr", {}, h("th", {}, "origin"), h("th", {}, "weight"), h("th", {}, "5xx"), h("th", {}, "p95"),
        h("th", {}, "health")),
      Object.entries(reading.origins).map(([origin, o]) => h("tr", { "data-origin": origin },
        h("td", {}, origin), h("td", { class: "weight" }, `${o.weight} %`),
        cell(o.error_rate_pct, `${Number(o.error_rate_pct).toFixed(1)} %`, "error-rate"),
        cell(o.p95_ms, `${o.p95_ms} ms`, "p95"),
        cell(o.score, o.score === null ? "" : Number(o.score).toFixed(2),
          `score${o.score !== null && o.score < 0 ? " negative" : o.score !== null && o.score < 0.8 ? " low" : ""}`))));
  });
}

// the latest rollout of a desired-state version: its waves in order with their state and start
// (decide/rollout.py's timeline), the last gate reading with its readings, each PoP's version
function rolloutPanel(shown) {
  if (!shown) return [];
  const rollout = shown.rollout;
  const versions = h("table", { class: "pop-versions" },
    h("tr", {}, h("th", {}, "PoP"), h("th", {}, "version"), h("th", {}, "applied"),
      h("th", {}, "pending"), h("th", {}, "NACKed")),
    Object.entries(shown.pop_versions).flatMap(([pop, v]) => [h("tr", { "data-pop": pop },
      h("td", {}, popLink(pop)), h("td", {}, h("code", {}, v.version.slice(0, 16))),
      h("td", {}, String(v.applied)), h("td", {}, String(v.pending)),
      h("td", { class: v.nacked ? "warn" : "" }, String(v.nacked))),
      // with replicas: each replica's nodes of the PoP (every replica counts in the row above)
      ...Object.entries(v.replicas || {}).map(([replica, r]) => h("tr", { class: "replica", "data-pop": pop, "data-replica": replica },
        h("td", { class: "muted" }, `via ${replica}`), h("td", {}, h("code", {}, String(r.version).slice(0, 16))),
        h("td", {}, String(r.applied)), h("td", {}, String(r.pending)),
        h("td", { class: r.nacked ? "warn" : "" }, String(r.nacked))))]));
  if (!rollout) {
    return h("section", { class: "panel rollout", "data-phase": "none" }, h("h2", {}, "Rollout"),
      h("p", { class: "muted" }, "no rollout since the state was new"), versions);
  }
  const waves = h("ol", { class: "waves" }, rollout.timeline.map((wave) =>
    h("li", { class: `wave ${wave.state.replace("_", "-")}`, "data-wave": String(wave.wave) },
      h("strong", {}, `wave ${wave.wave}`), " ", wave.pops.join(", "), " ",
      h("span", { class: "muted" }, wave.state.replace("_", " "),
        wave.started_ms ? ` since ${new Date(wave.started_ms).toLocaleTimeString()}` : ""))));
  const gate = rollout.gate;
  const readings = gate ? h("details", { class: "gate", open: gate.verdict === "fail" },
    h("summary", {}, h("span", { class: `verdict ${gate.verdict}` }, `gate: ${gate.verdict}`), " ",
      gate.why.join("; ")),
    h("table", {}, h("tr", {}, h("th", {}, "PoP"), h("th", {}, "signal"), h("th", {}, "key"),
      h("th", {}, "verdict"), h("th", {}, "reading")),
    gate.readings.map((r) => h("tr", { class: r.verdict }, h("td", {}, r.pop), h("td", {}, r.signal),
      h("td", {}, r.key), h("td", {}, r.verdict), h("td", {}, r.text))))) : h("p", { class: "muted" },
    "no gate reading yet");
  const failed = Object.entries(rollout.failed_versions || {}).map(([digest, why]) =>
    h("div", { class: "warn failed-version" }, h("code", {}, digest.slice(0, 16)), ` failed: ${why}`));
  return h("section", { class: "panel rollout", "data-phase": rollout.phase },
    h("h2", {}, "Rollout ", h("code", {}, rollout.to_version.slice(0, 16)),
      h("span", { class: "muted" }, ` from ${rollout.from_version.slice(0, 16)}: `),
      h("span", { class: `phase ${rollout.phase}` }, rollout.phase.replace("_", " ")),
      rollout.immediate ? h("span", { class: "muted" }, " (immediate)") : null),
    rolloutActions(rollout.phase),
    h("p", { class: "reason" }, rollout.reason), waves, readings, failed, versions);
}

// what on-call may do to a rollout in progress (POST /rollout/<action>, as `ballast rollout`)
const ROLLOUT_ACTIONS = { baking: ["pause", "abort", "promote"], paused: ["resume", "abort", "promote"] };

function rolloutActions(phase) {
  const actions = ROLLOUT_ACTIONS[phase];
  if (!actions) return null;
  const said = h("span", { class: "action-result muted" });
  const act = async (action) => {
    if (!window.confirm(`${action} this rollout?`)) return;
    said.textContent = `${action}…`;
    try {
      await postJSON(`/rollout/${action}`);
      said.textContent = "";
      await render();
    } catch (err) {
      said.textContent = `${action}: ${err.message}`;
    }
  };
  return h("p", { class: "rollout-actions" }, actions.map((action) =>
    h("button", { type: "button", "data-action": action, onclick: () => act(action) }, action)), said);
}

function servedCertificatesPanel(certs) {
  if (!certs.length) return [];
  return h("section", { class: "panel served-certificates" }, h("h2", {}, "Served certificates"),
    h("ul", {}, certs.map((c) => h("li", { class: `certificate ${c.state}`, "data-certificate": `${c.listener}/${c.certificate}` },
      h("strong", {}, `${c.listener}/${c.certificate}`), " ",
      h("span", { class: c.problem ? "warn" : "" }, `${c.days_to_expiry.toFixed(1)} days to expiry`), " ",
      h("span", { class: "muted" }, `${(c.hostnames.length ? c.hostnames : ["(default)"]).join(", ")} in ${c.pops.join(", ")}`),
      c.problem ? h("div", { class: "warn" }, c.problem) : null))));
}

function fillFilterOptions(data) {
  const form = document.getElementById("stream-filter");
  const fill = (name, values) => {
    const select = form.elements[name];
    if (select.options.length > 1) return;
    for (const value of values) select.append(h("option", { value }, value));
  };
  fill("pop", data.pops.map((p) => p.name));
  fill("group", data.groups || []);
  fill("kind", data.kinds || []);
}

// -- one PoP ---------------------------------------------------------------------------------

async function renderPop(route) {
  const data = await getJSON(`/pops/${encodeURIComponent(route.pop)}`);
  if (state.route !== route) return;
  crumbs(h("a", { href: "#/" }, "Fleet"), h("span", {}, `PoP ${data.pop}`));
  const types = ["CDS", "EDS", "LDS", "RDS"];
  const nodes = h("table", { class: "nodes" },
    h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", {}, "Envoy"), h("th", {}, "mode"),
      h("th", {}, "status"), types.map((t) => h("th", {}, t)), h("th", {}, "last NACK"))),
    h("tbody", {}, data.nodes.map((node) => h("tr", { "data-node": node.node_id },
      h("td", {}, node.node_id), h("td", {}, node.envoy_version), h("td", {}, node.mode),
      h("td", {}, badge(node.status)), types.map((t) => h("td", {}, node.types[t] ? badge(node.types[t]) : "–")),
      h("td", { class: "nack" }, node.last_nack ? `${node.last_nack.type} ${node.last_nack.version}: ${node.last_nack.message}` : "")))));
  const groups = h("table", { class: "groups" },
    h("thead", {}, h("tr", {}, h("th", {}, "group"), h("th", {}, "weights"), h("th", {}, "home"),
      h("th", {}, "tier actions"))),
    h("tbody", {}, data.groups.map((g) => h("tr", { class: g.away ? "away" : "" },
      h("td", {}, groupLink(data.pop, g.name)),
      h("td", {}, weightBar(g.weights, Object.keys(g.home)), " ", weightsText(g.weights)),
      h("td", { class: "muted" }, weightsText(g.home)),
      h("td", {}, g.tier_actions ? g.tier_actions.description : "")))));
  setView(h("h1", {}, `PoP ${data.pop}`),
    h("section", { class: "panel" }, h("h2", {}, `Nodes (${data.nodes.length})`),
      data.nodes.length ? nodes : h("p", { class: "muted" }, "no node connected")),
    h("section", { class: "panel" }, h("h2", {}, `Origin groups (${data.groups.length})`), groups));
}

// -- one (PoP, group): the timeline ----------------------------------------------------------

function timeScale(data, width) {
  const t0 = Date.parse(data.start);
  const t1 = Date.parse(data.end);
  return (iso) => ((Date.parse(iso) - t0) / Math.max(1, t1 - t0)) * width;
}

function axes(g, data, width, height, yTicks, yLabel) {
  const x = timeScale(data, width);
  const t0 = Date.parse(data.start);
  const t1 = Date.parse(data.end);
  for (let i = 0; i <= 4; i++) {
    const iso = new Date(t0 + ((t1 - t0) * i) / 4).toISOString();
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    g.append(s("line", { x1: x(iso), x2: x(iso), y1: 0, y2: height, class: "grid" }),
      s("text", { x: x(iso), y: height + 14, class: "tick", "text-anchor": anchor }, `${hhmmss(iso)}Z`));
  }
  for (const [value, y] of yTicks) {
    g.append(s("line", { x1: 0, x2: width, y1: y, y2: y, class: "grid" }),
      s("text", { x: -6, y: y + 4, class: "tick", "text-anchor": "end" }, value));
  }
  g.append(s("text", { x: -34, y: -8, class: "axis-label" }, yLabel));
}

function refLine(g, width, y, label) {
  g.append(s("line", { x1: 0, x2: width, y1: y, y2: y, class: "ref" }),
    s("text", { x: width - 4, y: y - 4, class: "ref-label", "text-anchor": "end" }, label));
}

function weightsChart(data, picked, onPick) {
  const W = 860, H = 250, M = { l: 44, r: 12, t: 16 + 13 * MARK_ROWS, b: 24 };
  const width = W - M.l - M.r, height = H - M.t - M.b;
  const x = timeScale(data, width);
  const y = (w) => height - (w / 100) * height;
  const g = s("g", { transform: `translate(${M.l},${M.t})` });
  axes(g, data, width, height, [0, 25, 50, 75, 100].map((v) => [`${v}%`, y(v)]), "weight");
  refLine(g, width, y(data.thresholds.min_warm_pool), `min warm pool ${data.thresholds.min_warm_pool}%`);
  data.origins.forEach((origin, i) => {
    let d = `M0,${y(data.initial[origin] ?? 0)}`;
    for (const p of data.points) {
      if (!p.weights || p.weights[origin] === undefined) continue;
      d += ` H${x(p.time).toFixed(1)} V${y(p.weights[origin]).toFixed(1)}`;
    }
    d += ` H${width}`;
    g.append(s("path", { d, class: "wline", stroke: COLORS[i % COLORS.length], "data-origin": origin }));
  });
  const marks = [...data.points.filter((p) => p.kind !== "steady" || data.points.length < 200), ...data.markers]
    .sort((a, b) => a.seq - b.seq);
  const rowEnds = [];  // markers closer than their width stack in rows above the chart
  for (const p of marks) {
    const cx = x(p.time);
    let row = rowEnds.findIndex((end) => cx - end >= 13);
    if (row < 0) row = rowEnds.length < MARK_ROWS ? rowEnds.length : rowEnds.indexOf(Math.min(...rowEnds));
    rowEnds[row] = cx;
    const chosen = String(p.seq) === String(picked) ? " picked" : "";
    const mark = s("g", { class: `mark ${kindClass(p.kind)}${chosen}`, "data-seq": p.seq,
                          transform: `translate(${cx.toFixed(1)},${-8 - 13 * row})`, tabindex: 0,
                          role: "button", "aria-label": `decision ${p.seq}: ${p.kind}`,
                          onclick: () => onPick(p.seq),
                          onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") onPick(p.seq); } },
      s("title", {}, `#${p.seq} ${p.kind} ${hhmmss(p.time)}Z\n${p.rule || ""}\nnext: ${p.next || "–"}`),
      s("path", { d: "M-6,-7 L6,-7 L0,4 Z", class: "mark-head" }),
      s("line", { x1: 0, x2: 0, y1: 4, y2: height + 8 + 13 * row, class: "mark-line" }));
    g.append(mark);
  }
  return s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart weights", role: "img",
                    "aria-label": `weights of ${data.group} in ${data.pop}` }, g);
}

function healthChart(data) {
  const W = 860, H = 170, M = { l: 44, r: 12, t: 16, b: 24 };
  const width = W - M.l - M.r, height = H - M.t - M.b;
  const x = timeScale(data, width);
  // scores go below 0 past five times a threshold (decide/health.py: 60 % 5xx scores -5):
  // the axis reaches down to the lowest one shown, 0 is a line of its own
  const scores = data.points.flatMap((p) => Object.values(p.scores).filter((v) => typeof v === "number"));
  const low = Math.min(0, Math.floor(Math.min(...scores, 0)));
  const y = (v) => height - ((v - low) / (1 - low)) * height;
  const g = s("g", { transform: `translate(${M.l},${M.t})` });
  const ticks = low < 0 ? [low, ...(low < -1 ? [Math.round(low / 2)] : []), 0, 1] : [0, 0.5, 1];
  axes(g, data, width, height, ticks.map((v) => [v.toFixed(1), y(v)]), "health");
  g.append(s("line", { x1: 0, x2: width, y1: y(0), y2: y(0), class: "zero", "data-value": 0 }));
  const t = data.thresholds;
  refLine(g, width, y(t.score_at_threshold),
    `at threshold (5xx ${(t.error_rate * 100).toFixed(1)}% · p95 ${t.p95_ms} ms)`);
  data.origins.forEach((origin, i) => {
    const pts = data.points.filter((p) => typeof p.scores[origin] === "number");
    if (!pts.length) return;
    g.append(s("polyline", {
      points: pts.map((p) => `${x(p.time).toFixed(1)},${y(p.scores[origin]).toFixed(1)}`).join(" "),
      class: "hline", stroke: COLORS[i % COLORS.length], "data-origin": origin }));
    for (const p of pts) {
      g.append(s("circle", { cx: x(p.time), cy: y(p.scores[origin]), r: 2.5, fill: COLORS[i % COLORS.length],
                             "data-origin": origin, "data-score": p.scores[origin], "data-seq": p.seq },
        s("title", {}, `${origin} ${p.scores[origin].toFixed(2)} at ${hhmmss(p.time)}Z`)));
    }
  });
  return s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart health", role: "img",
                    "aria-label": `health scores in ${data.pop}` }, g);
}

function legend(data) {
  return h("div", { class: "legend" }, data.origins.map((origin, i) => h("span", { class: "key" },
    h("span", { class: "swatch", style: { background: COLORS[i % COLORS.length] } }), origin,
    h("strong", { "data-current": origin }, ` ${data.current[origin] ?? "?"}%`),
    h("span", { class: "muted" }, ` (home ${data.home[origin]}%)`))));
}

// the failover ramp in words (admin/dashboard_views.py ramp_view): each standby's stage and
// share, its weight, since when it ramps and why, linked to the record that says so
function rampSentences(route, standbys) {
  if (!standbys.length) return h("p", { class: "muted" }, "none active");
  return standbys.map((r) => h("div", { class: "ramp", "data-origin": r.origin },
    h("p", { class: "ramp-sentence" }, r.sentence,
      r.seq ? h("span", {}, " ", h("a", { href: groupHash(route, { seq: r.seq }) }, `#${r.seq}`)) : null),
    r.next ? h("p", { class: "muted" }, `next: ${r.next}`) : null));
}

function genericTable(obj) {
  return h("table", { class: "kv" }, h("tbody", {}, Object.entries(obj).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v))))));
}

function recordDetail(record) {
  return h("div", { class: "decision", "data-seq": record.seq },
    h("h3", {}, kindTag(record.kind), " ", decisionLink(record.seq), " ", h("time", {}, record.time),
      record.pop ? h("span", {}, " · ", popLink(record.pop)) : null,
      record.pop && record.group ? h("span", {}, " / ", groupLink(record.pop, record.group)) : null),
    h("p", { class: "rule" }, h("strong", {}, "rule: "), record.rule || "–"),
    (record.detail && record.detail.next) || record.next
      ? h("p", { class: "next" }, h("strong", {}, "next: "), (record.detail && record.detail.next) || record.next) : null,
    record.weights_before ? h("p", {}, h("strong", {}, "weights: "),
      `${weightsText(record.weights_before)} → ${weightsText(record.weights_after)}`) : null,
    record.detail && record.detail.proposed ? h("p", { class: "proposed" }, h("strong", {}, "the controller proposed: "),
      `${weightsText(record.detail.proposed)} (not pushed: ${record.detail.changed_by})`) : null,
    record.inputs ? h("details", { open: true }, h("summary", {}, "inputs"),
      h("pre", {}, JSON.stringify(record.inputs, null, 2))) : null,
    record.detail ? h("details", {}, h("summary", {}, "detail"),
      h("pre", {}, JSON.stringify(record.detail, null, 2))) : null);
}

async function showPicked(seq, target) {
  try {
    const { record } = await getJSON(`/decisions/${encodeURIComponent(seq)}`);
    target.replaceChildren(recordDetail(record));
  } catch (err) {
    target.replaceChildren(h("p", { class: "error" }, err.message));
  }
}

async function renderGroup(route) {
  const query = new URLSearchParams({ pop: route.pop, group: route.group, range: route.range });
  const data = await getJSON(`/timeline?${query}`);
  if (state.route !== route) return;
  crumbs(h("a", { href: "#/" }, "Fleet"), popLink(route.pop), h("span", {}, `group ${route.group}`));
  const picked = h("div", { id: "picked", class: "panel" },
    h("p", { class: "muted" }, "Hover a marker for its rule; click it for the whole record."));
  const pick = (seq) => { location.hash = groupHash(route, { seq }); };
  const ranges = h("div", { class: "ranges", role: "group", "aria-label": "time range" },
    RANGES.map((r) => h("a", { href: groupHash(route, { range: r, seq: null }),
                              class: r === data.range ? "on" : "" }, r)));
  const changes = data.points.filter((p) => p.kind !== "steady").concat(data.markers)
    .sort((a, b) => b.seq - a.seq).slice(0, 100);
  const list = h("table", { class: "records" }, h("tbody", {}, changes.map((p) => h("tr", { "data-seq": p.seq },
    h("td", {}, h("a", { href: groupHash(route, { seq: p.seq }) }, `#${p.seq}`)),
    h("td", {}, `${hhmmss(p.time)}Z`), h("td", {}, kindTag(p.kind)),
    h("td", {}, weightsText(p.weights)), h("td", { class: "rule" }, p.rule)))));
  const controllers = Object.entries(data.controllers || {}).map(([name, value]) =>
    h("section", { class: "panel controller", "data-controller": name }, h("h2", {}, name),
      !value ? h("p", { class: "muted" }, "none active")
        : value.standbys ? rampSentences(route, value.standbys) : genericTable(value)));
  setView(
    h("h1", {}, `${route.group} in ${route.pop}`),
    h("div", { class: "toolbar" }, ranges, legend(data),
      data.truncated ? h("span", { class: "warn" }, "older records not scanned (bounded read)") : null,
      data.log_begins ? h("span", { class: "muted" }, "the log begins inside this range") : null),
    h("section", { class: "panel charts" }, weightsChart(data, route.seq, pick), healthChart(data)),
    picked, controllers,
    h("section", { class: "panel" }, h("h2", {}, `Decisions in the last ${data.range} (${changes.length} changes)`), list));
  if (route.seq) await showPicked(route.seq, picked);
}

// -- one decision ----------------------------------------------------------------------------

async function renderDecision(route) {
  crumbs(h("a", { href: "#/" }, "Fleet"), h("span", {}, `decision #${route.seq}`));
  const { record } = await getJSON(`/decisions/${encodeURIComponent(route.seq)}`);
  if (state.route !== route) return;
  const timelineLink = record.pop && record.group
    ? h("p", {}, h("a", { href: groupHash({ pop: record.pop, group: record.group, range: "1h" }, { seq: record.seq }) },
      "show on the timeline")) : null;
  setView(h("h1", {}, `Decision #${record.seq}`), h("section", { class: "panel" }, recordDetail(record)), timelineLink);
}

// -- live streams (server-sent events) -------------------------------------------------------

function streamUrl(filter) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(filter)) if (v) params.set(k, v);
  return `${API}/stream?${params}`;
}

function openViewStream(route) {
  if (state.viewStream) state.viewStream.close();
  state.viewStream = null;
  if (route.name === "decision") return;
  const filter = route.name === "group" ? { pop: route.pop, group: route.group }
    : route.name === "pop" ? { pop: route.pop } : {};
  const source = new EventSource(streamUrl(filter));
  source.addEventListener("decision", () => scheduleRefresh(route.name === "overview" ? 1000 : 300));
  state.viewStream = source;
}

function streamItem(record) {
  return h("li", { class: "event", "data-seq": record.seq, "data-kind": record.kind, "data-pop": record.pop || "" },
    h("div", {}, h("time", {}, `${hhmmss(record.time)}Z`), " ", kindTag(record.kind), " ", decisionLink(record.seq)),
    h("div", { class: "where" }, record.pop ? popLink(record.pop) : null,
      record.pop && record.group ? h("span", {}, " / ", groupLink(record.pop, record.group)) : null,
      record.weights_after ? h("span", { class: "muted" }, ` ${weightsText(record.weights_after)}`) : null),
    h("div", { class: "rule" }, record.rule || ""));
}

async function openPanelStream() {
  if (state.panelStream) state.panelStream.close();
  state.panelStream = null;
  const generation = ++state.panelGeneration;  // a newer filter change wins over this one
  const form = document.getElementById("stream-filter");
  const filter = Object.fromEntries([...new FormData(form).entries()].filter(([, v]) => v));
  const list = document.getElementById("stream-list");
  const live = document.getElementById("live");
  const params = new URLSearchParams({ ...filter, limit: "30" });
  let newest = 0;
  try {
    const { records } = await getJSON(`/decisions?${params}`);
    if (generation !== state.panelGeneration) return;
    list.replaceChildren(...records.reverse().map(streamItem));
    newest = records.length ? records[0].seq : 0;
  } catch (err) {
    if (generation !== state.panelGeneration) return;
    list.replaceChildren(h("li", { class: "error" }, err.message));
  }
  const source = new EventSource(streamUrl(filter));
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = "live off"; });
  source.addEventListener("decision", (event) => {
    const record = JSON.parse(event.data);
    if (record.seq <= newest) return;  // already listed from the recent records
    list.prepend(streamItem(record));
    while (list.children.length > 200) list.lastChild.remove();
  });
  state.panelStream = source;
}

async function start() {
  document.getElementById("stream-filter").addEventListener("change", openPanelStream);
  document.getElementById("sign-out").addEventListener("click", signOut);
  showSignOut().catch(() => {});
  window.addEventListener("hashchange", render);
  await render();
  if (!state.overview) {
    try { fillFilterOptions(await getJSON("/overview")); } catch (err) { /* shown by the view */ }
  }
  openPanelStream();
}

document.addEventListener("DOMContentLoaded", start);
