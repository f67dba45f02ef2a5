"""The composition root: a config file in, a hub with its services out, started and stopped in
the written order. What ``gpuscope hub`` runs is what this test runs."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from alert.rig import Scripted, lost
from alert.sink import Sink
from gpuscope.config import load_config
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.lifecycle import LifecycleDetector
from gpuscope.detect.loss import LossDetector
from gpuscope.model import Batch, Frame
from gpuscope.runtime import assemble, evaluation_hub, keep_finished_jobs
from gpuscope.store.duckdb import DuckDBStore
from support import free_port

TOKEN = "a-runtime-test-token-0123"


def _config(tmp_path: Path, sink: Sink, port: int, name: str = "hub") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "storage": {"path": str(tmp_path / f"{name}.duckdb")},
                "auth": {"tokens": [TOKEN]},
                "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
                "routes": [{"receiver": "hook", "group_wait": "0s"}],
                "slos": [{"service": "chat", "availability": 0.99}],
            }
        )
    )
    return path


def test_assembled_hub_serves_evaluates_notifies_and_resumes(tmp_path: Path) -> None:
    sink = Sink()
    cfg = load_config(_config(tmp_path, sink, free_port()))
    runtime = assemble(cfg, evaluate_interval=0.1)
    assert runtime.server is not None and runtime.cluster is None
    script = Scripted()
    runtime.hub.detection = DetectionEngine([script])
    assert set(runtime.quality._slos) == {"chat"}  # the slos: section, attached
    runtime.start()
    try:
        url, auth = runtime.server.url, {"Authorization": f"Bearer {TOKEN}"}
        script.findings = [lost()]
        # the runtime's clock evaluates, alerting routes the change, its outbox delivers it
        body = sink.wait_for(1)[0]
        assert body["alerts"][0]["labels"]["alertname"] == "gpu_lost"
        status = httpx.get(f"{url}/api/v1/alerting/status", headers=auth).json()
        assert status["receivers"] == ["hook"]  # the service the runtime built, handed to the API
        caps = httpx.get(f"{url}/api/v1/ui/capabilities", headers=auth).json()
        assert caps["alerting"] is True
        firing = [a["id"] for a in httpx.get(f"{url}/api/v1/alerts", headers=auth).json()["alerts"]]
        assert len(firing) == 1
    finally:
        runtime.stop()
    assert runtime.evaluator is not None and not runtime.evaluator.is_alive()
    assert runtime.alerting._thread is not None and not runtime.alerting._thread.is_alive()

    # a second start on the same files continues the firing alert without notifying it again
    again = assemble(load_config(_config(tmp_path, sink, free_port())), evaluate_interval=0.1)
    again.hub.detection = DetectionEngine([Scripted()])
    again.start()
    try:
        assert [a.id for a in again.hub.firing()] == firing
        time.sleep(0.5)
        assert len(sink.bodies("/hook")) == 1
    finally:
        again.stop()
        sink.down()


def test_a_taken_port_is_refused_unless_any_port_is_allowed(tmp_path: Path) -> None:
    sink = Sink()
    port = free_port()
    first = assemble(load_config(_config(tmp_path, sink, port)))
    first.start()
    cfg = load_config(_config(tmp_path, sink, port, name="second"))
    try:
        with pytest.raises(OSError):
            assemble(cfg)
        assert not (tmp_path / "second.duckdb").exists() or _reopens(tmp_path / "second.duckdb")
        other = assemble(cfg, any_port=True)
        assert other.server is not None and other.server.port != port
        other.stop()
    finally:
        first.stop()
        sink.down()


def _reopens(path: Path) -> bool:
    """The refused assembly closed its store: the file opens again at once."""
    store = DuckDBStore(str(path))
    store.close()
    return True


def test_a_stopping_hub_keeps_the_gpu_time_counted_since_its_last_upkeep(tmp_path: Path) -> None:
    sink = Sink()
    cfg = load_config(_config(tmp_path, sink, free_port()))
    runtime = assemble(cfg, serve=False, evaluate_interval=None)  # no upkeep runs: only the stop saves
    t0 = float(int(time.time()) - 120)
    runtime.start(t0)
    try:
        entities = [{"node": "node-0", "gpu": str(g)} for g in range(2)]
        for k in range(61):
            frame = Frame(t0 + k, ["gpu_utilization_percent"], entities, np.full((2, 1), 0.0))
            runtime.hub.ingest(Batch("node-0", frames=[frame]))
            runtime.hub.settle()  # as each evaluation does first
            runtime.hub.productivity.advance(t0 + k, [])
        counted = runtime.hub.productivity.gpu_hours(t0, t0 + 60)
    finally:
        runtime.stop()
    assert counted["idle_unallocated"] == round(2 * 60 / 3600, 4)

    again = assemble(load_config(_config(tmp_path, sink, free_port())), serve=False, evaluate_interval=None)
    again.start(t0 + 61)
    try:
        assert again.hub.productivity.gpu_hours(t0, t0 + 60) == counted
    finally:
        again.stop()
        sink.down()


def test_the_finished_job_retention_reaches_the_model_and_the_detectors() -> None:
    hub = evaluation_hub(DuckDBStore(":memory:", durable=False), 2.5)
    try:
        keep_finished_jobs(hub, 120.0)
        assert hub.productivity.finished_job_retention_s == 120.0
        kept = [d for d in hub.detection.detectors if isinstance(d, LossDetector | LifecycleDetector)]
        assert len(kept) == 2 and all(d.finished_job_retention_s == 120.0 for d in kept)
    finally:
        hub.store.close()
