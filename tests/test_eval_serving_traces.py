"""eval/eval_serving_traces.py on a small trace in the Alibaba GenAI layout: its rows reach the
hub's serving rules under the names they read (a doubled latency fires, a steady one does not),
and without the data folder it skips cleanly."""

from __future__ import annotations

import gzip
import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

EVAL = Path(__file__).resolve().parent.parent / "eval"
IP = "0123456789abcdef0123456789abcdef"


def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EVAL))
    return importlib.import_module("eval_serving_traces")


def write(path: Path, header: str, rows: list[str]) -> None:
    with gzip.open(path, "wt") as f:
        f.write(header + "\n" + "\n".join(rows) + "\n")


def trace(folder: Path, hours: float = 3.0) -> None:
    """One container sampled every 60 s (latency about 15 s, queueing 0.2 s, 0.1 request/s) and a
    gateway (1 request/s, an empty queue)."""
    rng = np.random.default_rng(5)
    times = [1.0e9 + 60.0 * k for k in range(int(hours * 60))]
    noise = [float(np.exp(0.05 * rng.standard_normal())) for _ in times]
    folder.mkdir(parents=True)
    write(
        folder / "pipeline_inference_data_anon.csv.gz",
        "timestamp_anon,value,container_ip",
        [f"{t},{15000 * n},{IP}" for t, n in zip(times, noise, strict=True)],
    )
    write(
        folder / "queue_rt_raw_anon.csv.gz",
        "value,container_ip,timestamp_anon",
        [f"200,{IP},{t}" for t in times],
    )
    write(
        folder / "qps.csv.gz",
        "timestamp_anon,value,container_ip,request_type",
        [f"{t},0.1,{IP},Generative Requests" for t in times] + [f"{t},1.0,,API Requests" for t in times],
    )
    write(
        folder / "queue_size_raw_anon.csv.gz",
        "value,container_ip,timestamp_anon",
        [f"0.0,,{t}" for t in times],
    )
    write(
        folder / "model_predict_data_anon.csv.gz",
        "timestamp_anon,value,container_ip",
        [f"{t},{12000 * n},{IP}" for t, n in zip(times, noise, strict=True)],
    )


def test_a_doubled_latency_fires_on_its_service_and_the_steady_trace_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = script(monkeypatch)
    trace(tmp_path / ev.FOLDER)
    services = ev.load(tmp_path / ev.FOLDER, containers=1, predict=0)
    assert sorted(s.name for s in services) == ["c-01234567", "gateway"]
    assert ev.replay(services, []) == []
    plan = ev.RUNS["latency x2"]
    assert plan is not None
    faults = [f for s in services for f in plan(s)]
    assert len(faults) == len(ev.AT)
    alerts = ev.replay(services, faults)
    fired = sorted((a.rule, a.entity["service"]) for a in alerts)
    assert fired == [("inference_latency_regression", "c-01234567")] * len(faults)
    for fault, alert in zip(faults, sorted(alerts, key=lambda a: a.started_at), strict=True):
        assert fault.start <= alert.started_at <= fault.start + ev.FAULT


def test_without_the_data_it_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = script(monkeypatch)
    monkeypatch.setattr("sys.argv", ["eval_serving_traces.py", "--data", str(tmp_path)])
    assert ev.main() == 0
    assert capsys.readouterr().out.startswith("SKIP")


def test_a_late_joiner_is_a_new_service_from_a_quarter_of_its_samples_and_the_rest_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = script(monkeypatch)
    trace(tmp_path / ev.FOLDER)
    services = ev.load(tmp_path / ev.FOLDER, containers=1, predict=1)
    moved, joins = ev.joined(services, half=0)
    times = services[0].series[ev.LATENCY][0]
    # the first container and the first predict series join late; the gateway is as it was
    assert sorted(joins) == ["c-01234567", "p-01234567"]
    assert joins["c-01234567"] == times[int(0.25 * (len(times) - 1))]
    for svc in moved:
        first = min(ts[0] for ts, _ in svc.series.values())
        assert first == joins.get(svc.name, services[0].span[0]), svc.name
    assert ev.joined(services, half=1)[1] == {}
