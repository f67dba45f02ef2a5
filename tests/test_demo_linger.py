"""The demo's dashboard stays up after the run until Ctrl-C (here: the ``linger`` event), and the
agents' clean leave keeps the lingering hub from paging node_unreachable; a demo cut short ends its
jobs, so a hub reopened on its store pages nothing for them."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpuscope.demo import run_demo
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from support import free_port

SCENARIO = """
name: linger
seed: 2
duration: 4
interval: 1
cluster: {nodes: 1, gpus_per_node: 2, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: train, kind: training, nodes: [node-0], step_time: 1.0}
"""


def test_dashboard_stays_up_after_the_run_until_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "linger.yaml"
    path.write_text(SCENARIO)
    port = free_port()
    linger = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(run_demo(scenario_path=path, port=port, linger=linger)), daemon=True
    )
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the run to end: agents have left the hub
        try:
            drained = httpx.get(f"{url}/api/v1/productivity/gpus", timeout=2).json()["gpus"] == []
            seen = httpx.get(f"{url}/api/v1/events", params={"kind": "agent_stopping", "start": 0}).json()
            if drained and seen["events"]:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the demo run did not end")
    time.sleep(6)  # well past the end of the run and the node_unreachable threshold
    assert thread.is_alive()
    assert httpx.get(f"{url}/ui/", timeout=5).status_code == 200
    firing = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["alerts"]
    assert not [a for a in firing if a["rule"] == "node_unreachable"]
    linger.set()
    thread.join(timeout=30)
    assert codes == [0]
    try:
        httpx.get(f"{url}/ui/", timeout=2)
        raise AssertionError("the hub still answers after the interrupt")
    except httpx.HTTPError:
        pass


CUT_SHORT = """
name: cut-short
seed: 3
duration: 120
interval: 1
cluster: {nodes: 1, gpus_per_node: 2, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: train, kind: training, nodes: [node-0], step_time: 1.0}
"""


def test_a_demo_cut_short_ends_its_jobs_so_its_reopened_store_raises_no_lost_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cut-short.yaml"
    path.write_text(CUT_SHORT)
    assert run_demo(scenario_path=path, duration=8, port=free_port()) == 0  # of 120 s: cut short
    out = capsys.readouterr().out
    kept = next(line for line in out.splitlines() if line.startswith("data kept in "))
    workdir = Path(kept.removeprefix("data kept in ").strip())
    store = DuckDBStore(str(workdir / "demo.duckdb"))
    hub = Hub(store)
    try:
        ended = store.events(0, time.time() + 60, kind="job_ended")
        assert [e.labels["job"] for e in ended] == ["train"]  # the job said it ended with the demo
        now = time.time() + 60  # a minute after the demo: every rank long silent
        hub.resume(now)
        for k in range(5):
            hub.evaluate(now + k)
        raised = [f"{a.rule} {a.entity}" for a in hub.alert_view()[0]]
        assert not [a for a in raised if a.startswith(("rank_lost", "training_stalled", "node_unreachable"))]
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)
