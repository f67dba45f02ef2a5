"""Driving a load run: the simulated fleet in real time, sender processes, hub resources, faults.

Before the run the main process pre-encodes the fleet's traffic (:mod:`gpuscope.loadgen.playback`:
a ring of simulated ticks as binary frames, the jobs that faults touch simulated live); each second
of wall time it patches one tick's frames and hands them to the sender processes (each owns a
fixed set of agents' streams). Beside it, one
thread samples the hubs' CPU and memory (psutil, by PID) and one polls ``/api/v1/alerts`` on every
hub, timing the detection of each injected fault from its onset.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import psutil

from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.sender import Item, SenderStats, worker_main
from gpuscope.loadgen.traffic import ExpectedAlert, FleetShape, expected_alerts, scenario_doc, shard_of
from gpuscope.rules import HUB_OVERLOADED


@dataclass(slots=True)
class LoadOptions:
    hubs: list[str]
    shape: FleetShape = field(default_factory=FleetShape)
    duration: float = 600.0
    workers: int = 2
    connections: int = 64  # per hub per sender process
    token: str | None = None
    hub_pids: list[int] = field(default_factory=list)
    faults: list[dict[str, Any]] | None = None  # None: gpuscope.loadgen.traffic.default_faults
    poll_interval: float = 1.0
    grace: float = 60.0  # after the last tick, for retries to get through
    detect_grace: float = 20.0  # after the last tick, for late detections
    timeout: float = 30.0
    start_delay: float = 3.0
    max_backlog: int = 120  # batches per stream waiting for the hub (a bounded agent spool)
    ring: int = 30  # simulated ticks pre-encoded and replayed (30 s: 20 steps of 1.5 s)
    # simulated ticks before the ring (the jobs' start-up), not replayed; a multiple of the simulated
    # services' 30-s and 60-s quality windows, so those fall on the same ticks as without a ring
    warmup: int = 60
    urgent: bool = True  # news (a hard fault's events) ahead of the spool, marked urgent


class ResourceMonitor(threading.Thread):
    """Samples CPU (percent of one core) and RSS of the given processes once a second."""

    def __init__(self, pids: list[int], interval: float = 1.0) -> None:
        super().__init__(name="loadgen-resources", daemon=True)
        self.procs = [psutil.Process(p) for p in pids]
        self.interval = interval
        self.cpu: list[float] = []  # summed over the processes, per sample
        self.rss: list[int] = []
        self.stop_event = threading.Event()
        self._cpu0 = self._cpu_seconds()
        self._t0 = time.monotonic()
        self.cpu_seconds = 0.0
        self.wall = 0.0

    def _cpu_seconds(self) -> float:
        total = 0.0
        for p in self.procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def run(self) -> None:
        for p in self.procs:
            p.cpu_percent(None)
        while not self.stop_event.wait(self.interval):
            cpu, rss = 0.0, 0
            for p in self.procs:
                try:
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            self.cpu.append(cpu)
            self.rss.append(rss)

    def stop(self) -> None:
        self.cpu_seconds = self._cpu_seconds() - self._cpu0
        self.wall = time.monotonic() - self._t0
        self.stop_event.set()
        self.join(timeout=5)

    @property
    def mean_cores(self) -> float:
        return self.cpu_seconds / self.wall if self.wall else 0.0


@dataclass(slots=True)
class Detection:
    expected: ExpectedAlert
    alert_started: float | None = None  # the hub's started_at of the matching alert
    seen: float | None = None  # when this watcher first read it from the API

    @property
    def ttd(self) -> float | None:
        """Fault onset to the alert's start, seconds (what ``sim-eval`` scores)."""
        return None if self.alert_started is None else self.alert_started - self.expected.at_wall

    @property
    def ttd_seen(self) -> float | None:
        """Fault onset to the alert being readable through the API."""
        return None if self.seen is None else self.seen - self.expected.at_wall


class AlertWatcher(threading.Thread):
    """Polls every hub's alerts; records when each expected alert appears, and all others."""

    def __init__(
        self, hubs: list[str], expected: list[ExpectedAlert], headers: dict[str, str], interval: float
    ) -> None:
        super().__init__(name="loadgen-alerts", daemon=True)
        self.hubs = hubs
        self.detections = [Detection(e) for e in expected]
        self.alerts: dict[tuple[str, Any], dict[str, Any]] = {}
        self.poll_errors = 0
        self.interval = interval
        self.headers = headers
        self.stop_event = threading.Event()
        self._lock = threading.Lock()

    def poll(self, client: httpx.Client) -> None:
        for hub in self.hubs:
            try:
                resp = client.get(f"{hub}/api/v1/alerts", params={"state": "all", "limit": 100_000})
                rows = resp.json()["alerts"] if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError):
                rows = None
            if rows is None:
                self.poll_errors += 1
                continue
            now = time.time()
            with self._lock:
                for alert in rows:
                    self.alerts[(alert.get("rule"), alert.get("id"))] = alert
                    for d in self.detections:
                        if d.seen is None and d.expected.matches(alert):
                            started = alert.get("started_at")
                            if isinstance(started, int | float) and started >= d.expected.at_wall - 1:
                                d.seen, d.alert_started = now, float(started)

    def all_detected(self) -> bool:
        with self._lock:
            return all(d.seen is not None for d in self.detections)

    def run(self) -> None:
        with httpx.Client(timeout=10, headers=self.headers) as client:
            while not self.stop_event.is_set():
                self.poll(client)
                self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=15)


_SIMULATED_NODE = re.compile(r"node-(\d{1,9})")


def _job_of(node: str, per_job: int) -> str | None:
    """The training job the load generator places on ``node``; None for a node it does not play
    (a hub under test may hold other senders, named as their owners chose)."""
    match = _SIMULATED_NODE.fullmatch(node)
    return None if match is None else f"job-{int(match.group(1)) // per_job}"


@dataclass(slots=True)
class LoadReport:
    """Everything one run measured; :meth:`rows` is the table the benchmark prints."""

    options: LoadOptions
    t0: float
    stats: SenderStats
    detections: list[Detection]
    hub_cores: float
    hub_cpu_seconds: float
    hub_cpu_p95: float
    hub_rss_peak: int
    hub_rss_end: int
    generator_cores: float
    dispatch_late_max: float  # how far behind real time the generator fell, seconds
    health: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    poll_errors: int
    machine_cores_busy: float  # every process on the machine, mean over the run
    load_average: tuple[float, float]  # one-minute load average at the start and at the end

    @property
    def duration(self) -> float:
        return self.options.duration

    @property
    def samples_per_second(self) -> float:
        return self.stats.samples_acked / self.duration

    def per_second_rates(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Samples acknowledged in each whole second of the run, warm-up and tail trimmed."""
        lo, hi = int(self.t0) + 5, int(self.t0 + self.duration) - 2
        secs = range(lo, hi) if hi > lo else range(int(self.t0), int(self.t0 + self.duration) + 1)
        return np.array([self.stats.acked_per_second.get(s, 0) for s in secs], dtype=np.float64)

    @property
    def samples_per_hub_cpu_second(self) -> float:
        """Samples acknowledged per second of hub CPU: the per-core rate that sizing scales from."""
        return self.stats.samples_acked / self.hub_cpu_seconds if self.hub_cpu_seconds else 0.0

    @property
    def drops(self) -> int:
        st = self.stats
        return st.batches_unacked + st.batches_refused + st.batches_overflowed

    def stored(self) -> dict[str, int] | None:
        """Rows the single DuckDB hub holds (``None`` when that is not what runs)."""
        if len(self.health) != 1:
            return None
        store = self.health[0].get("store") or {}
        rows = store.get("rows") or {}
        if "raw_rows" not in store:
            return None
        return {
            "rows": int(store["raw_rows"]),
            "events": int(rows.get("events", -1)),
            "training": int(rows.get("training", -1)),
        }

    def disk_bytes(self) -> int | None:
        total = [h.get("store", {}).get("disk_bytes") for h in self.health]
        return sum(int(b) for b in total if isinstance(b, int)) if any(total) else None

    def overload_alerts(self) -> list[dict[str, Any]]:
        """The hubs' own ``hub_overloaded`` alerts that the run's traffic confirms: the hub says it
        fell behind and refused requests, and the senders were refused (HTTP 503) and sent again.

        Such an alert is the hub under test reporting on the machine the run gave it (CPU taken by
        other processes), not a verdict on the fleet: it is reported on its own row, not counted
        with the fleet's false alarms. One whose refusals the senders never met stays unexplained.
        """
        if self.stats.http_errors.get(503, 0) <= 0:
            return []
        return [
            a
            for a in self.alerts
            if a.get("rule") == HUB_OVERLOADED and int((a.get("details") or {}).get("shed_requests") or 0) > 0
        ]

    def unexplained_alerts(self) -> list[dict[str, Any]]:
        """P1/P2 alerts away from every injected fault's node and job (false alarms under load),
        but for the hub's own overload that the senders met (:meth:`overload_alerts`)."""
        scenario_faults = [d.expected.fault for d in self.detections]
        nodes = {str(f.target["node"]) for f in scenario_faults if "node" in f.target}
        jobs = {str(f.target["job"]) for f in scenario_faults if "job" in f.target}
        per_job = self.options.shape.job_nodes
        jobs |= {job for n in nodes if (job := _job_of(n, per_job)) is not None}
        out = []
        confirmed = {id(a) for a in self.overload_alerts()}
        for a in self.alerts:
            entity = a.get("entity") or {}
            if a.get("severity") not in ("P1", "P2") or id(a) in confirmed:
                continue
            if entity.get("node") in nodes or entity.get("job") in jobs:
                continue
            node = entity.get("node")
            if node and _job_of(str(node), per_job) in jobs:
                continue
            out.append(a)
        return out

    def to_dict(self) -> dict[str, Any]:
        lat = np.asarray(self.stats.latencies) * 1000
        lags = np.asarray(self.stats.lags)
        rates = self.per_second_rates()
        shape = self.options.shape
        return {
            "nodes": shape.nodes,
            "gpus": shape.nodes * shape.gpus_per_node,
            "hubs": len(self.options.hubs),
            "duration_s": self.duration,
            "batches": {
                "offered": self.stats.batches_offered,
                "acknowledged": self.stats.batches_acked,
                "refused": self.stats.batches_refused,
                "unacknowledged": self.stats.batches_unacked,
                "overflowed": self.stats.batches_overflowed,
                "died_with_their_sender": self.stats.batches_died,
                "duplicates": self.stats.duplicates,
                "retries": self.stats.retries,
                "connect_errors": self.stats.connect_errors,
                "http_errors": self.stats.http_errors,
                "refusals": self.stats.refusal_messages,
            },
            "drops": self.drops,
            "samples_acknowledged": self.stats.samples_acked,
            "samples_offered": self.stats.samples_offered,
            "samples_per_second": self.samples_per_second,
            "samples_per_second_p5": float(np.percentile(rates, 5)) if rates.size else 0.0,
            "events_acknowledged": self.stats.events_acked,
            "training_acknowledged": self.stats.training_acked,
            "rows_acknowledged": self.stats.rows_acked,
            "latency_ms": _percentiles(lat),
            "ack_lag_s": _percentiles(lags),
            "hub_cores": self.hub_cores,
            "hub_cpu_seconds": self.hub_cpu_seconds,
            "hub_samples_per_cpu_second": self.samples_per_hub_cpu_second,
            "machine_cores": psutil.cpu_count(),
            "machine_cores_busy": self.machine_cores_busy,
            "load_average": self.load_average,
            "hub_cpu_percent_p95": self.hub_cpu_p95,
            "hub_rss_peak_bytes": self.hub_rss_peak,
            "hub_rss_end_bytes": self.hub_rss_end,
            "generator_cores": self.generator_cores,
            "dispatch_late_max_s": self.dispatch_late_max,
            "stored": self.stored(),
            "disk_bytes": self.disk_bytes(),
            "detections": [
                {
                    "kind": d.expected.fault.kind,
                    "rule": d.expected.rule,
                    "target": d.expected.fault.target,
                    "at": d.expected.fault.at,
                    "hard": d.expected.hard,
                    "ttd_s": d.ttd,
                    "ttd_seen_s": d.ttd_seen,
                }
                for d in self.detections
            ],
            "alerts_total": len(self.alerts),
            "unexplained_p1_p2": [
                {k: a.get(k) for k in ("rule", "entity", "started_at", "value", "details")}
                for a in self.unexplained_alerts()
            ],
            "hub_overloaded": [
                {
                    "entity": a.get("entity"),
                    "started_at": a.get("started_at"),
                    "shed_requests": (a.get("details") or {}).get("shed_requests"),
                    "episodes": (a.get("details") or {}).get("episodes"),
                }
                for a in self.overload_alerts()
            ],
            "alert_poll_errors": self.poll_errors,
        }

    def rows(self) -> list[list[str]]:
        """(figure, value, budget or note) rows for the benchmark's table."""
        d = self.to_dict()
        lat, lag = d["latency_ms"], d["ack_lag_s"]
        out = [
            [
                "fleet",
                f"{d['nodes']:,} nodes × {self.options.shape.gpus_per_node} GPUs, {d['hubs']} hub(s)",
                "",
            ],
            [
                "batches acknowledged / offered",
                f"{d['batches']['acknowledged']:,} / {d['batches']['offered']:,}",
                "",
            ],
            ["drops (refused + never acknowledged)", str(self.drops), "must be 0"],
            ["retries / duplicates", f"{self.stats.retries:,} / {self.stats.duplicates:,}", ""],
            ["samples/s acknowledged (mean)", f"{self.samples_per_second:,.0f}", ""],
            ["samples/s, 5th percentile second", f"{d['samples_per_second_p5']:,.0f}", ""],
            [
                "training records + events acknowledged",
                f"{self.stats.training_acked:,} + {self.stats.events_acked:,}",
                "",
            ],
            [
                "request latency p50 / p95 / p99 ms",
                f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f}",
                "",
            ],
            ["ack lag (due → acknowledged) p95 / max s", f"{lag['p95']:.2f} / {lag['max']:.2f}", ""],
            [
                "hub CPU, cores (mean / p95 sample)",
                f"{self.hub_cores:.2f} / {self.hub_cpu_p95 / 100:.2f}",
                "",
            ],
            [
                "hub samples per CPU-second",
                f"{self.samples_per_hub_cpu_second:,.0f}",
                f"{self.hub_cpu_seconds:,.0f} CPU-s; per-core rate for docs/scaling.md",
            ],
            [
                "hub RSS peak / end MiB",
                f"{self.hub_rss_peak / 2**20:,.0f} / {self.hub_rss_end / 2**20:,.0f}",
                "",
            ],
            ["generator CPU, cores", f"{self.generator_cores:.2f}", "competes with the hub here"],
            ["generator late max s", f"{self.dispatch_late_max:.2f}", ""],
            [
                "machine: cores busy (all processes) / load average",
                f"{self.machine_cores_busy:.2f} of {psutil.cpu_count()} / "
                f"{self.load_average[0]:.1f} → {self.load_average[1]:.1f}",
                "others' work competes on a shared machine",
            ],
        ]
        stored = d["stored"]
        if stored is not None:
            ok = (
                stored["rows"] == self.stats.rows_acked
                and stored["events"] == self.stats.events_acked
                and stored["training"] == self.stats.training_acked
            )
            out.append(
                [
                    "stored once (rows / events / training)",
                    f"{stored['rows']:,} / {stored['events']:,} / {stored['training']:,}",
                    "= acknowledged"
                    if ok
                    else f"acknowledged {self.stats.rows_acked:,} rows"
                    + (" (batches cut off at the end may be stored unacknowledged)" if self.drops else ""),
                ]
            )
        if d["disk_bytes"]:
            out.append(
                [
                    "store bytes/sample",
                    f"{d['disk_bytes'] / max(1, self.stats.samples_acked):.2f}",
                    "budget ≤ 0.8",
                ]
            )
        for det in self.detections:
            target = ",".join(f"{k}={v}" for k, v in det.expected.fault.target.items())
            budget = "hard: p50 ≤ 5 s, p95 ≤ 15 s" if det.expected.hard else "no §6 budget"
            value = (
                "not detected"
                if det.ttd is None
                else f"{det.ttd:.1f} s (API {det.ttd_seen:.1f} s)"
                if det.ttd_seen is not None
                else f"{det.ttd:.1f} s"
            )
            out.append([f"TTD {det.expected.fault.kind} → {det.expected.rule} ({target})", value, budget])
        if d["hub_overloaded"]:
            shed = sum(int(a["shed_requests"] or 0) for a in d["hub_overloaded"])
            met = self.stats.http_errors.get(503, 0)
            out.append(
                [
                    "hub_overloaded (the hub behind: its machine, not the fleet)",
                    f"{len(d['hub_overloaded'])} (shed {shed:,}; senders met {met:,} × 503)",
                    "a hub given its CPU: 0",
                ]
            )
        out.append(["unexplained P1/P2 alerts", str(len(d["unexplained_p1_p2"])), "healthy fleet: 0"])
        return out


def _percentiles(values: np.ndarray[Any, np.dtype[Any]]) -> dict[str, float]:
    if not values.size:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(values.max())}


def _health(hub: str, headers: dict[str, str]) -> dict[str, Any]:
    try:
        resp = httpx.get(f"{hub}/api/v1/health", headers=headers, timeout=60)
        body: dict[str, Any] = resp.json()
        return body
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)}


def run_load(opts: LoadOptions, say: Callable[[str], None] = lambda _: None) -> LoadReport:
    """Run the load for ``opts.duration`` seconds against ``opts.hubs``; blocks until done."""
    if not opts.hubs:
        raise ValueError("hubs: at least one hub URL is needed")
    if opts.workers < 1 or opts.duration < 1:
        raise ValueError("workers and duration must be at least 1")
    headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}
    playback = Playback(
        scenario_doc(opts.shape, opts.duration, opts.faults), opts.ring, opts.warmup, opts.urgent
    )
    scenario = playback.scenario
    ctx = mp.get_context("spawn")
    conns = []
    procs = []
    for _ in range(opts.workers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=worker_main,
            args=(child, opts.hubs, opts.token, opts.connections, opts.timeout, max(2, opts.max_backlog)),
            daemon=True,
            name="loadgen-sender",
        )
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    t0 = math.ceil(time.time()) + opts.start_delay
    watcher = AlertWatcher(opts.hubs, expected_alerts(scenario, t0), headers, opts.poll_interval)
    hub_monitor = ResourceMonitor(opts.hub_pids)
    gen_monitor = ResourceMonitor([mp.current_process().pid or 0, *[p.pid or 0 for p in procs]])
    load0 = os.getloadavg()[0]
    machine0 = _busy_seconds()
    wall0 = time.monotonic()
    hub_monitor.start()
    gen_monitor.start()
    watcher.start()
    late = 0.0
    next_report = t0 + 10
    deaths = sorted((t0 + at, sender) for sender, at in playback.deaths.items())
    try:
        for due, outgoing in playback.ticks(t0):
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            while deaths and deaths[0][0] <= due:
                _, dead = deaths.pop(0)
                conns[shard_of(dead, len(conns))].send(("kill", [dead]))
            buckets: list[list[Item]] = [[] for _ in conns]
            for o in outgoing:
                buckets[shard_of(o.sender, len(conns))].append(
                    (o.sender, o.body, o.rows, o.samples, o.events, o.training, o.urgent)
                )
            for conn, bucket in zip(conns, buckets, strict=True):
                conn.send(("tick", due, bucket))
            if due >= next_report:
                next_report += 10
                cpu = hub_monitor.cpu[-1] / 100 if hub_monitor.cpu else 0.0
                say(f"t={due - t0:.0f}s hub CPU {cpu:.2f} cores, generator late {late:.2f}s")
        stats = SenderStats()
        for conn in conns:
            conn.send(("stop", opts.grace))
        for conn in conns:
            stats.merge(conn.recv())
        end = t0 + opts.duration
        while not watcher.all_detected() and time.time() < end + opts.detect_grace:
            time.sleep(0.5)
    finally:
        watcher.stop()
        hub_monitor.stop()
        gen_monitor.stop()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    machine_busy = (_busy_seconds() - machine0) / (time.monotonic() - wall0)
    with httpx.Client(timeout=10, headers=headers) as client:
        watcher.poll(client)
    health = [_health(h, headers) for h in opts.hubs]
    return LoadReport(
        options=opts,
        t0=t0,
        stats=stats,
        detections=watcher.detections,
        hub_cores=hub_monitor.mean_cores,
        hub_cpu_seconds=hub_monitor.cpu_seconds,
        hub_cpu_p95=float(np.percentile(hub_monitor.cpu, 95)) if hub_monitor.cpu else 0.0,
        hub_rss_peak=max(hub_monitor.rss, default=0),
        hub_rss_end=hub_monitor.rss[-1] if hub_monitor.rss else 0,
        generator_cores=gen_monitor.mean_cores,
        dispatch_late_max=late,
        health=health,
        alerts=list(watcher.alerts.values()),
        poll_errors=watcher.poll_errors,
        machine_cores_busy=machine_busy,
        load_average=(load0, os.getloadavg()[0]),
    )


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))
