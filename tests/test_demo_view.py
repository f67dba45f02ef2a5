"""The demo's terminal view shows the productivity model's figures, the same the API serves."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from rich.console import Console

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.demo import DemoView, faults_played
from gpuscope.hub import Hub
from gpuscope.model import Batch, Event, Frame, TrainingRecord
from gpuscope.sim.scenario import builtin_scenario, load_scenario
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi


def test_terminal_view_shows_gpu_hours_by_state_as_the_api_does() -> None:
    now = [1_700_000_000.0]
    hub = Hub(DuckDBStore(":memory:"), price_per_gpu_hour=2.5)
    client = TestClient(HubApi(hub, clock=lambda: now[0]).app)
    try:
        hub.ingest(Batch("sdk", events=[Event(now[0], "job_started", {"job": "train"})]))
        for k in range(1, 61):
            now[0] += 1
            entities = [{"node": "node-0", "gpu": str(g), "job": "train"} for g in range(8)]
            hub.ingest(
                Batch(
                    "node-0",
                    frames=[Frame(now[0], ["gpu_utilization_percent"], entities, np.full((8, 1), 99.0))],
                )
            )
            if k <= 20:  # steps stop at 20 s: the job hangs
                records = [TrainingRecord(now[0], "train", r, k, {"step_seconds": 1.0}) for r in range(8)]
                hub.ingest(Batch("sdk", training=records))
            hub.evaluate(now[0])
        scenario = load_scenario(builtin_scenario("demo"))
        view = DemoView(client, scenario, "http://hub", scenario.duration)
        console = Console(record=True, width=200)
        console.print(view.render(60.0, []))
        text = console.export_text()
        api = client.get("/api/v1/productivity", params={"by": "fleet", "range": "1d"}).json()["groups"][0]
        stalled = api["states"]["busy_not_productive"]
        assert stalled["causes"]["hung"]["gpu_hours"] > 0
        line = next(row for row in text.splitlines() if "busy not productive" in row)
        assert (
            f"{stalled['gpu_hours']:.3f}" in line and f"{stalled['dollars']:.2f}" in line and "hung" in line
        )
        assert f"wasted {api['waste']['gpu_hours']:.3f} GPU-h" in text
    finally:
        hub.store.close()


def test_the_default_make_demo_plays_every_fault_it_announces() -> None:
    """Seen: ``make demo`` ran 180 s of a 900 s scenario, so 5 of the 8 announced faults never played."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    args = next(
        line.split("?=", 1)[1].split() for line in makefile.splitlines() if line.startswith("DEMO_ARGS")
    )
    scenario = load_scenario(builtin_scenario("demo"))
    end = float(args[args.index("--duration") + 1]) if "--duration" in args else scenario.duration
    assert len(scenario.faults) == 8
    for fault in scenario.faults:
        assert fault.at + (fault.duration or 0) <= end, fault.label()


def test_a_shortened_run_announces_the_faults_it_plays() -> None:
    """Seen: ``--duration 30`` announced "8 faults", played one, and scored it MISSED."""
    scenario = load_scenario(builtin_scenario("demo"))
    assert faults_played(scenario, scenario.duration) == "8 faults"
    assert faults_played(scenario, 30.0) == "1 of its 8 faults"
