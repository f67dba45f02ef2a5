"""A fleet under load: 1,024 agents (8 GPUs each, full metric set, 1 Hz) plus training SDK traffic.

(a) one ``gpuscope hub`` process on the embedded DuckDB store; (b) two sharded hubs on
VictoriaMetrics (remote write) + PostgreSQL (cluster state, meta store), when those backends are
in this version; (c) three such hubs, one of them SIGKILLed halfway through the run, with every
notification sent to a webhook receiver here: drops, and notifications lost or sent twice. The
load generator (``gpuscope loadgen``) plays a simulated cluster in real time
over HTTP, one in-order stream per agent and SDK process, retrying until acknowledged, and injects
faults during the run (DESIGN §4 kinds) whose time to detect is read from ``/api/v1/alerts``.

Anchor, same run: VictoriaMetrics ingesting the same samples at the same pace (one request per
node per second, Prometheus text through its import API): the cores it needs for what the hub
does, beside the hub's cores.

``--py-spy FILE`` (setup (a)): py-spy (the ``bench`` extra) samples the hub process over the load,
every thread that is not idle into FILE and only the thread holding the interpreter lock into
``FILE.gil`` (collapsed stacks: where its one core of Python goes), and the hub process's CPU is
given by thread (named from py-spy's stacks) in cores and in ms a batch it took.

usage: python bench/bench_load.py [--duration 600] [--nodes 1024] [--only a|b|c] [--anchor-seconds 60]
       [--ingest-workers N] [--py-spy FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import psutil
import yaml

from bench_hub_cpu import thread_names
from common import (
    ROOT,
    Pacer,
    console,
    free_port,
    gpuscope_hub,
    print_table,
    prometheus_bodies,
    victoria_metrics,
    victoria_metrics_binary,
    wait_http,
)
from gpuscope.alert.labels import fingerprint
from gpuscope.alert.triagequeue import BUDGET_S
from gpuscope.loadgen import FleetShape, LoadOptions, LoadReport, run_load
from gpuscope.loadgen.run import ResourceMonitor
from gpuscope.model import Alert

sys.path.insert(0, str(ROOT / "tests"))
from alert.sink import Sink
from pgserver import PostgresServer, postgres_bin_dir

PEER_TOKEN = "bench-load-peer-token-0123456789"


def print_report(title: str, report: LoadReport, extra: list[list[str]] | None = None) -> None:
    print_table(title, ["figure", "value", "budget / note"], [*report.rows(), *(extra or [])])


def run_single(args: argparse.Namespace, shape: FleetShape) -> LoadReport:
    workers = args.ingest_workers
    extra = ["--ingest-workers", str(workers)] if workers else []
    with tempfile.TemporaryDirectory() as tmp, gpuscope_hub(Path(tmp) / "load.duckdb", extra) as (url, proc):
        # the workers are the hub's children (started before it answered): their CPU and RSS count
        # as the hub's; a worker restarted during the run is not counted
        children = [c.pid for c in psutil.Process(proc.pid).children()]
        how = f", {len(children)} ingest worker process(es)" if workers else ", ingest in the hub's process"
        console.print(f"(a) one hub on DuckDB at {url}{how}: {shape.nodes} agents for {args.duration:g} s")
        alone, fronts = ResourceMonitor([proc.pid]), ResourceMonitor(children)
        samplers, threads = [], None
        if args.py_spy is not None:
            threads = HubThreads(proc.pid, url)
            gil = args.py_spy.with_name(f"{args.py_spy.name}.gil")
            samplers = [
                py_spy(proc.pid, args.duration, args.py_spy, False),
                py_spy(proc.pid, args.duration, gil, True),
            ]
        alone.start()
        fronts.start()
        report = run_load(_options(args, shape, [url], [proc.pid, *children]), say=console.print)
        alone.stop()
        fronts.stop()
        if threads is not None:
            threads.stop()
        for sampler in samplers:
            sampler.wait()
    rows = [
        ["hub process alone, cores (mean)", f"{alone.mean_cores:.2f}", "store commit, detection, API"],
        ["ingest workers, cores (mean)", f"{fronts.mean_cores:.2f}", f"{len(children)} process(es)"],
    ]
    if threads is not None and args.py_spy is not None:
        rows += threads.rows(thread_names(args.py_spy))
    title = f"(a) one hub, DuckDB: {shape.nodes} nodes × {shape.gpus_per_node} GPUs at 1 Hz"
    if workers:
        title += f", {workers} ingest workers"
    print_report(title, report, rows if workers else None)
    return report


def py_spy(pid: int, seconds: float, output: Path, gil: bool) -> subprocess.Popen[bytes]:
    """py-spy sampling process ``pid`` for ``seconds`` into ``output`` (collapsed stacks), every
    thread that is not idle, or with ``gil`` only the one holding the interpreter lock."""
    binary = shutil.which("py-spy")
    if binary is None:
        raise SystemExit("--py-spy: py-spy is not installed (pip install -e '.[bench]')")
    argv = [binary, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw"]
    argv += ["--nonblocking", "--threads", "--rate", "100", "--output", str(output)]
    return subprocess.Popen([*argv, "--gil"] if gil else argv, stdout=subprocess.DEVNULL)


class HubThreads:
    """The hub process's CPU seconds by thread, and the batches it took, from now to :meth:`stop`."""

    def __init__(self, pid: int, url: str) -> None:
        self.proc, self.url = psutil.Process(pid), url
        self.start, self.wall = self._cpu(), time.monotonic()
        self.taken = self._taken()
        self.spent: dict[int, float] = {}

    def _cpu(self) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in self.proc.threads()}

    def _taken(self) -> int:
        """Batches the hub has taken in (its ``ingested`` counter, the workers' batches included)."""
        for line in httpx.get(f"{self.url}/metrics", timeout=60).text.splitlines():
            if line.startswith('gpuscope_hub_ingested_total{kind="batches"}'):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def stop(self) -> None:
        end = self._cpu()
        self.wall = time.monotonic() - self.wall
        self.taken = max(1, self._taken() - self.taken)
        self.spent = {tid: s - self.start.get(tid, 0.0) for tid, s in end.items()}

    def rows(self, names: dict[int, str]) -> list[list[str]]:
        """A row a thread of at least 0.005 core: cores, and ms of CPU a batch taken."""
        rows = [
            [
                f"· hub thread {names.get(tid, f'{tid} (not Python)')}",
                f"{s / self.wall:.3f}",
                f"{s * 1e3 / self.taken:.3f} ms a batch taken",
            ]
            for tid, s in sorted(self.spent.items(), key=lambda kv: -kv[1])
            if s / self.wall >= 0.005
        ]
        total = sum(self.spent.values())
        head = [
            "hub process by thread, cores",
            f"{total / self.wall:.2f}",
            f"{total * 1e3 / self.taken:.3f} ms a batch taken ({self.taken:,} batches)",
        ]
        return [head, *rows]


def _options(args: argparse.Namespace, shape: FleetShape, hubs: list[str], pids: list[int]) -> LoadOptions:
    return LoadOptions(
        hubs=hubs,
        shape=shape,
        duration=args.duration,
        workers=args.workers,
        connections=args.connections,
        hub_pids=pids,
        faults=[] if args.no_faults else None,
        urgent=not args.no_urgent,
    )


def cluster_unavailable() -> str | None:
    """Why (b) cannot run here, or None when the remote backend, the cluster mode and the servers exist."""
    for module in ("gpuscope.cluster", "gpuscope.store.remote"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not in this version"
    from gpuscope.config import ConfigError, load_config

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.yaml"
        path.write_text(
            yaml.safe_dump(_hub_config(7470, "http://127.0.0.1:8428", "postgresql://x@127.0.0.1/x", 0))
        )
        try:
            load_config(path)
        except ConfigError as exc:
            return f"the config of (b) is refused: {exc}"
    if victoria_metrics_binary() is None:
        return "victoria-metrics (Debian package) is not installed"
    if postgres_bin_dir() is None:
        return "PostgreSQL (Debian package postgresql) is not installed"
    return None


def _hub_config(port: int, vm: str, dsn: str, index: int, hook: str | None = None) -> dict[str, object]:
    notify: dict[str, object] = {}
    if hook is not None:  # every notification to a receiver here; no repeats within a run
        notify = {
            "receivers": [{"name": "hook", "webhook": {"url": hook}}],
            # one group per alert: a notification names it once, so a repeat is a duplicate
            "routes": [
                {"receiver": "hook", "group_by": ["..."], "group_wait": "0s", "repeat_interval": "24h"}
            ],
        }
    return {
        **notify,
        "listen": f"127.0.0.1:{port}",
        "storage": {
            "backend": "prometheus",
            "remote_write_url": f"{vm}/api/v1/write",
            "query_url": vm,
            "meta": "postgres",
            "postgres_dsn": dsn,
        },
        "cluster": {
            "postgres_dsn": dsn,
            "hub_id": f"hub-{index}",
            "advertise_url": f"http://127.0.0.1:{port}",
            "peer_token": PEER_TOKEN,
        },
    }


@contextmanager
def cluster_hubs(
    vm: str, dsn: str, tmp: Path, count: int, hook: str | None = None
) -> Iterator[list[tuple[str, int]]]:
    """``count`` hub processes, each with its own config file, sharing VictoriaMetrics and PostgreSQL."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        hubs = []
        for i in range(count):
            port = free_port()
            cfg = tmp / f"hub-{i}.yaml"
            cfg.write_text(yaml.safe_dump(_hub_config(port, vm, dsn, i, hook)))
            log = (tmp / f"hub-{i}.log").open("wb")
            cmd = [
                sys.executable,
                "-m",
                "gpuscope.cli",
                "hub",
                "--config",
                str(cfg),
                "--db",
                str(tmp / f"h{i}.db"),
            ]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            hubs.append((f"http://127.0.0.1:{port}", procs[-1].pid))
        for url, _ in hubs:
            wait_http(f"{url}/api/v1/health", timeout=60)
        yield hubs
    finally:
        for proc in procs:
            proc.terminate()
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a finding to report, not a reason to lose the figures
                proc.kill()
                proc.wait()
                tail = (tmp / f"hub-{i}.log").read_text(errors="replace")[-2000:]
                console.print(
                    f"[red]hub {i} did not stop within 60 s of SIGTERM; killed. Log tail:[/red]\n{tail}"
                )


def run_cluster(
    args: argparse.Namespace,
    shape: FleetShape,
    setup: str = "b",
    count: int = 2,
    kill_at: float | None = None,
) -> LoadReport | None:
    """(b), or (c) with ``count`` hubs and the first SIGKILLed ``kill_at`` seconds into the load."""
    why = cluster_unavailable()
    if why is not None:
        console.print(f"[yellow]({setup}) skipped: backend not available ({why})[/yellow]")
        return None
    pg = PostgresServer(postgres_bin_dir() or Path()).start()
    sink = Sink() if kill_at is not None else None
    try:
        with victoria_metrics() as vm, tempfile.TemporaryDirectory() as tmp:
            assert vm is not None
            dsn = pg.create_database("bench_load")
            hook = f"{sink.url}/hook" if sink is not None else None
            with cluster_hubs(vm[0], dsn, Path(tmp), count, hook) as hubs:
                # VictoriaMetrics apart from PostgreSQL: its CPU per sample stored, on the
                # hubs' own remote writes, is this run's anchor for the hubs' figure
                vm_cpu = ResourceMonitor(_pids_with(f"-httpListenAddr={vm[0].removeprefix('http://')}"))
                pg_cpu = ResourceMonitor(_pids_with(f"-p {pg.port}"))
                vm_rows = _vm_rows(vm[0])
                vm_cpu.start()
                pg_cpu.start()
                console.print(
                    f"({setup}) {count} hubs on VictoriaMetrics + PostgreSQL: {[u for u, _ in hubs]}"
                )
                killer = None
                killed: list[float] = []

                def kill(victim: int) -> None:
                    killed.append(time.time())
                    os.kill(victim, signal.SIGKILL)

                load_end = time.time() + args.duration
                if kill_at is not None:
                    killer = threading.Timer(kill_at, kill, (hubs[0][1],))
                    killer.start()
                    console.print(f"({setup}) {hubs[0][0]} is SIGKILLed {kill_at:g} s into the load")
                report = run_load(
                    _options(args, shape, [u for u, _ in hubs], [p for _, p in hubs]), say=console.print
                )
                if killer is not None:
                    killer.cancel()
                vm_cpu.stop()
                pg_cpu.stop()
                stored = _vm_rows(vm[0]) - vm_rows
                extra = [
                    [
                        "VictoriaMetrics + PostgreSQL CPU, cores",
                        f"{vm_cpu.mean_cores + pg_cpu.mean_cores:.2f}",
                        f"beside the hubs; PostgreSQL {pg_cpu.mean_cores:.2f}",
                    ],
                    [
                        "anchor: VictoriaMetrics samples per CPU-second, same run",
                        f"{stored / max(vm_cpu.cpu_seconds, 1e-9):,.0f}",
                        f"{stored:,} samples the hubs wrote, {vm_cpu.mean_cores:.2f} cores (ingest, "
                        "and the hubs' queries)",
                    ],
                ]
                if sink is not None:
                    time.sleep(5)  # notifications of the last alerts leave the outbox within a few seconds
                    extra += notification_rows(
                        sink, [u for u, _ in hubs[1:]], load_end, killed[0] if killed else None
                    )
                    extra += unexplained_rows(report, killed[0] if killed else None)
                    extra += held_rows([u for u, _ in hubs[1:]])
                    extra += silence_rows(report)
                # printed before the hubs stop: a slow shutdown must not cost the figures
                print_report(
                    f"({setup}) {count} hubs, VictoriaMetrics + PostgreSQL: {shape.nodes} nodes",
                    report,
                    extra,
                )
        return report
    finally:
        if sink is not None:
            sink.down()
        pg.stop()


#: how long the check waits, after the load, for an alert that fired during it to be told: its
#: triage may hold it for the playbook's budget, then the route's group_wait (0 s here) and the
#: outbox's delivery
TELL_WAIT_S = BUDGET_S + 15.0


def _cluster_alerts(survivors: list[str]) -> tuple[list[dict[str, object]], str]:
    """Every alert of the cluster as the first survivor that answers lists it, and that survivor."""
    for hub in survivors:
        try:
            alerts = httpx.get(
                f"{hub}/api/v1/alerts", params={"state": "all", "limit": 100_000}, timeout=30
            ).json()["alerts"]
            return list(alerts), hub
        except (httpx.HTTPError, ValueError, KeyError):
            continue
    return [], survivors[0]


def _fingerprint(alert: dict[str, object]) -> str:
    """The fingerprint notifications name an alert by (rule, entity, the time it fired)."""
    entity = alert.get("entity") or {}
    assert isinstance(entity, dict)
    return fingerprint(
        Alert(
            str(alert.get("id")),
            str(alert.get("rule")),
            str(alert.get("severity")),
            str(alert.get("owner")),
            {str(k): str(v) for k, v in entity.items()},
            float(str(alert.get("started_at") or 0)),
            "",
            0.0,
        )
    )


def _told(sink: Sink) -> dict[tuple[str, str], list[tuple[str, float, str]]]:
    """(fingerprint, status) -> each time the receiver was told it: the tier, the wall-clock
    arrival and the alert's name."""
    offset = time.time() - time.monotonic()
    told: dict[tuple[str, str], list[tuple[str, float, str]]] = {}
    for path, body, arrived in list(sink.received):
        if path != "/hook":
            continue
        for alert in body["alerts"]:
            labels = alert["labels"]
            told.setdefault((alert["fingerprint"], alert["status"]), []).append(
                (labels.get("severity", ""), arrived + offset, labels.get("alertname", ""))
            )
    return told


def notification_rows(
    sink: Sink, survivors: list[str], load_end: float, killed_at: float | None
) -> list[list[str]]:
    """Alerts of the cluster (as a survivor answers) against what the receiver was told.

    Every alert that fired while the load ran is one of: notified; **lost** (queued in the
    cluster's outbox and never delivered, or never queued while still firing); or **suppressed by
    design** (never queued, and resolved or muted before its group was due: the alert's history
    names no notification). An alert that fired in the last seconds of the load may still be in
    triage when the load ends: the check waits up to TELL_WAIT_S for each firing alert not yet
    told. Alerts that fired after ``load_end`` are the generator stopping (every node silent for
    real) and are counted apart.

    A notification names its alert by fingerprint (rule, entity and the time it fired: an alert
    that fires again after it resolved is a new fingerprint). One fingerprint and status told
    more than once at the **same tier** is **sent twice**; told again at a graver tier is the
    alert's escalation, sent by design and counted apart."""
    alerts, answering = _cluster_alerts(survivors)
    told = _told(sink)
    waited_for = 0
    deadline = time.monotonic() + TELL_WAIT_S
    while True:
        during = [a for a in alerts if float(str(a.get("started_at") or 0)) < load_end]
        pending = [
            a for a in during if a.get("resolved_at") is None and (_fingerprint(a), "firing") not in told
        ]
        if not pending or time.monotonic() >= deadline:
            break
        waited_for = max(waited_for, len(pending))
        time.sleep(2)
        alerts, answering = _cluster_alerts(survivors)
        told = _told(sink)

    def queued(alert: dict[str, object]) -> bool:
        """Did a member put a notification of it in the outbox (its history says so)?"""
        try:
            rows = httpx.get(f"{answering}/api/v1/alerts/{alert.get('id')}/history", timeout=30).json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(str(r.get("what", "")).startswith("notified_firing") for r in rows.get("history", []))

    untold = [a for a in during if (_fingerprint(a), "firing") not in told]
    undelivered = [a for a in untold if queued(a)]
    unqueued = [a for a in untold if a not in undelivered]
    lost = undelivered + [a for a in unqueued if a.get("resolved_at") is None]
    by_design = [a for a in unqueued if a.get("resolved_at") is not None]
    for alert, why in [(a, "lost") for a in lost] + [(a, "suppressed by design") for a in by_design]:
        started = float(str(alert.get("started_at") or 0))
        console.print(
            f"never notified ({why}): {alert.get('rule')} {alert.get('entity')} started "
            f"{started - load_end:+.1f} s from the load's end, resolved {alert.get('resolved_at')}"
        )
    twice = escalated = 0
    for (fp, status), tells in told.items():
        tiers = [tier for tier, _, _ in tells]
        repeats = len(tiers) - len(set(tiers))
        twice += repeats > 0
        escalated += len(set(tiers)) > 1
        if len(tells) > 1:
            when = ", ".join(
                f"{tier} at {at - killed_at:+.1f} s from the kill" if killed_at is not None else tier
                for tier, at, _ in tells
            )
            what = "sent twice" if repeats else "escalated (a graver tier told again)"
            console.print(f"{what}: {tells[0][2]} {fp} {status}: {when}")
    return [
        [
            "alerts fired during the load / firing notifications",
            f"{len(during)} / {sum(1 for k in told if k[1] == 'firing')}",
            f"{len(alerts) - len(during)} more fired after the load ended (generator stopped)",
        ],
        [
            "notifications lost",
            str(len(lost)),
            f"must be 0 ({len(undelivered)} queued, never delivered; "
            f"{len(lost) - len(undelivered)} firing, never queued; "
            f"{waited_for} still untold at the load's end were waited for)",
        ],
        [
            "notifications sent twice",
            str(twice),
            f"must be 0 (one group per alert, repeat_interval 24h); {escalated} told again at a graver tier",
        ],
        [
            "alerts suppressed by design",
            str(len(by_design)),
            "resolved or muted before their group was due; never queued",
        ],
    ]


def unexplained_rows(report: LoadReport, killed_at: float | None) -> list[list[str]]:
    """Each P1/P2 alert away from every injected fault, timed from the SIGKILL."""
    rows = []
    for alert in report.unexplained_alerts():
        started = float(str(alert.get("started_at") or "nan"))
        when = f"{started - killed_at:+.1f} s from the kill" if killed_at is not None else ""
        rows.append([f"unexplained: {alert.get('rule')}", str(alert.get("entity")), when])
    return rows


def held_rows(survivors: list[str]) -> list[list[str]]:
    """Silence verdicts the survivors held, by source (gaps.py): the hub's own overload, the takeover."""
    held = dict.fromkeys(("overload", "takeover"), 0)
    for url in survivors:
        try:
            text = httpx.get(f"{url}/metrics", timeout=30).text
        except httpx.HTTPError:
            return [["silence verdicts held", "unknown", f"{url}/metrics did not answer"]]
        for line in text.splitlines():
            for source in held:
                if line.startswith(f'gpuscope_hub_operations_total{{name="silence_verdicts_held_{source}"}}'):
                    held[source] += int(float(line.rsplit(" ", 1)[1]))
    return [
        [
            "silence verdicts held, overload / takeover",
            f"{held['overload']} / {held['takeover']}",
            "survivors, evaluations × verdicts (gaps.py)",
        ]
    ]


def silence_rows(report: LoadReport) -> list[list[str]]:
    """For each silence fault detected: how long after its onset its last report reached the hub
    (the senders' and the hub's queues), and the silence the hub then judged against its threshold
    (the verdict: threshold, plus what the hub held it for)."""
    rows = []
    for d in report.detections:
        if d.alert_started is None:
            continue
        started = d.alert_started
        matching = (a for a in report.alerts if d.expected.matches(a) and a.get("started_at") == started)
        alert = next(matching, {})
        details = alert.get("details") or {}
        silence, threshold = details.get("silence_seconds"), details.get("threshold_seconds")
        if not isinstance(silence, int | float) or not isinstance(threshold, int | float):
            continue
        arrived = started - silence - d.expected.at_wall
        rows.append(
            [
                f"{d.expected.fault.kind}: last report reached the hub / silence at the verdict",
                f"{arrived:+.1f} s from onset / {silence:.1f} s",
                f"threshold {threshold:.1f} s; TTD = both",
            ]
        )
    return rows


def _vm_rows(url: str) -> int:
    """Samples VictoriaMetrics has taken in so far (all ingestion protocols)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("vm_rows_inserted_total{")
    )


def _pids_with(*needles: str) -> list[int]:
    """Processes whose command line holds any of ``needles`` (a server started here), and their children."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if any(n in line for n in needles):
            # PostgreSQL's work happens in the backends the postmaster forked for the hubs
            found += [p.pid, *(c.pid for c in p.children(recursive=True))]
    return found


def run_anchor(shape: FleetShape, seconds: float, ticks: int = 10) -> list[list[str]]:
    """VictoriaMetrics ingesting the same node samples, every node once a second: its CPU per sample."""
    console.print(f"anchor: encoding {ticks} s of the fleet's samples as Prometheus text")
    bodies = prometheus_bodies(shape, ticks)
    samples_per_tick = sum(b.count(b"\n") for b in bodies[0])
    with victoria_metrics() as vm:
        if vm is None:
            return [["VictoriaMetrics anchor", "skipped", "victoria-metrics not installed"]]
        monitor = ResourceMonitor(_pids_with(f"-httpListenAddr={vm[0].removeprefix('http://')}"))
        monitor.start()
        pacer = Pacer(vm[0] + "/api/v1/import/prometheus", bodies, seconds)
        pacer.run()
        monitor.stop()
    latencies, errors = pacer.latencies, pacer.errors
    latencies.sort()
    p95 = latencies[int(0.95 * (len(latencies) - 1))] * 1000 if latencies else float("nan")
    sent = samples_per_tick * int(seconds)
    return [
        [
            "anchor: VictoriaMetrics, same node samples at 1 Hz (16 nodes a request)",
            f"{samples_per_tick:,} samples/s offered",
            f"{sent:,} samples in {monitor.wall:.0f} s (the client may lag)",
        ],
        ["anchor: VictoriaMetrics CPU, cores", f"{monitor.mean_cores:.2f}", "vs hub CPU above"],
        [
            "anchor: VictoriaMetrics samples per CPU-second",
            f"{sent / max(monitor.cpu_seconds, 1e-9):,.0f}",
            f"errors {errors}; p95 request {p95:.0f} ms as this one client process saw it",
        ],
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600, help="seconds of load per setup (600)")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--job-nodes", type=int, default=16, help="nodes per training job (16)")
    ap.add_argument("--workers", type=int, default=2, help="sender processes of the load generator")
    ap.add_argument("--connections", type=int, default=64, help="connections per hub per sender")
    ap.add_argument("--only", choices=["a", "b", "c"], default=None, help="run one setup only")
    ap.add_argument("--anchor-seconds", type=float, default=60, help="VictoriaMetrics anchor; 0 skips it")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument(
        "--no-urgent", action="store_true", help="send events with the spool, not ahead of it (the old way)"
    )
    ap.add_argument(
        "--ingest-workers",
        type=int,
        default=0,
        help="(a): the hub's hub.ingest_workers (0: ingest in the hub's process)",
    )
    ap.add_argument("--json-out", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("--py-spy", type=Path, default=None, help="(a): py-spy's stacks of the hub process here")
    args = ap.parse_args()
    shape = FleetShape(nodes=args.nodes, gpus_per_node=args.gpus_per_node, job_nodes=args.job_nodes)
    load = os.getloadavg()
    console.print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} (others compete for them)")
    results: dict[str, object] = {}
    if args.only in (None, "a"):
        results["a"] = run_single(args, shape).to_dict()
        if args.anchor_seconds > 0:
            rows = run_anchor(shape, args.anchor_seconds)
            print_table("anchor, same samples, same pace", ["figure", "value", "note"], rows)
            results["anchor"] = rows
    if args.only in (None, "b"):
        report = run_cluster(args, shape)
        results["b"] = report.to_dict() if report is not None else "skipped: backend not available"
    if args.only in (None, "c"):
        report = run_cluster(args, shape, "c", 3, args.duration / 2)
        results["c"] = report.to_dict() if report is not None else "skipped: backend not available"
        if args.only == "c" and args.anchor_seconds > 0:
            rows = run_anchor(shape, args.anchor_seconds)
            print_table("anchor, same samples, same pace", ["figure", "value", "note"], rows)
            results["anchor"] = rows
    results["load_average_end"] = os.getloadavg()
    if args.json_out:
        args.json_out.write_bytes(
            orjson.dumps(  # HTTP statuses are integer keys
                results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
            )
        )


if __name__ == "__main__":
    main()
