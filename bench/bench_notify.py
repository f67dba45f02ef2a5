"""Latency from an alert firing to a webhook receiving it (budget: <= 1 s outside group_wait).

gpuscope: a hub with the alerting service (routing with group_wait 0 s, playbook triage against a
DuckDB store holding a simulated cluster's telemetry, the persisted outbox, its sender thread)
notifies a loopback webhook receiver; timed from the evaluation that fires the alert to the
receiver's arrival of the request. Anchor, same run: a real Alertmanager (Debian package
``prometheus-alertmanager``) with group_wait 0 s, timed from the push to its API v2 to the arrival
of its own webhook notification. Skips the anchor cleanly when the binary is absent.

usage: python bench/bench_notify.py [--trials 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from common import free_port, print_table, wait_http
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.model import Finding
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import builtin_scenario, load_scenario
from gpuscope.store.duckdb import DuckDBStore

BUDGET_S = 1.0


class Receiver:
    """A webhook receiver that notes when each alert (by its ``gpu`` label) first arrives."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrivals: dict[str, float] = {}
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                now = time.monotonic()
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with receiver.cond:
                    for alert in body.get("alerts", []):
                        if alert["status"] == "firing":
                            receiver.arrivals.setdefault(alert["labels"].get("gpu", ""), now)
                    receiver.cond.notify_all()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, key: str, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while key not in self.arrivals:
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"no notification for {key}")
            return self.arrivals[key]


class Scripted(Detector):
    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def evaluate(self, now: float) -> list[Finding]:
        return list(self.findings)


def bench_gpuscope(trials: int, receiver: Receiver) -> list[float]:
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store)
    scenario = load_scenario(builtin_scenario("demo"))
    for n, tick in enumerate(Simulator(scenario, t0=time.time() - 300).ticks()):
        for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
            hub.ingest(batch)
        if n >= 300:
            break
    script = Scripted()
    hub.detection = DetectionEngine([script])
    hub.alerts.resolve_after = 0.0
    cfg = {
        "receivers": [{"name": "hook", "webhook": {"url": f"http://127.0.0.1:{receiver.port}/hook"}}],
        "routes": [{"receiver": "hook", "group_by": ["alertname", "node", "gpu"], "group_wait": "0s"}],
    }
    service = AlertingService(hub, parse_alerting(cfg))
    service.start()
    latencies: list[float] = []
    try:
        for i in range(trials):
            key = f"g{i}"
            script.findings = [Finding("gpu_lost", {"node": "node-1", "gpu": key}, "lost")]
            fired = time.monotonic()
            hub.evaluate(time.time())
            latencies.append(receiver.wait(key) - fired)
            script.findings = []
            hub.evaluate(time.time())
    finally:
        service.stop()
        store.close()
    return latencies


def bench_alertmanager(trials: int, receiver: Receiver) -> list[float] | None:
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        return None
    work = Path(tempfile.mkdtemp(prefix="bench-am-"))
    port = free_port()
    (work / "am.yml").write_text(
        "route: {receiver: hook, group_by: [alertname, node, gpu], group_wait: 0s, group_interval: 1s,"
        " repeat_interval: 1h}\n"
        f"receivers: [{{name: hook, webhook_configs: [{{url: 'http://127.0.0.1:{receiver.port}/am'}}]}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: list[float] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready")
        with httpx.Client() as client:
            for i in range(trials):
                key = f"am{i}"
                alert = {"labels": {"alertname": "gpu_lost", "node": "node-1", "gpu": key}}
                sent = time.monotonic()
                client.post(f"http://127.0.0.1:{port}/api/v2/alerts", json=[alert]).raise_for_status()
                latencies.append(receiver.wait(key) - sent)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return latencies


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50_ms": 1000 * statistics.median(xs),
        "p95_ms": 1000 * xs[int(0.95 * (len(xs) - 1))],
        "max_ms": 1000 * xs[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    receiver = Receiver()
    ours = summary(bench_gpuscope(args.trials, receiver))
    am = bench_alertmanager(args.trials, receiver)
    anchor = summary(am) if am else None
    rows = [["gpuscope (fire -> triage -> outbox -> webhook)", *(f"{v:.1f}" for v in ours.values())]]
    if anchor:
        rows.append(
            ["Alertmanager 0.25 (push -> webhook), group_wait 0s", *(f"{v:.1f}" for v in anchor.values())]
        )
    else:
        rows.append(["Alertmanager: prometheus-alertmanager not installed (skipped)", "-", "-", "-"])
    print_table(
        f"alert fired -> webhook received, {args.trials} alerts (budget <= {BUDGET_S * 1000:.0f} ms)",
        ["path", "p50 ms", "p95 ms", "max ms"],
        rows,
    )
    verdict = "within" if ours["max_ms"] <= BUDGET_S * 1000 else "OVER"
    print(f"gpuscope worst case {ours['max_ms']:.1f} ms: {verdict} the {BUDGET_S:.0f} s budget")
    if args.json:
        args.json.write_text(json.dumps({"gpuscope": ours, "alertmanager": anchor, "budget_s": BUDGET_S}))


if __name__ == "__main__":
    main()
