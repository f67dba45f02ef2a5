"""Hostile and broken input through the real HTTP API (in process): every refusal names its field,
the hub stays healthy, and everything accepted before is still there with the same values.

What the hub does with each kind of bad input (the documented policy):

- unparseable bodies (deep nesting, broken UTF-8, NaN/Infinity tokens, numbers beyond double):
  400, field ``body``; bodies over ``max_body_bytes`` are cut off while streaming: 413.
- timestamps: refused with 400 naming the field when more than ``Limits.max_future_s`` (10 min)
  ahead of the hub's clock, older than ``Limits.max_past_s`` (the raw retention), or past the
  year 9999 (milliseconds sent as seconds). Never clamped: a clamped sample would sit in the
  wrong hour. Skew of seconds between agents is accepted as sent.
- values: null is missing; a finite value beyond float32 is refused and counted, the rest of the
  batch is stored. Negative counters (``*_total``) are stored as sent, and detectors treat them
  as missing; a counter that drops is a reset, never a negative rate.
- label sets past ``max_entities`` and metric names past ``max_metrics``: the batch is accepted,
  the new ones are refused and counted, known series keep flowing. Unknown metric names within
  the limit are accepted and queryable like any other.
- duplicates: a batch with a ``batch_id`` seen before is acknowledged and stored once; batches
  arriving out of order are read back in time order.
"""

from __future__ import annotations

import random
import tracemalloc
import warnings
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi

NOW = 1_700_000_000.0
DAY = 86_400.0
METRICS = ["gpu_utilization_percent", "gpu_temp_celsius"]
JSON = {"Content-Type": "application/json"}


class Rig:
    """A hub behind its HTTP API on a fixed clock, with a few known batches already stored."""

    def __init__(self, max_entities: int = 1000, max_metrics: int = 64, max_body: int = 8 << 20) -> None:
        self.now = NOW
        self.hub = Hub(DuckDBStore(":memory:", max_entities=max_entities, max_metrics=max_metrics))
        limits = Limits(max_body_bytes=max_body, max_past_s=7 * DAY)
        self.client = TestClient(HubApi(self.hub, limits=limits, clock=lambda: self.now).app)
        for k in range(3):
            assert self.post(known(k)).status_code == 200

    def post(self, body: Any) -> Any:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.client.post("/api/v1/ingest", content=raw, headers=JSON)

    def series(self, metric: str, start: float, end: float, **labels: str) -> list[list[float]]:
        params: dict[str, str | float] = {"metric": metric, "start": start, "end": end, "points": 10_000}
        params.update(labels)
        r = self.client.get("/api/v1/series", params=params)
        assert r.status_code == 200, r.text
        return r.json()["points"]  # type: ignore[no-any-return]

    def count(self, metric: str, start: float, end: float) -> int:
        r = self.client.get(
            "/api/v1/aggregate", params={"metric": metric, "by": "node", "start": start, "end": end}
        )
        return sum(g["count"] for g in r.json()["groups"])

    def health(self) -> dict[str, Any]:
        r = self.client.get("/api/v1/health")
        assert r.status_code == 200
        return r.json()  # type: ignore[no-any-return]

    def assert_intact(self) -> None:
        """The known batches are all there, once, with their values, and the hub is healthy."""
        for g in range(2):
            points = self.series("gpu_temp_celsius", NOW - 100, NOW, node="node-0", gpu=str(g))
            assert points == [[NOW - 60 + k, 60.0 + k] for k in range(3)]
        assert self.count("gpu_utilization_percent", NOW - 100, NOW) == 6
        assert self.health()["status"] == "ok"

    def close(self) -> None:
        self.hub.store.close()


def known(k: int) -> dict[str, Any]:
    return {
        "source": "node-0",
        "batch_id": f"known-{k}",
        "frames": [
            {
                "ts": NOW - 60 + k,
                "metrics": METRICS,
                "entities": [{"node": "node-0", "gpu": str(g)} for g in range(2)],
                "values": [[90.0 + g, 60.0 + k] for g in range(2)],
            }
        ],
    }


def one_frame(ts: float, value: Any = 1.0, metric: str = "probe", **labels: str) -> dict[str, Any]:
    return {
        "source": "hostile",
        "frames": [
            {"ts": ts, "metrics": [metric], "entities": [labels or {"node": "h"}], "values": [[value]]}
        ],
    }


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


def _deep(n: int, open_: bytes, close: bytes) -> bytes:
    return open_ * n + b"1" + close * n


REFUSED_BODIES = [
    ("deep arrays", _deep(100_000, b"[", b"]"), "body"),
    ("deep objects", _deep(100_000, b'{"a":', b"}"), "body"),
    ("broken UTF-8 in a string", b'{"source": "node-\xff\xfe", "frames": []}', "body"),
    ("broken UTF-8 in a key", b'{"sour\xc3\x28ce": "x"}', "body"),
    (
        "NaN token",
        b'{"source": "x", "frames": [{"ts": 1, "metrics": ["a"], "entities": [{}], "values": [[NaN]]}]}',
        "body",
    ),
    (
        "Infinity token",
        b'{"source": "x", "frames": [{"ts": 1, "metrics": ["a"], "entities": [{}], "values": [[Infinity]]}]}',
        "body",
    ),
    ("number beyond double", orjson.dumps(one_frame(NOW))[:-4] + b"1e999]]}]}", "body"),
    ("not an object", b"[1, 2, 3]", "body"),
    ("ts far in the future", orjson.dumps(one_frame(NOW + 3600)), "frames[0].ts"),
    ("ts in milliseconds", orjson.dumps(one_frame(NOW * 1000)), "frames[0].ts"),
    ("ts absurdly large", orjson.dumps(one_frame(1e300)), "frames[0].ts"),  # was a 500 (int64 overflow)
    ("ts past retention", orjson.dumps(one_frame(NOW - 8 * DAY)), "frames[0].ts"),
    ("ts negative", orjson.dumps(one_frame(-5.0)), "frames[0].ts"),
    (
        "event far in the future",
        orjson.dumps({"source": "x", "events": [{"ts": NOW, "kind": "k"}, {"ts": NOW + 1e6, "kind": "k"}]}),
        "events[1].ts",
    ),
    (
        "training far in the future",
        orjson.dumps({"source": "x", "training": [{"ts": NOW + 1e6, "job": "j", "rank": 0, "step": 1}]}),
        "training[0].ts",
    ),
    ("label value not a string", orjson.dumps(one_frame(NOW, node={"x": 1})), "frames[0].entities[0].node"),  # type: ignore[arg-type]
    ("metric name with a space", orjson.dumps(one_frame(NOW, metric="gpu temp")), "frames[0].metrics[0]"),
]


@pytest.mark.parametrize(("body", "field"), [pytest.param(b, f, id=i) for i, b, f in REFUSED_BODIES])
def test_hostile_body_is_refused_naming_the_field_and_loses_nothing(
    rig: Rig, body: bytes, field: str
) -> None:
    r = rig.post(body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert rig.health()["counters"]["ingest_rejected_batches"] == 1
    rig.assert_intact()


def test_oversized_body_is_cut_off_while_streaming() -> None:
    """No Content-Length (chunked): the hub stops reading at the limit instead of buffering it all."""
    rig = Rig(max_body=1 << 20)
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b" " * (256 << 10)

    r = rig.client.post("/api/v1/ingest", content=chunks(), headers=JSON)
    assert r.status_code == 413 and r.json()["field"] == "body"
    assert rig.hub.counters.get("ingest_refused_too_large") == 1
    rig.assert_intact()
    rig.close()


def test_huge_json_within_the_limit_stays_within_bounded_memory(rig: Rig) -> None:
    """4 MiB of values for entities that do not match: refused, with a bounded peak."""
    values = [[float(i)] * 8 for i in range(60_000)]  # ~4 MiB on the wire
    body = orjson.dumps(
        {
            "source": "x",
            "frames": [
                {"ts": NOW, "metrics": [f"m{j}" for j in range(8)], "entities": [{}], "values": values}
            ],
        }
    )
    assert 3 << 20 < len(body) <= 8 << 20
    tracemalloc.start()
    try:
        r = rig.post(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 400 and r.json()["field"] == "frames[0].values"
    assert peak < 30 * len(body), f"peak {peak >> 20} MiB for a {len(body) >> 20} MiB body"
    rig.assert_intact()


def test_cardinality_bomb_is_refused_past_the_limit_and_known_series_keep_flowing() -> None:
    rig = Rig(max_entities=500)
    bomb = {
        "source": "bomb",
        "frames": [
            {
                "ts": NOW - 10,
                "metrics": ["gpu_temp_celsius"],
                "entities": [{"node": "node-0", "gpu": "0"}]
                + [{"node": "bomb", "request_id": str(i)} for i in range(99_999)],
                "values": [[70.0]] * 100_000,
            }
        ],
    }
    r = rig.post(bomb)
    assert r.status_code == 200, r.text
    body = r.json()
    # 2 known entities + 498 new ones fit under 500; the rest are refused and counted
    assert body["accepted"]["samples"] == 1 + 498
    assert body["refused"] == {"entities": 99_999 - 498, "samples": 99_999 - 498}
    assert any("entity limit (500)" in n for n in body["notes"])
    again = rig.post(one_frame(NOW - 5, node="bomb", request_id="new-one"))
    assert again.json()["refused"]["entities"] == 1
    health = rig.health()
    assert health["counters"]["ingest_refused_samples"] == 99_999 - 498 + 1
    assert health["store"]["entities"] == 500
    assert rig.post(known(3)).json()["accepted"]["samples"] == 4  # known series keep flowing
    points = rig.series("gpu_temp_celsius", NOW - 100, NOW, node="node-0", gpu="0")
    assert points == [[NOW - 60 + k, 60.0 + k] for k in range(4)] + [[NOW - 10, 70.0]]
    rig.close()


def test_values_beyond_float32_are_refused_and_counted_the_rest_is_stored(rig: Rig) -> None:
    body = {
        "source": "x",
        "frames": [
            {
                "ts": NOW - 30,
                "metrics": ["gpu_power_watts", "gpu_ecc_sbe_aggregate_total"],
                "entities": [{"node": "n1", "gpu": "0"}, {"node": "n1", "gpu": "1"}],
                "values": [[300.0, 1e39], [None, -4.0]],  # null is missing; -4 is stored as sent
            }
        ],
    }
    r = rig.post(body).json()
    assert r["accepted"]["samples"] == 2 and r["refused"]["samples"] == 1
    assert rig.series("gpu_power_watts", NOW - 60, NOW, node="n1") == [[NOW - 30, 300.0]]
    assert rig.series("gpu_ecc_sbe_aggregate_total", NOW - 60, NOW, node="n1", gpu="1") == [[NOW - 30, -4.0]]
    assert rig.series("gpu_ecc_sbe_aggregate_total", NOW - 60, NOW, node="n1", gpu="0") == []
    rig.assert_intact()


def _counter_frame(ts: float, value: float) -> dict[str, Any]:
    return {
        "source": "n1",
        "frames": [
            {
                "ts": ts,
                "metrics": ["gpu_pcie_replay_total", "gpu_utilization_percent"],
                "entities": [{"node": "n1", "gpu": "0"}],
                "values": [[value, 95.0]],
            }
        ],
    }


@pytest.mark.parametrize("glitch", ["reset", "negative"])
def test_counter_resets_and_negative_counters_do_not_poison_the_detectors(glitch: str) -> None:
    """A slowly climbing replay counter, then a reset to 0 (a reboot) or a bogus negative reading:
    neither is a burst of errors, and neither is stored as a negative rate."""
    rig = Rig()
    start = NOW - 1800
    value = 1000.0
    for t in range(0, 1800, 5):
        ts = start + t
        rig.now = ts + 1
        if t == 900:
            reading = 0.0 if glitch == "reset" else -1e6
            if glitch == "reset":
                value = 0.0
        else:
            value += 0.01 * 5  # one replay per 100 s
            reading = value
        assert rig.post(_counter_frame(ts, reading)).status_code == 200
        rig.hub.evaluate(ts + 1)
    rules = {a.rule for a in rig.hub.alerts.all()}
    assert "pcie_replay_rising" not in rules, rules
    rig.close()


def test_clock_skew_of_seconds_between_agents_is_accepted_and_read_in_order() -> None:
    """Two agents 5 s ahead and 5 s behind the hub: both stored as sent, nobody reported silent."""
    rig = Rig()
    for tick in range(60):
        rig.now = NOW + tick
        for node, skew in (("fast", 5.0), ("slow", -5.0)):
            body = {
                "source": node,
                "batch_id": f"{node}-{tick}",
                "frames": [
                    {
                        "ts": rig.now + skew,
                        "metrics": ["node_cpu_percent"],
                        "entities": [{"node": node}],
                        "values": [[float(tick)]],
                    }
                ],
            }
            assert rig.post(body).status_code == 200
        rig.hub.evaluate(rig.now)
    for node, skew in (("fast", 5.0), ("slow", -5.0)):
        points = rig.series("node_cpu_percent", NOW - 10, NOW + 70, node=node)
        assert points == [[NOW + t + skew, float(t)] for t in range(60)]
    silent = [a.entity for a in rig.hub.alerts.all() if a.rule == "node_unreachable"]
    assert silent == [{"node": "node-0"}]  # only the rig's first sender, which really went quiet
    rig.close()


def test_duplicate_and_out_of_order_batches_are_stored_once_in_time_order(rig: Rig) -> None:
    batches = [known(k) for k in range(3, 23)]
    order = batches + batches[::3]  # a third of them retried after a "lost reply"
    random.Random(7).shuffle(order)
    dup = 0
    for b in order:
        r = rig.post(b).json()
        dup += r["duplicate"]
    assert dup == len(batches[::3])
    points = rig.series("gpu_temp_celsius", NOW - 100, NOW, node="node-0", gpu="1")
    assert points == [[NOW - 60 + k, 60.0 + k] for k in range(23)]
    assert rig.count("gpu_utilization_percent", NOW - 100, NOW) == 2 * 23
    assert rig.health()["counters"]["ingest_duplicate_batches"] == len(batches[::3])


def test_unknown_metric_names_are_accepted_within_the_limit_and_refused_past_it() -> None:
    rig = Rig(max_metrics=6)  # two known metrics stored already
    names = [f"vendor_thing_{i}_total" for i in range(6)]
    body = {
        "source": "x",
        "frames": [
            {"ts": NOW - 20, "metrics": names, "entities": [{"node": "n9"}], "values": [list(range(6))]}
        ],
    }
    r = rig.post(body).json()
    assert r["accepted"]["samples"] == 4 and r["refused"]["samples"] == 2
    assert any("metric column limit (6)" in n for n in r["notes"])
    assert rig.series("vendor_thing_3_total", NOW - 60, NOW, node="n9") == [[NOW - 20, 3.0]]
    assert rig.series("vendor_thing_5_total", NOW - 60, NOW, node="n9") == []
    assert rig.post(known(3)).json()["accepted"]["samples"] == 4
    rig.close()
