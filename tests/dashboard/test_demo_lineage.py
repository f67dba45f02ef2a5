"""The demo registers its story's lineage through the hub's lineage API, so the Lineage page
draws run → checkpoint → version → deployment for the version serving and for a rollout.

Seen: the built-in demo's Lineage page said "no model version has been deployed yet" although its
scenario names model ``chat`` version ``v7``. A real ``gpuscope demo`` run, real headless Chromium.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from gpuscope.demo import run_demo
from gpuscope.demo_lineage import ORIGIN_STEP, manifest_hash
from support import free_port

# headless Chromium; without it the module is skipped before the demo runs
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

# the training job starts (10-20 s), saves a checkpoint (at least 10 s), then v8 rolls out
SCENARIO = """
name: lineage-demo
seed: 4
duration: 40
interval: 1
cluster: {nodes: 2, gpus_per_node: 2, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: llm-pretrain, kind: training, nodes: [node-0], step_time: 0.5, checkpoint_every: 1,
     checkpoint_seconds: 10}
  - {name: chat-api, kind: inference, nodes: [node-1], gpus: [0, 1], rps: 20, model: chat, version: v7}
faults:
  - {at: 36, kind: bad_version, target: {service: chat-api}}
"""


def test_the_demo_s_versions_are_drawn_with_their_runs_and_checkpoints(tmp_path: Path, page: Page) -> None:
    path = tmp_path / "lineage.yaml"
    path.write_text(SCENARIO)
    port = free_port()
    linger = threading.Event()
    thread = threading.Thread(target=run_demo, kwargs={"scenario_path": path, "port": port, "linger": linger})
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        deployed: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(deployed) < 2:
            time.sleep(1)
            try:
                deployed = httpx.get(f"{url}/api/v1/lineage/deployments", timeout=5).json()["deployments"]
            except httpx.HTTPError:
                continue
        assert [(d["service"], d["version"]) for d in deployed] == [("chat-api", "v7"), ("chat-api", "v8")]
        v7 = httpx.get(f"{url}/api/v1/lineage/versions/chat/v7", timeout=5).json()
        assert (v7["run"]["job"], v7["checkpoint"]["step"], v7["aliases"]) == (
            "chat-finetune",
            ORIGIN_STEP,
            ["champion"],
        )
        v8 = httpx.get(f"{url}/api/v1/lineage/versions/chat/v8", timeout=5).json()
        step = v8["checkpoint"]["step"]
        assert v8["run"]["job"] == "llm-pretrain" and step > 0
        # the checkpoint the training job reported saved, its manifest hash as the SDK sends it
        assert v8["checkpoint"]["manifest_hash"] == manifest_hash("llm-pretrain", step)
        # one promotion event per promotion: the simulator's own copy was not sent as well
        events = httpx.get(
            f"{url}/api/v1/events", params={"kind": "model_version_promoted", "start": 0}, timeout=5
        ).json()["events"]
        assert sorted(e["labels"]["version"] for e in events) == ["v7", "v8"]

        page.goto(f"{url}/ui/?refresh=60#/lineage")
        page.wait_for_selector('body[data-ready="1"]', timeout=15_000)
        assert page.locator("#l-empty").count() == 0
        v7_row = page.inner_text('[data-version="chat:v7"]')
        assert "chat-finetune" in v7_row and f"step {ORIGIN_STEP}" in v7_row and "@champion" in v7_row
        v8_row = page.inner_text('[data-version="chat:v8"]')
        assert "llm-pretrain" in v8_row and f"step {step}" in v8_row and "chat-api" in v8_row
        # the events read as words: no JSON of the version's source
        table = page.inner_text("#l-events")
        assert "{" not in table and '"' not in table
        promoted = page.locator("#l-events tr", has_text="model_version_promoted").all_inner_texts()
        assert any(f"chat v8 → chat-api from llm-pretrain step {step}" in row for row in promoted)
        saved = page.locator("#l-events tr", has_text="checkpoint_completed").first.inner_text()
        assert f"manifest {manifest_hash('llm-pretrain', step)[:12]}" in saved
    finally:
        linger.set()
        thread.join(timeout=60)
