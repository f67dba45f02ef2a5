// Fleet, Node, GPU and Alerts pages.
"use strict";
(() => {
  const { esc, fmt, sev } = GS;

  function heatColor(v, lo, hi) {
    if (v === null || v === undefined) return "#232a31";
    const f = hi > lo ? Math.min(1, Math.max(0, (v - lo) / (hi - lo))) : 0.5;
    const hue = 220 - 130 * f, sat = 60 + 10 * f, light = 22 + 40 * f;
    return `hsl(${hue.toFixed(0)} ${sat.toFixed(0)}% ${light.toFixed(0)}%)`;
  }

  GS.pages.fleet = {
    metric: "state",
    mount(root) {
      root.innerHTML = `<h1>Fleet</h1>
        <div class="cards" id="f-cards"></div>
        <h2>Who must act · firing alerts by owning team</h2><div id="f-owners"></div>
        <h2>GPU time in this range</h2><div id="f-hours"></div>
        <div class="legend">colour by <select id="f-metric"></select> <span id="f-states">${GS.STATES.map(([k, c]) => `<span><i style="background:${c}"></i>${k.replace(/_/g, " ")}</span>`).join("")}</span>
          <span><span class="grad"></span> <span id="f-lo"></span> → <span id="f-hi"></span></span>
          <span><i style="background:var(--p1)"></i>P1 fault</span><span><i style="background:var(--p2)"></i>P2</span>
          <span><i style="background:var(--p3)"></i>P3</span><span><i style="background:var(--stale)"></i>silent</span>
          <span><i style="outline:1px dashed #9aa4b1"></i>idle (&lt; 5 %)</span></div>
        <div class="heat" id="f-heat"></div>
        <h2>Idle GPUs</h2><div id="f-idle"></div>`;
      root.querySelector("#f-metric").addEventListener("change", (ev) => {
        this.metric = ev.target.value;
        GS.refresh();
      });
    },
    async update(root) {
      const byState = this.metric === "state";
      const { start, end } = GS.window();
      const d = await GS.api("/api/v1/ui/fleet", { metric: byState ? "gpu_utilization_percent" : this.metric, start, end });
      const sel = root.querySelector("#f-metric");
      if (!sel.options.length)
        sel.innerHTML = ["state", ...d.metrics].map((m) => `<option ${m === this.metric ? "selected" : ""}>${esc(m)}</option>`).join("");
      root.querySelector("#f-hours").innerHTML = GS.hours(d.productivity, "f-hoursbar");
      root.querySelector("#f-heat").classList.toggle("bystate", byState);
      let [lo, hi] = d.range;
      if (d.metric.endsWith("_percent")) [lo, hi] = [0, 100];
      root.querySelector("#f-lo").textContent = fmt(lo);
      root.querySelector("#f-hi").textContent = fmt(hi);
      const f = d.summary.firing;
      root.querySelector("#f-cards").innerHTML = `
        <div class="card">nodes<b>${d.summary.nodes}</b></div><div class="card">GPUs<b>${d.summary.gpus}</b></div>
        <div class="card">firing<b>${sev("P1")} ${f.P1} ${sev("P2")} ${f.P2} ${sev("P3")} ${f.P3}</b></div>
        <div class="card">idle GPUs<b id="f-idle-count">${d.idle.allocated + d.idle.unallocated}</b>
          <span class="muted">${d.idle.allocated} allocated · ${d.idle.unallocated} free</span></div>
        <div class="card">idle cost<b id="f-idle-cost">$${fmt(d.idle.cost_per_hour, 2)}/h</b>
          <span class="muted">allocated $${fmt(d.idle.allocated_cost_per_hour, 2)}/h</span></div>
        <div class="card">GPUs now by state<b style="font-size:12px" id="f-now">${GS.STATES.filter(([k]) => d.states_now[k]).map(([k]) => `${GS.stateTag(k)} <span data-now="${k}">${d.states_now[k]}</span>`).join("<br>") || "–"}</b></div>
        <div class="card">waste by cause<b style="font-size:12px" id="f-waste">${d.waste_by_cause.slice(0, 4).map((w) => `${esc(w.cause.replace(/_/g, " "))} ${fmt(w.gpu_hours, 2)} GPU-h · $${fmt(w.dollars, 2)}`).join("<br>") || "none"}</b></div>`;
      const parts = [];
      for (const n of d.nodes) {
        const node = encodeURIComponent(n.node);
        const worstState = ["down", "busy_not_productive", "idle_allocated", "degraded", "maintenance"].find((k) => n.states[k]);
        const badge = n.badge === "ok" && worstState ? GS.stateTag(worstState) : sev(n.badge);
        parts.push(`<div class="node" data-node="${esc(n.node)}" data-worst="${esc(worstState || "")}"><div class="nh"><a href="#/node/${node}">${esc(n.node)}</a>${badge}</div><div class="cells">`);
        for (const [gpu, v, s, job, idle, ps, cause] of n.gpus) {
          const tip = `${n.node} GPU ${gpu}: ${ps ? ps.replace(/_/g, " ") + (cause ? " (" + cause.replace(/_/g, " ") + ")" : "") + " · " : ""}util ${fmt(v)}${job ? " · job " + job : ""}${s !== "ok" ? " · " + s : ""}${idle ? " · idle" : ""}`;
          const bg = byState ? GS.stateColour(ps) : heatColor(v, lo, hi);
          parts.push(`<a class="cell${idle ? " idle" : ""}" href="#/gpu/${node}/${encodeURIComponent(gpu)}" data-node="${esc(n.node)}" data-gpu="${esc(gpu)}" data-state="${s}" data-pstate="${esc(ps || "")}" title="${esc(tip)}" style="background:${bg}"></a>`);
        }
        parts.push("</div></div>");
      }
      root.querySelector("#f-heat").innerHTML = parts.join("");
      root.querySelector("#f-owners").innerHTML = d.owners.length
        ? `<table id="f-owner-table"><tr><th>owner</th><th>P1</th><th>P2</th><th>P3</th><th>cost of delay</th><th>rules</th></tr>${d.owners
            .map((o) => `<tr data-owner="${esc(o.owner)}"><td><b>${esc(o.owner)}</b></td>${["P1", "P2", "P3"].map((t) => `<td class="num" data-tier="${t}">${o[t] ? sev(t) + " " + o[t] : "–"}</td>`).join("")}<td class="num">$${fmt(o.cost_per_hour, 2)}/h</td><td>${Object.entries(o.rules).map(([r, n]) => `<a href="#/alerts">${esc(r)}</a>${n > 1 ? ` ×${n}` : ""}`).join(", ")}</td></tr>`)
            .join("")}</table>`
        : '<p class="muted">no firing alerts: nobody needs to act</p>';
      const idle = d.idle.gpus.slice(0, 50);
      root.querySelector("#f-idle").innerHTML = idle.length
        ? `<table id="f-idle-table"><tr><th>node</th><th>GPU</th><th>job</th><th>owner</th></tr>${idle
            .map((g) => `<tr data-owner="${esc(g.owner)}"><td><a href="#/node/${encodeURIComponent(g.node)}">${esc(g.node)}</a></td><td><a href="#/gpu/${encodeURIComponent(g.node)}/${encodeURIComponent(g.gpu)}">${esc(g.gpu)}</a></td><td>${g.job ? `<a href="#/job/${encodeURIComponent(g.job)}">${esc(g.job)}</a>` : '<span class="muted">unallocated</span>'}</td><td class="owner">${esc(g.owner)}</td></tr>`)
            .join("")}</table>`
        : `<p class="muted">no GPU below ${d.idle.threshold_percent} % utilization</p>`;
    },
  };

  // firing first, then the most recent; a resolved alert says so and costs nothing any more
  GS.alertRows = (alerts) =>
    alerts.length
      ? `<table><tr><th>sev</th><th>rule</th><th>where</th><th>state</th><th>cost</th><th>summary</th></tr>${[...alerts]
          .sort((a, b) => !!a.resolved_at - !!b.resolved_at || b.started_at - a.started_at)
          .map((a) => `<tr data-alert="${esc(a.id)}" data-state="${a.resolved_at ? "resolved" : "firing"}"><td>${sev(a.severity)}</td><td><a href="#/alert/${esc(a.id)}">${esc(a.rule)}</a></td><td>${GS.entityLinks(a.entity)}</td><td>${a.resolved_at ? `resolved <span class="muted">${GS.ago(a.resolved_at)} ago</span>` : `firing <span class="muted">for ${GS.ago(a.started_at)}</span>`}</td><td>${a.resolved_at ? "–" : GS.perHour(a.cost_per_hour)}</td><td>${esc(a.summary)}</td></tr>`)
          .join("")}</table>`
      : '<p class="muted">no firing alerts</p>';

  GS.pages.node = {
    mount(root, [node]) {
      root.innerHTML = `<h1>Node ${esc(node)}</h1><div class="cards" id="n-host"></div>
        <h2>GPUs</h2><div id="n-gpus"></div><h2>Alerts</h2><div id="n-alerts"></div><h2>History</h2><div id="n-charts"></div>`;
      GS.chartBoxes(root.querySelector("#n-charts"), ["util", "temp", "power", "cpu", "net", "ib"]);
    },
    async update(root, [node]) {
      const d = await GS.api("/api/v1/ui/node", { node });
      const h = d.host ? d.host.values : {};
      root.querySelector("#n-host").innerHTML = `
        <div class="card">CPU<b>${fmt(h.node_cpu_percent)} %</b></div><div class="card">load<b>${fmt(h.node_load1)}</b></div>
        <div class="card">memory<b>${fmt(h.node_memory_used_bytes)}B</b><span class="muted">of ${fmt(h.node_memory_total_bytes)}B</span></div>
        <div class="card">net rx/tx<b>${fmt(h.node_net_rx_bytes_per_second)} / ${fmt(h.node_net_tx_bytes_per_second)} B/s</b></div>
        <div class="card">IB rx/tx<b>${fmt(h.node_ib_rx_bytes_per_second)} / ${fmt(h.node_ib_tx_bytes_per_second)} B/s</b><span class="muted">ports down ${fmt(h.node_ib_ports_down)}</span></div>
        <div class="card">last report<b>${GS.ago(d.host && d.host.ts)}</b></div>`;
      root.querySelector("#n-gpus").innerHTML = `<table><tr><th>GPU</th><th>state</th><th>job</th><th>util %</th><th>temp °C</th><th>power W</th><th>memory used</th><th>SM MHz</th></tr>${d.gpus
        .map((g) => `<tr><td><a href="#/gpu/${encodeURIComponent(node)}/${encodeURIComponent(g.gpu)}">GPU ${esc(g.gpu)}</a></td><td>${sev(g.state)}</td><td>${g.job ? `<a href="#/job/${encodeURIComponent(g.job)}">${esc(g.job)}</a>` : "–"}</td>${["gpu_utilization_percent", "gpu_temp_celsius", "gpu_power_watts"].map((m) => `<td${g.stale ? ' class="muted stale" title="last value before the GPU went silent"' : ""}>${fmt(g.values[m])}${g.stale ? " (stale)" : ""}</td>`).join("")}<td>${fmt(g.values.gpu_memory_used_bytes)}B</td><td>${fmt(g.values.gpu_sm_clock_mhz)}</td></tr>`)
        .join("")}</table>${d.gpus.filter((g) => g.faulty).map((g) => `<p class="faulty" data-gpu="${esc(g.gpu)}">${sev(g.faulty.severity)} <a href="#/gpu/${encodeURIComponent(node)}/${encodeURIComponent(g.gpu)}">GPU ${esc(g.gpu)}</a> slow since it started: ${faultyText(g.faulty)}</p>`).join("")}${[...new Set(d.services.map((s) => s.labels.service))].map((name) => `<p class="serves">serves <a href="#/service/${encodeURIComponent(name)}">${esc(name)}</a></p>`).join("")}`;
      root.querySelector("#n-alerts").innerHTML = GS.alertRows(d.alerts);
      const gpus = d.gpus.map((g) => g.gpu);
      const per = async (metric) => GS.align(await Promise.all(gpus.map((g) => GS.series(metric, { node, gpu: g }))));
      const gs = gpus.map((g) => ({ label: `GPU ${g}` }));
      const [util, temp, power, cpu, net, ib] = await Promise.all([
        per("gpu_utilization_percent"), per("gpu_temp_celsius"), per("gpu_power_watts"),
        GS.series("node_cpu_percent", { node }).then((p) => GS.align([p])),
        Promise.all([GS.series("node_net_rx_bytes_per_second", { node }), GS.series("node_net_tx_bytes_per_second", { node })]).then(GS.align),
        Promise.all([GS.series("node_ib_rx_bytes_per_second", { node }), GS.series("node_ib_tx_bytes_per_second", { node })]).then(GS.align),
      ]);
      GS.chart(root.querySelector("#c-util"), "GPU utilization %", util, gs);
      GS.chart(root.querySelector("#c-temp"), "GPU temperature °C", temp, gs);
      GS.chart(root.querySelector("#c-power"), "GPU power W", power, gs);
      GS.chart(root.querySelector("#c-cpu"), "host CPU %", cpu, [{ label: "cpu" }]);
      GS.chart(root.querySelector("#c-net"), "host network B/s", net, [{ label: "rx" }, { label: "tx" }]);
      GS.chart(root.querySelector("#c-ib"), "InfiniBand B/s", ib, [{ label: "rx" }, { label: "tx" }]);
    },
  };

  // a GPU slow since it started past what parts differ by, in its P2's own figures
  const faultyText = (f) =>
    `${fmt(100 * f.lag_share)} % behind its speed group in job ${f.job ? `<a href="#/job/${encodeURIComponent(f.job)}">${esc(f.job)}</a>` : "–"}: a faulty part, not a slowdown; the job loses ${fmt(100 * f.lost_share)} % of its GPU time, ${GS.perHour(f.cost_per_hour)} (<a href="#/alert/${esc(f.id)}">${esc(f.id)}</a>)`;

  const HW_EVENTS = ["xid", "ecc_dbe", "gpu_lost"];
  GS.pages.gpu = {
    mount(root, [node, gpu]) {
      root.innerHTML = `<h1>GPU ${esc(gpu)} on <a href="#/node/${encodeURIComponent(node)}">${esc(node)}</a></h1>
        <div class="cards" id="g-now"></div><h2>XID, ECC and lost-GPU timeline</h2><div id="g-events"></div>
        <h2>Alerts on this GPU</h2><div id="g-alerts"></div><h2>History</h2><div id="g-charts"></div>`;
      GS.chartBoxes(root.querySelector("#g-charts"), ["util", "temp", "power", "clock", "throttle", "ecc"]);
    },
    async update(root, [node, gpu]) {
      const labels = { node, gpu };
      const { start, end } = GS.window();
      const [nodeView, alerts, ...evs] = await Promise.all([
        GS.api("/api/v1/ui/node", { node }),
        GS.api("/api/v1/alerts", { state: "all" }),
        ...HW_EVENTS.map((kind) => GS.api("/api/v1/events", { kind, start, end, node, gpu, limit: 500 })),
      ]);
      const me = nodeView.gpus.find((g) => g.gpu === gpu) || { values: {}, state: "unknown" };
      const v = me.values;
      const stale = me.stale ? `<span class="muted" id="g-stale">last report ${GS.ago(me.ts)} ago: values are stale</span>` : "";
      root.querySelector("#g-now").innerHTML = `<div class="card">state<b>${sev(me.state)}</b>${me.pstate ? GS.stateTag(me.pstate) : ""} ${stale}</div>
        <div class="card">job<b>${me.job ? `<a href="#/job/${encodeURIComponent(me.job)}">${esc(me.job)}</a>` : "–"}</b></div>
        <div class="card">util<b>${fmt(v.gpu_utilization_percent)} %</b></div><div class="card">temp<b>${fmt(v.gpu_temp_celsius)} °C</b></div>
        <div class="card">power<b>${fmt(v.gpu_power_watts)} W</b><span class="muted">limit ${fmt(v.gpu_power_limit_watts)}</span></div>
        <div class="card">ECC DBE / SBE<b>${fmt(v.gpu_ecc_dbe_volatile_total)} / ${fmt(v.gpu_ecc_sbe_volatile_total)}</b></div>
        <div class="card">uuid<b style="font-size:11px">${esc(me.uuid || "–")}</b></div>
        ${me.faulty ? `<div class="card" id="g-faulty" data-alert="${esc(me.faulty.id)}" title="${esc(me.faulty.summary)}">faulty part<b>${sev(me.faulty.severity)} slow since it started</b><span class="muted">${faultyText(me.faulty)}</span></div>` : ""}`;
      const events = evs.flatMap((e) => e.events).sort((a, b) => a.ts - b.ts);
      root.querySelector("#g-events").innerHTML = events.length
        ? `<table><tr><th>time</th><th>kind</th><th>detail</th></tr>${events.map((e) => `<tr><td>${GS.time(e.ts)}</td><td>${esc(e.kind.replace(/_/g, " "))}${e.kind === "xid" && e.data.code ? " " + esc(e.data.code) : ""}</td><td>${esc(e.data.message || e.data.reason || GS.detail(e.data))}</td></tr>`).join("")}</table>`
        : '<p class="muted">no XID, ECC or lost-GPU event in this range</p>';
      const mine = alerts.alerts.filter((a) => a.entity.node === node && a.entity.gpu === gpu);
      root.querySelector("#g-alerts").innerHTML = mine.length ? GS.alertRows(mine) : '<p class="muted">none</p>';
      const many = (ms) => Promise.all(ms.map((m) => GS.series(m, labels))).then(GS.align);
      const throttles = ["gpu_throttle_hw_thermal", "gpu_throttle_sw_thermal", "gpu_throttle_sw_power", "gpu_throttle_hw_power_brake", "gpu_throttle_hw_slowdown"];
      const [util, temp, power, clock, thr, ecc] = await Promise.all([
        many(["gpu_utilization_percent"]), many(["gpu_temp_celsius", "gpu_memory_temp_celsius"]),
        many(["gpu_power_watts", "gpu_power_limit_watts"]), many(["gpu_sm_clock_mhz"]), many(throttles),
        many(["gpu_ecc_sbe_volatile_total", "gpu_ecc_dbe_volatile_total"]),
      ]);
      GS.chart(root.querySelector("#c-util"), "utilization %", util, [{ label: "util" }]);
      GS.chart(root.querySelector("#c-temp"), "temperature °C", temp, [{ label: "die" }, { label: "HBM" }]);
      GS.chart(root.querySelector("#c-power"), "power W", power, [{ label: "draw" }, { label: "limit" }]);
      GS.chart(root.querySelector("#c-clock"), "SM clock MHz", clock, [{ label: "SM clock" }]);
      // each reason is 1 while engaged: a point's mean is the share of its time, drawn as 0-100 %
      // whatever the data (an all-zero series was scaled 0-100, a throttled one 0-1)
      const thrPct = [thr[0], ...thr.slice(1).map((ys) => ys.map((v) => (v === null ? null : 100 * v)))];
      GS.chart(root.querySelector("#c-throttle"), "throttle reasons (% of time)", thrPct, throttles.map((t) => ({ label: t.replace("gpu_throttle_", "") })), { y: [0, 100] });
      GS.chart(root.querySelector("#c-ecc"), "ECC errors (volatile)", ecc, [{ label: "SBE" }, { label: "DBE" }]);
    },
  };

  function playbook(a) {
    const p = a.details && a.details.playbook;
    if (!p) return '<span class="muted">no playbook results attached</span>';
    const steps = (p.diagnosis || []).map((s) => `<div class="step"><span class="st ${esc(s.status)}">${esc(s.status)}</span> ${esc(s.step)}: ${esc(s.result)}</div>`).join("");
    const mit = (p.mitigation || []).map((m) => `<li>${esc(m)}</li>`).join("");
    return `<details><summary>playbook: ${esc(p.summary || p.meaning || "")}</summary>
      <div class="step"><b>meaning</b> ${esc(p.meaning)}</div><div class="step"><b>impact</b> ${esc(p.impact)}</div>
      ${steps}<div class="step"><b>mitigation</b><ol>${mit}</ol></div></details>`;
  }

  function who() {
    const u = document.getElementById("user").value.trim();
    return u || "dashboard";
  }

  async function act(fn, what) {
    try {
      await fn();
      GS.banner("");
    } catch (err) {
      GS.banner(`${what} failed: ${err.message}`);
      return;
    }
    await GS.refresh();
  }

  GS.ack = (id) => act(() => GS.post(`/api/v1/alerts/${encodeURIComponent(id)}/ack`, { by: who(), comment: "from the dashboard" }), `ack of ${id}`);
  GS.silence = (labels, id) => {
    const matchers = Object.fromEntries(Object.entries(labels).filter(([k]) => !["severity", "tier", "owner", "incident", "alertname"].includes(k)));
    return act(() => GS.post("/api/v1/silences", { matchers, duration: "1h", created_by: who(), comment: `silenced ${id} from the dashboard` }), `silence of ${id}`);
  };

  function alertRow(a, alerting) {
    const acked = a.ack ? `acked by ${esc(a.ack.by)}` : "";
    const muted = a.muted ? `muted (${esc(typeof a.muted === "string" ? a.muted : JSON.stringify(a.muted))})` : "";
    const state = a.resolved_at ? "resolved" : "firing";
    const buttons = alerting && !a.resolved_at
      ? `${a.ack ? "" : `<button class="ack" data-ack="${esc(a.id)}">ack</button>`} <button class="silence" data-silence="${esc(a.id)}">silence 1 h</button>`
      : "";
    return `<tr data-alert="${esc(a.id)}" data-state="${state}" data-acked="${a.ack ? "1" : "0"}"><td>${sev(a.severity)}</td>
      <td><a href="#/alert/${esc(a.id)}">${esc(a.rule)}</a><div class="muted">${esc(a.id)} · ${esc(a.owner)}</div></td>
      <td>${GS.entityLinks(a.entity)}</td><td>${state}<div class="muted">${GS.ago(a.started_at)} ago</div></td>
      <td>${GS.perHour(a.cost_per_hour)}</td><td>${esc(a.summary)}${playbook(a)}</td>
      <td class="ackstate">${acked} ${muted} ${buttons}</td></tr>`;
  }

  function wire(root, byId) {
    for (const b of root.querySelectorAll("button[data-ack]")) b.onclick = () => GS.ack(b.dataset.ack);
    for (const b of root.querySelectorAll("button[data-silence]")) {
      const a = byId.get(b.dataset.silence);
      b.onclick = () => GS.silence(a.labels || { rule: a.rule, ...a.entity }, a.id);
    }
  }

  async function loadAlerts(state) {
    const caps = await GS.api("/api/v1/ui/capabilities");
    if (caps.alerting) {
      const [al, inc] = await Promise.all([
        GS.api("/api/v1/alerting/alerts", { state }),
        GS.api("/api/v1/alerting/incidents", { state: state === "firing" ? "open" : "all" }),
      ]);
      return { alerting: true, alerts: al.alerts, incidents: inc.incidents };
    }
    const [al, inc] = await Promise.all([GS.api("/api/v1/alerts", { state }), GS.api("/api/v1/incidents")]);
    return { alerting: false, alerts: al.alerts, incidents: inc.incidents };
  }

  GS.pages.alerts = {
    state: "firing",
    mount(root) {
      root.innerHTML = `<h1>Alerts and incidents</h1>
        <div class="legend">show <select id="a-state"><option value="firing">firing</option><option value="all">all</option></select>
        <span id="a-note" class="muted"></span></div>
        <h2>Incidents</h2><div id="a-inc"></div><h2>Alerts</h2><div id="a-list"></div>`;
      const sel = root.querySelector("#a-state");
      sel.value = this.state;
      sel.addEventListener("change", () => { this.state = sel.value; GS.refresh(); });
    },
    async update(root) {
      const d = await loadAlerts(this.state);
      root.querySelector("#a-note").textContent = d.alerting ? "" : "this hub runs no alerting service: ack and silence are unavailable";
      const byId = new Map(d.alerts.map((a) => [a.id, a]));
      root.querySelector("#a-inc").innerHTML = d.incidents.length
        ? `<table><tr><th>incident</th><th>root cause</th><th>members</th><th>since</th><th></th></tr>${d.incidents
            .map((i) => {
              const rootAlert = byId.get(i.root);
              return `<tr data-incident="${esc(i.id)}" data-state="${i.resolved_at ? "resolved" : "open"}"><td><b>${esc(i.id)}</b> ${esc(i.title || "")}</td>
                <td>${rootAlert ? `${sev(rootAlert.severity)} <a href="#/alert/${esc(i.root)}">${esc(rootAlert.rule)}</a> ${GS.entityLinks(rootAlert.entity)}` : `<a href="#/alert/${esc(i.root)}">${esc(i.root)}</a>${this.state === "firing" ? ' <span class="muted">resolved</span>' : ""}`}</td>
                <td>${(i.members || []).map((m) => `<a href="#/alert/${esc(m)}">${esc(m)}</a>`).join(" ")}</td><td>${i.resolved_at ? `resolved <span class="muted">${GS.ago(i.resolved_at)} ago</span>` : GS.ago(i.started_at)}</td>
                <td>${d.alerting && !i.resolved_at ? `<button data-ack="${esc(i.id)}">ack incident</button>` : ""}</td></tr>`;
            })
            .join("")}</table>`
        : '<p class="muted">no incidents</p>';
      root.querySelector("#a-list").innerHTML = d.alerts.length
        ? `<table><tr><th>sev</th><th>rule</th><th>where</th><th>state</th><th>cost</th><th>summary and playbook</th><th>ack / silence</th></tr>${d.alerts.map((a) => alertRow(a, d.alerting)).join("")}</table>`
        : '<p class="muted">no alerts</p>';
      wire(root, byId);
    },
  };

  GS.pages.alert = {
    mount(root, [id]) {
      root.innerHTML = `<h1>Alert ${esc(id)}</h1><div id="al-body"></div><h2>History</h2><div id="al-hist"></div>`;
    },
    async update(root, [id]) {
      const d = await loadAlerts("all");
      const a = d.alerts.find((x) => x.id === id);
      if (!a) { root.querySelector("#al-body").innerHTML = '<p class="muted">no such alert</p>'; return; }
      const inc = d.incidents.find((i) => (i.members || []).includes(id));
      root.querySelector("#al-body").innerHTML = `<p>${sev(a.severity)} <b>${esc(a.rule)}</b> · ${GS.entityLinks(a.entity)}
        ${inc ? ` · incident <b>${esc(inc.id)}</b>, root cause <a href="#/alert/${esc(inc.root)}">${esc(inc.root)}</a>` : ""}</p>
        <table>${alertRow(a, d.alerting)}</table>`;
      wire(root, new Map([[a.id, a]]));
      for (const dt of root.querySelectorAll("details")) dt.open = true;
      if (d.alerting) {
        const h = await GS.api(`/api/v1/alerts/${encodeURIComponent(id)}/history`);
        root.querySelector("#al-hist").innerHTML = `<table>${h.history.map((r) => `<tr><td>${GS.time(r.ts)}</td><td>${esc(r.what)}</td><td>${esc(r.detail)}</td></tr>`).join("")}</table>`;
      }
    },
  };
})();
