"""The inference SDK against a real hub: request timing, tokens, errors, gauges, versions, drops."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import gpuscope
from gpuscope.sdk.inference import Service
from serving.rig import hub_rig


def test_requests_tokens_errors_gauges_and_versions(tmp_path: Path) -> None:
    with hub_rig(tmp_path) as rig:
        svc = gpuscope.serve("chat", "llama", "v1", rig.url, state_dir=tmp_path / "s", flush_interval=60)
        t0 = time.time()
        for i in range(20):
            with svc.request() as r:
                time.sleep(0.002)
                r.first_token()
                for _ in range(4):
                    time.sleep(0.001)
                    r.tokens(1)
                if i % 10 == 0:
                    r.error()
        with pytest.raises(RuntimeError), svc.request():
            raise RuntimeError("model crashed")
        svc.queue_depth(3)
        svc.batch_size(8)
        svc.memory(weights=16e9, kv_cache=40e9)
        svc.predict("yes", confidence=0.9, features={"lang": "en", "len": 12})
        svc.flush()
        svc.set_version("v2")
        with svc.request():
            pass
        svc.close()
        snap = {
            (e["labels"]["version"]): e["values"]
            for e in rig.store.snapshot()
            if e["labels"].get("service") == "chat" and "feature" not in e["labels"]
        }
        v1 = snap["v1"]
        assert v1["inference_ttft_p50_seconds"] == pytest.approx(0.002, abs=0.002)
        assert 0.0009 < v1["inference_itl_p50_seconds"] < 0.004
        assert v1["inference_queue_depth"] == 3 and v1["inference_batch_size"] == 8
        assert v1["inference_memory_weights_bytes"] == 16e9 and v1["inference_memory_kv_cache_bytes"] == 40e9
        assert "inference_requests_per_second" in snap["v2"]
        windows = rig.store.events(t0 - 1, time.time() + 1, kind="serving_window")
        assert windows[0].data["requests"] == 21 and windows[0].data["errors"] == 3
        sketches = {
            e.labels["feature"]: e.data["sketch"]["type"]
            for e in rig.store.events(t0 - 1, time.time() + 1, kind="quality_sketch")
        }
        assert sketches == {
            "prediction": "categorical",
            "confidence": "numeric",
            "lang": "categorical",
            "len": "numeric",
        }


def test_bounded_queue_counts_drops(tmp_path: Path) -> None:
    svc = Service("s", "m", "v", "http://127.0.0.1:9", state_dir=tmp_path, capacity=5, flush_interval=60)
    for _ in range(8):
        with svc.request():
            pass
    assert svc.stats()["dropped_requests"] == 3
    with pytest.raises(ValueError, match="service"):
        Service("", "m", "v", "http://127.0.0.1:9", state_dir=tmp_path)
    svc._closed = True  # nothing to deliver to: do not wait for the unreachable hub at exit
