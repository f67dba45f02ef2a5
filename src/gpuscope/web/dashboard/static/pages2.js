// Jobs, Services, Reports and Lineage pages.
"use strict";
(() => {
  const { esc, fmt, sev } = GS;
  const jobLink = (j) => `<a href="#/job/${encodeURIComponent(j)}">${esc(j)}</a>`;

  GS.pages.jobs = {
    mount(root) {
      root.innerHTML = `<h1>Jobs</h1><div id="j-list"></div>`;
    },
    async update(root) {
      const d = await GS.api("/api/v1/ui/jobs");
      root.querySelector("#j-list").innerHTML = d.jobs.length
        ? `<table><tr><th>job</th><th>kind</th><th>state</th><th>ranks</th><th>GPUs now</th><th>restarts</th><th>started</th><th>alerts</th></tr>${d.jobs
            .map((j) => `<tr data-job="${esc(j.job)}"><td>${j.kind === "inference" ? `<a href="#/service/${encodeURIComponent(j.job)}">${esc(j.job)}</a>` : jobLink(j.job)}</td><td>${esc(j.kind)}</td><td data-status="${esc(j.status)}"><span class="jst ${esc(j.status)}">${esc(j.status)}</span></td><td>${j.world_size ?? "–"}</td><td>${j.gpus_now}</td><td>${j.restarts}</td><td>${GS.time(j.started_at)}</td><td>${j.alerts ? sev(j.worst) + " " + j.alerts : "–"}</td></tr>`)
            .join("")}</table>`
        : '<p class="muted">no job has reported in the last 30 days</p>';
    },
  };

  const GOODPUT = [
    ["productive", "var(--ok)"], ["data_wait", "#39c5cf"], ["checkpoint", "#6cb6ff"], ["restart", "var(--p3)"], ["stalled", "var(--p1)"],
  ];

  GS.pages.job = {
    mount(root, [job, rank]) {
      root.innerHTML = `<h1>Job ${esc(job)}${rank !== undefined ? ` · rank ${esc(rank)}` : ""}</h1>
        <div class="cards" id="jb-cards"></div><h2>GPU time</h2><div id="jb-hours"></div><h2>Goodput (step records)</h2><div id="jb-good"></div>
        <h2>Per-rank curves</h2><div id="jb-charts"></div>
        <h2>Checkpoints</h2><div id="jb-ckpt"></div><h2>Alerts</h2><div id="jb-alerts"></div>
        <h2>Ranks</h2><div id="jb-ranks"></div>`;
      GS.chartBoxes(root.querySelector("#jb-charts"), ["loss", "grad_norm", "step_seconds"]);
    },
    async update(root, [job, rank]) {
      const { start, end } = GS.window();
      const d = await GS.api("/api/v1/ui/job", { job, start, end, points: 300 });
      // a rank whose straggler alert resolved is no straggler now: named apart, not marked
      const strags = d.stragglers.filter((s) => s.firing !== false).map((s) => String(s.rank));
      const earlier = d.stragglers.filter((s) => s.firing === false && !strags.includes(String(s.rank)));
      const focus = rank !== undefined ? String(rank) : null;
      // every firing slow_placement: the ranks' group and each GPU slower than its speed group
      const placements = d.slow_placements || [];
      const slow = [...new Set(placements.flatMap((p) => p.ranks.map(String)))];
      const pct = (share) => (share === null || share === undefined ? "–" : fmt(100 * share));
      const cost = (p) => `${pct(p.lost_share)} % of its GPU time, ${GS.perHour(p.cost_per_hour)} (<a href="#/alert/${esc(p.id)}">${esc(p.id)}</a>)`;
      const rankList = (rs) => (rs.length ? `rank${rs.length > 1 ? "s" : ""} ${rs.map((r) => `<a href="#/job/${encodeURIComponent(job)}/${r}">${r}</a>`).join(", ")}` : "no rank placed");
      const placementCard = (p) =>
        p.kind === "gpu"
          ? `<div class="card" title="${esc(p.summary)}">placement<b class="jb-placement-gpu" data-node="${esc(p.node)}" data-gpu="${esc(p.gpu)}" data-ranks="${esc(p.ranks.join(","))}">${sev(p.severity)} <a href="#/gpu/${encodeURIComponent(p.node)}/${encodeURIComponent(p.gpu)}">${esc(p.node)} GPU ${esc(p.gpu)}</a> ${pct(p.lag_share)} % slower than its speed group</b><span class="muted">${rankList(p.ranks)} on it; since it started (its part or its placement, not a live fault): the job loses ${cost(p)}</span></div>`
          : `<div class="card" title="${esc(p.summary)}">placement<b id="jb-placement" data-ranks="${esc(p.ranks.join(","))}">${sev(p.severity)} ranks ${esc(p.ranks.join(", "))} slower</b><span class="muted">the job's pace since it started, not a live fault: ${cost(p)}</span></div>`;
      // a GPU slow since it started past what parts differ by: its P2's own figures, named apart
      const faultyCard = (f) =>
        `<div class="card" title="${esc(f.summary)}">faulty GPU<b class="jb-faulty-gpu" data-node="${esc(f.node)}" data-gpu="${esc(f.gpu)}" data-ranks="${esc(f.ranks.join(","))}" data-alert="${esc(f.id)}">${sev(f.severity)} <a href="#/gpu/${encodeURIComponent(f.node)}/${encodeURIComponent(f.gpu)}">${esc(f.node)} GPU ${esc(f.gpu)}</a> slow since it started</b><span class="muted">${pct(f.lag_share)} % behind its speed group: a faulty part, not a slowdown; ${rankList(f.ranks)} on it; the job loses ${cost(f)}</span></div>`;
      // the job's ranks are where it runs, whether or not they reported a step in this range
      const placed = Object.keys(d.placement).length;
      const lost = d.alerts.filter((a) => a.rule === "rank_lost" && !a.resolved_at).map((a) => String(a.entity.rank));
      root.querySelector("#jb-hours").innerHTML = GS.hours(d.productivity, "jb-hoursbar");
      root.querySelector("#jb-cards").innerHTML = `<div class="card">status<b id="jb-status" data-status="${esc(d.status)}"><span class="jst ${esc(d.status)}">${esc(d.status)}</span></b></div>
        <div class="card">last step<b>${d.last_step ?? "–"}</b></div>
        <div class="card">ranks<b id="jb-nranks">${Math.max(placed, d.ranks.length)}</b>${d.ranks.length < placed ? `<span class="muted" id="jb-stepping">${d.ranks.length} reporting steps in this range</span>` : ""}</div>
        <div class="card">straggler<b id="jb-strag">${strags.length ? strags.map((r) => `rank <a href="#/job/${encodeURIComponent(job)}/${r}">${r}</a>`).join(", ") : "none"}</b><span class="muted">${d.stragglers.filter((s) => s.firing !== false).map((s) => esc(s.source)).join(", ")}</span>${earlier.length ? `<span class="muted" id="jb-strag-earlier">earlier: ${earlier.map((s) => `rank <a href="#/job/${encodeURIComponent(job)}/${s.rank}">${s.rank}</a> (${esc(s.source)}, resolved)`).join(", ")}</span>` : ""}</div>
        ${(d.faulty_gpus || []).map(faultyCard).join("")}
        ${placements.map(placementCard).join("")}
        <div class="card">checkpoints<b>${d.checkpoints.filter((c) => c.completed).length}</b><span class="muted">${d.checkpoints.filter((c) => c.failed).length} failed</span></div>
        <div class="card">lifecycle<b style="font-size:12px">${d.lifecycle.slice(-3).map((e) => `${esc(e.kind)} ${GS.ago(e.ts)} ago`).join("<br>") || "–"}</b></div>`;
      const g = d.goodput;
      if (g && g.elapsed > 0) {
        root.querySelector("#jb-good").innerHTML = `<div class="bar" id="jb-goodbar">${GOODPUT.map(([k, c]) => `<span data-kind="${k}" style="width:${((100 * (g[k] || 0)) / g.elapsed).toFixed(2)}%;background:${c}" title="${k} ${fmt(g[k])} s"></span>`).join("")}</div>
          <div class="legend">${GOODPUT.map(([k, c]) => `<span><i style="background:${c}"></i>${k} ${((100 * (g[k] || 0)) / g.elapsed).toFixed(1)} % (${fmt(g[k])} s)</span>`).join("")}</div>`;
      } else root.querySelector("#jb-good").innerHTML = '<p class="muted">no steps in this range</p>';
      const ranks = d.ranks.map(String);
      const series = ranks.map((r, i) => {
        const slow = strags.includes(r);
        const hot = slow || r === focus;
        return { label: `rank ${r}${slow ? " (straggler)" : ""}`, stroke: hot ? (slow ? "#e5484d" : "#f5a524") : `hsla(${(i * 37) % 360} 45% 60% / 0.55)`, width: hot ? 3 : 1 };
      });
      for (const c of ["loss", "grad_norm", "step_seconds"]) {
        const data = [d.ts, ...ranks.map((r) => d.curves[c][r])];
        GS.chart(root.querySelector(`#c-${c}`), `${c} per rank`, data, series);
      }
      const span = Math.max(1, end - start);
      const marks = d.checkpoints
        .filter((c) => c.started || c.completed)
        .map((c) => {
          const t = c.started || c.completed;
          const cls = c.failed || c.verified === false ? "failed" : c.completed ? "" : "pending";
          return `<i class="${cls}" style="left:${((100 * (t - start)) / span).toFixed(2)}%" title="step ${c.step}: ${c.failed ? "failed " + esc(c.failed) : c.completed ? "saved by " + c.ranks_done + " ranks" : "in progress"}"></i>`;
        })
        .join("");
      // no empty box and header while nothing was saved: say so
      root.querySelector("#jb-ckpt").innerHTML = d.checkpoints.length
        ? `<div class="tl" id="jb-tl">${marks}</div>
        <table><tr><th>step</th><th>started</th><th>completed</th><th>ranks done</th><th>verified</th><th>failure</th></tr>${d.checkpoints
          .map((c) => `<tr><td>${c.step}</td><td>${GS.time(c.started)}</td><td>${GS.time(c.completed)}</td><td>${c.ranks_done}</td><td>${c.verified === undefined ? "–" : c.verified ? "ok" : "FAILED"}</td><td>${esc(c.failed || "")}</td></tr>`)
          .join("")}</table>`
        : '<p class="muted" id="jb-no-ckpt">no checkpoint started in this range</p>';
      root.querySelector("#jb-alerts").innerHTML = GS.alertRows(d.alerts);
      root.querySelector("#jb-ranks").innerHTML = `<table><tr><th>rank</th><th>node</th><th>GPU</th></tr>${Object.entries(d.placement)
        .map(([r, p]) => `<tr class="${lost.includes(r) ? "lost" : strags.includes(r) ? "straggler" : slow.includes(r) ? "slowgroup" : ""}" data-rank="${r}"><td>${r}${lost.includes(r) ? " lost (silent)" : ""}${strags.includes(r) ? " straggler" : ""}${slow.includes(r) ? ' <span class="muted">slow placement</span>' : ""}</td><td><a href="#/node/${encodeURIComponent(p.node)}">${esc(p.node)}</a></td><td>${p.gpu ? `<a href="#/gpu/${encodeURIComponent(p.node)}/${encodeURIComponent(p.gpu)}">GPU ${esc(p.gpu)}</a>` : "CPU"}</td></tr>`)
        .join("")}</table>`;
    },
  };

  GS.pages.services = {
    mount(root) {
      root.innerHTML = `<h1>Services</h1><div id="s-list"></div>`;
    },
    async update(root) {
      const d = await GS.api("/api/v1/ui/services");
      root.querySelector("#s-list").innerHTML = d.services.length
        ? `<table><tr><th>service</th><th>model</th><th>version</th><th>nodes</th><th>req/s</th><th>errors/s</th><th>p95 latency s</th><th>TTFT p95 s</th><th>queue</th><th>KV cache</th><th>alerts</th></tr>${d.services
            .map((s) => `<tr data-service="${esc(s.service)}"><td><a href="#/service/${encodeURIComponent(s.service)}">${esc(s.service)}</a></td><td>${esc(s.model)}</td><td class="version">${esc(s.serving.version || "–")}</td><td>${s.nodes.map((n) => `<a href="#/node/${encodeURIComponent(n)}">${esc(n)}</a>`).join(" ")}</td><td>${fmt(s.values.inference_requests_per_second)}</td><td>${fmt(s.values.inference_errors_per_second)}</td><td>${fmt(s.values.inference_latency_p95_seconds)}</td><td>${fmt(s.values.inference_ttft_p95_seconds)}</td><td>${fmt(s.values.inference_queue_depth)}</td><td>${fmt(100 * (s.values.inference_kv_cache_usage_ratio ?? NaN))} %</td><td>${s.alerts ? sev(s.worst) + " " + s.alerts : "–"}</td></tr>`)
            .join("")}</table>`
        : '<p class="muted">no inference service has reported</p>';
    },
  };

  // the version serving now (the latest promotion's, which version_regression blames), with when
  // and how much traffic, and what the service's reports name when that is something else
  function versionCard(sv) {
    const when = sv.since ? `promoted ${GS.time(sv.since)}${sv.traffic_share !== null && sv.traffic_share < 1 ? ` · ${fmt(100 * sv.traffic_share)} % of traffic` : ""}` : "from the service's reports";
    const other = sv.reported.length && !(sv.reported.length === 1 && sv.reported[0] === sv.version)
      ? `<span class="muted" id="sv-reported">reports name ${esc(sv.reported.join(", "))}</span>` : "";
    return `<div class="card">version serving<b id="sv-version">${esc(sv.version || "–")}</b><span class="muted">${esc(when)}</span>${other}</div>`;
  }

  GS.pages.service = {
    mount(root, [svc]) {
      root.innerHTML = `<h1>Service ${esc(svc)}</h1><div class="cards" id="sv-cards"></div><div id="sv-charts"></div>
        <h2>Version timeline</h2><div id="sv-versions"></div><h2>Drift scores</h2><div id="sv-drift"></div><h2>Alerts</h2><div id="sv-alerts"></div>`;
      GS.chartBoxes(root.querySelector("#sv-charts"), ["latency", "ttft", "queue", "errors", "kv"]);
    },
    async update(root, [svc]) {
      const d = await GS.api("/api/v1/ui/service", { service: svc });
      const v = d.values;
      root.querySelector("#sv-cards").innerHTML = `<div class="card">model<b>${esc(d.model)}</b></div>${versionCard(d.serving)}
        <div class="card">req/s<b>${fmt(v.inference_requests_per_second)}</b></div><div class="card">p95 latency<b>${fmt(v.inference_latency_p95_seconds)} s</b></div>
        <div class="card">nodes<b>${d.nodes.map((n) => `<a href="#/node/${encodeURIComponent(n)}">${esc(n)}</a>`).join(" ")}</b></div>`;
      const lab = { service: svc };
      const many = (ms) => Promise.all(ms.map((m) => GS.series(m, lab))).then(GS.align);
      const [lat, ttft, queue, errs, kv] = await Promise.all([
        many(["inference_latency_p50_seconds", "inference_latency_p95_seconds", "inference_latency_p99_seconds"]),
        many(["inference_ttft_p95_seconds", "inference_itl_p95_seconds"]),
        many(["inference_queue_depth", "inference_running_requests"]),
        many(["inference_requests_per_second", "inference_errors_per_second"]),
        // a percentage, as on the Services page (the metric is a 0-1 ratio)
        GS.series("inference_kv_cache_usage_ratio", lab).then((p) => GS.align([p.map(([t, r]) => [t, r === null ? null : 100 * r])])),
      ]);
      GS.chart(root.querySelector("#c-latency"), "latency s", lat, [{ label: "p50" }, { label: "p95" }, { label: "p99" }]);
      GS.chart(root.querySelector("#c-ttft"), "time to first token / inter-token s", ttft, [{ label: "TTFT p95" }, { label: "ITL p95" }]);
      GS.chart(root.querySelector("#c-queue"), "queue", queue, [{ label: "waiting" }, { label: "running" }]);
      GS.chart(root.querySelector("#c-errors"), "requests and errors /s", errs, [{ label: "requests" }, { label: "errors", stroke: "#e5484d" }]);
      GS.chart(root.querySelector("#c-kv"), "KV cache used %", kv, [{ label: "used %" }], { y: [0, 100] });
      root.querySelector("#sv-versions").innerHTML = d.versions_timeline.length
        ? `<table><tr><th>time</th><th>event</th><th>version</th></tr>${d.versions_timeline.map((e) => `<tr><td>${GS.time(e.ts)}</td><td>${esc(e.kind)}</td><td>${esc(e.data.version || e.labels.version || "")}</td></tr>`).join("")}</table>`
        : `<p class="muted">no version registered or promoted in 30 days; serving ${esc(d.serving.version || "–")}</p>`;
      root.querySelector("#sv-drift").innerHTML = d.drift.length
        ? `<table><tr><th>rule</th><th>score</th><th>since</th><th>state</th></tr>${d.drift.map((x) => `<tr><td><a href="#/alert/${esc(x.id)}">${esc(x.rule)}</a></td><td>${fmt(x.score)}</td><td>${GS.time(x.started_at)}</td><td>${x.firing ? "firing" : "resolved"}</td></tr>`).join("")}</table>`
        : '<p class="muted">no drift score reported for this service (drift detectors have raised nothing)</p>';
      root.querySelector("#sv-alerts").innerHTML = GS.alertRows(d.alerts);
    },
  };

  // "7 days", "24 hours", "15 minutes": the range picker's span as the report's title says it
  function spanText(seconds) {
    const unit = (n, word) => `${Number(n.toFixed(1))} ${word}${n === 1 ? "" : "s"}`;
    if (seconds >= 2 * 86400) return unit(seconds / 86400, "day");
    if (seconds >= 3600) return unit(seconds / 3600, "hour");
    return unit(seconds / 60, "minute");
  }

  GS.pages.reports = {
    mount(root) {
      root.innerHTML = `<h1 id="r-title">Reports</h1><p class="muted" id="r-span"></p><div class="cards" id="r-cards"></div>
        <div class="charts"><div class="chart" id="r-waste" data-chart="waste"></div><div class="chart" id="c-trend" data-chart="trend"></div></div>
        <h2>Failing-GPU candidates</h2><div id="r-fail"></div><h2>Utilization by node</h2><div id="r-nodes"></div>
        <h2>Scheduler · queue wait and demand vs capacity per partition</h2><div id="r-sched"></div><div class="charts" id="r-sched-charts"></div>`;
    },
    async update(root) {
      const d = await GS.api("/api/v1/ui/reports", { range: GS.range() });
      root.querySelector("#r-title").textContent = `Reports · last ${spanText(d.range_seconds)}`;
      root.querySelector("#r-span").textContent = `${GS.time(d.start)} → ${GS.time(d.end)}`;
      const ia = d.idle_allocated, uc = d.unused_capacity;
      root.querySelector("#r-cards").innerHTML = `<div class="card">idle allocated GPU-hours<b id="r-idle-hours">${fmt(ia.gpu_hours, 2)}</b><span class="muted">$${fmt(ia.cost, 2)} at $${fmt(d.price_per_gpu_hour, 2)}/GPU-h</span></div>
        <div class="card">unused capacity<b>${fmt(uc.gpu_hours, 2)} GPU-h</b><span class="muted">$${fmt(uc.cost, 2)} · mean util ${fmt(uc.mean_utilization_percent)} % over ${uc.gpus} GPUs</span></div>
        <div class="card">idle by job<b style="font-size:12px">${Object.entries(ia.by_job).map(([j, h]) => `${jobLink(j)} ${fmt(h, 2)} h`).join("<br>") || "none"}</b></div>`;
      const w = d.waste;
      const rank = (title, id, rows, key, link) => `<h3>${title}</h3>${rows.length ? `<table id="${id}"><tr><th>${key}</th><th>wasted GPU-h</th><th>cost</th></tr>${rows.map((r) => `<tr data-${key}="${esc(r[key])}"><td>${link(r[key])}</td><td class="num">${fmt(r.gpu_hours, 2)}</td><td class="num">$${fmt(r.dollars, 2)}</td></tr>`).join("")}</table>` : '<p class="muted">none</p>'}`;
      root.querySelector("#r-waste").innerHTML = `<div class="title">wasted GPU time · <b id="r-waste-total">${fmt(w.total.gpu_hours, 2)} GPU-h · $${fmt(w.total.dollars, 2)}</b></div>
        ${rank("by cause", "r-by-cause", w.by_cause, "cause", (c) => `${esc(c.replace(/_/g, " "))}`)}
        ${rank("by team", "r-by-team", w.by_team.map((r) => ({ ...r, team: r.group })), "team", (t) => esc(t))}
        ${rank("by job", "r-by-job", w.by_job.map((r) => ({ ...r, job: r.group })), "job", jobLink)}`;
      const step = { 86400: "daily", 3600: "hourly" }[d.trend_bucket_seconds] || "5-minute";
      GS.chart(root.querySelector("#c-trend"), `fleet GPU utilization %, ${step} mean`, [d.trend.map((p) => p[0]), d.trend.map((p) => p[1])], [{ label: "mean utilization %", points: { show: true, size: 6 } }], { x: [d.start, d.end], y: [0, 100] });
      root.querySelector("#r-fail").innerHTML = d.failing_candidates.length
        ? `<table><tr><th>GPU</th><th>score</th><th>alerts by rule</th><th>firing</th></tr>${d.failing_candidates.map((c) => `<tr data-candidate="${esc(c.node)}/${esc(c.gpu)}"><td><a href="#/gpu/${encodeURIComponent(c.node)}/${encodeURIComponent(c.gpu)}">${esc(c.node)} GPU ${esc(c.gpu)}</a></td><td>${c.score}</td><td>${Object.entries(c.rules).map(([r, n]) => `${esc(r)}×${n}`).join(", ")}</td><td>${c.firing}</td></tr>`).join("")}</table>`
        : '<p class="muted">no GPU raised a hardware alert</p>';
      root.querySelector("#r-nodes").innerHTML = `<table><tr><th>node</th><th>mean util %</th><th>max</th></tr>${d.by_node.map((n) => `<tr><td><a href="#/node/${encodeURIComponent(n.node)}">${esc(n.node)}</a></td><td>${fmt(n.mean)}</td><td>${fmt(n.max)}</td></tr>`).join("")}</table>`;
      const sched = d.scheduler || [];
      root.querySelector("#r-sched").innerHTML = sched.length
        ? `<table id="r-sched-table"><tr><th>partition</th><th>queue wait mean</th><th>max</th><th>demand GPUs mean</th><th>peak</th><th>capacity GPUs mean</th><th>low</th></tr>${sched.map((p) => `<tr data-partition="${esc(p.partition)}"><td>${esc(p.partition)}</td><td class="num">${fmt(p.queue_wait_seconds.mean)} s</td><td class="num">${fmt(p.queue_wait_seconds.max)} s</td><td class="num">${fmt(p.demand_gpus.mean)}</td><td class="num">${fmt(p.demand_gpus.max)}</td><td class="num">${fmt(p.capacity_gpus.mean)}</td><td class="num">${fmt(p.capacity_gpus.min)}</td></tr>`).join("")}</table>`
        : '<p class="muted">no scheduler data: run an agent with <code>--slurm</code> to keep queue wait and demand vs capacity</p>';
      const boxes = root.querySelector("#r-sched-charts");
      boxes.innerHTML = sched.map((p, i) => `<div class="chart" id="c-sched-${i}" data-chart="sched-${esc(p.partition)}"></div>`).join("");
      sched.forEach((p, i) => {
        const h = p.history;
        GS.chart(root.querySelector(`#c-sched-${i}`), `partition ${p.partition}: GPUs asked for vs GPUs available`, [h.ts, h.demand_gpus, h.capacity_gpus], [{ label: "demand (pending + running)" }, { label: "capacity (total − unavailable)" }], { x: [d.start, d.end] });
      });
    },
  };

  const LINEAGE_KINDS = ["checkpoint_completed", "checkpoint_verified", "model_version_registered", "model_version_promoted"];

  // "ranks 0–15", or the ranks themselves when they are not a run from 0
  function rankText(ranks) {
    const sorted = [...new Set(ranks.map(Number))].sort((a, b) => a - b);
    if (sorted.length === 1) return `rank ${sorted[0]}`;
    const run = sorted[0] === 0 && sorted[sorted.length - 1] === sorted.length - 1;
    if (run) return `ranks 0–${sorted.length - 1}`;
    return `ranks ${sorted.slice(0, 8).join(", ")}${sorted.length > 8 ? ` … (${sorted.length})` : ""}`;
  }

  // one row per checkpoint of a job (kind, job, step), not one per rank that reported it;
  // events come newest first, so a row keeps its newest report's time and detail
  function byCheckpoint(events) {
    const out = [];
    const rows = new Map();
    for (const e of events) {
      const rank = e.labels.rank;
      if (rank === undefined || !e.kind.startsWith("checkpoint_")) {
        out.push(e);
        continue;
      }
      const key = [e.kind, e.labels.job, e.data.step].join("\u0000");
      const row = rows.get(key);
      if (row) {
        row.ranks.push(rank);
        row.data = { ...e.data, ...row.data }; // what only one rank reports (rank 0's manifest) too
        continue;
      }
      const { rank: _r, node: _n, gpu: _g, ...labels } = e.labels;
      const first = { ...e, labels, ranks: [rank], own: e.labels };
      rows.set(key, first);
      out.push(first);
    }
    // a checkpoint only one rank reported keeps its rank, node and GPU links
    return out.map((e) => (e.ranks && e.ranks.length === 1 ? { ...e, labels: e.own, ranks: undefined } : e));
  }
  // a lineage event's detail in words: the version, where it came from and where it serves
  // (nested source and metrics read as JSON before)
  function lineageDetail(e) {
    const d = e.data || {};
    const src = d.source && d.source.job ? ` from ${d.source.job} step ${d.source.step}` : "";
    const metrics = Object.entries(d.metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    if (e.kind === "model_version_promoted") {
      const share = typeof d.traffic_share === "number" && d.traffic_share < 1 ? ` (${fmt(100 * d.traffic_share)} % of traffic)` : "";
      return `${d.model} ${d.version} → ${d.service}${share}${src}`;
    }
    if (e.kind === "model_version_registered") return `${d.model} ${d.version}${src}${metrics ? ` · ${metrics}` : ""}`;
    if (e.kind === "checkpoint_completed") {
      const parts = [`step ${d.step}`];
      if (typeof d.bytes === "number") parts.push(`${fmt(d.bytes)}B`);
      if (typeof d.seconds === "number") parts.push(`${fmt(d.seconds)} s`);
      if (d.manifest_hash) parts.push(`manifest ${String(d.manifest_hash).slice(0, 12)}`);
      return parts.join(" · ");
    }
    if (e.kind === "checkpoint_verified") return `step ${d.step} · ${d.ok === false ? "FAILED verification" : "verified"}`;
    return GS.detail(d);
  }

  GS.pages.lineage = {
    mount(root) {
      root.innerHTML = `<h1>Lineage · run → checkpoint → version → deployment</h1><div id="l-note"></div><div id="l-body"></div>`;
    },
    async update(root) {
      const caps = await GS.api("/api/v1/ui/capabilities");
      if (caps.lineage) {
        const d = await GS.api("/api/v1/lineage/deployments");
        const seen = new Map();
        for (const dep of d.deployments) seen.set(`${dep.model}\u0000${dep.version}`, dep);
        const versions = await Promise.all([...seen.values()].map((dep) =>
          GS.api(`/api/v1/lineage/versions/${encodeURIComponent(dep.model)}/${encodeURIComponent(dep.version)}`)));
        root.querySelector("#l-note").innerHTML = versions.length
          ? `<table id="l-graph"><tr><th>training run</th><th>checkpoint</th><th>model version</th><th>deployments</th></tr>${versions.map((v) => `<tr data-version="${esc(v.model)}:${esc(v.version)}"><td>${GS.entityLinks({ job: v.run.job })}</td><td>step ${esc(v.checkpoint.step)} · ${esc(String(v.checkpoint.manifest_hash || "").slice(0, 12))}</td><td><b>${esc(v.model)} ${esc(v.version)}</b> ${v.aliases.map((a) => `<span class="badge">@${esc(a)}</span>`).join(" ")}</td><td>${v.deployments.map((dep) => `${GS.entityLinks({ service: dep.service })} since ${GS.time(dep.promoted_at)} (${fmt(100 * dep.traffic_share)} %)`).join("<br>")}</td></tr>`).join("")}</table>`
          : '<p id="l-empty" class="muted">no model version has been deployed yet: register one with <code>gpuscope lineage register</code> and promote it with <code>gpuscope lineage promote</code></p>';
      } else {
        root.querySelector("#l-note").innerHTML = `<p id="l-missing">This hub has no lineage API (<code>/api/v1/lineage</code>), so the run → checkpoint → version → deployment graph cannot be drawn.</p>`;
      }
      const { start, end } = GS.window();
      const lists = await Promise.all(LINEAGE_KINDS.map((kind) => GS.api("/api/v1/events", { kind, start, end, limit: 200 })));
      const events = byCheckpoint(lists.flatMap((l) => l.events).sort((a, b) => b.ts - a.ts)).slice(0, 200);
      root.querySelector("#l-body").innerHTML = events.length
        ? `<table id="l-events"><tr><th>time</th><th>event</th><th>where</th><th>detail</th></tr>${events.map((e) => `<tr><td>${GS.time(e.ts)}</td><td>${esc(e.kind)}</td><td>${GS.entityLinks(e.labels)}${e.ranks ? ` ${esc(rankText(e.ranks))}` : ""}</td><td>${esc(lineageDetail(e).slice(0, 160))}</td></tr>`).join("")}</table>`
        : '<p class="muted">no checkpoint or model-version event in this range</p>';
    },
  };
})();
