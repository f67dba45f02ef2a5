// gpuscope dashboard core: routing, fetching, live refresh, time range, charts (uPlot).
"use strict";
const GS = (window.GS = {
  pages: {},
  charts: new Map(),
  current: null,
  updates: 0,
  busy: false,
});

const qs = new URLSearchParams(location.search);
GS.refreshMs = Math.max(500, Number(qs.get("refresh") || 5) * 1000);

GS.esc = (v) =>
  String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

GS.fmt = (v, digits = 1) => {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e12) return (v / 1e12).toFixed(digits) + "T";
  if (a >= 1e9) return (v / 1e9).toFixed(digits) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(digits) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(digits) + "k";
  if (a !== 0 && a < 0.01) return v.toExponential(1);
  return Number(v.toFixed(a < 10 ? 3 : digits)).toString();
};
// Dollars an hour as a person reads them, to the cent (fmt gave "$3.334/h" under $10)
GS.perHour = (v) => (v === null || v === undefined || Number.isNaN(v) ? "–" : `$${v.toFixed(2)}/h`);
// Short tick labels that do not run into each other: time of day within two days, else the date.
GS.timeTicks = (u, vals) => {
  const span = vals.length > 1 ? vals[vals.length - 1] - vals[0] : 0;
  return vals.map((v) => {
    const d = new Date(v * 1000);
    return span > 2 * 86400
      ? d.toLocaleDateString(undefined, { month: "short", day: "numeric" })
      : d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
  });
};
// Event data as words, not JSON: "code 79 · source nvml".
GS.detail = (data) =>
  Object.entries(data || {})
    .filter(([, v]) => v !== "" && v !== null && v !== undefined)
    .map(([k, v]) => `${k.replace(/_/g, " ")} ${typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" · ");
GS.time = (ts) => (ts ? new Date(ts * 1000).toLocaleString() : "–");
GS.ago = (ts) => {
  if (!ts) return "–";
  const s = Math.max(0, Date.now() / 1000 - ts);
  return s < 90 ? `${s.toFixed(0)} s` : s < 5400 ? `${(s / 60).toFixed(0)} min` : `${(s / 3600).toFixed(1)} h`;
};
GS.sev = (s) => `<span class="sev ${GS.esc(s || "ok")}">${GS.esc(s || "ok")}</span>`;

GS.range = () => Number(document.getElementById("range").value);
GS.window = () => {
  const end = Date.now() / 1000;
  return { start: end - GS.range(), end };
};

// The token (kept for this tab in sessionStorage) goes with reads too: a hub off loopback
// answers reads only with a read-scoped token.
GS.auth = () => {
  const token = document.getElementById("token").value.trim();
  return token ? { Authorization: `Bearer ${token}` } : {};
};

GS.api = async (path, params) => {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null) url.searchParams.set(k, v);
  const res = await fetch(url, { headers: GS.auth() });
  const body = await res.json();
  if (res.status === 401) {
    document.getElementById("token").placeholder = "needed";
    throw new Error("this hub needs a token to read: enter a read token in the token box");
  }
  if (!res.ok) throw new Error(`${path}: ${body.error || res.status}`);
  return body;
};

GS.post = async (path, doc) => {
  const headers = { "Content-Type": "application/json", ...GS.auth() };
  const res = await fetch(path, { method: "POST", headers, body: JSON.stringify(doc) });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
  return body;
};

GS.banner = (msg) => {
  const b = document.getElementById("banner");
  b.hidden = !msg;
  b.textContent = msg || "";
};

// Links between layers: every label that names a place links to its page.
GS.entityLinks = (e) => {
  const out = [];
  if (e.service) out.push(`service <a href="#/service/${encodeURIComponent(e.service)}">${GS.esc(e.service)}</a>`);
  if (e.job) out.push(`job <a href="#/job/${encodeURIComponent(e.job)}">${GS.esc(e.job)}</a>`);
  if (e.job && e.rank !== undefined)
    out.push(`rank <a href="#/job/${encodeURIComponent(e.job)}/${encodeURIComponent(e.rank)}">${GS.esc(e.rank)}</a>`);
  if (e.node) out.push(`node <a href="#/node/${encodeURIComponent(e.node)}">${GS.esc(e.node)}</a>`);
  if (e.node && e.gpu !== undefined)
    out.push(`GPU <a href="#/gpu/${encodeURIComponent(e.node)}/${encodeURIComponent(e.gpu)}">${GS.esc(e.gpu)}</a>`);
  for (const [k, v] of Object.entries(e))
    if (!["service", "job", "rank", "node", "gpu"].includes(k)) out.push(`${GS.esc(k)}=${GS.esc(v)}`);
  return out.join(" · ");
};

// Series on one time axis: the union of their timestamps, null where a series has no point.
GS.align = (lists) => {
  const xs = [...new Set(lists.flatMap((l) => l.map((p) => p[0])))].sort((a, b) => a - b);
  const pos = new Map(xs.map((x, i) => [x, i]));
  const ys = lists.map((l) => {
    const y = new Array(xs.length).fill(null);
    for (const [t, v] of l) y[pos.get(t)] = v;
    return y;
  });
  return [xs, ...ys];
};

GS.series = async (metric, labels, points = 300) => {
  const { start, end } = GS.window();
  const body = await GS.api("/api/v1/series", { metric, start, end, points, ...labels });
  return body.points;
};

// GPU-time states of the productivity model (/api/v1/productivity), in the order the bar shows them.
GS.STATES = [
  ["productive", "#3fb950"], ["degraded", "#e3b341"], ["busy_not_productive", "#ff7b72"],
  ["idle_allocated", "#b06c00"], ["idle_unallocated", "#34404c"], ["down", "#8e1b21"], ["maintenance", "#7d6bd6"],
];
GS.stateColour = (s) => (GS.STATES.find(([k]) => k === s) || [null, "#232a31"])[1];
GS.stateTag = (s) => `<span class="pst" data-pstate="${GS.esc(s)}" style="background:${GS.stateColour(s)}">${GS.esc(String(s).replace(/_/g, " "))}</span>`;
// GPU-hours (and dollars) per state as one bar plus a table of states and causes with their owners.
GS.hours = (row, id) => {
  if (!row || !row.gpu_hours) return '<p class="muted">no GPU time counted in this range yet</p>';
  const total = row.gpu_hours;
  const bar = GS.STATES.map(([k, c]) => {
    const h = row.states[k].gpu_hours;
    return h > 0 ? `<span data-state="${k}" style="width:${((100 * h) / total).toFixed(2)}%;background:${c}" title="${k} ${GS.fmt(h, 2)} GPU-h"></span>` : "";
  }).join("");
  const rows = GS.STATES.filter(([k]) => row.states[k].gpu_hours > 0).map(([k]) => {
    const st = row.states[k];
    const causes = Object.entries(st.causes).sort((a, b) => b[1].gpu_hours - a[1].gpu_hours)
      .map(([c, v]) => `${GS.esc(c.replace(/_/g, " "))} ${GS.fmt(v.gpu_hours, 2)} h <span class="muted">(${GS.esc(v.owner)})</span>`).join(" · ");
    return `<tr data-state="${k}"><td>${GS.stateTag(k)}</td><td class="num" data-hours="${st.gpu_hours}">${GS.fmt(st.gpu_hours, 2)}</td><td class="num">${((100 * st.gpu_hours) / total).toFixed(1)} %</td><td class="num">$${GS.fmt(st.dollars, 2)}</td><td>${causes}</td></tr>`;
  }).join("");
  return `<div class="bar" id="${id}">${bar}</div><table class="hours"><tr><th>state</th><th>GPU-h</th><th>share</th><th>cost</th><th>causes (owner)</th></tr>${rows}</table>
    <p class="muted">wasted: <b data-waste="${row.waste.gpu_hours}">${GS.fmt(row.waste.gpu_hours, 2)} GPU-h · $${GS.fmt(row.waste.dollars, 2)}</b> of ${GS.fmt(total, 2)} GPU-h</p>`;
};

const PALETTE = ["#6cb6ff", "#3fb950", "#f5a524", "#c9a6ff", "#ff7b72", "#39c5cf", "#e3b341", "#f778ba"];
GS.color = (i) => PALETTE[i % PALETTE.length];

// One uPlot chart per box; a refresh with the same series only swaps the data (no re-layout).
GS.chart = (box, title, data, series, opts = {}) => {
  const points = data.slice(1).reduce((n, ys) => n + ys.filter((v) => v !== null && v !== undefined).length, 0);
  box.dataset.points = String(points);
  const key = box.id;
  const sig = series.map((s) => s.label + (s.stroke || "") + (s.width || "")).join("|");
  let entry = GS.charts.get(key);
  if (entry && (entry.sig !== sig || !document.body.contains(entry.u.root))) {
    entry.u.destroy();
    GS.charts.delete(key);
    entry = null;
  }
  if (!points) {
    if (entry) { entry.u.destroy(); GS.charts.delete(key); }
    box.innerHTML = `<div class="title">${GS.esc(title)}</div><div class="empty">no data in this range</div>`;
    return;
  }
  if (entry) {
    // a redraw for another range keeps the chart, with this draw's title and fixed scales
    entry.held.opts = opts;
    box.querySelector(".title").textContent = title;
    entry.u.setData(data);
    return;
  }
  const held = { opts };
  box.innerHTML = `<div class="title">${GS.esc(title)}</div>`;
  const width = Math.max(280, box.clientWidth - 14);
  const u = new uPlot(
    {
      width,
      height: opts.height || 180,
      series: [{}, ...series.map((s, i) => ({ stroke: GS.color(i), width: 1.25, spanGaps: true, points: { show: false }, ...s }))],
      axes: [
        { stroke: "#8b97a5", grid: { stroke: "#2a333d" }, space: 90, values: GS.timeTicks },
        { stroke: "#8b97a5", grid: { stroke: "#2a333d" }, size: 72, values: (u, vals) => vals.map((v) => GS.fmt(v)) },
      ],
      legend: { show: series.length <= 12 },
      cursor: { drag: { x: true, y: false } },
      scales: {
        x: { time: true, ...(opts.x ? { range: (u, lo, hi) => held.opts.x || [lo, hi] } : {}) },
        ...(opts.y ? { y: { range: (u, lo, hi) => held.opts.y || [lo, hi] } } : {}),
      },
    },
    data,
    box,
  );
  GS.charts.set(key, { u, sig, held });
};

GS.chartBoxes = (root, names) =>
  (root.innerHTML = `<div class="charts">${names.map((n) => `<div class="chart" id="c-${n}" data-chart="${n}"></div>`).join("")}</div>`);

// -- routing and the live loop ---------------------------------------------------------------

// pages people reach for by another name: incidents are listed on the Alerts page
const PAGE_ALIASES = { incidents: "alerts", incident: "alerts" };

// an address that names no page says so and lists the pages (it used to show Fleet silently)
GS.pages.missing = {
  mount(root) {
    const links = [...document.querySelectorAll("#nav a")]
      .map((a) => `<a href="${GS.esc(a.getAttribute("href"))}">${GS.esc(a.textContent)}</a>`)
      .join(", ");
    root.innerHTML = `<h1>No such page</h1>
      <p id="missing">There is no page ${GS.esc(location.hash)} in this dashboard. Its pages are ${links}.</p>`;
  },
  async update() {},
};

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const asked = parts[0] || "fleet";
  const known = PAGE_ALIASES[asked] || asked;
  const name = GS.pages[known] ? known : "missing";
  const page = GS.pages[name];
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name || (a.dataset.page === "jobs" && name === "job") || (a.dataset.page === "services" && name === "service") || (a.dataset.page === "alerts" && name === "alert"));
  for (const { u } of GS.charts.values()) u.destroy();
  GS.charts.clear();
  // each page gets a fresh container: an update of the page just left, still in flight, writes
  // into its own detached container, never into the new page's boxes (which share ids)
  const main = document.getElementById("main");
  const view = document.createElement("div");
  main.replaceChildren(view);
  document.body.dataset.page = name;
  document.body.dataset.ready = "0";
  GS.banner("");
  GS.current = { page, args: parts.slice(1), root: view };
  page.mount(view, GS.current.args);
  update();
}

async function update() {
  const cur = GS.current;
  if (!cur) return;
  if (GS.busy) { GS.again = true; return; } // run once the update in flight is done
  GS.busy = true;
  GS.again = false;
  const t0 = performance.now();
  try {
    await cur.page.update(cur.root, cur.args);
    if (cur !== GS.current) return;
    document.body.dataset.updateMs = (performance.now() - t0).toFixed(1);
    GS.updates += 1;
    document.body.dataset.updates = String(GS.updates);
    document.body.dataset.ready = "1";
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    GS.banner("");
  } catch (err) {
    if (cur !== GS.current) return; // the page was left meanwhile: its failure is no news
    GS.banner(`could not load this page: ${err.message}`);
    document.body.dataset.ready = "error";
  } finally {
    GS.busy = false;
    if (GS.again || cur !== GS.current) { GS.again = false; update(); }
  }
}
GS.refresh = update;

function init() {
  const range = document.getElementById("range");
  range.value = localStorage.getItem("gs.range") || qs.get("range") || "3600";
  range.addEventListener("change", () => { localStorage.setItem("gs.range", range.value); update(); });
  const user = document.getElementById("user");
  user.value = localStorage.getItem("gs.user") || "";
  user.addEventListener("change", () => localStorage.setItem("gs.user", user.value.trim()));
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("gs.token") || "";
  token.addEventListener("change", () => {
    sessionStorage.setItem("gs.token", token.value.trim());
    update();
  });
  window.addEventListener("hashchange", route);
  setInterval(() => {
    if (document.getElementById("live").checked && !document.hidden) update();
  }, GS.refreshMs);
  // pages register themselves in pages*.js, loaded after this file
  setTimeout(route, 0);
}
document.addEventListener("DOMContentLoaded", init);
